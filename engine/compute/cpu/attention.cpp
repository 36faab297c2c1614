#include "engine/compute/cpu/attention.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/compute/cpu/matmul.h"
#include "engine/compute/cpu/vec.h"

namespace anchorage::cpu {
namespace {

// Softmax of p[0..valid) in place (max, exp, sum, divide in index order); zeroes p[valid..len).
void SoftmaxPrefix(float* p, int64_t valid, int64_t len) {
  float mx = p[0];
  for (int64_t l = 1; l < valid; ++l) mx = std::max(mx, p[l]);
  float sum = 0.0f;
  for (int64_t l = 0; l < valid; ++l) {
    p[l] = std::exp(p[l] - mx);
    sum += p[l];
  }
  const float inv = 1.0f / sum;
  for (int64_t l = 0; l < valid; ++l) p[l] *= inv;
  for (int64_t l = valid; l < len; ++l) p[l] = 0.0f;
}

}  // namespace

void AttentionPrefill(ThreadPool& pool, const AttentionShape& shape, const float* q, int64_t q_stride,
                      int64_t q_head_stride, int64_t rows, int64_t pos0, const float* k, const float* v,
                      int64_t kv_stride, float* out, int64_t out_stride) {
  InitBlas();
  const int64_t blocks = (rows + kAttentionQueryBlock - 1) / kAttentionQueryBlock;
  const int64_t group = shape.num_heads / shape.num_kv_heads;
  const int64_t hd = shape.head_dim;
  // One task per (kv head, query block): the group's query heads are stacked into one product.
  pool.Run(static_cast<size_t>(shape.num_kv_heads * blocks), [&](size_t task) {
    const int64_t kvh = static_cast<int64_t>(task) / blocks;
    const int64_t b = static_cast<int64_t>(task) % blocks;
    const int64_t t0 = b * kAttentionQueryBlock;
    const int64_t m = std::min(rows, t0 + kAttentionQueryBlock) - t0;
    const int64_t len = pos0 + t0 + m;  // keys the last row of the block sees
    const int64_t gm = group * m;       // stacked rows: head g's row r at g*m + r
    thread_local std::vector<float> qs, scores, os;
    if (qs.size() < static_cast<size_t>(gm * hd)) qs.resize(static_cast<size_t>(gm * hd));
    if (os.size() < static_cast<size_t>(gm * hd)) os.resize(static_cast<size_t>(gm * hd));
    if (scores.size() < static_cast<size_t>(gm * len)) scores.resize(static_cast<size_t>(gm * len));
    for (int64_t g = 0; g < group; ++g)
      for (int64_t r = 0; r < m; ++r)
        std::copy_n(q + (t0 + r) * q_stride + (kvh * group + g) * q_head_stride, hd, qs.data() + (g * m + r) * hd);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(gm), static_cast<blasint>(len),
                static_cast<blasint>(hd), shape.scale, qs.data(), static_cast<blasint>(hd), k + kvh * hd,
                static_cast<blasint>(kv_stride), 0.0f, scores.data(), static_cast<blasint>(len));
    for (int64_t g = 0; g < group; ++g)
      for (int64_t r = 0; r < m; ++r) SoftmaxPrefix(scores.data() + (g * m + r) * len, pos0 + t0 + r + 1, len);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<blasint>(gm), static_cast<blasint>(hd),
                static_cast<blasint>(len), 1.0f, scores.data(), static_cast<blasint>(len), v + kvh * hd,
                static_cast<blasint>(kv_stride), 0.0f, os.data(), static_cast<blasint>(hd));
    for (int64_t g = 0; g < group; ++g)
      for (int64_t r = 0; r < m; ++r)
        std::copy_n(os.data() + (g * m + r) * hd, hd, out + (t0 + r) * out_stride + (kvh * group + g) * hd);
  });
}

void AttentionDecode(ThreadPool& pool, const AttentionShape& shape, const float* q, int64_t q_head_stride,
                     int64_t length, const float* k, const float* v, int64_t kv_stride, float* out) {
  const int64_t group = shape.num_heads / shape.num_kv_heads;
  const int64_t hd = shape.head_dim;
  pool.Run(static_cast<size_t>(shape.num_kv_heads), [&](size_t task) {
    const int64_t kvh = static_cast<int64_t>(task);
    thread_local std::vector<float> scores;
    if (scores.size() < static_cast<size_t>(group * length)) scores.resize(static_cast<size_t>(group * length));
    for (int64_t l = 0; l < length; ++l) {
      const float* kr = k + l * kv_stride + kvh * hd;
      for (int64_t g = 0; g < group; ++g)
        scores[g * length + l] = Dot(q + (kvh * group + g) * q_head_stride, kr, hd) * shape.scale;
    }
    for (int64_t g = 0; g < group; ++g) SoftmaxPrefix(scores.data() + g * length, length, length);
    for (int64_t g = 0; g < group; ++g) {
      float* o = out + (kvh * group + g) * hd;
      for (int64_t e = 0; e < hd; ++e) o[e] = 0.0f;
    }
    for (int64_t l = 0; l < length; ++l) {
      const float* vr = v + l * kv_stride + kvh * hd;
      for (int64_t g = 0; g < group; ++g) Axpy(scores[g * length + l], vr, out + (kvh * group + g) * hd, hd);
    }
  });
}

}  // namespace anchorage::cpu
