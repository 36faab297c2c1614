// y = x · Wᵀ with bf16 weights and fp32 activations, deterministic for any thread count.
#pragma once

#include <cstdint>

#include "engine/core/thread_pool.h"

namespace anchorage::cpu {

// Rows of x at or below this count use the bf16 mat-vec kernel; more rows use OpenBLAS sgemm.
inline constexpr int64_t kMatVecMaxRows = 8;
// Output columns per sgemm task; weights of one task are expanded to fp32 into a per-thread buffer.
inline constexpr int64_t kGemmColumnBlock = 512;
// Output columns per mat-vec task.
inline constexpr int64_t kMatVecRowBlock = 64;

// Makes OpenBLAS single-threaded; our tasks are the only parallelism. Idempotent.
void InitBlas();

// y fp32 [m, ldy] (first n columns written) = x fp32 [m, k] (row stride ldx) · w bf16 [n, k]ᵀ.
// Work is split over fixed blocks of output columns, so every element's bits are independent of
// pool.size(); the bits can differ between m <= kMatVecMaxRows and larger m.
void MatMulBf16(ThreadPool& pool, const float* x, int64_t m, int64_t ldx, const uint16_t* w, int64_t n,
                int64_t k, float* y, int64_t ldy);

// The same product with the portable mat-vec loop (no SIMD intrinsics); for tests and fallbacks.
void MatVecBf16Portable(const float* x, int64_t m, int64_t ldx, const uint16_t* w, int64_t n, int64_t k,
                        float* y, int64_t ldy);

// Name of the mat-vec path compiled in ("avx512" or "portable").
const char* MatVecPath();

}  // namespace anchorage::cpu
