// The AVX2 + FMA GEMM path: 8 fp32 lanes; a 32-byte load of 16 bf16 slots gives two vectors.
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include <cstring>

// Everything included before the pragma keeps the baseline target; the tile below it takes the path's.
#include "engine/compute/cpu/fp32_block.h"
#include "engine/compute/cpu/gemm_block.h"
#include "engine/core/bf16.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

#include "engine/compute/cpu/fp32_tile.h"
#include "engine/compute/cpu/gemm_int8_tile.h"
#include "engine/compute/cpu/gemm_tile.h"
#include "engine/compute/cpu/attention_decode_tile.h"

namespace anchorage::cpu {
namespace {

struct Avx2Lanes {
  static constexpr int kLanes = 8;
  static constexpr int kRowTile = 6;
  static constexpr int kFewRowsSegments = 2;
  using F = __m256;
  static F Zero() { return _mm256_setzero_ps(); }
  static F Broadcast(float s) { return _mm256_set1_ps(s); }
  static F Fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F Mul(F a, F b) { return _mm256_mul_ps(a, b); }
  // lo is columns 0..7 of the segment, hi columns 8..15.
  static void LoadW(const uint16_t* p, F& lo, F& hi) {
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    lo = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
    hi = _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
  }
  // LoadFp8 gives e4m3 values times this (Fp8Weights scales by its inverse).
  static constexpr float kFp8CodeFactor = 1.0f / 256.0f;
  // A segment's e4m3 codes in PackedQ8's order (lo's 8 bytes, hi's 16 on) as values / 2^8 (via halves).
  static void LoadFp8(const uint8_t* p, F& lo, F& hi) {
    lo = _mm256_cvtph_ps(Fp8ToHalves(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
    hi = _mm256_cvtph_ps(Fp8ToHalves(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 16))));
  }
  // e4m3's fields moved into a half's (sign-extended, shifted, the byte's sign cleared from the exponent's top bit).
  static __m128i Fp8ToHalves(__m128i codes) {
    return _mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(codes), 7), _mm_set1_epi16(static_cast<short>(0xbf80)));
  }
  static void LoadOut(const float* y, int cols, F& lo, F& hi) {
    if (cols == 16) {
      lo = _mm256_loadu_ps(y);
      hi = _mm256_loadu_ps(y + 8);
      return;
    }
    alignas(32) float t[16] = {};
    std::memcpy(t, y, static_cast<size_t>(cols) * sizeof(float));
    lo = _mm256_load_ps(t);
    hi = _mm256_load_ps(t + 8);
  }
  static void StoreOut(float* y, int cols, F lo, F hi) {
    if (cols == 16) {
      _mm256_storeu_ps(y, lo);
      _mm256_storeu_ps(y + 8, hi);
      return;
    }
    alignas(32) float t[16];
    _mm256_store_ps(t, lo);
    _mm256_store_ps(t + 8, hi);
    std::memcpy(y, t, static_cast<size_t>(cols) * sizeof(float));
  }
  // fp32 rows in natural order: lo is columns 0..7, hi columns 8..15.
  static void LoadF(const float* p, int cols, F& lo, F& hi) {
    if (cols == 16) {
      lo = _mm256_loadu_ps(p);
      hi = _mm256_loadu_ps(p + 8);
      return;
    }
    alignas(32) float t[16] = {};
    std::memcpy(t, p, static_cast<size_t>(cols) * sizeof(float));
    lo = _mm256_load_ps(t);
    hi = _mm256_load_ps(t + 8);
  }
  static void LoadFullF(const float* p, F& lo, F& hi) {
    lo = _mm256_loadu_ps(p);
    hi = _mm256_loadu_ps(p + 8);
  }
  static void StoreF(float* p, int cols, F lo, F hi) { StoreOut(p, cols, lo, hi); }
};

