#include "engine/compute/cpu/gated_delta.h"

#include <cassert>
#include <cmath>
#include <vector>

#include <cblas.h>

#include "engine/compute/cpu/matmul.h"
#include "engine/compute/cpu/vec.h"

namespace anchorage::cpu {

void GatedDeltaChunk(const DeltaInputs& in, int64_t n, int64_t dk, int64_t dv, float* state, float* out,
                     int64_t out_stride) {
  assert(n >= 1 && n <= kDeltaChunkTokens);
  constexpr int64_t C = kDeltaChunkTokens;
  InitBlas();
  const int64_t ld = dv + dk;  // row stride of the [U | W] right-hand sides
  thread_local std::vector<float> buf;
  const size_t need = static_cast<size_t>(C * 4 + 2 * C * C + C * ld + C * dk);
  if (buf.size() < need) buf.resize(need);
  float* G = buf.data();   // [C] inclusive cumulative log-decay
  float* beta = G + C;     // [C]
  float* eg = beta + C;    // [C] exp(G_i)
  float* tail = eg + C;    // [C] exp(G_{n-1} - G_j)
  float* A = tail + C;     // [C, C] beta_i (k_i.k_j) exp(G_i - G_j) below the diagonal
  float* QK = A + C * C;   // [C, C] (q_i.k_j) exp(G_i - G_j) on and below the diagonal
  float* UW = QK + C * C;  // [C, dv + dk]: U (becomes V') then W
  float* Kt = UW + C * ld; // [C, dk] k_j exp(G_{n-1} - G_j)
  const blasint bn = static_cast<blasint>(n), bdk = static_cast<blasint>(dk), bdv = static_cast<blasint>(dv);

  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    acc += in.g[i * in.g_stride];
    G[i] = acc;
    beta[i] = in.beta[i * in.beta_stride];
    eg[i] = std::exp(G[i]);
  }
  for (int64_t j = 0; j < n; ++j) tail[j] = std::exp(G[n - 1] - G[j]);
  // Gram matrices K K^T and Q K^T, then decay weights and masks.
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bn, bn, bdk, 1.0f, in.k, static_cast<blasint>(in.k_stride),
              in.k, static_cast<blasint>(in.k_stride), 0.0f, A, static_cast<blasint>(C));
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bn, bn, bdk, 1.0f, in.q, static_cast<blasint>(in.q_stride),
              in.k, static_cast<blasint>(in.k_stride), 0.0f, QK, static_cast<blasint>(C));
  for (int64_t i = 0; i < n; ++i) {
    float* a = A + i * C;
    float* qk = QK + i * C;
    for (int64_t j = 0; j < i; ++j) {
      const float decay = std::exp(G[i] - G[j]);
      a[j] = beta[i] * a[j] * decay;
      qk[j] = qk[j] * decay;
    }
    for (int64_t j = i + 1; j < n; ++j) qk[j] = 0.0f;
  }
  // Right-hand sides beta v and beta exp(G) k; solve (I + A) [U | W] = [beta v | beta exp(G) k].
  for (int64_t i = 0; i < n; ++i) {
    float* u = UW + i * ld;
    float* w = u + dv;
    const float* vi = in.v + i * in.v_stride;
    const float* ki = in.k + i * in.k_stride;
    for (int64_t e = 0; e < dv; ++e) u[e] = beta[i] * vi[e];
    const float bw = beta[i] * eg[i];
    for (int64_t d = 0; d < dk; ++d) w[d] = bw * ki[d];
  }
  cblas_strsm(CblasRowMajor, CblasLeft, CblasLower, CblasNoTrans, CblasUnit, bn, static_cast<blasint>(ld), 1.0f, A,
              static_cast<blasint>(C), UW, static_cast<blasint>(ld));
  // V' = U - W S0.
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, bn, bdv, bdk, -1.0f, UW + dv, static_cast<blasint>(ld), state,
              bdv, 1.0f, UW, static_cast<blasint>(ld));
  // o = diag(exp(G)) Q S0 + QK V'.
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, bn, bdv, bdk, 1.0f, in.q, static_cast<blasint>(in.q_stride),
              state, bdv, 0.0f, out, static_cast<blasint>(out_stride));
  for (int64_t i = 0; i < n; ++i) Scale(eg[i], out + i * out_stride, dv);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, bn, bdv, bn, 1.0f, QK, static_cast<blasint>(C), UW,
              static_cast<blasint>(ld), 1.0f, out, static_cast<blasint>(out_stride));
  // S = exp(G_{n-1}) S0 + (diag(tail) K)^T V'.
  for (int64_t j = 0; j < n; ++j) {
    const float* kj = in.k + j * in.k_stride;
    for (int64_t d = 0; d < dk; ++d) Kt[j * dk + d] = tail[j] * kj[d];
  }
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, bdk, bdv, bn, 1.0f, Kt, bdk, UW, static_cast<blasint>(ld),
              eg[n - 1], state, bdv);
}

void GatedDeltaRecurrent(const DeltaInputs& in, int64_t n, int64_t dk, int64_t dv, float* state, float* out,
                         int64_t out_stride) {
  thread_local std::vector<float> buf;
  if (buf.size() < static_cast<size_t>(dv)) buf.resize(static_cast<size_t>(dv));
  float* m = buf.data();
  for (int64_t t = 0; t < n; ++t) {
    const float* q = in.q + t * in.q_stride;
    const float* k = in.k + t * in.k_stride;
    const float* v = in.v + t * in.v_stride;
    const float beta = in.beta[t * in.beta_stride];
    const float decay = std::exp(in.g[t * in.g_stride]);
    for (int64_t e = 0; e < dv; ++e) m[e] = 0.0f;
    for (int64_t d = 0; d < dk; ++d) {
      float* s = state + d * dv;
      Scale(decay, s, dv);
      Axpy(k[d], s, m, dv);
    }
    for (int64_t e = 0; e < dv; ++e) m[e] = beta * (v[e] - m[e]);
    float* o = out + t * out_stride;
    for (int64_t e = 0; e < dv; ++e) o[e] = 0.0f;
    for (int64_t d = 0; d < dk; ++d) {
      float* s = state + d * dv;
      Axpy(k[d], m, s, dv);
      Axpy(q[d], s, o, dv);
    }
  }
}

}  // namespace anchorage::cpu
