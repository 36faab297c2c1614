// The AVX-512F lanes of a super-panel's k row (a shift gives columns 0..7 and 16..23, a mask 8..15 and
// 24..31), the vector type the shared fp32 tiles instantiate. Include after an AVX-512F target pragma.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "engine/compute/cpu/packed_q8.h"

namespace anchorage::cpu {
namespace {

struct Avx512Lanes {
  static constexpr int kLanes = 16;
  static constexpr int kRowTile = 12;
  static constexpr int kFewRowsSegments = 4;
  using F = __m512;
  static F Zero() { return _mm512_setzero_ps(); }
  static F Broadcast(float s) { return _mm512_set1_ps(s); }
  static F Fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F Mul(F a, F b) { return _mm512_mul_ps(a, b); }
  // lo is columns 0..7 and 16..23 of the super-panel, hi columns 8..15 and 24..31.
  static void LoadW(const uint16_t* p, F& lo, F& hi) {
    const __m512i w = _mm512_loadu_si512(p);
    lo = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
    hi = _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
  }
  // LoadFp8 gives e4m3 values times this (Fp8Weights scales by its inverse).
  static constexpr float kFp8CodeFactor = 1.0f / 256.0f;
  // A k row's 32 e4m3 codes (PackedQ8's order: bytes 0..15 are lo's lanes, 16..31 hi's) as values / 2^8 (via halves).
  static void LoadFp8(const uint8_t* p, F& lo, F& hi) {
    const __m512i halves = Fp8ToHalves(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    lo = _mm512_cvtph_ps(_mm512_castsi512_si256(halves));
    hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(halves, 1));
  }
  // e4m3's sign, exponent and mantissa moved into a half's fields (sign-extended, shifted, the byte's
  // sign cleared from the exponent's top bit): the half is the value / 2^8.
  static __m512i Fp8ToHalves(__m256i codes) {
    return _mm512_and_si512(_mm512_slli_epi16(_mm512_cvtepi8_epi16(codes), 7), _mm512_set1_epi16(static_cast<short>(0xbf80)));
  }
  // Lanes 0..7 from the first operand's lanes 0..7 (or 8..15), lanes 8..15 from the second's.
  static __m512i FirstHalves() { return _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23); }
  static __m512i SecondHalves() { return _mm512_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31); }
  static __mmask16 Mask(int count) {
    return count >= 16 ? static_cast<__mmask16>(0xffff) : count <= 0 ? static_cast<__mmask16>(0)
                                                                      : static_cast<__mmask16>((1u << count) - 1);
  }
  static void LoadOut(const float* y, int cols, F& lo, F& hi) {
    const F a = _mm512_maskz_loadu_ps(Mask(cols), y);
    const F b = _mm512_maskz_loadu_ps(Mask(cols - 16), y + 16);
    lo = _mm512_permutex2var_ps(a, FirstHalves(), b);
    hi = _mm512_permutex2var_ps(a, SecondHalves(), b);
  }
  static void StoreOut(float* y, int cols, F lo, F hi) {
    _mm512_mask_storeu_ps(y, Mask(cols), _mm512_permutex2var_ps(lo, FirstHalves(), hi));
    _mm512_mask_storeu_ps(y + 16, Mask(cols - 16), _mm512_permutex2var_ps(lo, SecondHalves(), hi));
  }
  // fp32 rows in natural order: lo is columns 0..15, hi columns 16..31.
  static void LoadF(const float* p, int cols, F& lo, F& hi) {
    lo = _mm512_maskz_loadu_ps(Mask(cols), p);
    hi = _mm512_maskz_loadu_ps(Mask(cols - 16), p + 16);
  }
  static void LoadFullF(const float* p, F& lo, F& hi) {
    lo = _mm512_loadu_ps(p);
    hi = _mm512_loadu_ps(p + 16);
  }
  static void StoreF(float* p, int cols, F lo, F hi) {
    _mm512_mask_storeu_ps(p, Mask(cols), lo);
    _mm512_mask_storeu_ps(p + 16, Mask(cols - 16), hi);
  }
};

}  // namespace
}  // namespace anchorage::cpu
