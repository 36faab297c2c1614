// What the fp32 attention product of a path is called with, and the paths' entry points.
#pragma once

#include <cstdint>

#include "engine/compute/cpu/attention.h"

namespace anchorage::cpu {

// Columns of a b panel: with b_panel_stride > 0, columns [32p, 32p + 32) of b are a [k, 32] block
// (row stride ldb) at b + p * b_panel_stride; consecutive rows then sit in consecutive lines.
inline constexpr int64_t kF32PanelColumns = 32;

// y [rows, cols] (row stride ldy) = (or +=) a [rows, k] (row stride lda) · b [k, cols] (row stride ldb).
struct RowsTimesArgs {
  const float* a = nullptr;
  int64_t lda = 0, rows = 0;
  const float* b = nullptr;
  int64_t ldb = 0, k = 0, cols = 0;
  int64_t b_panel_stride = 0;
  float* y = nullptr;
  int64_t ldy = 0;
  bool accumulate = false;
};

// A row stride of at least n floats whose rows start an odd number of cache lines apart, so rows
// a tile reads together fall in different L1 sets.
inline int64_t SpreadStride(int64_t n) {
  const int64_t lines = (n + 15) / 16;
  return (lines % 2 == 0 ? lines + 1 : lines) * 16;
}

// A decode step's scores for one kv head's group of query rows: scores[h * ld + j] = q[h] · key j (from 0, e in
// order, one fma each: RowsTimes' bits) for keys [j0, j1), reading the key rows in place from column `column`.
struct DecodeScoresArgs {
  const float* q = nullptr;
  int64_t q_head_stride = 0, heads = 0, head_dim = 0;
  const KvSource* kv = nullptr;
  int64_t column = 0, j0 = 0, j1 = 0;
  const uint8_t* zero_row = nullptr;  // a row of zero bytes, read in place of keys past j1
  float* scores = nullptr;
  int64_t ld = 0;
};

// And its output columns [c0, c1) of the group's rows: out[h * out_head_stride + c] = Σ_j p[h * ld + j] · value j's
// column + c, keys 0..length-1 in order from 0, one fma each (RowsTimes' bits), value rows read in place.
struct DecodeValuesArgs {
  const float* p = nullptr;
  int64_t ld = 0, heads = 0, length = 0;
  const KvSource* kv = nullptr;
  int64_t column = 0, c0 = 0, c1 = 0;
  float* out = nullptr;
  int64_t out_head_stride = 0;
};

// A path's fp32 attention products; the decode pair may be null (then decode runs as a one-row prefill).
struct Fp32Kernels {
  void (*rows_times)(const RowsTimesArgs&);
  void (*decode_scores)(const DecodeScoresArgs&) = nullptr;
  void (*decode_values)(const DecodeValuesArgs&) = nullptr;
};

// y [rows, cols] (=|+=) a [rows, k] · b [k, cols] (row stride ldb; in 32-column panels when panel_stride > 0).
inline void RowsTimes(const Fp32Kernels& kernels, const float* a, int64_t lda, int64_t rows, const float* b, int64_t ldb,
                      int64_t panel_stride, int64_t k, int64_t cols, float* y, int64_t ldy, bool accumulate) {
  RowsTimesArgs p;
  p.a = a;
  p.lda = lda;
  p.rows = rows;
  p.b = b;
  p.ldb = ldb;
  p.k = k;
  p.cols = cols;
  p.b_panel_stride = panel_stride;
  p.y = y;
  p.ldy = ldy;
  p.accumulate = accumulate;
  kernels.rows_times(p);
}

extern const Fp32Kernels kFp32Portable, kFp32Emulated16, kFp32Avx2, kFp32Avx512;

}  // namespace anchorage::cpu
