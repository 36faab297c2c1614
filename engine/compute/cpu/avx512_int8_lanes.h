// The AVX-512 vectors of the int8 tile (gemm_int8_tile.h): 16 output columns a vector, each lane one column's
// int32 dot of a pair of inputs at a time; the fp32 operations are Avx512Lanes'. Include after an AVX-512BW
// target pragma (with AVX-512 VNNI for kVnni).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "engine/compute/cpu/avx512_lanes.h"

namespace anchorage::cpu {
namespace {

template <bool kVnni>
struct Avx512Int8Lanes : Avx512Lanes {
  static constexpr int kCols = 16;
  static constexpr int kOneRowGroups = 8;
  static constexpr int kTwoRowsGroups = 4;
  static constexpr int kRowTile = 6;
  static constexpr int kManyRowsGroups = 2;
  using I = __m512i;
  using Codes = __m512i;
  static I ZeroI() { return _mm512_setzero_si512(); }
  // 16 columns' codes for a pair of inputs, widened to int16.
  static Codes LoadCodes(const uint8_t* p) { return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static I Dot(I acc, Codes w, int32_t pair) {
    if constexpr (kVnni) {
      return _mm512_dpwssd_epi32(acc, w, _mm512_set1_epi32(pair));
    } else {
      return _mm512_add_epi32(acc, _mm512_madd_epi16(w, _mm512_set1_epi32(pair)));
    }
  }
  static F ToFloat(I v) { return _mm512_cvtepi32_ps(v); }
  static F LoadScales(const float* p) { return _mm512_loadu_ps(p); }
  static F LoadOut(const float* y, int cols) { return _mm512_maskz_loadu_ps(Mask(cols), y); }
  static void StoreOut(float* y, int cols, F v) { _mm512_mask_storeu_ps(y, Mask(cols), v); }
};

}  // namespace
}  // namespace anchorage::cpu
