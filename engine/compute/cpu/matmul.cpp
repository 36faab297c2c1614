#include "engine/compute/cpu/matmul.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
// GCC 12 reports its own AVX-512 intrinsic headers as reading uninitialised values; not our code.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#define ANCHORAGE_MATVEC_AVX512 1
#endif

namespace anchorage::cpu {
namespace {

inline float Bf16(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Expands rows [0, n) of a bf16 [n, k] matrix into fp32.
void ExpandBf16(const uint16_t* w, int64_t count, float* out) {
#if defined(ANCHORAGE_MATVEC_AVX512)
  int64_t i = 0;
  for (; i + 16 <= count; i += 16) {
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + i));
    __m512i wide = _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
    _mm512_storeu_ps(out + i, _mm512_castsi512_ps(wide));
  }
  for (; i < count; ++i) out[i] = Bf16(w[i]);
#else
  for (int64_t i = 0; i < count; ++i) out[i] = Bf16(w[i]);
#endif
}

void MatVecRowsPortable(const float* x, int64_t m, int64_t ldx, const uint16_t* w, int64_t j0, int64_t j1,
                        int64_t k, float* y, int64_t ldy) {
  for (int64_t j = j0; j < j1; ++j) {
    const uint16_t* wr = w + j * k;
    for (int64_t r = 0; r < m; ++r) {
      const float* xr = x + r * ldx;
      float acc[16] = {};
      int64_t i = 0;
      for (; i + 16 <= k; i += 16)
        for (int l = 0; l < 16; ++l) acc[l] += Bf16(wr[i + l]) * xr[i + l];
      for (int l = 0; i + l < k; ++l) acc[l] += Bf16(wr[i + l]) * xr[i + l];
      float s = 0.0f;
      for (int l = 0; l < 16; ++l) s += acc[l];
      y[r * ldy + j] = s;
    }
  }
}

#if defined(ANCHORAGE_MATVEC_AVX512)
inline void LoadBf16x32(const uint16_t* p, __mmask32 mask, __m512& lo, __m512& hi) {
  __m512i h = _mm512_maskz_loadu_epi16(mask, p);
  lo = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(h)), 16));
  hi = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(h, 1)), 16));
}

// Four weight rows against one activation row; eight independent accumulators.
inline void Dot4(const uint16_t* w0, const uint16_t* w1, const uint16_t* w2, const uint16_t* w3,
                 const float* x, int64_t k, float* out) {
  __m512 a0l = _mm512_setzero_ps(), a0h = a0l, a1l = a0l, a1h = a0l, a2l = a0l, a2h = a0l, a3l = a0l, a3h = a0l;
  for (int64_t i = 0; i < k; i += 32) {
    __mmask32 mask = k - i >= 32 ? static_cast<__mmask32>(0xffffffffu) : static_cast<__mmask32>((1ull << (k - i)) - 1);
    __mmask16 mlo = static_cast<__mmask16>(mask), mhi = static_cast<__mmask16>(mask >> 16);
    __m512 xl = _mm512_maskz_loadu_ps(mlo, x + i), xh = _mm512_maskz_loadu_ps(mhi, x + i + 16);
    __m512 lo, hi;
    LoadBf16x32(w0 + i, mask, lo, hi);
    a0l = _mm512_fmadd_ps(lo, xl, a0l); a0h = _mm512_fmadd_ps(hi, xh, a0h);
    LoadBf16x32(w1 + i, mask, lo, hi);
    a1l = _mm512_fmadd_ps(lo, xl, a1l); a1h = _mm512_fmadd_ps(hi, xh, a1h);
    LoadBf16x32(w2 + i, mask, lo, hi);
    a2l = _mm512_fmadd_ps(lo, xl, a2l); a2h = _mm512_fmadd_ps(hi, xh, a2h);
    LoadBf16x32(w3 + i, mask, lo, hi);
    a3l = _mm512_fmadd_ps(lo, xl, a3l); a3h = _mm512_fmadd_ps(hi, xh, a3h);
  }
  out[0] = _mm512_reduce_add_ps(_mm512_add_ps(a0l, a0h));
  out[1] = _mm512_reduce_add_ps(_mm512_add_ps(a1l, a1h));
  out[2] = _mm512_reduce_add_ps(_mm512_add_ps(a2l, a2h));
  out[3] = _mm512_reduce_add_ps(_mm512_add_ps(a3l, a3h));
}

void MatVecRowsAvx512(const float* x, int64_t m, int64_t ldx, const uint16_t* w, int64_t j0, int64_t j1,
                      int64_t k, float* y, int64_t ldy) {
  int64_t j = j0;
  for (; j + 4 <= j1; j += 4) {
    const uint16_t* wr = w + j * k;
    for (int64_t r = 0; r < m; ++r) Dot4(wr, wr + k, wr + 2 * k, wr + 3 * k, x + r * ldx, k, y + r * ldy + j);
  }
  for (; j < j1; ++j) {
    const uint16_t* wr = w + j * k;
    for (int64_t r = 0; r < m; ++r) {
      float out[4];
      Dot4(wr, wr, wr, wr, x + r * ldx, k, out);
      y[r * ldy + j] = out[0];
    }
  }
}
#endif

}  // namespace

void InitBlas() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

const char* MatVecPath() {
#if defined(ANCHORAGE_MATVEC_AVX512)
  return "avx512";
#else
  return "portable";
#endif
}

void MatVecBf16Portable(const float* x, int64_t m, int64_t ldx, const uint16_t* w, int64_t n, int64_t k,
                        float* y, int64_t ldy) {
  MatVecRowsPortable(x, m, ldx, w, 0, n, k, y, ldy);
}

void MatMulBf16(ThreadPool& pool, const float* x, int64_t m, int64_t ldx, const uint16_t* w, int64_t n,
                int64_t k, float* y, int64_t ldy) {
  if (m <= 0 || n <= 0) return;
  if (m <= kMatVecMaxRows) {
    const int64_t tasks = (n + kMatVecRowBlock - 1) / kMatVecRowBlock;
    pool.Run(static_cast<size_t>(tasks), [&](size_t t) {
      const int64_t j0 = static_cast<int64_t>(t) * kMatVecRowBlock;
      const int64_t j1 = std::min(n, j0 + kMatVecRowBlock);
#if defined(ANCHORAGE_MATVEC_AVX512)
      MatVecRowsAvx512(x, m, ldx, w, j0, j1, k, y, ldy);
#else
      MatVecRowsPortable(x, m, ldx, w, j0, j1, k, y, ldy);
#endif
    });
    return;
  }
  const int64_t tasks = (n + kGemmColumnBlock - 1) / kGemmColumnBlock;
  InitBlas();
  pool.Run(static_cast<size_t>(tasks), [&](size_t t) {
    const int64_t j0 = static_cast<int64_t>(t) * kGemmColumnBlock;
    const int64_t nb = std::min(n, j0 + kGemmColumnBlock) - j0;
    thread_local std::vector<float> wf;
    if (wf.size() < static_cast<size_t>(nb * k)) wf.resize(static_cast<size_t>(nb * k));
    ExpandBf16(w + j0 * k, nb * k, wf.data());
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(m), static_cast<blasint>(nb),
                static_cast<blasint>(k), 1.0f, x, static_cast<blasint>(ldx), wf.data(), static_cast<blasint>(k),
                0.0f, y + j0, static_cast<blasint>(ldy));
  });
}

}  // namespace anchorage::cpu
