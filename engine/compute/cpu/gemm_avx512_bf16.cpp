// The AVX-512 BF16 GEMM path: activations split into bf16 parts (bf16_split.h), two k a lane in
// VDPBF16PS; two k rows of a super-panel, interleaved by one unpack, give 32 columns of weight pairs.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <array>

#include "engine/compute/cpu/bf16_split.h"
#include "engine/compute/cpu/gemm_block.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512bf16")

#include "engine/compute/cpu/bf16_lanes.h"

namespace anchorage::cpu {
namespace {

// Where a tile reads its activation words: row r, part p, pair t at x + r * row_words + p * part_words + t.
struct PairRows {
  const uint32_t* x;
  int64_t row_words, part_words;
};

// R rows by S super-panels over parts [0, P); pairs full k pairs, then one k (paired with zero) when odd_tail.
template <int R, int S, int P>
void Tile(PairRows x, const uint16_t* const* w, float* const* y, const int* cols, int64_t ldy, int64_t pairs, bool odd_tail,
          bool accumulate) {
  __m512 lo[R][S], hi[R][S];
  for (int r = 0; r < R; ++r)
    for (int s = 0; s < S; ++s) {
      if (accumulate) {
        LoadOut(y[s] + r * ldy, cols[s], lo[r][s], hi[r][s]);
      } else {
        lo[r][s] = _mm512_setzero_ps();
        hi[r][s] = _mm512_setzero_ps();
      }
    }
  const auto step = [&](int64_t t, bool last_alone) {
    __m512bh wl[S], wh[S];
    for (int s = 0; s < S; ++s) {
      const __m512i even = _mm512_loadu_si512(w[s] + 2 * t * kPanelColumns);
      const __m512i odd = last_alone ? _mm512_setzero_si512() : _mm512_loadu_si512(w[s] + (2 * t + 1) * kPanelColumns);
      __m512i lo, hi;
      InterleavePairs(even, odd, lo, hi);
      wl[s] = reinterpret_cast<__m512bh>(lo);
      wh[s] = reinterpret_cast<__m512bh>(hi);
    }
    for (int r = 0; r < R; ++r)
      for (int p = 0; p < P; ++p) {
        const auto b = reinterpret_cast<__m512bh>(
            _mm512_set1_epi32(static_cast<int>(x.x[r * x.row_words + p * x.part_words + t])));
        for (int s = 0; s < S; ++s) {
          lo[r][s] = _mm512_dpbf16_ps(lo[r][s], wl[s], b);
          hi[r][s] = _mm512_dpbf16_ps(hi[r][s], wh[s], b);
        }
      }
  };
  for (int64_t t = 0; t < pairs; ++t) step(t, false);
  if (odd_tail) step(pairs, true);
  for (int r = 0; r < R; ++r)
    for (int s = 0; s < S; ++s) StoreOut(y[s] + r * ldy, cols[s], lo[r][s], hi[r][s]);
}

template <int S, int MaxR, int P, int R = 1>
void TileRows(int rows, PairRows x, const uint16_t* const* w, float* const* y, const int* cols, int64_t ldy, int64_t pairs,
              bool odd_tail, bool accumulate) {
  if constexpr (R <= MaxR) {
    if (rows == R) return Tile<R, S, P>(x, w, y, cols, ldy, pairs, odd_tail, accumulate);
    return TileRows<S, MaxR, P, R + 1>(rows, x, w, y, cols, ldy, pairs, odd_tail, accumulate);
  }
}

constexpr int kRowTile = 12;
constexpr int kFewRowsPanels = 4;

template <int P>
void RunParts(const GemmBlock& b) {
  const uint16_t* w[kFewRowsPanels];
  float* y[kFewRowsPanels];
  int cols[kFewRowsPanels];
  const int panels = static_cast<int>(b.panel_count);
  for (int p = 0; p < panels; ++p) {
    w[p] = b.panels + p * b.k * kPanelColumns + b.k0 * kPanelColumns;
    y[p] = b.y + p * kPanelColumns;
    cols[p] = static_cast<int>(b.cols - p * kPanelColumns < kPanelColumns ? b.cols - p * kPanelColumns : kPanelColumns);
  }
  const PairRows x{b.x_pairs + b.k0 / 2, kBf16Parts * b.pair_stride, b.pair_stride};
  const int64_t pairs = (b.k1 - b.k0) / 2;
  const bool odd_tail = (b.k1 - b.k0) % 2 != 0;
  if (b.rows <= kFewRows) {
    const int rows = static_cast<int>(b.rows);
    if (panels == kFewRowsPanels) return TileRows<kFewRowsPanels, kFewRows, P>(rows, x, w, y, cols, b.ldy, pairs, odd_tail, b.accumulate);
    for (int p = 0; p < panels; ++p) TileRows<1, kFewRows, P>(rows, x, w + p, y + p, cols + p, b.ldy, pairs, odd_tail, b.accumulate);
    return;
  }
  for (int64_t r0 = 0; r0 < b.rows; r0 += kRowTile) {
    const int rows = static_cast<int>(b.rows - r0 < kRowTile ? b.rows - r0 : kRowTile);
    const PairRows xr{x.x + r0 * x.row_words, x.row_words, x.part_words};
    for (int p = 0; p < panels; ++p) {
      float* yr = y[p] + r0 * b.ldy;
      TileRows<1, kRowTile, P>(rows, xr, w + p, &yr, cols + p, b.ldy, pairs, odd_tail, b.accumulate);
    }
  }
}

void Run(const GemmBlock& b) {
  if (b.parts == 1) return RunParts<1>(b);
  RunParts<kBf16Parts>(b);
}

// SplitRowsPortable's words, 16 pairs at a time.
void Split(const float* x, int64_t ldx, int64_t rows, int64_t k, int64_t pair_stride, uint32_t* out, int parts) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * ldx;
    int64_t t = 0;
    for (; 2 * t + 32 <= k; t += 16)
      SplitSixteenPairs(_mm512_loadu_ps(row + 2 * t), _mm512_loadu_ps(row + 2 * t + 16), out + r * kBf16Parts * pair_stride + t,
                        pair_stride, parts);
    SplitPairsPortable(row, k, t, pair_stride, out + r * kBf16Parts * pair_stride, parts);
  }
}

}  // namespace

#pragma GCC pop_options

void GemmBlockAvx512Bf16(const GemmBlock& b) { Run(b); }
void SplitRowsAvx512Bf16(const float* x, int64_t ldx, int64_t rows, int64_t k, int64_t pair_stride, uint32_t* out, int parts) {
  Split(x, ldx, rows, k, pair_stride, out, parts);
}

}  // namespace anchorage::cpu