// The int8 tile's vectors: 8 output columns a vector, VPMADDWD's pair sums added to int32 lanes; the fp32
// operations are Avx2Lanes'.
struct Avx2Int8Lanes : Avx2Lanes {
  static constexpr int kCols = 8;
  static constexpr int kOneRowGroups = 4;
  static constexpr int kTwoRowsGroups = 2;
  static constexpr int kRowTile = 3;
  static constexpr int kManyRowsGroups = 2;
  using I = __m256i;
  using Codes = __m256i;
  static I ZeroI() { return _mm256_setzero_si256(); }
  static Codes LoadCodes(const uint8_t* p) { return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static I Dot(I acc, Codes w, int32_t pair) { return _mm256_add_epi32(acc, _mm256_madd_epi16(w, _mm256_set1_epi32(pair))); }
  static F ToFloat(I v) { return _mm256_cvtepi32_ps(v); }
  static F LoadScales(const float* p) { return _mm256_loadu_ps(p); }
  static F LoadOut(const float* y, int cols) {
    if (cols == 8) return _mm256_loadu_ps(y);
    alignas(32) float t[8] = {};
    std::memcpy(t, y, static_cast<size_t>(cols) * sizeof(float));
    return _mm256_load_ps(t);
  }
  static void StoreOut(float* y, int cols, F v) {
    if (cols == 8) return _mm256_storeu_ps(y, v);
    alignas(32) float t[8];
    _mm256_store_ps(t, v);
    std::memcpy(y, t, static_cast<size_t>(cols) * sizeof(float));
  }
};

// Decode attention's vectors: 8 keys' dims transposed in registers, bf16 rows widened as loaded.
struct Avx2Decode : Avx2Lanes {
  static void Store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static F LoadKv(const uint8_t* p, KvDtype dtype) {
    if (dtype == KvDtype::kF32) return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  // 8 e4m3 codes times an fp8 block's factor (via halves: code / 2^8, then times factor x 2^8, both exact).
  static F LoadFp8Kv(const uint8_t* codes, float scale) {
    const __m128i halves = _mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes))), 7),
                                         _mm_set1_epi16(static_cast<short>(0xbf80)));
    return _mm256_mul_ps(_mm256_cvtph_ps(halves), _mm256_set1_ps(scale * 256.0f));
  }
  // Each 128-bit block's low (high) 64 bits of a, then of b.
  static F Low64(F a, F b) { return _mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(a), _mm256_castps_pd(b))); }
  static F High64(F a, F b) { return _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(a), _mm256_castps_pd(b))); }
  // r[i] holds row i's 8 values; afterwards r[c] holds value c of rows 0..7.
  static void Transpose(F (&r)[8]) {
    F t[8];
    for (int i = 0; i < 4; ++i) {
      t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; ++i) {  // r[4i + k]: in 128-bit block b, value 4b + k of rows 4i..4i+3
      r[4 * i] = Low64(t[4 * i], t[4 * i + 2]);
      r[4 * i + 1] = High64(t[4 * i], t[4 * i + 2]);
      r[4 * i + 2] = Low64(t[4 * i + 1], t[4 * i + 3]);
      r[4 * i + 3] = High64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int k = 0; k < 4; ++k) {
      t[k] = _mm256_permute2f128_ps(r[k], r[4 + k], 0x20);
      t[4 + k] = _mm256_permute2f128_ps(r[k], r[4 + k], 0x31);
    }
    for (int i = 0; i < 8; ++i) r[i] = t[i];
  }
};

void Run(const GemmBlock& b) { RunGemmBlock<Avx2Lanes>(b); }
void RunFp8(const GemmBlock& b) { RunGemmBlock<Avx2Lanes, Fp8Weights>(b); }
void RunInt8(const GemmBlock& b) { RunInt8Block<Avx2Int8Lanes>(b); }
void RowsTimes(const RowsTimesArgs& p) { RunRowsTimes<Avx2Lanes>(p); }
void DecodeScores(const DecodeScoresArgs& a) { RunDecodeScores<Avx2Decode>(a); }
void DecodeValues(const DecodeValuesArgs& a) { RunDecodeValues<Avx2Decode>(a); }

}  // namespace

#pragma GCC pop_options

void GemmBlockAvx2(const GemmBlock& b) { Run(b); }
const Fp32Kernels kFp32Avx2{RowsTimes, DecodeScores, DecodeValues};
const Q8Kernels kQ8Avx2{RunFp8, RunInt8};

}  // namespace anchorage::cpu
