// Small fp32 vector primitives with one summation order for every build (AVX-512 when built for it).
#pragma once

#include <bit>
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

// Sum of a[i]*b[i] in one order for every build and CPU: each product rounded (not fused) and added to lane
// i mod 32 in index order; then lane l + 16 is added to lane l, and the 16 lanes halve to one (l + 8, l + 4,
// l + 2, l + 1). DotPortable is the same sum without vectors (tests compare the two).
inline float HalvingSum16(float* v) {
  for (int width = 8; width >= 1; width /= 2)
    for (int l = 0; l < width; ++l) v[l] += v[l + width];
  return v[0];
}

inline float DotPortable(const float* a, const float* b, int64_t n) {
  float lanes[32] = {};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int l = 0; l < 32; ++l) lanes[l] += a[i + l] * b[i + l];
  for (int l = 0; i + l < n; ++l) lanes[l] += a[i + l] * b[i + l];
  float v[16];
  for (int l = 0; l < 16; ++l) v[l] = lanes[l] + lanes[l + 16];
  return HalvingSum16(v);
}

inline float Dot(const float* a, const float* b, int64_t n) {
#if defined(__AVX512F__)
  __m512 lo = _mm512_setzero_ps(), hi = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    lo = _mm512_add_ps(lo, _mm512_mul_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i)));
    hi = _mm512_add_ps(hi, _mm512_mul_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16)));
  }
  const auto mask = [](int64_t count) {
    return count >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << count) - 1);
  };
  if (i < n) {
    const __mmask16 m = mask(n - i);
    lo = _mm512_mask_add_ps(lo, m, lo, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i)));
  }
  if (i + 16 < n) {
    const __mmask16 m = mask(n - i - 16);
    hi = _mm512_mask_add_ps(hi, m, hi,
                            _mm512_mul_ps(_mm512_maskz_loadu_ps(m, a + i + 16), _mm512_maskz_loadu_ps(m, b + i + 16)));
  }
  alignas(64) float v[16];
  _mm512_store_ps(v, _mm512_add_ps(lo, hi));
  return HalvingSum16(v);
#else
  return DotPortable(a, b, n);
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

// e^x within 0.99 ulp on [-86, ln(FLT_MAX)] (checked on every float there); 0 below -86 (results under 2^-124
// flush, as with FTZ), infinity above, NaN for NaN. Only float multiplies, adds and selects, no branch and no
// libm: the same bits for every build, CPU and C library, and loops of it vectorise (with -fno-trapping-math
// on SSE2). The reduction is Cody and Waite's, the polynomial Cephes' expf.
inline float Exp(float x) {
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  constexpr float kLow = -86.0f, kHigh = 88.72283935546875f;
  const float clamped = x < kLow ? kLow : (x > kHigh ? kHigh : x);
  const float t = clamped * 1.44269502162933349609375f + kRound;
  const float n = t - kRound;  // nearest integer to x / ln 2
  const float r = (clamped - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e_r = (p * (r * r) + r) + 1.0f;
  const int32_t n_int = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(kRound);
  const float half_power = std::bit_cast<float>((n_int + 126) << 23);  // 2^(n - 1): n = 128 still encodes
  float y = (e_r * half_power) * 2.0f;
  y = x < kLow ? 0.0f : y;
  return x != x ? x : y;
}

inline float Sigmoid(float x) { return 1.0f / (1.0f + Exp(-x)); }
inline float Silu(float x) { return x / (1.0f + Exp(-x)); }
// log(1 + exp(x)), returning x above the threshold 20 as PyTorch does.
inline float Softplus(float x) { return x > 20.0f ? x : std::log1p(Exp(x)); }

}  // namespace anchorage::cpu
