// The AVX-512 vectors of the int8 tile (gemm_int8_tile.h): 16 output columns a vector, each lane one column's
// int32 dot of a pair of inputs at a time. Include after an AVX-512BW target pragma (with AVX-512 VNNI for kVnni).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace anchorage::cpu {
namespace {

template <bool kVnni>
struct Avx512Int8Lanes {
  static constexpr int kCols = 16;
  static constexpr int kOneRowGroups = 8;
  static constexpr int kTwoRowsGroups = 4;
  static constexpr int kRowTile = 6;
  static constexpr int kManyRowsGroups = 2;
  using F = __m512;
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
  static F Zero() { return _mm512_setzero_ps(); }
  static F Broadcast(float s) { return _mm512_set1_ps(s); }
  static F Mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F Fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static __mmask16 Mask(int cols) { return cols >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << cols) - 1); }
  static F LoadOut(const float* y, int cols) { return _mm512_maskz_loadu_ps(Mask(cols), y); }
  static void StoreOut(float* y, int cols, F v) { _mm512_mask_storeu_ps(y, Mask(cols), v); }
};

}  // namespace
}  // namespace anchorage::cpu
