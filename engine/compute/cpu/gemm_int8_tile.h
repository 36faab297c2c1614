// The int8 GEMM tile every path instantiates with its own vector types. Each output takes, block by block of
// 32 inputs in order, the block's exact integer dot of int16 activation codes and int8 weight codes, then one
// fused multiply-add: y = fma(float(dot), weight scale x activation scale, y). Integer sums are exact, so
// every path, row count, block split and thread count gives the same bits.
#pragma once

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <cstring>

#include "engine/compute/cpu/gemm_block.h"
#include "engine/compute/cpu/matmul.h"

namespace anchorage::cpu {

namespace {

inline constexpr int64_t kInt8PairsABlock = PackedQ8::kInt8Block / 2;
inline constexpr int kInt8MaxGroups = 32;
// Decode also asks for a super-panel's two scale lines this many blocks ahead (its codes: kDecodePrefetchRows).
inline constexpr int64_t kInt8PrefetchBlocks = 2;

// The activation pair (inputs 2t, 2t + 1) of a row of codes, as the 32-bit word VPDPWSSD broadcasts.
inline int32_t CodePair(const int16_t* row, int64_t t) {
  int32_t pair;
  std::memcpy(&pair, row + 2 * t, sizeof pair);
  return pair;
}

// Groups of V::kCols output columns: their codes (pair t at w + t * 2 * kPanelColumns), scale rows (block b at
// scales + b * kPanelColumns) and outputs.
struct Int8Groups {
  const uint8_t* w[kInt8MaxGroups];
  const float* scales[kInt8MaxGroups];
  float* y[kInt8MaxGroups];
  int cols[kInt8MaxGroups];
  bool starts_panel[kInt8MaxGroups];  // the group holds its super-panel's first column
};

// R rows by G groups over pairs [t0, t1), from the stored partial sums when accumulate.
template <class V, int R, int G>
inline void Int8Tile(const int16_t* codes, int64_t ld_codes, const float* x_scales, int64_t ld_scales,
                     const Int8Groups& g, int first, int64_t ldy, int64_t t0, int64_t t1, bool accumulate) {
  using F = typename V::F;
  using I = typename V::I;
  F out[R][G];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < G; ++c)
      out[r][c] = accumulate ? V::LoadOut(g.y[first + c] + r * ldy, g.cols[first + c]) : V::Zero();
  for (int64_t t = t0; t < t1;) {
    const int64_t block = t / kInt8PairsABlock;
    const int64_t block_end = std::min(t1, (block + 1) * kInt8PairsABlock);
    I dot[R][G];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < G; ++c) dot[r][c] = V::ZeroI();
    for (; t < block_end; ++t) {
      typename V::Codes w[G];
      for (int c = 0; c < G; ++c) w[c] = V::LoadCodes(g.w[first + c] + t * 2 * kPanelColumns);
      if constexpr (R <= kFewRows)
        for (int c = 0; c < G; ++c)
          if (g.starts_panel[first + c]) __builtin_prefetch(g.w[first + c] + (t + kDecodePrefetchRows) * 2 * kPanelColumns);
      for (int r = 0; r < R; ++r) {
        const int32_t pair = CodePair(codes + r * ld_codes, t);
        for (int c = 0; c < G; ++c) dot[r][c] = V::Dot(dot[r][c], w[c], pair);
      }
    }
    for (int c = 0; c < G; ++c) {
      if (R <= kFewRows && g.starts_panel[first + c]) {
        __builtin_prefetch(g.scales[first + c] + (block + kInt8PrefetchBlocks) * kPanelColumns);
        __builtin_prefetch(g.scales[first + c] + (block + kInt8PrefetchBlocks) * kPanelColumns + 16);
      }
      const F weight_scales = V::LoadScales(g.scales[first + c] + block * kPanelColumns);
      for (int r = 0; r < R; ++r)
        out[r][c] = V::Fma(V::ToFloat(dot[r][c]), V::Mul(weight_scales, V::Broadcast(x_scales[r * ld_scales + block])),
                           out[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < G; ++c) V::StoreOut(g.y[first + c] + r * ldy, g.cols[first + c], out[r][c]);
}

// Int8Tile<V, rows, G> for a run-time row count in [R, MaxR].
template <class V, int G, int MaxR, int R = 1>
inline void Int8TileRows(int rows, const int16_t* codes, int64_t ld_codes, const float* x_scales, int64_t ld_scales,
                         const Int8Groups& g, int first, int64_t ldy, int64_t t0, int64_t t1, bool accumulate) {
  if constexpr (R <= MaxR) {
    if (rows == R) return Int8Tile<V, R, G>(codes, ld_codes, x_scales, ld_scales, g, first, ldy, t0, t1, accumulate);
    return Int8TileRows<V, G, MaxR, R + 1>(rows, codes, ld_codes, x_scales, ld_scales, g, first, ldy, t0, t1, accumulate);
  }
}

// Rows of up to MaxR at a time, G groups at a time and the rest one by one.
template <class V, int G, int MaxR>
inline void Int8Rows(const GemmBlock& b, const Int8Groups& g, int groups, int64_t r0, int rows, int64_t t0, int64_t t1) {
  const int64_t ld_codes = ActivationCodesStride(b.k), ld_scales = ActivationScalesStride(b.k);
  const int16_t* codes = b.x_codes + r0 * ld_codes;
  const float* x_scales = b.x_code_scales + r0 * ld_scales;
  Int8Groups shifted = g;
  for (int c = 0; c < groups; ++c) shifted.y[c] = g.y[c] + r0 * b.ldy;
  int c = 0;
  for (; c + G <= groups; c += G)
    Int8TileRows<V, G, MaxR>(rows, codes, ld_codes, x_scales, ld_scales, shifted, c, b.ldy, t0, t1, b.accumulate);
  for (; c < groups; ++c)
    Int8TileRows<V, 1, MaxR>(rows, codes, ld_codes, x_scales, ld_scales, shifted, c, b.ldy, t0, t1, b.accumulate);
}

// One GemmBlock of int8 weights: up to kFewRows rows take wide tiles of groups (decode), more rows tiles of
// V::kRowTile rows.
template <class V>
inline void RunInt8Block(const GemmBlock& b) {
  static_assert(kPanelColumns % V::kCols == 0);
  static_assert(kGemmTaskPanels * kPanelColumns <= kInt8MaxGroups * V::kCols, "a task's columns fit the groups");
  static_assert(kGemmKBlock % PackedQ8::kInt8Block == 0, "k blocks end on whole blocks of 32");
  assert(b.q8_block_k == PackedQ8::kInt8Block);
  const int64_t k_blocks = ActivationScalesStride(b.k);
  Int8Groups g;
  int groups = 0;
  for (int64_t c0 = 0; c0 < b.cols && groups < kInt8MaxGroups; c0 += V::kCols, ++groups) {
    const int64_t panel = c0 / kPanelColumns, in_panel = c0 % kPanelColumns;
    g.w[groups] = b.q8_panels + panel * b.q8_panel_bytes + 2 * in_panel;
    g.scales[groups] = b.q8_scales + panel * k_blocks * kPanelColumns + in_panel;
    g.y[groups] = b.y + c0;
    g.cols[groups] = static_cast<int>(std::min<int64_t>(V::kCols, b.cols - c0));
    g.starts_panel[groups] = in_panel == 0;
  }
  const int64_t t0 = b.k0 / 2, t1 = (b.k1 + 1) / 2;
  if (b.rows == 1) return Int8Rows<V, V::kOneRowGroups, 1>(b, g, groups, 0, 1, t0, t1);
  if (b.rows == 2) return Int8Rows<V, V::kTwoRowsGroups, 2>(b, g, groups, 0, 2, t0, t1);
  for (int64_t r0 = 0; r0 < b.rows; r0 += V::kRowTile)
    Int8Rows<V, V::kManyRowsGroups, V::kRowTile>(b, g, groups, r0, static_cast<int>(std::min<int64_t>(V::kRowTile, b.rows - r0)),
                                                 t0, t1);
}

}  // namespace

}  // namespace anchorage::cpu
