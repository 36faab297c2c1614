// A plain double-precision forward of the whole Qwen3.5 text model, written straight from
// docs qwen35-model.md sections 4-5 for tests and benchmarks. Shares no code with the engine's kernels:
// weights are read element by element through TensorView::At, the delta rule is the recurrence.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "engine/model/model_config.h"
#include "engine/model/weights.h"

namespace anchorage::reference {

using Vec = std::vector<double>;

// t as a dense double matrix [rows, cols] (an FP8 one times its block scales, exactly).
inline Vec Dense(const TensorView& t) {
  Vec out(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) out[i] = t.At(i);
  if (t.scale_inv != nullptr) {
    const int64_t cols = t.shape[1], scale_cols = t.scale_inv->shape[1];
    for (int64_t i = 0; i < t.numel(); ++i)
      out[i] *= t.scale_inv->At((i / cols / t.scale_block_rows) * scale_cols + (i % cols) / t.scale_block_cols);
  }
  return out;
}

// y[T, n] = x[T, k] W[n, k]^T.
inline Vec Linear(const Vec& x, int64_t T, int64_t k, const TensorView& w) {
  const Vec W = Dense(w);
  const int64_t n = static_cast<int64_t>(W.size()) / k;
  Vec y(static_cast<size_t>(T * n), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0.0;
      for (int64_t i = 0; i < k; ++i) s += x[t * k + i] * W[j * k + i];
      y[t * n + j] = s;
    }
  return y;
}

// Zero-centred RMSNorm (weight applied as 1 + w) of each width-sized group of x.
inline Vec RmsNorm1p(const Vec& x, int64_t width, const TensorView& w, double eps) {
  Vec y(x.size());
  for (size_t r = 0; r < x.size() / width; ++r) {
    double ss = 0.0;
    for (int64_t i = 0; i < width; ++i) ss += x[r * width + i] * x[r * width + i];
    const double inv = 1.0 / std::sqrt(ss / width + eps);
    for (int64_t i = 0; i < width; ++i) y[r * width + i] = x[r * width + i] * inv * (1.0 + w.At(i));
  }
  return y;
}

inline double Silu(double x) { return x / (1.0 + std::exp(-x)); }
inline double Sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
inline double Softplus(double x) { return x > 20.0 ? x : std::log1p(std::exp(x)); }

// An image's rows in a prompt: rows x columns merged patches from row `row`, their inputs given.
struct Image {
  int64_t row = 0, rows = 0, columns = 0;
  const float* inputs = nullptr;  // [rows * columns, H]
};

// Qwen3-VL's get_rope_index for one sequence: (t, h, w) of every row, walking text and images in order.
inline std::vector<std::array<int64_t, 3>> RopeIndex(int64_t T, const std::vector<Image>& images) {
  std::vector<std::array<int64_t, 3>> pos;
  int64_t next = 0;  // the position after the last one given
  for (const Image& im : images) {
    while (static_cast<int64_t>(pos.size()) < im.row) pos.push_back({next, next, next}), ++next;
    const int64_t base = next;
    for (int64_t r = 0; r < im.rows; ++r)
      for (int64_t col = 0; col < im.columns; ++col) pos.push_back({base, base + r, base + col});
    next = base + std::max(im.rows, im.columns);
  }
  while (static_cast<int64_t>(pos.size()) < T) pos.push_back({next, next, next}), ++next;
  return pos;
}

// Logits [T, vocab] of ids from an empty state: text rows at positions 0..T-1, or as RopeIndex moves them
// after images, whose rows take their given inputs instead of the embedding.
inline Vec Logits(const ModelConfig& c, const ModelWeights& w, const std::vector<int32_t>& ids, const std::vector<Image>& images = {}) {
  const int64_t T = static_cast<int64_t>(ids.size()), H = c.hidden_size;
  const double eps = c.rms_norm_eps;
  Vec x(static_cast<size_t>(T * H));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < H; ++i) x[t * H + i] = ids[t] < c.vocab_size ? w.embed_tokens.At(static_cast<int64_t>(ids[t]) * H + i) : 0.0;
  for (const Image& im : images)
    for (int64_t r = 0; r < im.rows * im.columns; ++r)
      for (int64_t i = 0; i < H; ++i) x[(im.row + r) * H + i] = im.inputs[r * H + i];
  const std::vector<std::array<int64_t, 3>> positions = RopeIndex(T, images);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const LayerWeights& lw = w.layers[l];
    Vec a = RmsNorm1p(x, H, lw.input_layernorm, eps);
    Vec mix;
    if (c.layer_types[l] == LayerKind::kLinearAttention) {
      const GdnWeights& g = lw.gdn;
      const int64_t C = c.conv_dim(), K = c.linear_conv_kernel_dim, Nk = c.linear_num_key_heads;
      const int64_t Nv = c.linear_num_value_heads, dk = c.linear_key_head_dim, dv = c.linear_value_head_dim;
      const int64_t KD = c.key_dim(), VD = c.value_dim(), r = Nv / Nk;
      Vec qkv = Linear(a, T, H, g.in_proj_qkv), z = Linear(a, T, H, g.in_proj_z);
      Vec b = Linear(a, T, H, g.in_proj_b), al = Linear(a, T, H, g.in_proj_a);
      Vec cv(qkv.size());
      for (int64_t t = 0; t < T; ++t)
        for (int64_t ch = 0; ch < C; ++ch) {
          double s = 0.0;
          for (int64_t j = 0; j < K; ++j) {
            const int64_t src = t - (K - 1) + j;  // tap j multiplies the input at t - (K-1) + j
            if (src >= 0) s += g.conv1d.At(ch * K + j) * qkv[src * C + ch];
          }
          cv[t * C + ch] = Silu(s);
        }
      Vec core(static_cast<size_t>(T * VD));
      Vec S(static_cast<size_t>(Nv * dk * dv), 0.0);
      for (int64_t t = 0; t < T; ++t) {
        double* row = &cv[t * C];
        for (int64_t h = 0; h < 2 * Nk; ++h) {  // q heads then k heads
          double ss = 0.0;
          for (int64_t i = 0; i < dk; ++i) ss += row[h * dk + i] * row[h * dk + i];
          const double inv = 1.0 / std::sqrt(ss + eps);
          for (int64_t i = 0; i < dk; ++i) row[h * dk + i] *= inv * (h < Nk ? 1.0 / std::sqrt(double(dk)) : 1.0);
        }
        for (int64_t h = 0; h < Nv; ++h) {
          const double beta = Sigmoid(b[t * Nv + h]);
          const double gg = -std::exp(g.A_log.At(h)) * Softplus(al[t * Nv + h] + g.dt_bias.At(h));
          const double* q = row + (h / r) * dk;
          const double* k = row + KD + (h / r) * dk;
          const double* v = row + 2 * KD + h * dv;
          double* Sh = &S[h * dk * dv];
          for (int64_t i = 0; i < dk * dv; ++i) Sh[i] *= std::exp(gg);
          for (int64_t e = 0; e < dv; ++e) {
            double m = 0.0;
            for (int64_t d = 0; d < dk; ++d) m += Sh[d * dv + e] * k[d];
            const double delta = beta * (v[e] - m);
            for (int64_t d = 0; d < dk; ++d) Sh[d * dv + e] += k[d] * delta;
          }
          double* o = &core[t * VD + h * dv];
          for (int64_t e = 0; e < dv; ++e) {
            double s = 0.0;
            for (int64_t d = 0; d < dk; ++d) s += Sh[d * dv + e] * q[d];
            o[e] = s;
          }
          double ss = 0.0;
          for (int64_t e = 0; e < dv; ++e) ss += o[e] * o[e];
          const double inv = 1.0 / std::sqrt(ss / dv + eps);
          for (int64_t e = 0; e < dv; ++e) o[e] = o[e] * inv * g.norm.At(e) * Silu(z[t * VD + h * dv + e]);
        }
      }
      mix = Linear(core, T, VD, g.out_proj);
    } else {
      const AttentionWeights& at = lw.attn;
      const int64_t Nh = c.num_attention_heads, Nkv = c.num_key_value_heads, hd = c.head_dim;
      const int64_t rot = c.rotary_dim(), half = rot / 2;
      Vec qg = Linear(a, T, H, at.q_proj), k = Linear(a, T, H, at.k_proj), v = Linear(a, T, H, at.v_proj);
      Vec q(static_cast<size_t>(T * Nh * hd)), gate(q.size());
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < Nh; ++h)
          for (int64_t e = 0; e < hd; ++e) {
            q[(t * Nh + h) * hd + e] = qg[t * 2 * Nh * hd + h * 2 * hd + e];
            gate[(t * Nh + h) * hd + e] = qg[t * 2 * Nh * hd + h * 2 * hd + hd + e];
          }
      q = RmsNorm1p(q, hd, at.q_norm, eps);
      k = RmsNorm1p(k, hd, at.k_norm, eps);
      // Interleaved M-RoPE: frequencies 1, 4, .. below 3 x section[1] turn by h, 2, 5, .. below 3 x section[2] by w.
      auto rope = [&](double* p, const std::array<int64_t, 3>& pos) {
        for (int64_t i = 0; i < half; ++i) {
          int axis = 0;
          for (int64_t j = 1; j < 3 * c.mrope_section[1]; j += 3) axis = j == i ? 1 : axis;
          for (int64_t j = 2; j < 3 * c.mrope_section[2]; j += 3) axis = j == i ? 2 : axis;
          const double th = pos[axis] * std::pow(c.rope_theta, -2.0 * i / rot);
          const double x0 = p[i], x1 = p[i + half];
          p[i] = x0 * std::cos(th) - x1 * std::sin(th);
          p[i + half] = x1 * std::cos(th) + x0 * std::sin(th);
        }
      };
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t h = 0; h < Nh; ++h) rope(&q[(t * Nh + h) * hd], positions[t]);
        for (int64_t h = 0; h < Nkv; ++h) rope(&k[(t * Nkv + h) * hd], positions[t]);
      }
      Vec out(static_cast<size_t>(T * Nh * hd), 0.0);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < Nh; ++h) {
          const int64_t kvh = h / (Nh / Nkv);
          Vec s(static_cast<size_t>(t + 1));
          double mx = -1e300;
          for (int64_t j = 0; j <= t; ++j) {
            double d = 0.0;
            for (int64_t e = 0; e < hd; ++e) d += q[(t * Nh + h) * hd + e] * k[(j * Nkv + kvh) * hd + e];
            s[j] = d / std::sqrt(double(hd));
            mx = std::max(mx, s[j]);
          }
          double sum = 0.0;
          for (int64_t j = 0; j <= t; ++j) sum += (s[j] = std::exp(s[j] - mx));
          for (int64_t j = 0; j <= t; ++j)
            for (int64_t e = 0; e < hd; ++e) out[(t * Nh + h) * hd + e] += s[j] / sum * v[(j * Nkv + kvh) * hd + e];
          for (int64_t e = 0; e < hd; ++e) out[(t * Nh + h) * hd + e] *= Sigmoid(gate[(t * Nh + h) * hd + e]);
        }
      mix = Linear(out, T, Nh * hd, at.o_proj);
    }
    for (size_t i = 0; i < x.size(); ++i) x[i] += mix[i];
    Vec bn = RmsNorm1p(x, H, lw.post_attention_layernorm, eps);
    Vec gt = Linear(bn, T, H, lw.gate_proj), up = Linear(bn, T, H, lw.up_proj);
    for (size_t i = 0; i < gt.size(); ++i) gt[i] = Silu(gt[i]) * up[i];
    Vec down = Linear(gt, T, c.intermediate_size, lw.down_proj);
    for (size_t i = 0; i < x.size(); ++i) x[i] += down[i];
  }
  Vec xf = RmsNorm1p(x, H, w.norm, eps);
  return Linear(xf, T, H, w.lm_head);
}

}  // namespace anchorage::reference
