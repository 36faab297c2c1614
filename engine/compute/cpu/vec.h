// Small fp32 vector primitives with a fixed summation order (AVX-512 when built for it, else portable).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#if defined(__AVX512F__)
// GCC 12 reports its own AVX-512 intrinsic headers as reading uninitialised values; not our code.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

namespace anchorage::cpu {

// v's data with room for at least count elements (grown, never shrunk): scratch that is reused.
template <typename T>
T* Sized(std::vector<T>& v, int64_t count) {
  if (v.size() < static_cast<size_t>(count)) v.resize(static_cast<size_t>(count));
  return v.data();
}

// Sum of a[i]*b[i]; the order depends only on n and the build, never on threads.
inline float Dot(const float* a, const float* b, int64_t n) {
#if defined(__AVX512F__)
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), acc1);
  }
  for (; i < n; i += 16) {
    __mmask16 m = n - i >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << (n - i)) - 1);
    acc0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
#else
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; ++l) acc[l] += a[i + l] * b[i + l];
  for (int l = 0; i + l < n; ++l) acc[l] += a[i + l] * b[i + l];
  float s = 0.0f;
  for (int l = 0; l < 16; ++l) s += acc[l];
  return s;
#endif
}

// y[i] += a * x[i].
inline void Axpy(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// x[i] *= a.
inline void Scale(float a, float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= a;
}

inline float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float Silu(float x) { return x / (1.0f + std::exp(-x)); }
// log(1 + exp(x)), returning x above the threshold 20 as PyTorch does.
inline float Softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

}  // namespace anchorage::cpu
