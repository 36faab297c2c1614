#include "engine/compute/cpu/gated_delta.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <vector>

#include "engine/compute/cpu/fp32_block.h"
#include "engine/compute/cpu/matmul.h"
#include "engine/compute/cpu/vec.h"

namespace anchorage::cpu {

void GatedDeltaChunk(const DeltaInputs& in, int64_t n, int64_t dk, int64_t dv, float* state, float* out,
                     int64_t out_stride) {
  assert(n >= 1 && n <= kDeltaChunkTokens);
  constexpr int64_t C = kDeltaChunkTokens;
  const Fp32Kernels& kernels = Fp32KernelsOf(ActivePath());
  const int64_t ld = dv + dk;  // row stride of the [U | W] right-hand sides
  thread_local std::vector<float> buf;
  float* G = Sized(buf, C * 4 + 2 * C * C + C * ld + 3 * C * dk);     // [C] inclusive cumulative log-decay
  float* beta = G + C;       // [C]
  float* eg = beta + C;      // [C] exp(G_i)
  float* tail = eg + C;      // [C] exp(G_{n-1} - G_j)
  float* A = tail + C;       // [C, C] -beta_i (k_i.k_j) exp(G_i - G_j) below the diagonal
  float* QK = A + C * C;     // [C, C] (q_i.k_j) exp(G_i - G_j) on and below the diagonal, 0 above
  float* UW = QK + C * C;    // [C, dv + dk]: U (becomes V') then W
  float* Kt = UW + C * ld;   // [dk, C] k transposed; then (k_j exp(G_{n-1} - G_j)) transposed
  float* negW = Kt + dk * C; // [C, dk] -W
  float* Qs = negW + C * dk; // [C, dk] unused rows stay unread

  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    acc += in.g[i * in.g_stride];
    G[i] = acc;
    beta[i] = in.beta[i * in.beta_stride];
  }
  for (int64_t i = 0; i < n; ++i) eg[i] = Exp(G[i]);
  for (int64_t j = 0; j < n; ++j) tail[j] = Exp(G[n - 1] - G[j]);
  // Gram matrices K K^T and Q K^T (through K transposed), then decay weights and masks.
  for (int64_t d = 0; d < dk; ++d)
    for (int64_t j = 0; j < n; ++j) Kt[d * C + j] = in.k[j * in.k_stride + d];
  RowsTimes(kernels, in.k, in.k_stride, n, Kt, C, 0, dk, n, A, C, false);
  RowsTimes(kernels, in.q, in.q_stride, n, Kt, C, 0, dk, n, QK, C, false);
  for (int64_t i = 0; i < n; ++i) {
    float* a = A + i * C;
    float* qk = QK + i * C;
    for (int64_t j = 0; j < i; ++j) {
      const float decay = Exp(G[i] - G[j]);
      a[j] = -(beta[i] * a[j] * decay);
      qk[j] = qk[j] * decay;
    }
    for (int64_t j = i + 1; j < n; ++j) qk[j] = 0.0f;
  }
  // Right-hand sides beta v and beta exp(G) k; solve (I + A) [U | W] = [beta v | beta exp(G) k] by
  // forward substitution: row i starts from its right-hand side and takes -A[i][j] row j for j < i, in
  // order. Rows go in blocks: the rows before a block reach all of it in one product, then each row
  // takes its block's earlier rows (the same fused multiply-adds in the same order).
  for (int64_t i = 0; i < n; ++i) {
    float* u = UW + i * ld;
    float* w = u + dv;
    const float* vi = in.v + i * in.v_stride;
    const float* ki = in.k + i * in.k_stride;
    for (int64_t e = 0; e < dv; ++e) u[e] = beta[i] * vi[e];
    const float bw = beta[i] * eg[i];
    for (int64_t d = 0; d < dk; ++d) w[d] = bw * ki[d];
  }
  constexpr int64_t kSolveBlock = 16;
  for (int64_t b0 = 0; b0 < n; b0 += kSolveBlock) {
    const int64_t rows = std::min(kSolveBlock, n - b0);
    if (b0 > 0) RowsTimes(kernels, A + b0 * C, C, rows, UW, ld, 0, b0, ld, UW + b0 * ld, ld, true);
    for (int64_t i = b0 + 1; i < b0 + rows; ++i)
      RowsTimes(kernels, A + i * C + b0, C, 1, UW + b0 * ld, ld, 0, i - b0, ld, UW + i * ld, ld, true);
  }
  // V' = U - W S0.
  for (int64_t i = 0; i < n; ++i)
    for (int64_t d = 0; d < dk; ++d) negW[i * dk + d] = -UW[i * ld + dv + d];
  RowsTimes(kernels, negW, dk, n, state, dv, 0, dk, dv, UW, ld, true);
  // o = diag(exp(G)) Q S0 + QK V'.
  for (int64_t i = 0; i < n; ++i)
    for (int64_t d = 0; d < dk; ++d) Qs[i * dk + d] = eg[i] * in.q[i * in.q_stride + d];
  RowsTimes(kernels, Qs, dk, n, state, dv, 0, dk, dv, out, out_stride, false);
  RowsTimes(kernels, QK, C, n, UW, ld, 0, n, dv, out, out_stride, true);
  // S = exp(G_{n-1}) S0 + (diag(tail) K)^T V'.
  for (int64_t d = 0; d < dk; ++d)
    for (int64_t j = 0; j < n; ++j) Kt[d * C + j] *= tail[j];
  for (int64_t i = 0; i < dk * dv; ++i) state[i] *= eg[n - 1];
  RowsTimes(kernels, Kt, C, dk, UW, ld, 0, n, dv, state, dv, true);
}

void GatedDeltaRecurrent(const DeltaInputs& in, int64_t n, int64_t dk, int64_t dv, float* state, float* out,
                         int64_t out_stride) {
  thread_local std::vector<float> buf;
  float* m = Sized(buf, dv);
  for (int64_t t = 0; t < n; ++t) {
    const float* q = in.q + t * in.q_stride;
    const float* k = in.k + t * in.k_stride;
    const float* v = in.v + t * in.v_stride;
    const float beta = in.beta[t * in.beta_stride];
    const float decay = Exp(in.g[t * in.g_stride]);
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
