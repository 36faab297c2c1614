// What a GEMM kernel path is called with, and the paths' entry points (one file each).
#pragma once

#include <cstdint>

#include "engine/compute/cpu/bf16_split.h"
#include "engine/compute/cpu/packed_bf16.h"
#include "engine/compute/cpu/packed_q8.h"

namespace anchorage::cpu {

// Rows of the packed activations the fp32 kernels read for many rows: group g holds rows
// [12g, 12g + 12) as [k][12], so a tile's broadcasts come from one line and its rows share no L1 sets.
inline constexpr int64_t kRowGroup = 12;

// One call of a path's kernel: rows of x against a group of consecutive super-panels, k in [k0, k1).
struct GemmBlock {
  const float* x = nullptr;  // row 0, column 0 of the rows; row stride ldx
  int64_t ldx = 0;
  // fp32 paths, more than kFewRows rows: the rows packed (kRowGroup); row 0 starts a group.
  const float* x_groups = nullptr;
  int64_t rows = 0;
  const uint16_t* panels = nullptr;  // the group's first super-panel; the next one starts k * 32 slots on
  int64_t panel_count = 0;
  int64_t k = 0;
  int64_t k0 = 0, k1 = 0;
  int64_t cols = 0;  // valid output columns from the group's first (the rest are padding)
  float* y = nullptr;  // output column of the group's first, row 0; row stride ldy
  int64_t ldy = 0;
  bool accumulate = false;  // continue from the partial sums in y (k0 > 0)
  // bf16 paths: the rows split into bf16 parts (bf16_split.h); row r's part p at x_pairs + (r * parts + p) * pair_stride
  // (the AMX path: row tile r / 16 from x_pairs + r * parts * pair_stride, SplitRowsAmxBf16's layout).
  const uint32_t* x_pairs = nullptr;
  int64_t pair_stride = 0;
  int parts = kBf16Parts;  // the parts the products use, from part 0 (fast precision: 1, the bf16-rounded activation)
  // 8-bit weights (PackedQ8's layout): the group's first super-panel's codes and scales; panels is unset.
  const uint8_t* q8_panels = nullptr;
  const float* q8_scales = nullptr;
  int64_t q8_block_k = 0;
  int64_t q8_panel_bytes = 0;
  // int8 weights: the rows as QuantizeActivations writes them, from row 0.
  const int16_t* x_codes = nullptr;
  const float* x_code_scales = nullptr;
};

// The kernels of each path (one file each); the emulated ones run the 16-lane kernel's arithmetic
// and lane order, and the bf16 kernel's arithmetic, in portable C++, so tests check them on any CPU.
void GemmBlockPortable(const GemmBlock& b);
void GemmBlockEmulated16(const GemmBlock& b);
void GemmBlockAvx2(const GemmBlock& b);
void GemmBlockAvx512(const GemmBlock& b);
void GemmBlockAvx512Bf16(const GemmBlock& b);
void GemmBlockEmulatedBf16(const GemmBlock& b);
void GemmBlockAmxBf16(const GemmBlock& b);
void GemmBlockEmulatedAmx(const GemmBlock& b);
using GemmBlockFn = void (*)(const GemmBlock& b);
// 8-bit weights: FP8 in the fp32 arithmetic (each weight code x scale rounded once, then the fp32 paths'
// order); int8 in gemm_int8_tile.h's.
struct Q8Kernels {
  GemmBlockFn fp8;
  GemmBlockFn int8;
};
extern const Q8Kernels kQ8Portable, kQ8Emulated16, kQ8Avx2, kQ8Avx512;
// int8 weights on AVX-512 with VPDPWSSD (the AVX-512F path's int8 kernel adds VPMADDWD's sums instead: same bits).
void GemmBlockInt8Avx512Vnni(const GemmBlock& b);
void SplitRowsAvx512Bf16(const float* x, int64_t ldx, int64_t rows, int64_t k, int64_t pair_stride, uint32_t* out, int parts);
// The same words laid out as the AMX kernel's A tiles: rows in tiles of 16, row tile R's chunk c (16 pairs,
// pair_stride / 16 of them) part p at out + R * 16 * kBf16Parts * pair_stride + (c * kBf16Parts + p) * 256, row i of
// it at + 16 i. Rows come in whole tiles from the first (rows <= 16 unless out is a tile's start).
void SplitRowsAmxBf16(const float* x, int64_t ldx, int64_t rows, int64_t k, int64_t pair_stride, uint32_t* out, int parts);

// x [rows, k] (row stride ldx) into kRowGroup groups: row r, column t at out[((r / 12) * k + t) * 12 + r % 12].
void PackRowGroups(const float* x, int64_t ldx, int64_t rows, int64_t k, float* out);

// Rows more than this take the packed tiles; the kernels' few-rows tiles read x in place.
inline constexpr int kFewRows = 2;
// Up to this many rows (a decode batch) the fp32 kernels stream each bf16 weight from memory once, over the whole k.
inline constexpr int kStreamRows = 4;

// Decode streams every weight from memory once: a few-rows tile asks for the k row (int8: the pair of k rows)
// of its super-panels' codes this far ahead, 2 KiB for bf16 and int8 (64-byte rows), 1 KiB for FP8.
inline constexpr int64_t kDecodePrefetchRows = 32;

}  // namespace anchorage::cpu
