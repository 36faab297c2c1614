// The fp32 product attention runs on (scores and values), instantiated by every path with its own
// vector type in that path's file: y[r][c] takes a[r][t] * b[t][c] for t in order, one fma each,
// from 0 or from the partial sums in y, so the bits depend on neither the path nor the shape.
#pragma once

#include <cstdint>

#include "engine/compute/cpu/fp32_block.h"

namespace anchorage::cpu {
namespace {

// kFull: all 2L columns, loaded without a bounds check, so the sums stay in registers.
template <class V, int R, bool kFull>
inline void F32Tile(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t k, float* y, int64_t ldy, int cols,
                    bool accumulate) {
  using F = typename V::F;
  F lo[R], hi[R];
  for (int r = 0; r < R; ++r) {
    if (accumulate) {
      V::LoadF(y + r * ldy, cols, lo[r], hi[r]);
    } else {
      lo[r] = V::Zero();
      hi[r] = V::Zero();
    }
  }
  for (int64_t t = 0; t < k; ++t) {
    F bl, bh;
    if constexpr (kFull) {
      V::LoadFullF(b + t * ldb, bl, bh);
    } else {
      V::LoadF(b + t * ldb, cols, bl, bh);
    }
    for (int r = 0; r < R; ++r) {
      const F s = V::Broadcast(a[r * lda + t]);
      lo[r] = V::Fma(s, bl, lo[r]);
      hi[r] = V::Fma(s, bh, hi[r]);
    }
  }
  for (int r = 0; r < R; ++r) V::StoreF(y + r * ldy, cols, lo[r], hi[r]);
}

template <class V, int MaxR, int R = 1>
inline void F32TileRows(int rows, const float* a, int64_t lda, const float* b, int64_t ldb, int64_t k, float* y,
                        int64_t ldy, int cols, bool accumulate) {
  if constexpr (R <= MaxR) {
    if (rows == R) {
      if (cols == 2 * V::kLanes) return F32Tile<V, R, true>(a, lda, b, ldb, k, y, ldy, cols, accumulate);
      return F32Tile<V, R, false>(a, lda, b, ldb, k, y, ldy, cols, accumulate);
    }
    return F32TileRows<V, MaxR, R + 1>(rows, a, lda, b, ldb, k, y, ldy, cols, accumulate);
  }
}

template <class V>
inline void RunRowsTimes(const RowsTimesArgs& p) {
  constexpr int kSegment = 2 * V::kLanes;
  for (int64_t c0 = 0; c0 < p.cols; c0 += kSegment) {
    const int cols = static_cast<int>(p.cols - c0 < kSegment ? p.cols - c0 : kSegment);
    const float* b = p.b_panel_stride > 0 ? p.b + (c0 / kF32PanelColumns) * p.b_panel_stride + c0 % kF32PanelColumns : p.b + c0;
    for (int64_t r0 = 0; r0 < p.rows; r0 += V::kRowTile) {
      const int rows = static_cast<int>(p.rows - r0 < V::kRowTile ? p.rows - r0 : V::kRowTile);
      F32TileRows<V, V::kRowTile>(rows, p.a + r0 * p.lda, p.lda, b, p.ldb, p.k, p.y + r0 * p.ldy + c0, p.ldy, cols,
                                  p.accumulate);
    }
  }
}

}  // namespace
}  // namespace anchorage::cpu
