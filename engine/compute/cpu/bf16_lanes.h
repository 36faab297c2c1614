// Where the bf16 paths' products land: two k rows of a super-panel interleaved by unpacklo (lanes
// 0..15) and unpackhi (16..31) hold the k pairs of 32 columns in lane order, and outputs in that
// order are permuted back to columns on the way to y. Include after the file's AVX-512 target pragma.
#pragma once

#include <immintrin.h>

#include <array>

#include "engine/compute/cpu/avx512_lanes.h"
#include "engine/compute/cpu/bf16_split.h"
#include "engine/compute/cpu/packed_bf16.h"

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

inline __m512i Indices(const std::array<int, 16>& a) { return _mm512_loadu_si512(a.data()); }

inline __mmask16 Mask(int count) { return Avx512Lanes::Mask(count); }

// The first `cols` columns of y into lane order (the rest 0).
inline void LoadOut(const float* y, int cols, __m512& lo, __m512& hi) {
  const __m512 a = _mm512_maskz_loadu_ps(Mask(cols), y);
  const __m512 b = _mm512_maskz_loadu_ps(Mask(cols - 16), y + 16);
  lo = _mm512_permutex2var_ps(a, Indices(kPermutes.columns_of_lanes[0]), b);
  hi = _mm512_permutex2var_ps(a, Indices(kPermutes.columns_of_lanes[1]), b);
}

// Lanes back to columns; only the first `cols` columns of y are written.
inline void StoreOut(float* y, int cols, __m512 lo, __m512 hi) {
  _mm512_mask_storeu_ps(y, Mask(cols), _mm512_permutex2var_ps(lo, Indices(kPermutes.lanes_of_columns[0]), hi));
  _mm512_mask_storeu_ps(y + 16, Mask(cols - 16), _mm512_permutex2var_ps(lo, Indices(kPermutes.lanes_of_columns[1]), hi));
}

// The k pairs of 32 columns from k rows `even` and `odd` of a super-panel: lanes 0..15 in lo, 16..31 in hi.
inline void InterleavePairs(__m512i even, __m512i odd, __m512i& lo, __m512i& hi) {
  lo = _mm512_unpacklo_epi16(even, odd);
  hi = _mm512_unpackhi_epi16(even, odd);
}

// 32 consecutive activations as bf16_split.h's 16 words a part, parts [0, parts): part p's at part0 + p * part_words.
inline void SplitSixteenPairs(__m512 first16, __m512 next16, uint32_t* part0, int64_t part_words, int parts) {
  alignas(64) static constexpr std::array<uint16_t, 32> kHighHalves = [] {
    std::array<uint16_t, 32> a{};
    for (int i = 0; i < 32; ++i) a[i] = static_cast<uint16_t>(2 * i + 1);
    return a;
  }();
  const __m512i high_halves = _mm512_load_si512(kHighHalves.data());
  const auto round = [&](__m512i bits) {  // a capture: no function-pointer conversion compiled outside the target
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_and_si512(_mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))),
                                             _mm512_set1_epi32(static_cast<int>(0xffff0000u)));
    return _mm512_maskz_mov_epi32(_mm512_test_epi32_mask(rounded, _mm512_set1_epi32(0x7f800000)), rounded);
  };
  for (int p = 0; p < parts; ++p) {
    const __m512i a = round(_mm512_castps_si512(first16)), b = round(_mm512_castps_si512(next16));
    _mm512_storeu_si512(part0 + p * part_words, _mm512_permutex2var_epi16(a, high_halves, b));
    first16 = _mm512_sub_ps(first16, _mm512_castsi512_ps(a));
    next16 = _mm512_sub_ps(next16, _mm512_castsi512_ps(b));
  }
}

}  // namespace
}  // namespace anchorage::cpu
