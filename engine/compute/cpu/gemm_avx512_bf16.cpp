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

namespace anchorage::cpu {
namespace {

// Column of a super-panel that slot s holds (see PackedBf16).
constexpr int ColumnOfSlot(int s) { return (s / 16) * 16 + ((s % 16) % 2 == 0 ? (s % 16) / 2 : 8 + (s % 16) / 2); }
// After unpacklo (lanes 0..15) and unpackhi (16..31) of two k rows, lane l holds the pair of this slot.
constexpr int SlotOfLane(int l) { return l < 16 ? 8 * (l / 4) + l % 4 : 8 * ((l - 16) / 4) + 4 + l % 4; }

struct Permutes {
  std::array<int, 16> lanes_of_columns[2];  // output columns 0..15 and 16..31 from the lanes (lo then hi)
  std::array<int, 16> columns_of_lanes[2];  // lo and hi lanes from columns (0..15 then 16..31)
};

constexpr Permutes MakePermutes() {
  Permutes p{};
  for (int l = 0; l < 32; ++l) {
    const int c = ColumnOfSlot(SlotOfLane(l));
    p.lanes_of_columns[c / 16][c % 16] = l;
    p.columns_of_lanes[l / 16][l % 16] = c;
  }
  return p;
}

constexpr Permutes kPermutes = MakePermutes();

__m512i Indices(const std::array<int, 16>& a) { return _mm512_loadu_si512(a.data()); }

__mmask16 Mask(int count) {
  return count >= 16 ? static_cast<__mmask16>(0xffff) : count <= 0 ? static_cast<__mmask16>(0)
                                                                    : static_cast<__mmask16>((1u << count) - 1);
}

void LoadOut(const float* y, int cols, __m512& lo, __m512& hi) {
  const __m512 a = _mm512_maskz_loadu_ps(Mask(cols), y);
  const __m512 b = _mm512_maskz_loadu_ps(Mask(cols - 16), y + 16);
  lo = _mm512_permutex2var_ps(a, Indices(kPermutes.columns_of_lanes[0]), b);
  hi = _mm512_permutex2var_ps(a, Indices(kPermutes.columns_of_lanes[1]), b);
}

void StoreOut(float* y, int cols, __m512 lo, __m512 hi) {
  _mm512_mask_storeu_ps(y, Mask(cols), _mm512_permutex2var_ps(lo, Indices(kPermutes.lanes_of_columns[0]), hi));
  _mm512_mask_storeu_ps(y + 16, Mask(cols - 16), _mm512_permutex2var_ps(lo, Indices(kPermutes.lanes_of_columns[1]), hi));
}

// Where a tile reads its activation words: row r, part p, pair t at x + r * row_words + p * part_words + t.
struct PairRows {
  const uint32_t* x;
  int64_t row_words, part_words;
};

// R rows by S super-panels; pairs full k pairs, then one k (paired with zero) when odd_tail.
template <int R, int S>
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
      wl[s] = reinterpret_cast<__m512bh>(_mm512_unpacklo_epi16(even, odd));
      wh[s] = reinterpret_cast<__m512bh>(_mm512_unpackhi_epi16(even, odd));
    }
    for (int r = 0; r < R; ++r)
      for (int p = 0; p < kBf16Parts; ++p) {
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

template <int S, int MaxR, int R = 1>
void TileRows(int rows, PairRows x, const uint16_t* const* w, float* const* y, const int* cols, int64_t ldy, int64_t pairs,
              bool odd_tail, bool accumulate) {
  if constexpr (R <= MaxR) {
    if (rows == R) return Tile<R, S>(x, w, y, cols, ldy, pairs, odd_tail, accumulate);
    return TileRows<S, MaxR, R + 1>(rows, x, w, y, cols, ldy, pairs, odd_tail, accumulate);
  }
}

constexpr int kRowTile = 12;
constexpr int kFewRowsPanels = 4;

void Run(const GemmBlock& b) {
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
    if (panels == kFewRowsPanels) return TileRows<kFewRowsPanels, kFewRows>(rows, x, w, y, cols, b.ldy, pairs, odd_tail, b.accumulate);
    for (int p = 0; p < panels; ++p) TileRows<1, kFewRows>(rows, x, w + p, y + p, cols + p, b.ldy, pairs, odd_tail, b.accumulate);
    return;
  }
  for (int64_t r0 = 0; r0 < b.rows; r0 += kRowTile) {
    const int rows = static_cast<int>(b.rows - r0 < kRowTile ? b.rows - r0 : kRowTile);
    const PairRows xr{x.x + r0 * x.row_words, x.row_words, x.part_words};
    for (int p = 0; p < panels; ++p) {
      float* yr = y[p] + r0 * b.ldy;
      TileRows<1, kRowTile>(rows, xr, w + p, &yr, cols + p, b.ldy, pairs, odd_tail, b.accumulate);
    }
  }
}

// SplitRowsPortable's words, 16 pairs at a time.
void Split(const float* x, int64_t ldx, int64_t rows, int64_t k, uint32_t* out) {
  const int64_t pairs = PairCount(k);
  alignas(64) static constexpr std::array<uint16_t, 32> kHighHalves = [] {
    std::array<uint16_t, 32> a{};
    for (int i = 0; i < 32; ++i) a[i] = static_cast<uint16_t>(2 * i + 1);
    return a;
  }();
  const __m512i high_halves = _mm512_loadu_si512(kHighHalves.data());
  const auto round = [](__m512i bits) {
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_and_si512(_mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))),
                                             _mm512_set1_epi32(static_cast<int>(0xffff0000u)));
    return _mm512_maskz_mov_epi32(_mm512_test_epi32_mask(rounded, _mm512_set1_epi32(0x7f800000)), rounded);
  };
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * ldx;
    int64_t t = 0;
    for (; 2 * t + 32 <= k; t += 16) {
      __m512 rest_a = _mm512_loadu_ps(row + 2 * t), rest_b = _mm512_loadu_ps(row + 2 * t + 16);
      for (int p = 0; p < kBf16Parts; ++p) {
        const __m512i a = round(_mm512_castps_si512(rest_a)), b = round(_mm512_castps_si512(rest_b));
        _mm512_storeu_si512(out + (r * kBf16Parts + p) * pairs + t, _mm512_permutex2var_epi16(a, high_halves, b));
        rest_a = _mm512_sub_ps(rest_a, _mm512_castsi512_ps(a));
        rest_b = _mm512_sub_ps(rest_b, _mm512_castsi512_ps(b));
      }
    }
    SplitPairsPortable(row, k, t, out + r * kBf16Parts * pairs);
  }
}

}  // namespace

#pragma GCC pop_options

void GemmBlockAvx512Bf16(const GemmBlock& b) { Run(b); }
void SplitRowsAvx512Bf16(const float* x, int64_t ldx, int64_t rows, int64_t k, uint32_t* out) { Split(x, ldx, rows, k, out); }

}  // namespace anchorage::cpu
