// The one bf16 GEMM tile every fp32 kernel path instantiates with its own vector type, compiled in
// each path's file under that path's target. Each output starts at 0 (or its stored partial) and takes its k products in index order, one fused
// multiply-add each, so every path, row count, block split and thread count gives the same bits.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "engine/compute/cpu/gemm_block.h"

namespace anchorage::cpu {

namespace {

// Segments are the slot runs one vector pair covers: 2 * V::kLanes slots of a k row.
inline constexpr int kMaxSegments = 16;

// Row r, step t of a tile's activations: in a packed row group (kRowGroup), or rows at stride ldx.
template <bool kPacked>
inline float XAt(const float* x, int64_t ldx, int r, int64_t t) {
  return kPacked ? x[t * kRowGroup + r] : x[r * ldx + t];
}

// A segment's bf16 weights from k0 on: 2 * V::kLanes slots of each k row.
struct Bf16Weights {
  static constexpr bool kScaled = false;
  const uint16_t* w = nullptr;
  static Bf16Weights Of(const GemmBlock& b, int64_t panel, int64_t first_slot) {
    return {b.panels + (panel * b.k + b.k0) * kPanelColumns + first_slot};
  }
  template <class V>
  void LoadScales(int64_t, typename V::F&, typename V::F&) const {}
  // k row t's weights (no scales: the arguments are not read).
  template <class V>
  void Load(int64_t t, const typename V::F&, const typename V::F&, typename V::F& lo, typename V::F& hi) const {
    V::LoadW(w + t * kPanelColumns, lo, hi);
  }
  int64_t BlockEnd(int64_t) const { return INT64_MAX; }
  void Prefetch(int64_t t) const { __builtin_prefetch(w + t * kPanelColumns); }
  // The same segment from k row t on.
  Bf16Weights From(int64_t t) const { return {w + t * kPanelColumns}; }
};

// A segment's FP8 codes from k0 on (its lo lanes' bytes, the hi lanes' 16 on) and its scale rows (by
// absolute k); V::LoadFp8 gives an e4m3 code's value times V::kFp8CodeFactor (exact), LoadScales the
// scales divided by it, so their product is the weight.
struct Fp8Weights {
  static constexpr bool kScaled = true;
  const uint8_t* w = nullptr;
  const float* scales = nullptr;
  int64_t block_k = 1;
  static Fp8Weights Of(const GemmBlock& b, int64_t panel, int64_t first_column) {
    const int64_t k_blocks = (b.k + b.q8_block_k - 1) / b.q8_block_k;
    return {b.q8_panels + (panel * b.k + b.k0) * kPanelColumns + PackedQ8::SlotOf(first_column),
            b.q8_scales + panel * k_blocks * kPanelColumns + first_column, b.q8_block_k};
  }
  template <class V>
  void LoadScales(int64_t k, typename V::F& lo, typename V::F& hi) const {
    V::LoadOut(scales + (k / block_k) * kPanelColumns, 2 * V::kLanes, lo, hi);
    if constexpr (V::kFp8CodeFactor != 1.0f) {
      lo = V::Mul(lo, V::Broadcast(1.0f / V::kFp8CodeFactor));
      hi = V::Mul(hi, V::Broadcast(1.0f / V::kFp8CodeFactor));
    }
  }
  // k row t's weights: each code times its scale (from LoadScales), rounded once.
  template <class V>
  void Load(int64_t t, const typename V::F& scale_lo, const typename V::F& scale_hi, typename V::F& lo,
            typename V::F& hi) const {
    V::LoadFp8(w + t * kPanelColumns, lo, hi);
    lo = V::Mul(lo, scale_lo);
    hi = V::Mul(hi, scale_hi);
  }
  int64_t BlockEnd(int64_t k) const { return (k / block_k + 1) * block_k; }
  void Prefetch(int64_t t) const { __builtin_prefetch(w + t * kPanelColumns); }
};

// A segment's weights widened to fp32 in V's lane order: k row t's lo lanes at w + t * 2 * V::kLanes, hi after.
struct WidenedWeights {
  static constexpr bool kScaled = false;
  const float* w = nullptr;
  template <class V>
  void LoadScales(int64_t, typename V::F&, typename V::F&) const {}
  template <class V>
  void Load(int64_t t, const typename V::F&, const typename V::F&, typename V::F& lo, typename V::F& hi) const {
    V::LoadFullF(w + t * 2 * V::kLanes, lo, hi);
  }
  int64_t BlockEnd(int64_t) const { return INT64_MAX; }
};

// Writes k rows [k0, k0 + steps) of a scaled segment as WidenedWeights: each weight as the tile makes it.
template <class V, class W>
inline void Widen(const W& w, int64_t k0, int64_t steps, float* out) {
  using F = typename V::F;
  for (int64_t t = 0; t < steps;) {
    const int64_t block_end = std::min(steps, w.BlockEnd(k0 + t) - k0);
    F scale_lo, scale_hi;
    w.template LoadScales<V>(k0 + t, scale_lo, scale_hi);
    for (; t < block_end; ++t) {
      F lo, hi;
      w.template Load<V>(t, scale_lo, scale_hi, lo, hi);
      V::StoreF(out + t * 2 * V::kLanes, 2 * V::kLanes, lo, hi);
    }
  }
}

// kStream: the weights come from memory once for these rows (decode, a batch of a few rows), so each
// segment asks for its k rows kDecodePrefetchRows ahead.
template <class V, class W, int R, int S, bool kPacked, bool kStream = !kPacked>
inline void Tile(const float* x, int64_t ldx, const W* w, float* const* y, const int* cols, int64_t ldy, int64_t k0,
                 int64_t steps, bool accumulate) {
  using F = typename V::F;
  F lo[R][S], hi[R][S];
  for (int r = 0; r < R; ++r)
    for (int s = 0; s < S; ++s) {
      if (accumulate) {
        V::LoadOut(y[s] + r * ldy, cols[s], lo[r][s], hi[r][s]);
      } else {
        lo[r][s] = V::Zero();
        hi[r][s] = V::Zero();
      }
    }
  for (int64_t t = 0; t < steps;) {
    const int64_t block_end = std::min(steps, w[0].BlockEnd(k0 + t) - k0);
    F scale_lo[S], scale_hi[S];
    if constexpr (W::kScaled)
      for (int s = 0; s < S; ++s) w[s].template LoadScales<V>(k0 + t, scale_lo[s], scale_hi[s]);
    for (; t < block_end; ++t) {
      for (int s = 0; s < S; ++s) {
        F wl, wh;
        w[s].template Load<V>(t, scale_lo[s], scale_hi[s], wl, wh);
        if constexpr (kStream) w[s].Prefetch(t + kDecodePrefetchRows);
        for (int r = 0; r < R; ++r) {
          const F b = V::Broadcast(XAt<kPacked>(x, ldx, r, t));
          lo[r][s] = V::Fma(b, wl, lo[r][s]);
          hi[r][s] = V::Fma(b, wh, hi[r][s]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int s = 0; s < S; ++s) V::StoreOut(y[s] + r * ldy, cols[s], lo[r][s], hi[r][s]);
}

// Tile<V, W, rows, S, kPacked, kStream> for a run-time row count in [R, MaxR].
template <class V, class W, int S, int MaxR, bool kPacked, bool kStream = !kPacked, int R = 1>
inline void TileRows(int rows, const float* x, int64_t ldx, const W* w, float* const* y, const int* cols, int64_t ldy,
                     int64_t k0, int64_t steps, bool accumulate) {
  if constexpr (R <= MaxR) {
    if (rows == R) return Tile<V, W, R, S, kPacked, kStream>(x, ldx, w, y, cols, ldy, k0, steps, accumulate);
    return TileRows<V, W, S, MaxR, kPacked, kStream, R + 1>(rows, x, ldx, w, y, cols, ldy, k0, steps, accumulate);
  }
}

// More than kFewRows rows: tiles of V::kRowTile rows (a divisor of kRowGroup) from the packed rows. The
// first tile brings each weight from memory (the others find it in cache): it prefetches as decode does.
template <class V, class W>
inline void RunManyRows(const GemmBlock& b, const W* w, float* const* y, const int* cols, int segments, int64_t steps) {
  static_assert(kRowGroup % V::kRowTile == 0);
  constexpr bool kCanPrefetch = requires(const W& weights) { weights.Prefetch(int64_t{0}); };
  for (int64_t r0 = 0; r0 < b.rows; r0 += V::kRowTile) {
    const int rows = static_cast<int>(b.rows - r0 < V::kRowTile ? b.rows - r0 : V::kRowTile);
    const float* xr = b.x_groups + ((r0 / kRowGroup) * b.k + b.k0) * kRowGroup + r0 % kRowGroup;
    for (int s = 0; s < segments; ++s) {
      float* ys = y[s] + r0 * b.ldy;
      if (r0 == 0) TileRows<V, W, 1, V::kRowTile, true, kCanPrefetch>(rows, xr, 0, w + s, &ys, cols + s, b.ldy, b.k0, steps, b.accumulate);
      else TileRows<V, W, 1, V::kRowTile, true>(rows, xr, 0, w + s, &ys, cols + s, b.ldy, b.k0, steps, b.accumulate);
    }
  }
}

// Up to kStreamRows rows where a segment is half a panel's line: both halves run a chunk of kStreamChunk k rows
// before the next chunk, so each line is used up while in L1 and the weights stream from memory at one pace, as
// in decode, instead of in bursts between passes over cached rows.
inline constexpr int64_t kStreamChunk = 64;

template <class V>
inline constexpr bool kStreamsInChunks = kPanelColumns / (2 * V::kLanes) > 1;

template <class V>
inline void RunRowsInChunks(const GemmBlock& b, const Bf16Weights* w, float* const* y, const int* cols, int segments,
                            int64_t steps) {
  constexpr int kPerPanel = static_cast<int>(kPanelColumns) / (2 * V::kLanes);
  const int rows = static_cast<int>(b.rows);
  for (int first = 0; first < segments; first += kPerPanel) {
    const int halves = std::min(kPerPanel, segments - first);
    for (int64_t c0 = 0; c0 < steps; c0 += kStreamChunk) {
      const int64_t chunk = std::min(kStreamChunk, steps - c0);
      const float* x = b.x + b.k0 + c0;
      const bool accumulate = b.accumulate || c0 > 0;
      for (int h = 0; h < halves; ++h) {
        const Bf16Weights from = w[first + h].From(c0);
        if (h == 0)
          TileRows<V, Bf16Weights, 1, kStreamRows, false, true>(rows, x, b.ldx, &from, y + first + h, cols + first + h,
                                                                b.ldy, b.k0 + c0, chunk, accumulate);
        else
          TileRows<V, Bf16Weights, 1, kStreamRows, false, false>(rows, x, b.ldx, &from, y + first + h, cols + first + h,
                                                                 b.ldy, b.k0 + c0, chunk, accumulate);
      }
    }
  }
}

// V::kRowTile rows a tile (a divisor of kRowGroup) from the packed rows for many rows; up to kFewRows
// rows read x in place and take V::kFewRowsSegments segments at once, so decode keeps enough
// independent sums in flight.
template <class V, class W = Bf16Weights>
inline void RunGemmBlock(const GemmBlock& b) {
  constexpr int kSegmentSlots = 2 * V::kLanes;
  constexpr int kPerPanel = static_cast<int>(kPanelColumns) / kSegmentSlots;
  W w[kMaxSegments];
  float* y[kMaxSegments];
  int cols[kMaxSegments];
  int segments = 0;
  for (int64_t p = 0; p < b.panel_count; ++p)
    for (int h = 0; h < kPerPanel && segments < kMaxSegments; ++h) {
      const int64_t first = p * kPanelColumns + h * kSegmentSlots;
      if (first >= b.cols) break;
      w[segments] = W::Of(b, p, h * kSegmentSlots);
      y[segments] = b.y + first;
      cols[segments] = static_cast<int>(b.cols - first < kSegmentSlots ? b.cols - first : kSegmentSlots);
      ++segments;
    }
  const int64_t steps = b.k1 - b.k0;
  const float* x = b.x + b.k0;
  if (b.rows <= kFewRows) {
    const int rows = static_cast<int>(b.rows);
    int s = 0;
    for (; s + V::kFewRowsSegments <= segments; s += V::kFewRowsSegments)
      TileRows<V, W, V::kFewRowsSegments, kFewRows, false>(rows, x, b.ldx, w + s, y + s, cols + s, b.ldy, b.k0, steps,
                                                           b.accumulate);
    for (; s < segments; ++s)
      TileRows<V, W, 1, kFewRows, false>(rows, x, b.ldx, w + s, y + s, cols + s, b.ldy, b.k0, steps, b.accumulate);
    return;
  }
  // Many rows: each tile of rows reads every weight again, so 8-bit codes are widened once for all of them.
  if constexpr (W::kScaled) {
    thread_local std::vector<float> widened;
    widened.resize(static_cast<size_t>(segments * steps * 2 * V::kLanes));
    WidenedWeights ready[kMaxSegments];
    for (int s = 0; s < segments; ++s) {
      ready[s].w = widened.data() + s * steps * 2 * V::kLanes;
      Widen<V>(w[s], b.k0, steps, widened.data() + s * steps * 2 * V::kLanes);
    }
    return RunManyRows<V>(b, ready, y, cols, segments, steps);
  } else {
    if constexpr (kStreamsInChunks<V>)
      if (b.rows <= kStreamRows) return RunRowsInChunks<V>(b, w, y, cols, segments, steps);
    return RunManyRows<V>(b, w, y, cols, segments, steps);
  }
}

}  // namespace

}  // namespace anchorage::cpu
