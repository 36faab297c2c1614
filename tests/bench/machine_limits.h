// The machine's measured limits (FMA, bf16 dot and AMX peaks of one core, streaming read rate), printed
// beside every kernel figure so that figures from two machines compare as fractions of them.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdint>
#include <span>
#include <thread>
#include <vector>

#include "engine/compute/cpu/bf16_split.h"
#include "engine/compute/cpu/cpu_features.h"
#include "engine/compute/cpu/matmul.h"

namespace anchorage::bench {

inline double LimitsNow() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// fp32 FMA throughput of one core: twelve independent chains of fused multiply-adds on full vectors.
#define ANCHORAGE_FMA_CHAINS(V, FMA, SET1, TOFLOAT, LANES, ITERS, M, A)                                   \
  V x0 = SET1(0.01f), x1 = SET1(0.02f), x2 = SET1(0.03f), x3 = SET1(0.04f), x4 = SET1(0.05f), x5 = SET1(0.06f); \
  V x6 = SET1(0.07f), x7 = SET1(0.08f), x8 = SET1(0.09f), x9 = SET1(0.10f), x10 = SET1(0.11f), x11 = SET1(0.12f); \
  const auto m = M;                                                                                        \
  const auto a = A;                                                                                        \
  const double t0 = LimitsNow();                                                                                 \
  for (int64_t k = 0; k < ITERS; ++k) {                                                                    \
    x0 = FMA(x0, m, a); x1 = FMA(x1, m, a); x2 = FMA(x2, m, a); x3 = FMA(x3, m, a);                         \
    x4 = FMA(x4, m, a); x5 = FMA(x5, m, a); x6 = FMA(x6, m, a); x7 = FMA(x7, m, a);                         \
    x8 = FMA(x8, m, a); x9 = FMA(x9, m, a); x10 = FMA(x10, m, a); x11 = FMA(x11, m, a);                     \
  }                                                                                                        \
  const double secs = LimitsNow() - t0;                                                                          \
  volatile float sink = TOFLOAT(x0) + TOFLOAT(x1) + TOFLOAT(x2) + TOFLOAT(x3) + TOFLOAT(x4) + TOFLOAT(x5) +   \
                        TOFLOAT(x6) + TOFLOAT(x7) + TOFLOAT(x8) + TOFLOAT(x9) + TOFLOAT(x10) + TOFLOAT(x11);   \
  (void)sink;                                                                                              \
  return 2.0 * LANES * 12 * static_cast<double>(ITERS) / secs / 1e9;

__attribute__((target("avx2,fma"))) inline double FmaGflopsAvx2() {
  ANCHORAGE_FMA_CHAINS(__m256, _mm256_fmadd_ps, _mm256_set1_ps, _mm256_cvtss_f32, 8, 100'000'000, _mm256_set1_ps(0.99999f),
                       _mm256_set1_ps(1e-7f))
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"  // GCC 12's own AVX-512 cast header
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
__attribute__((target("avx512f"))) inline float First512(__m512 v) { return _mm_cvtss_f32(_mm512_castps512_ps128(v)); }

__attribute__((target("avx512f"))) inline double FmaGflopsAvx512() {
  ANCHORAGE_FMA_CHAINS(__m512, _mm512_fmadd_ps, _mm512_set1_ps, First512, 16, 50'000'000, _mm512_set1_ps(0.99999f),
                       _mm512_set1_ps(1e-7f))
}

// bf16 dot-product throughput of one core, counting each VDPBF16PS as 2 * 32 flops.
__attribute__((target("avx512f,avx512bf16"))) inline __m512bh Bf16Pairs(uint32_t word) {
  return reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(word)));
}
__attribute__((target("avx512f,avx512bf16"))) inline __m512 DotBf16(__m512 acc, __m512bh a, __m512bh b) { return _mm512_dpbf16_ps(acc, a, b); }
__attribute__((target("avx512f,avx512bf16"))) inline double Bf16DotGflopsAvx512() {
  ANCHORAGE_FMA_CHAINS(__m512, DotBf16, _mm512_set1_ps, First512, 32, 50'000'000, Bf16Pairs(0x3f803f7fu), Bf16Pairs(0x33d633d6u))
}

