// The CUDA backend's kernels over fp32 activations in device memory. Every reduction has a fixed
// order and no atomics, and a row's bits depend on that row's inputs alone (row-invariant).
// Plain C++: callers need no CUDA header. Launches are asynchronous on the given stream.
#pragma once

#include <cstdint>

#include "engine/core/kv_dtype.h"

struct CUstream_st;

namespace anchorage::cuda {

using Stream = CUstream_st*;

// The delta rule's chunk: chunks start at absolute positions that are multiples of it.
inline constexpr int64_t kDeltaChunkTokens = 64;
// The widest attention head the attention kernel holds in registers.
inline constexpr int64_t kMaxHeadDim = 256;

struct Q8Weights;
// x[t] = table[ids[t]] widened from bf16 (from q8 where q8.q is set); x is [n, width].
void EmbedRows(const uint16_t* table, const int32_t* ids, int64_t n, int64_t width, float* x, Stream s, const Q8Weights& q8);
// y[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w1 (w1 already holds 1 + w).
void RmsNormRows(const float* x, const float* w1, int64_t n, int64_t width, float eps, float* y, Stream s);
// The split that keeps fp32 accuracy through bf16 products: rows [0, n) of out are bf16(x) (nearest
// even), rows [rows, rows + n) bf16(x - hi) where low is set. out is bf16 [2 * rows, width] (rows >= n: a padded call).
void SplitBf16(const float* x, int64_t n, int64_t width, int64_t rows, bool low, uint16_t* out, Stream s);
// y[t] = halves[t] + halves[rows + t] for t < n (low), or halves[t] alone; rows of width floats.
void SumHalves(const float* halves, int64_t n, int64_t width, int64_t rows, bool low, float* y, int64_t y_stride, Stream s);
// Block-scaled 8-bit weights: w[j, i] = code(q[j, i]) x scales[j / block_rows, i / block_cols], each
// weight widened in fp32 (the code exactly, times its scale rounded once). The codes are F8_E4M3
// (Qwen's FP8 checkpoints) or, with int8, two's-complement integers (--weights int8: a scale a row
// and 32 inputs, as the CPU's).
struct Q8Weights {
  const uint8_t* q = nullptr;  // [rows, cols] row-major; null: the weights are bf16
  const float* scales = nullptr;
  int64_t block_rows = 0, block_cols = 0, scale_cols = 0;  // scale_cols = ceil(cols / block_cols)
  bool int8 = false;
};

// y[t, j] = sum_i w[j, i] * x[t, i] in fp32, w bf16 [rows, cols] row-major: one warp a weight row,
// read once for up to 8 rows of x. Every row gets a one-row call's bits (and GemvMany's and GemvSwiGlu's).
void Gemv(const uint16_t* w, int64_t rows, int64_t cols, const float* x, int64_t n, float* y, Stream s);
// The same over 8-bit weights: each weight widened, then the fmas in the bf16 GEMV's order.
void GemvQ8(const Q8Weights& w, int64_t rows, int64_t cols, const float* x, int64_t n, float* y, Stream s);
// y[t * y_stride + j] = sum_k x[t, k] w[j, k] on CUDA cores in fp32, each output over k in order: the
// products' fallback where cuBLASLt's rows would depend on the call (slower; no split needed).
void GemmSimt(const uint16_t* w, int64_t N, int64_t K, const float* x, int64_t n, float* y, int64_t y_stride, Stream s);
// The same over 8-bit weights (prefill's products for FP8 and int8 weights).
void GemmSimtQ8(const Q8Weights& w, int64_t N, int64_t K, const float* x, int64_t n, float* y, int64_t y_stride, Stream s);
// out[t] = [left[t] | right[t]], rows of width floats each side.
void JoinRows(const float* left, const float* right, int64_t n, int64_t width, float* out, Stream s);
// to[i] += from[i].
void AddRows(const float* from, int64_t count, float* to, Stream s);
// x += add, then y = RmsNorm(x) * w1 per row: the residual add and the next norm in one launch,
// with the bits of AddRows then RmsNormRows.
void AddRmsNorm(float* x, const float* add, const float* w1, int64_t n, int64_t width, float eps, float* y, Stream s);
// gate[i] = silu(gate[i]) * up[i].
void SwiGlu(float* gate, const float* up, int64_t count, Stream s);

// A position: `value`, plus *device when set. Decode reads its position from device memory, so one
// captured graph serves every step.
struct Position {
  int64_t value = 0;
  const int64_t* device = nullptr;
};

// Up to four matrices of the same width multiplied by one vector in one launch (decode): row j of
// matrix m goes to y[m][position * position_stride[m] + j], with the bits of Gemv (GemvQ8 where q8[m] is set).
struct GemvSet {
  const uint16_t* w[4] = {};
  Q8Weights q8[4];
  float* y[4] = {};
  int64_t rows[4] = {};
  int64_t position_stride[4] = {};
  int count = 0;
  Position position;
};
void GemvMany(const GemvSet& set, int64_t cols, const float* x, Stream s);
// y[j] = silu(gate_j . x) * (up_j . x) for one vector (decode): the bits of two Gemv calls and SwiGlu
// (GemvQ8 calls where gate_q8.q and up_q8.q are set).
void GemvSwiGlu(const uint16_t* gate, const uint16_t* up, int64_t rows, int64_t cols, const float* x, float* y, Stream s,
                const Q8Weights& gate_q8 = {}, const Q8Weights& up_q8 = {});

// The GDN layer's per-row work before the delta rule, in one launch: the causal depthwise conv over
// [tail; qkv] (tail [taps-1, channels], oldest first; w tap-major [taps, channels]) and SiLU into out
// [n, channels], the L2 norm of every q and k head (q also times q_scale), and beta = sigmoid(b),
// g = -a_exp * softplus(a + dt_bias) per value head.
struct ConvNormGates {
  const float* qkv = nullptr;
  const float* tail = nullptr;
  const float* w = nullptr;
  float* out = nullptr;
  int64_t channels = 0, taps = 0, key_heads = 0, dk = 0;
  float eps = 0.0f, q_scale = 1.0f;
  const float* b = nullptr;
  const float* a = nullptr;
  const float* a_exp = nullptr;
  const float* dt_bias = nullptr;
  float* beta = nullptr;
  float* g = nullptr;
  int64_t value_heads = 0;
};
void ConvNormGatesRows(const ConvNormGates& args, int64_t n, Stream s);
// The last taps-1 rows of [tail; qkv] become the tail, in place (after the conv has read it).
void NextTail(const float* qkv, float* tail, int64_t n, int64_t channels, int64_t taps, Stream s);

struct DeltaShape {
  int64_t key_heads = 0, value_heads = 0, dk = 0, dv = 0;
  int64_t channels = 0;  // conv row width: q [Nk*dk] | k [Nk*dk] | v [Nv*dv]
};
// Dynamic shared memory the chunked kernels need, to check against the device's limit.
int64_t GatedDeltaChunkedSharedBytes(const DeltaShape& shape);
// The scratch (floats) GatedDeltaChunked needs for calls of up to `rows` rows.
int64_t GatedDeltaChunkedScratchFloats(const DeltaShape& shape, int64_t rows);
// Whether the state pass holds this shape (dk a multiple of 4, at most 128).
bool GatedDeltaChunkedSupports(const DeltaShape& shape);
// The chunked gated delta rule over rows [0, n) at positions pos0..; chunks end at absolute multiples
// of 64. First every (chunk, head) at once computes what needs no state (into scratch), then the
// chunks pass through the state in order, 32 state columns a block. state fp32 [Nv, dk, dv] in
// place; out [n, Nv*dv].
void GatedDeltaChunked(const DeltaShape& shape, const float* conv, const float* beta, const float* g, int64_t n,
                       int64_t pos0, float* state, float* out, float* scratch, Stream s);
// The one-token recurrence over rows [0, n), in order. With z set each output row then takes the gated
// norm (as GatedNorm, with norm_w and eps).
void GatedDeltaRecurrent(const DeltaShape& shape, const float* conv, const float* beta, const float* g, int64_t n,
                         float* state, float* out, const float* z, const float* norm_w, float eps, Stream s);
// core[t, h] = core[t, h] / sqrt(mean(core^2) + eps) * w * silu(z[t, h]) per value head of dv floats.
void GatedNorm(float* core, const float* z, const float* w, int64_t n, int64_t heads, int64_t dv, float eps, Stream s);

// Rows whose rotary positions are M-RoPE's three axes (images in the prompt): row t's (t, h, w) at
// positions[3t..3t+2] (device memory); frequency j turns by h where j % 3 == 1 and j < h_limit, by w
// where j % 3 == 2 and j < w_limit, else by t. No positions: every axis at pos + t.
struct RopeAxes {
  const int64_t* positions = nullptr;
  int64_t h_limit = 0, w_limit = 0;
};

// Per head of each row (rows + t*row_stride + h*head_stride, rows first moved to the position's row
// when rows_at_position): RMSNorm with w1, then NeoX RoPE on the first 2*half dims at position
// pos + t or as axes give (angles in double from inv_freq, a device array [half]).
void NormRope(float* rows, int64_t n, int64_t row_stride, int64_t heads, int64_t head_stride, int64_t head_dim,
              const float* w1, float eps, const double* inv_freq, int64_t half, Position pos, bool rows_at_position,
              Stream s, RopeAxes axes = {});

// An attention layer's K and V rows in a state's device memory: kv_width values a row, fp32, bf16 or fp8
// (KvRowBytes(dtype, kv_width) bytes a row).
struct KvBuffers {
  void* k = nullptr;
  void* v = nullptr;
  KvDtype dtype = KvDtype::kF32;
};
// Rows [0, n) of k and v (fp32, width floats a row) into rows At(pos).. of rows, in its dtype: bf16
// rounded to nearest even, the CPU's FloatToBf16 bits (NaN quieted as it does); fp8 the CPU's StoreKvRows bits.
void StoreKvRows(const float* k, const float* v, int64_t n, int64_t width, Position pos, const KvBuffers& rows, Stream s);

struct AttentionShape {
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
  float scale = 1.0f;
  int64_t keys = 0;  // > 0: every query row attends keys [0, keys) with no mask (a vision tower's attention)
};
// Causal attention of query rows [0, n) at positions pos0.. over K/V rows 0..pos0 + t (or shape.keys rows
// for every row, pos0 unused), kv_width values a row (k and v may point into one buffer of wider rows), bf16 and fp8 widened exactly as loaded): keys in index order, in tiles of 32 from key 0, so a row's bits depend only on its
// query, its position and the keys. out[t] at out + t*out_stride, heads side by side, each times
// sigmoid(gate) when gate is set (laid out as q). A block takes 8 positions of every head of a kv group
// (32 x heads/kv_heads threads).
void Attention(const AttentionShape& shape, const float* q, int64_t q_stride, int64_t q_head_stride, int64_t n,
               Position pos0, const KvBuffers& rows, int64_t kv_width, const float* gate, float* out, int64_t out_stride, Stream s);
// Dynamic shared memory the attention kernel needs, to check against the device's limit.
int64_t AttentionSharedBytes(const AttentionShape& shape);
// The most threads a block of the attention kernel can have on the current device (its registers
// decide; the least over the row dtypes) in *threads; returns the query's CUDA error code.
int AttentionMaxThreads(int* threads);

// The vision tower's row kernels (fp32, a row's bits its own).
// y[t] = (x[t] - mean) / sqrt(var + eps) * w + b per row of width floats (mean and variance over the row).
void LayerNormRows(const float* x, const float* w, const float* b, int64_t n, int64_t width, float eps, float* y, Stream s);
enum class Activation { kNone, kGeluTanh, kGeluErf };
// y[t, j] = act(y[t, j] + bias[j]) over n rows of width floats.
void BiasActivation(float* y, const float* bias, int64_t n, int64_t width, Activation act, Stream s);
// Rotates each head of each row by its row's angles: values i and i + half of a head (half = head_dim / 2)
// turn by cos, sin [t, i] ([n, half]), as RoPE's rotate-half. Heads sit head_dim apart from rows + t*row_stride.
void RotateHalves(float* rows, int64_t n, int64_t row_stride, int64_t heads, int64_t head_dim, const float* cos, const float* sin, Stream s);

}  // namespace anchorage::cuda
