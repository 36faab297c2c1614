// The AVX-512F GEMM path (with AVX-512BW for 8-bit codes): 16 fp32 lanes; a 64-byte load of a super-panel's k row gives two vectors.
// GCC 12 reports its own AVX-512 intrinsic headers as reading uninitialised values; not our code.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cmath>
#include <cstring>

// Everything included before the pragma keeps the baseline target; the tile below it takes the path's.
#include "engine/compute/cpu/fp32_block.h"
#include "engine/compute/cpu/gemm_block.h"
#include "engine/core/bf16.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw")

#include "engine/compute/cpu/avx512_int8_lanes.h"
#include "engine/compute/cpu/avx512_lanes.h"
#include "engine/compute/cpu/fp32_tile.h"
#include "engine/compute/cpu/gemm_int8_tile.h"
#include "engine/compute/cpu/gemm_tile.h"
#include "engine/compute/cpu/attention_decode_tile.h"

namespace anchorage::cpu {
namespace {

// Decode attention's vectors: 16 keys' dims transposed in registers, bf16 rows widened as loaded.
struct Avx512Decode : Avx512Lanes {
  static void Store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static F LoadKv(const uint8_t* p, KvDtype dtype) {
    if (dtype == KvDtype::kF32) return _mm512_loadu_ps(p);
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  // 16 e4m3 codes times an fp8 block's factor (via halves: code / 2^8, then times factor x 2^8, both exact).
  static F LoadFp8Kv(const uint8_t* codes, float scale) {
    const __m256i halves = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes))), 7),
                                            _mm256_set1_epi16(static_cast<short>(0xbf80)));
    return _mm512_mul_ps(_mm512_cvtph_ps(halves), _mm512_set1_ps(scale * 256.0f));
  }
  // Each 128-bit block's low (high) 64 bits of a, then of b.
  static F Low64(F a, F b) { return _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(b))); }
  static F High64(F a, F b) { return _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(b))); }
  // r[i] holds row i's 16 values; afterwards r[c] holds value c of rows 0..15.
  static void Transpose(F (&r)[16]) {
    F t[16];
    for (int i = 0; i < 8; ++i) {
      t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i) {  // r[4i + k]: in 128-bit block b, value 4b + k of rows 4i..4i+3
      r[4 * i] = Low64(t[4 * i], t[4 * i + 2]);
      r[4 * i + 1] = High64(t[4 * i], t[4 * i + 2]);
      r[4 * i + 2] = Low64(t[4 * i + 1], t[4 * i + 3]);
      r[4 * i + 3] = High64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int k = 0; k < 4; ++k) {
      const F a_lo = _mm512_shuffle_f32x4(r[k], r[4 + k], 0x44), a_hi = _mm512_shuffle_f32x4(r[k], r[4 + k], 0xEE);
      const F b_lo = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0x44), b_hi = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0xEE);
      t[k] = _mm512_shuffle_f32x4(a_lo, b_lo, 0x88);
      t[4 + k] = _mm512_shuffle_f32x4(a_lo, b_lo, 0xDD);
      t[8 + k] = _mm512_shuffle_f32x4(a_hi, b_hi, 0x88);
      t[12 + k] = _mm512_shuffle_f32x4(a_hi, b_hi, 0xDD);
    }
    for (int i = 0; i < 16; ++i) r[i] = t[i];
  }
};

void Run(const GemmBlock& b) { RunGemmBlock<Avx512Lanes>(b); }
void RunFp8(const GemmBlock& b) { RunGemmBlock<Avx512Lanes, Fp8Weights>(b); }
void RunInt8(const GemmBlock& b) { RunInt8Block<Avx512Int8Lanes<false>>(b); }
void RowsTimes(const RowsTimesArgs& p) { RunRowsTimes<Avx512Lanes>(p); }
void DecodeScores(const DecodeScoresArgs& a) { RunDecodeScores<Avx512Decode>(a); }
void DecodeValues(const DecodeValuesArgs& a) { RunDecodeValues<Avx512Decode>(a); }

}  // namespace

#pragma GCC pop_options

void GemmBlockAvx512(const GemmBlock& b) { Run(b); }
const Fp32Kernels kFp32Avx512{RowsTimes, DecodeScores, DecodeValues};
const Q8Kernels kQ8Avx512{RunFp8, RunInt8};

}  // namespace anchorage::cpu