#pragma GCC diagnostic pop
#undef ANCHORAGE_FMA_CHAINS

// TDPBF16PS throughput of one core: four independent 16 x 16 accumulator tiles, each instruction
// 16 x 16 x 32 products (2 flops each). Needs the AMX permission (cpu::DetectCpu asks for it).
__attribute__((target("amx-tile,amx-bf16"))) inline double AmxBf16Gflops() {
  struct alignas(64) {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t bytes_a_row[16] = {};
    uint8_t rows[16] = {};
  } config;
  for (int t = 0; t < 6; ++t) {
    config.rows[t] = 16;
    config.bytes_a_row[t] = 64;
  }
  _tile_loadconfig(&config);
  alignas(64) static uint16_t ones[16 * 32];
  for (auto& v : ones) v = 0x3f80;
  _tile_loadd(4, ones, 64);
  _tile_loadd(5, ones, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  constexpr int64_t kIters = 2'000'000;
  const double t0 = LimitsNow();
  for (int64_t i = 0; i < kIters; ++i) {
    _tile_dpbf16ps(0, 4, 5);
    _tile_dpbf16ps(1, 4, 5);
    _tile_dpbf16ps(2, 4, 5);
    _tile_dpbf16ps(3, 4, 5);
  }
  alignas(64) float sink[16 * 16];
  _tile_stored(0, sink, 64);
  const double secs = LimitsNow() - t0;
  _tile_release();
  volatile float keep = sink[0];
  (void)keep;
  return 4.0 * 16 * 16 * 32 * 2 * static_cast<double>(kIters) / secs / 1e9;
}

// One core's measured peaks, 0 where the CPU lacks the instructions.
struct Peaks {
  double fma = 0, bf16_dot = 0, amx = 0;
  // The fp32-equivalent peak a path's arithmetic can reach in the active precision: the bf16 paths spend
  // kBf16Parts products on each fp32 one in exact, one in fast.
  double Of(cpu::KernelPath path) const {
    const int parts = cpu::RunsFast(path, cpu::ActivePrecision()) ? 1 : cpu::kBf16Parts;
    switch (cpu::ArithmeticOf(path)) {
      case cpu::Arithmetic::kBf16Dot: return bf16_dot / parts;
      case cpu::Arithmetic::kBf16Amx: return amx / parts;
      case cpu::Arithmetic::kFp32Fma: break;
    }
    return fma;
  }
};

inline Peaks MeasurePeaks(const cpu::CpuFeatures& f) {
  Peaks p;
  p.fma = f.avx512f ? FmaGflopsAvx512() : f.avx2 && f.fma ? FmaGflopsAvx2() : 0.0;
  p.bf16_dot = f.avx512_bf16 ? Bf16DotGflopsAvx512() : 0.0;
  p.amx = f.amx_bf16 && f.amx_permitted ? AmxBf16Gflops() : 0.0;
  return p;
}

// Streaming read rate in GB/s with `threads` readers over a buffer much larger than the caches; best of 3.
inline double StreamGBs(std::span<const float> buffer, int threads) {
  double best = 0;
  for (int round = 0; round < 3; ++round) {
    std::vector<double> sums(static_cast<size_t>(threads));
    std::vector<std::thread> pool;
    const size_t per = buffer.size() / static_cast<size_t>(threads);
    const double t0 = LimitsNow();
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        const float* p = buffer.data() + per * static_cast<size_t>(t);
        // An integer sum of the words: it vectorises (a float sum keeps its order and is bound by add latency).
        uint32_t sum = 0;
        for (size_t i = 0; i < per; ++i) sum += std::bit_cast<uint32_t>(p[i]);
        sums[static_cast<size_t>(t)] = sum;
      });
    for (auto& th : pool) th.join();
    const double secs = LimitsNow() - t0;
    best = std::max(best, static_cast<double>(per * static_cast<size_t>(threads) * sizeof(float)) / secs / 1e9);
  }
  return best;
}

}  // namespace anchorage::bench
