#include "engine/compute/cuda/kernels.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>

// Launches and dynamic shared memory go through these macros, so that the SIMT emulator in
// tests/gpu can run this file as C++ on the CPU (it defines both before including the file).
#ifndef ANCHORAGE_LAUNCH
#define ANCHORAGE_LAUNCH(kernel, grid, block, shared, stream) kernel<<<grid, block, shared, stream>>>
#define ANCHORAGE_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#define ANCHORAGE_UNROLL _Pragma("unroll")
#endif

namespace anchorage::cuda {
namespace {

constexpr int kBlock = 256;
constexpr unsigned kFullMask = 0xffffffffu;

int Blocks(int64_t count, int per_block = kBlock) { return static_cast<int>((count + per_block - 1) / per_block); }

__device__ float Bf16ToFloat(uint16_t v) { return __uint_as_float(static_cast<uint32_t>(v) << 16); }
// Round to nearest even in integer steps, NaN quieted: the CPU's FloatToBf16 bits (the intrinsic's NaN differs).
__device__ uint16_t Bf16Bits(float f) {
  const uint32_t bits = __float_as_uint(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}
// The exact value of an OCP e4m3 ("fn") byte: 0x7f and 0xff are NaN, exponent 0 is subnormal.
__device__ float Fp8ToFloat(uint32_t byte) {
  const uint32_t sign = (byte & 0x80u) << 24, exponent = (byte >> 3) & 0xfu, mantissa = byte & 7u;
  if ((byte & 0x7fu) == 0x7fu) return __uint_as_float(sign | 0x7fc00000u);
  if (exponent == 0) return __uint_as_float(sign | __float_as_uint(static_cast<float>(mantissa) * 0.001953125f));
  return __uint_as_float(sign | ((exponent + 120u) << 23) | (mantissa << 20));
}
// The e4m3 byte nearest a (ties to even), saturating at +-448; NaN gives 0x7f: the CPU's FloatToFp8E4m3 in integer steps.
__device__ uint8_t Fp8Bits(float a) {
  const uint32_t bits = __float_as_uint(a), sign = (bits >> 24) & 0x80u, magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);
  if (magnitude >= 0x43e00000u) return static_cast<uint8_t>(sign | 0x7eu);  // 448 and above
  if (magnitude < 0x3c800000u) return static_cast<uint8_t>(sign | static_cast<uint32_t>(rintf(__uint_as_float(magnitude) * 512.0f)));
  const uint32_t shifted = magnitude - (120u << 23);  // the exponent rebiased from 127 to 7
  const uint32_t code = (shifted + 0x7ffffu + ((shifted >> 20) & 1u)) >> 20;
  return static_cast<uint8_t>(sign | (code < 0x7eu ? code : 0x7eu));
}
// The scale exponent of an fp8 K/V block: the CPU's KvFp8Exponent.
__device__ int Fp8KvExponent(float amax) {
  const uint32_t bits = __float_as_uint(amax) & 0x7fffffffu;
  if (bits >= 0x7f800000u) return 119;
  const int field = static_cast<int>(bits >> 23);
  if (field == 0) return -100;
  const int e = field - 127 - 8 + ((bits & 0x7fffffu) > 0x600000u ? 1 : 0);
  return e < -100 ? -100 : e > 119 ? 119 : e;
}
// An attention layer's K or V rows as fp32 values, one reader a row dtype (fp8: codes, then a scale byte a block).
struct F32Kv {
  const float* p;
  int64_t width;
  __device__ float At(int64_t row, int64_t column) const { return p[row * width + column]; }
};
struct Bf16Kv {
  const uint16_t* p;
  int64_t width;
  __device__ float At(int64_t row, int64_t column) const { return Bf16ToFloat(p[row * width + column]); }
};
struct Fp8Kv {
  const uint8_t* p;
  int64_t width;
  __device__ float At(int64_t row, int64_t column) const {
    const uint8_t* r = p + row * (width + width / kKvFp8Block);
    return Fp8ToFloat(r[column]) * __uint_as_float(static_cast<uint32_t>(r[width + column / kKvFp8Block]) << 23);
  }
};
// A weight row of bf16 weights, widened 8 at a time where cols allows (uint4 loads), else one at a time.
struct Bf16Row {
  const uint16_t* w;
  __device__ bool Wide(int64_t cols) const { return cols % 8 == 0; }
  __device__ void Load8(int64_t c, float* wv) const {
    const uint4 packed = *reinterpret_cast<const uint4*>(w + c);
    const uint32_t words[4] = {packed.x, packed.y, packed.z, packed.w};
    for (int q = 0; q < 4; ++q) {
      wv[2 * q] = __uint_as_float(words[q] << 16);
      wv[2 * q + 1] = __uint_as_float(words[q] & 0xffff0000u);
    }
  }
  __device__ float At(int64_t c) const { return Bf16ToFloat(w[c]); }
};
// A weight row of 8-bit weights with its blocks' scales: each weight the code's exact value times its scale, rounded once.
struct Q8Row {
  const uint8_t* q;
  const float* scales;
  int64_t block_cols;
  bool int8;
  __device__ float Code(uint32_t byte) const {
    return int8 ? static_cast<float>(static_cast<int8_t>(static_cast<uint8_t>(byte))) : Fp8ToFloat(byte);
  }
  __device__ bool Wide(int64_t cols) const { return cols % 8 == 0 && block_cols % 8 == 0; }
  __device__ void Load8(int64_t c, float* wv) const {
    const uint2 packed = *reinterpret_cast<const uint2*>(q + c);
    const float scale = scales[static_cast<uint32_t>(c) / static_cast<uint32_t>(block_cols)];
    for (int i = 0; i < 4; ++i) {
      wv[i] = Code((packed.x >> (8 * i)) & 0xffu) * scale;
      wv[4 + i] = Code((packed.y >> (8 * i)) & 0xffu) * scale;
    }
  }
  __device__ float At(int64_t c) const { return Code(q[c]) * scales[static_cast<uint32_t>(c) / static_cast<uint32_t>(block_cols)]; }
};
__device__ Q8Row Q8RowOf(const Q8Weights& w, int64_t j, int64_t cols) {
  return {w.q + j * cols, w.scales + static_cast<uint32_t>(j) / static_cast<uint32_t>(w.block_rows) * w.scale_cols, w.block_cols,
          w.int8};
}

__device__ float SigmoidOf(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ float SiluOf(float x) { return x / (1.0f + expf(-x)); }
__device__ float SoftplusOf(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
__device__ int64_t At(const Position& p) { return p.device != nullptr ? p.value + *p.device : p.value; }

// Butterfly sums: every lane ends with the same bits (addition commutes), the order fixed by the shape.
__device__ float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}
__device__ float WarpMax(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}
// Sum over the block: warps by butterfly, then warp totals in warp order. blockDim.x a multiple of 32.
__device__ float BlockSum(float v) {
  __shared__ float partial[32];
  __shared__ float total;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = WarpSum(v);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float sum = 0.0f;
    for (int w = 0; w < warps; ++w) sum += partial[w];
    total = sum;
  }
  __syncthreads();
  const float out = total;
  __syncthreads();
  return out;
}

__global__ void EmbedRowsKernel(const uint16_t* table, Q8Weights q8, const int32_t* ids, int64_t width, float* x) {
  const int64_t t = blockIdx.x, id = ids[t];
  if (q8.q != nullptr) {
    const Q8Row row = Q8RowOf(q8, id, width);
    for (int64_t i = threadIdx.x; i < width; i += blockDim.x) x[t * width + i] = row.At(i);
    return;
  }
  const uint16_t* row = table + id * width;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) x[t * width + i] = Bf16ToFloat(row[i]);
}

__global__ void RmsNormRowsKernel(const float* x, const float* w1, int64_t width, float eps, float* y) {
  const float* xr = x + blockIdx.x * width;
  float* yr = y + blockIdx.x * width;
  float sq = 0.0f;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) sq += xr[i] * xr[i];
  const float inv = 1.0f / sqrtf(BlockSum(sq) / static_cast<float>(width) + eps);
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) yr[i] = xr[i] * inv * w1[i];
}

// x += add, then y = RmsNorm(x) * w1: the residual add and the next norm in one pass (the same bits
// as AddRows then RmsNormRows).
__global__ void AddRmsNormKernel(float* x, const float* add, const float* w1, int64_t width, float eps, float* y) {
  float* xr = x + blockIdx.x * width;
  const float* ar = add + blockIdx.x * width;
  float* yr = y + blockIdx.x * width;
  float sq = 0.0f;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) {
    const float v = xr[i] + ar[i];
    xr[i] = v;
    sq += v * v;
  }
  const float inv = 1.0f / sqrtf(BlockSum(sq) / static_cast<float>(width) + eps);
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) yr[i] = xr[i] * inv * w1[i];
}

__global__ void SplitBf16Kernel(const float* x, int64_t count, int64_t lo_offset, bool low, uint16_t* out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= count) return;
  const __nv_bfloat16 hi = __float2bfloat16_rn(x[i]);
  out[i] = __bfloat16_as_ushort(hi);
  if (low) out[lo_offset + i] = __bfloat16_as_ushort(__float2bfloat16_rn(x[i] - __bfloat162float(hi)));
}

__global__ void SumHalvesKernel(const float* halves, int64_t n, int64_t width, int64_t lo_offset, bool low, float* y, int64_t y_stride) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n * width) return;
  const int64_t t = i / width, c = i % width;
  y[t * y_stride + c] = low ? halves[i] + halves[lo_offset + i] : halves[i];
}

constexpr int kGemvWarps = 8;

constexpr int kSimtTile = 64;   // output rows and columns a block of the CUDA-core GEMM
constexpr int kSimtDepth = 32;  // k a step

// Where GemmSimtKernel takes its weights from: bf16, or 8-bit codes with block scales.
struct Bf16Rows {
  const uint16_t* w;
  __device__ float operator()(int64_t j, int64_t k, int64_t K) const { return Bf16Row{w + j * K}.At(k); }
};
struct Q8Rows {
  Q8Weights w;
  __device__ float operator()(int64_t j, int64_t k, int64_t K) const { return Q8RowOf(w, j, K).At(k); }
};

// y = x W^T on CUDA cores in fp32: a block 64 rows x 64 columns, a thread 4 x 4 of them; every output
// takes its products in k order, one fma each, so its bits are its row's alone.
template <typename Weights>
__global__ void GemmSimtKernel(Weights w, int64_t N, int64_t K, const float* x, int64_t n, float* y, int64_t y_stride) {
  __shared__ float xs[kSimtTile][kSimtDepth + 1];
  __shared__ float ws[kSimtTile][kSimtDepth + 1];
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kSimtTile, j0 = static_cast<int64_t>(blockIdx.x) * kSimtTile;
  const int tr = threadIdx.x / 16, tc = threadIdx.x % 16;
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < K; k0 += kSimtDepth) {
    for (int i = threadIdx.x; i < kSimtTile * kSimtDepth; i += blockDim.x) {
      const int r = i / kSimtDepth, kk = i % kSimtDepth;
      const int64_t k = k0 + kk;
      xs[r][kk] = t0 + r < n && k < K ? x[(t0 + r) * K + k] : 0.0f;
      ws[r][kk] = j0 + r < N && k < K ? w(j0 + r, k, K) : 0.0f;
    }
    __syncthreads();
    const int depth = K - k0 < kSimtDepth ? static_cast<int>(K - k0) : kSimtDepth;
    for (int kk = 0; kk < depth; ++kk)
      for (int a = 0; a < 4; ++a)
        for (int b = 0; b < 4; ++b) acc[a][b] = fmaf(xs[tr + 16 * a][kk], ws[tc + 16 * b][kk], acc[a][b]);
    __syncthreads();
  }
  for (int a = 0; a < 4; ++a)
    for (int b = 0; b < 4; ++b) {
      const int64_t t = t0 + tr + 16 * a, j = j0 + tc + 16 * b;
      if (t < n && j < N) y[t * y_stride + j] = acc[a][b];
    }
}

// One warp a weight row against `rows` (at most R) input rows of cols floats: each row's dot takes its
// fmas in the same order whatever R and rows are, and the weights are read once for all of them.
template <int R, typename Row>
__device__ void WarpRowDots(const Row& weights, const float* x, int64_t cols, int rows, int lane, float* sums) {
  float acc[R];
  ANCHORAGE_UNROLL
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  if (weights.Wide(cols)) {
    for (int64_t c = lane * 8; c < cols; c += 256) {
      float wv[8];
      weights.Load8(c, wv);
      ANCHORAGE_UNROLL
      for (int r = 0; r < R; ++r) {
        if (r >= rows) break;
        const float* xr = x + r * cols + c;
        for (int q = 0; q < 8; ++q) acc[r] = fmaf(wv[q], xr[q], acc[r]);
      }
    }
  } else {
    for (int64_t c = lane; c < cols; c += 32) {
      const float wv = weights.At(c);
      ANCHORAGE_UNROLL
      for (int r = 0; r < R; ++r) {
        if (r >= rows) break;
        acc[r] = fmaf(wv, x[r * cols + c], acc[r]);
      }
    }
  }
  ANCHORAGE_UNROLL
  for (int r = 0; r < R; ++r)
    if (r < rows) sums[r] = WarpSum(acc[r]);
}

// WarpRowDots over row j of bf16 weights w, or of 8-bit weights where q8.q is set.
template <int R>
__device__ void WarpRowDotsOf(const uint16_t* w, const Q8Weights& q8, int64_t j, const float* x, int64_t cols, int rows, int lane,
                              float* sums) {
  if (q8.q != nullptr) {
    WarpRowDots<R>(Q8RowOf(q8, j, cols), x, cols, rows, lane, sums);
  } else {
    WarpRowDots<R>(Bf16Row{w + j * cols}, x, cols, rows, lane, sums);
  }
}

// One warp a weight row: the dot product the GEMV takes, over row j and an fp32 vector.
__device__ float WarpRowDot(const uint16_t* w, const Q8Weights& q8, int64_t j, const float* xr, int64_t cols, int lane) {
  float sum;
  WarpRowDotsOf<1>(w, q8, j, xr, cols, 1, lane, &sum);
  return sum;
}

// Input rows a GEMV warp takes against one read of its weight row.
constexpr int kGemvRowsAtOnce = 8;

__global__ void GemvKernel(const uint16_t* w, Q8Weights q8, int64_t rows, int64_t cols, const float* x, int64_t n, float* y) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * static_cast<int64_t>(kGemvWarps) + threadIdx.x / 32;
  if (row >= rows) return;
  for (int64_t t = 0; t < n; t += kGemvRowsAtOnce) {
    const int count = n - t < kGemvRowsAtOnce ? static_cast<int>(n - t) : kGemvRowsAtOnce;
    float sums[kGemvRowsAtOnce];
    WarpRowDotsOf<kGemvRowsAtOnce>(w, q8, row, x + t * cols, cols, count, lane, sums);
    ANCHORAGE_UNROLL
    for (int r = 0; r < kGemvRowsAtOnce; ++r)
      if (lane == 0 && r < count) y[(t + r) * rows + row] = sums[r];
  }
}

// Up to four GEMVs over one vector in one launch: the warps' rows run through the matrices in turn.
__global__ void GemvSetKernel(GemvSet set, int64_t cols, const float* x) {
  const int lane = threadIdx.x % 32;
  int64_t row = blockIdx.x * static_cast<int64_t>(kGemvWarps) + threadIdx.x / 32;
  int m = 0;
  while (m < set.count && row >= set.rows[m]) row -= set.rows[m++];
  if (m == set.count) return;
  const float acc = WarpRowDot(set.w[m], set.q8[m], row, x, cols, lane);
  if (lane == 0) set.y[m][At(set.position) * set.position_stride[m] + row] = acc;
}

// y[j] = silu(gate_j . x) * (up_j . x): the MLP's two GEMVs and its product in one launch.
__global__ void GemvSwiGluKernel(const uint16_t* gate, const uint16_t* up, Q8Weights gate_q8, Q8Weights up_q8, int64_t rows,
                                 int64_t cols, const float* x, float* y) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * static_cast<int64_t>(kGemvWarps) + threadIdx.x / 32;
  if (row >= rows) return;
  const float g = WarpRowDot(gate, gate_q8, row, x, cols, lane);
  const float u = WarpRowDot(up, up_q8, row, x, cols, lane);
  if (lane == 0) y[row] = SiluOf(g) * u;
}

__global__ void JoinRowsKernel(const float* left, const float* right, int64_t n, int64_t width, float* out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= 2 * n * width) return;
  const int64_t t = i / (2 * width), j = i % (2 * width);
  out[i] = j < width ? left[t * width + j] : right[t * width + j - width];
}

__global__ void AddRowsKernel(const float* from, int64_t count, float* to) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < count) to[i] += from[i];
}

__global__ void SwiGluKernel(float* gate, const float* up, int64_t count) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < count) gate[i] = SiluOf(gate[i]) * up[i];
}

// The conv over [tail; qkv] and SiLU for channel ch of row t: taps in order.
__device__ float ConvSiluAt(const float* qkv, const float* tail, const float* w, int64_t t, int64_t ch, int64_t channels,
                            int64_t taps) {
  float acc = 0.0f;
  for (int64_t j = 0; j < taps; ++j) {
    const int64_t src = t - (taps - 1) + j;
    const float in = src >= 0 ? qkv[src * channels + ch] : tail[(taps - 1 + src) * channels + ch];
    acc += w[j * channels + ch] * in;
  }
  return SiluOf(acc);
}

// Per row t (blockIdx.x): blocks y < 2 Nk a q or k head (conv, SiLU, L2 norm, q also times q_scale),
// then blocks of 128 value channels (conv, SiLU), then one block for beta and g of the row's heads.
__global__ void ConvNormGatesKernel(ConvNormGates a) {
  const int64_t t = blockIdx.x, y = blockIdx.y, qk_heads = 2 * a.key_heads;
  const int64_t value_blocks = (a.channels - qk_heads * a.dk + 127) / 128;
  float* row = a.out + t * a.channels;
  if (y < qk_heads) {
    float sq = 0.0f;
    for (int64_t i = threadIdx.x; i < a.dk; i += blockDim.x) {
      const float v = ConvSiluAt(a.qkv, a.tail, a.w, t, y * a.dk + i, a.channels, a.taps);
      row[y * a.dk + i] = v;
      sq += v * v;
    }
    const float inv = 1.0f / sqrtf(BlockSum(sq) + a.eps);
    for (int64_t i = threadIdx.x; i < a.dk; i += blockDim.x) {
      const float normed = row[y * a.dk + i] * inv;
      row[y * a.dk + i] = y < a.key_heads ? normed * a.q_scale : normed;
    }
  } else if (y < qk_heads + value_blocks) {
    const int64_t ch = qk_heads * a.dk + (y - qk_heads) * 128 + threadIdx.x;
    if (ch < a.channels) row[ch] = ConvSiluAt(a.qkv, a.tail, a.w, t, ch, a.channels, a.taps);
  } else {
    for (int64_t h = threadIdx.x; h < a.value_heads; h += blockDim.x) {
      const int64_t i = t * a.value_heads + h;
      a.beta[i] = SigmoidOf(a.b[i]);
      a.g[i] = -a.a_exp[h] * SoftplusOf(a.a[i] + a.dt_bias[h]);
    }
  }
}

// The last taps-1 rows of [tail; qkv] become the tail, in place: one block, a row at a time; row r
// reads old row r + n, which a later step writes.
__global__ void NextTailKernel(const float* qkv, float* tail, int64_t n, int64_t channels, int64_t keep) {
  for (int64_t r = 0; r < keep; ++r) {
    const int64_t src = n - keep + r;  // row of [tail; qkv] counted from qkv's first row
    for (int64_t ch = threadIdx.x; ch < channels; ch += blockDim.x)
      tail[r * channels + ch] = src >= 0 ? qkv[src * channels + ch] : tail[(keep + src) * channels + ch];
    __syncthreads();
  }
}

constexpr int kDeltaThreads = 128;
constexpr int64_t kC = kDeltaChunkTokens;

__device__ float RowDot(const float* a, const float* b, int64_t count) {
  float acc = 0.0f;
  for (int64_t d = 0; d < count; ++d) acc = fmaf(a[d], b[d], acc);
  return acc;
}

// Where chunk c of a call's rows starts: chunks end at absolute multiples of 64.
__device__ int64_t ChunkStart(int64_t c, int64_t pos0) {
  const int64_t first = kC - pos0 % kC;
  return c == 0 ? 0 : first + (c - 1) * kC;
}

// What the first phase leaves for each (chunk, value head): [U | W] [C, dv + dk], the decayed QK
// [C, C] (zero above the diagonal), exp(G) [C] and the state-update weights exp(G_last - G_j) [C].
__host__ __device__ int64_t ChunkScratchFloats(int64_t dk, int64_t dv) { return kC * (dv + dk) + kC * kC + 2 * kC; }

// Phase 1, every (chunk, value head) at once: the chunk's cumulative decay, its Gram matrices with
// decay and mask, and the forward substitution (I + A) [U | W] = [beta v | beta exp(G) k], a column
// a thread. Nothing here reads the state.
__global__ void DeltaChunkPrepKernel(DeltaShape sh, const float* conv, const float* beta_in, const float* g_in, int64_t n,
                                     int64_t pos0, float* scratch) {
  ANCHORAGE_DYNAMIC_SHARED(float, smem);
  const int64_t c = blockIdx.x, h = blockIdx.y, kh = h / (sh.value_heads / sh.key_heads);
  const int64_t dk = sh.dk, dv = sh.dv, C = sh.channels, Nv = sh.value_heads, ld = dv + dk;
  const int64_t key_dim = sh.key_heads * dk;
  const int64_t t = ChunkStart(c, pos0);
  const int64_t m = min(n - t, kC - (pos0 + t) % kC);
  float* G = smem;
  float* beta = G + kC;
  float* A = beta + kC;      // row i, column j < i: -beta_i (k_i.k_j) exp(G_i - G_j)
  float* UW = A + kC * kC;
  float* out = scratch + (c * Nv + h) * ChunkScratchFloats(dk, dv);
  float* QK = out + kC * ld;  // row i, column j <= i: (q_i.k_j) exp(G_i - G_j)
  float* eg = QK + kC * kC;
  float* tail = eg + kC;
  const float* q0 = conv + t * C + kh * dk;
  const float* k0 = conv + t * C + key_dim + kh * dk;
  const float* v0 = conv + t * C + 2 * key_dim + h * dv;
  const int tid = threadIdx.x, threads = blockDim.x;
  if (tid == 0) {
    float acc = 0.0f;
    for (int64_t i = 0; i < m; ++i) {
      acc += g_in[(t + i) * Nv + h];
      G[i] = acc;
      beta[i] = beta_in[(t + i) * Nv + h];
    }
  }
  __syncthreads();
  for (int64_t i = tid; i < m; i += threads) {
    eg[i] = expf(G[i]);
    tail[i] = expf(G[m - 1] - G[i]);
  }
  for (int64_t idx = tid; idx < m * m; idx += threads) {
    const int64_t i = idx / m, j = idx % m;
    if (j < i) {
      const float decay = expf(G[i] - G[j]);
      A[i * kC + j] = -(beta[i] * RowDot(k0 + i * C, k0 + j * C, dk) * decay);
      QK[i * kC + j] = RowDot(q0 + i * C, k0 + j * C, dk) * decay;
    } else {
      QK[i * kC + j] = j == i ? RowDot(q0 + i * C, k0 + j * C, dk) : 0.0f;
    }
  }
  __syncthreads();
  for (int64_t col = tid; col < ld; col += threads) {
    for (int64_t i = 0; i < m; ++i) {
      float val = col < dv ? beta[i] * v0[i * C + col] : beta[i] * expf(G[i]) * k0[i * C + (col - dv)];
      for (int64_t j = 0; j < i; ++j) val = fmaf(A[i * kC + j], UW[j * ld + col], val);
      UW[i * ld + col] = val;
      out[i * ld + col] = val;
    }
  }
}

constexpr int kStateColumns = 32;   // state columns a block of the second phase
constexpr int kStateGroups = 4;     // its threads split the dk rows into this many slices
constexpr int kMaxSliceRows = 32;   // dk <= 128

// Phase 2, the chunks in order: a block holds 32 columns of one head's state in registers, each of
// its 4 warps a quarter of the rows. Per chunk: V' = U - W S and o = exp(G) Q S + QK V' (the four
// quarters' partial sums added in quarter order), then S = exp(G_last) S + (tail K)^T V'.
__global__ void DeltaStatePassKernel(DeltaShape sh, const float* conv, int64_t n, int64_t pos0, const float* scratch,
                                     float* state, float* core) {
  ANCHORAGE_DYNAMIC_SHARED(float, smem);
  const int64_t h = blockIdx.x, kh = h / (sh.value_heads / sh.key_heads);
  const int64_t dk = sh.dk, dv = sh.dv, C = sh.channels, Nv = sh.value_heads, ld = dv + dk;
  const int64_t key_dim = sh.key_heads * dk, value_dim = Nv * dv;
  const int col = threadIdx.x % kStateColumns, quarter = threadIdx.x / kStateColumns;
  const int64_t e = static_cast<int64_t>(blockIdx.y) * kStateColumns + col;
  const bool live = e < dv;
  const int64_t slice = dk / kStateGroups, d0 = quarter * slice;
  float* part_w = smem;                                   // [4][C][32]
  float* part_q = part_w + kStateGroups * kC * kStateColumns;  // [4][C][32]
  float* vnew = part_q + kStateGroups * kC * kStateColumns;    // [C][32] V'
  float* S = state + h * dk * dv;
  float s[kMaxSliceRows];  // fully unrolled loops keep it in registers
  ANCHORAGE_UNROLL
  for (int r = 0; r < kMaxSliceRows; ++r) s[r] = r < slice && live ? S[(d0 + r) * dv + e] : 0.0f;
  const int64_t chunks = n <= kC - pos0 % kC ? 1 : 1 + (n - (kC - pos0 % kC) + kC - 1) / kC;
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t t = ChunkStart(c, pos0);
    const int64_t m = min(n - t, kC - (pos0 + t) % kC);
    const float* UW = scratch + (c * Nv + h) * ChunkScratchFloats(dk, dv);
    const float* QK = UW + kC * ld;
    const float* eg = QK + kC * kC;
    const float* tail = eg + kC;
    const float* q0 = conv + t * C + kh * dk;
    const float* k0 = conv + t * C + key_dim + kh * dk;
    for (int64_t i = 0; i < m; ++i) {
      float pw = 0.0f, pq = 0.0f;
      ANCHORAGE_UNROLL
      for (int r = 0; r < kMaxSliceRows; ++r) {
        if (r < slice) {
          pw = fmaf(UW[i * ld + dv + d0 + r], s[r], pw);
          pq = fmaf(eg[i] * q0[i * C + d0 + r], s[r], pq);
        }
      }
      part_w[(quarter * kC + i) * kStateColumns + col] = pw;
      part_q[(quarter * kC + i) * kStateColumns + col] = pq;
    }
    __syncthreads();
    for (int64_t i = quarter; i < m; i += kStateGroups) {
      float w_s = 0.0f;
      for (int g = 0; g < kStateGroups; ++g) w_s += part_w[(g * kC + i) * kStateColumns + col];
      vnew[i * kStateColumns + col] = live ? UW[i * ld + e] - w_s : 0.0f;
    }
    __syncthreads();
    for (int64_t i = quarter; i < m; i += kStateGroups) {
      float o = 0.0f;
      for (int g = 0; g < kStateGroups; ++g) o += part_q[(g * kC + i) * kStateColumns + col];
      for (int64_t j = 0; j <= i; ++j) o = fmaf(QK[i * kC + j], vnew[j * kStateColumns + col], o);
      if (live) core[(t + i) * value_dim + h * dv + e] = o;
    }
    ANCHORAGE_UNROLL
    for (int r = 0; r < kMaxSliceRows; ++r) {
      if (r < slice) {
        float acc = s[r] * eg[m - 1];
        for (int64_t j = 0; j < m; ++j) acc = fmaf(k0[j * C + d0 + r] * tail[j], vnew[j * kStateColumns + col], acc);
        s[r] = acc;
      }
    }
    __syncthreads();
  }
  ANCHORAGE_UNROLL
  for (int r = 0; r < kMaxSliceRows; ++r)
    if (r < slice && live) S[(d0 + r) * dv + e] = s[r];
}

// The one-token recurrence, a thread a state column (columns are independent), the rows in order.
// With z set, each row's output then takes the gated norm (as GatedNorm) before it is written.
__global__ void GatedDeltaRecurrentKernel(DeltaShape sh, const float* conv, const float* beta_in, const float* g_in,
                                          int64_t n, float* state, float* out, const float* z, const float* norm_w,
                                          float eps) {
  const int64_t h = blockIdx.x, kh = h / (sh.value_heads / sh.key_heads);
  const int64_t dk = sh.dk, dv = sh.dv, C = sh.channels, Nv = sh.value_heads;
  const int64_t key_dim = sh.key_heads * dk, value_dim = Nv * dv;
  float* S = state + h * dk * dv;
  for (int64_t t = 0; t < n; ++t) {
    const float* q = conv + t * C + kh * dk;
    const float* k = conv + t * C + key_dim + kh * dk;
    const float beta = beta_in[t * Nv + h];
    const float decay = expf(g_in[t * Nv + h]);
    float* o_row = out + t * value_dim + h * dv;
    float sq = 0.0f;
    for (int64_t e = threadIdx.x; e < dv; e += blockDim.x) {
      const float v = conv[t * C + 2 * key_dim + h * dv + e];
      float predicted = 0.0f;
      for (int64_t d = 0; d < dk; ++d) {
        const float s = S[d * dv + e] * decay;
        S[d * dv + e] = s;
        predicted = fmaf(k[d], s, predicted);
      }
      const float delta = beta * (v - predicted);
      float o = 0.0f;
      for (int64_t d = 0; d < dk; ++d) {
        const float s = fmaf(k[d], delta, S[d * dv + e]);
        S[d * dv + e] = s;
        o = fmaf(q[d], s, o);
      }
      o_row[e] = o;
      sq += o * o;
    }
    if (z == nullptr) continue;
    const float inv = 1.0f / sqrtf(BlockSum(sq) / static_cast<float>(dv) + eps);
    const float* z_row = z + t * value_dim + h * dv;
    for (int64_t e = threadIdx.x; e < dv; e += blockDim.x) o_row[e] = o_row[e] * inv * norm_w[e] * SiluOf(z_row[e]);
  }
}

__global__ void GatedNormKernel(float* core, const float* z, const float* w, int64_t heads, int64_t dv, float eps) {
  const int64_t t = blockIdx.x, h = blockIdx.y;
  float* o = core + (t * heads + h) * dv;
  const float* zr = z + (t * heads + h) * dv;
  float sq = 0.0f;
  for (int64_t e = threadIdx.x; e < dv; e += blockDim.x) sq += o[e] * o[e];
  const float inv = 1.0f / sqrtf(BlockSum(sq) / static_cast<float>(dv) + eps);
  for (int64_t e = threadIdx.x; e < dv; e += blockDim.x) o[e] = o[e] * inv * w[e] * SiluOf(zr[e]);
}

__global__ void NormRopeKernel(float* rows, int64_t row_stride, int64_t head_stride, int64_t head_dim, const float* w1,
                               float eps, const double* inv_freq, int64_t half, Position pos, bool rows_at_position, RopeAxes axes) {
  __shared__ float normed[kMaxHeadDim];
  const int64_t t = blockIdx.x, h = blockIdx.y, pos0 = At(pos);
  float* v = rows + ((rows_at_position ? pos0 : 0) + t) * row_stride + h * head_stride;
  float sq = 0.0f;
  for (int64_t i = threadIdx.x; i < head_dim; i += blockDim.x) sq += v[i] * v[i];
  const float inv = 1.0f / sqrtf(BlockSum(sq) / static_cast<float>(head_dim) + eps);
  for (int64_t i = threadIdx.x; i < head_dim; i += blockDim.x) normed[i] = v[i] * inv * w1[i];
  __syncthreads();
  for (int64_t i = threadIdx.x; i < head_dim; i += blockDim.x) {
    if (i >= 2 * half) {
      v[i] = normed[i];
      continue;
    }
    const int64_t pair = i < half ? i : i - half;
    const int axis = pair % 3 == 1 && pair < axes.h_limit ? 1 : pair % 3 == 2 && pair < axes.w_limit ? 2 : 0;
    const int64_t at = axes.positions != nullptr ? axes.positions[t * 3 + axis] : pos0 + t;
    const double angle = static_cast<double>(at) * inv_freq[pair];
    const float co = static_cast<float>(cos(angle)), si = static_cast<float>(sin(angle));
    const float x0 = normed[pair], x1 = normed[pair + half];
    v[i] = i < half ? x0 * co - x1 * si : x1 * co + x0 * si;
  }
}

constexpr int kHeadDimPerLane = kMaxHeadDim / 32;
constexpr int kQueryRows = 8;  // query positions a block, for each head of one kv group
constexpr int kKeyTile = 32;   // keys a tile, a lane a key

// Shared memory of the attention block: queries [group][8][hd], the key tile [32][hd + 1] (padded:
// lane j reads key j without bank conflicts), the value tile [32][hd], the probabilities [group][8][32].
int64_t AttentionSharedFloats(int64_t group, int64_t hd) {
  return group * kQueryRows * hd + kKeyTile * (hd + 1) + kKeyTile * hd + group * kQueryRows * kKeyTile;
}

// A block holds 8 query positions of every head of one kv group (a warp a head) and walks the keys
// in tiles of 32 from key 0, loading each tile once for the whole group. For each of its rows a warp
// takes the tile's scores (a lane a key, dot over d in order), their max and sum by butterfly (online
// softmax), and adds the values in key order (a lane 8 dims). A row uses only the keys up to its
// position and runs the same steps in whatever block it sits, so its bits are its own.
template <typename KvRows>
__global__ void AttentionKernel(AttentionShape shape, const float* q, int64_t q_stride, int64_t q_head_stride, int64_t n,
                                Position pos, KvRows k, KvRows v, const float* gate, float* out, int64_t out_stride) {
  ANCHORAGE_DYNAMIC_SHARED(float, smem);
  const int64_t pos0 = At(pos);
  const int64_t hd = shape.head_dim, group = shape.heads / shape.kv_heads;
  const int64_t kvh = blockIdx.y, t0 = static_cast<int64_t>(blockIdx.x) * kQueryRows;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t h = kvh * group + warp;
  const int64_t rows = n - t0 < kQueryRows ? n - t0 : kQueryRows;  // rows of this block that exist
  const int64_t kstride = hd + 1;
  float* queries = smem;                                   // [group][8][hd]
  float* keys = queries + group * kQueryRows * hd;         // [32][hd + 1]
  float* values = keys + kKeyTile * kstride;               // [32][hd]
  float* probs = values + kKeyTile * hd;                   // [group][8][32]
  float* my_queries = queries + warp * kQueryRows * hd;
  float* my_probs = probs + warp * kQueryRows * kKeyTile;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t d = lane; d < hd; d += 32) my_queries[r * hd + d] = q[(t0 + r) * q_stride + h * q_head_stride + d];
  float o[kQueryRows][kHeadDimPerLane];
  float running_max[kQueryRows], running_sum[kQueryRows];
  for (int r = 0; r < kQueryRows; ++r) {
    running_max[r] = -INFINITY;
    running_sum[r] = 0.0f;
    for (int c = 0; c < kHeadDimPerLane; ++c) o[r][c] = 0.0f;
  }
  // The last key row r reads: its position, or every key's last where the attention is bidirectional.
  const auto last_key_of = [&](int64_t r) { return shape.keys > 0 ? shape.keys - 1 : pos0 + t0 + r; };
  const int64_t last_key = last_key_of(rows - 1);  // the block's: keys 0..last_key
  for (int64_t s0 = 0; s0 <= last_key; s0 += kKeyTile) {
    __syncthreads();  // the previous tile is no longer read
    for (int64_t i = threadIdx.x; i < kKeyTile * hd; i += blockDim.x) {
      const int64_t j = i / hd, d = i % hd;
      const bool present = s0 + j <= last_key;
      keys[j * kstride + d] = present ? k.At(s0 + j, kvh * hd + d) : 0.0f;
      values[j * hd + d] = present ? v.At(s0 + j, kvh * hd + d) : 0.0f;
    }
    __syncthreads();
    float dots[kQueryRows];
    for (int r = 0; r < kQueryRows; ++r) dots[r] = 0.0f;
    for (int64_t d = 0; d < hd; ++d) {
      const float key = keys[lane * kstride + d];
      for (int r = 0; r < kQueryRows; ++r) dots[r] = fmaf(my_queries[r * hd + d], key, dots[r]);
    }
    for (int r = 0; r < rows; ++r) {
      const int64_t position = last_key_of(r);
      if (s0 > position) continue;  // this row's keys end before the tile (a later row's may not)
      const bool valid = s0 + lane <= position;
      const float score = valid ? dots[r] * shape.scale : -INFINITY;
      const float new_max = fmaxf(running_max[r], WarpMax(score));
      const float correction = expf(running_max[r] - new_max);
      const float p = valid ? expf(score - new_max) : 0.0f;
      running_sum[r] = running_sum[r] * correction + WarpSum(p);
      running_max[r] = new_max;
      my_probs[r * kKeyTile + lane] = p;
      for (int c = 0; c < kHeadDimPerLane; ++c) o[r][c] *= correction;
    }
    __syncwarp();
    for (int r = 0; r < rows; ++r) {
      const int64_t position = last_key_of(r);
      if (s0 > position) continue;
      const int64_t count = position - s0 + 1 < kKeyTile ? position - s0 + 1 : kKeyTile;
      for (int64_t j = 0; j < count; ++j) {
        const float pj = my_probs[r * kKeyTile + j];
        for (int c = 0; c < kHeadDimPerLane; ++c) {
          const int64_t d = lane + 32 * c;
          if (d < hd) o[r][c] = fmaf(pj, values[j * hd + d], o[r][c]);
        }
      }
    }
    __syncwarp();
  }
  for (int r = 0; r < rows; ++r) {
    const float inv = 1.0f / running_sum[r];
    for (int c = 0; c < kHeadDimPerLane; ++c) {
      const int64_t d = lane + 32 * c;
      if (d >= hd) continue;
      const float attended = o[r][c] * inv;
      out[(t0 + r) * out_stride + h * hd + d] =
          gate == nullptr ? attended : attended * SigmoidOf(gate[(t0 + r) * q_stride + h * q_head_stride + d]);
    }
  }
}

// A block a row: mean, then the variance about it, each by BlockSum.
__global__ void LayerNormRowsKernel(const float* x, const float* w, const float* b, int64_t width, float eps, float* y) {
  const float* xr = x + blockIdx.x * width;
  float* yr = y + blockIdx.x * width;
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) sum += xr[i];
  const float mean = BlockSum(sum) / static_cast<float>(width);
  float sq = 0.0f;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) sq += (xr[i] - mean) * (xr[i] - mean);
  const float inv = 1.0f / sqrtf(BlockSum(sq) / static_cast<float>(width) + eps);
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) yr[i] = (xr[i] - mean) * inv * w[i] + b[i];
}

__global__ void BiasActivationKernel(float* y, const float* bias, int64_t count, int64_t width, Activation act) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= count) return;
  const float v = y[i] + bias[i % width];
  if (act == Activation::kGeluTanh) {
    y[i] = 0.5f * v * (1.0f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v)));
  } else if (act == Activation::kGeluErf) {
    y[i] = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
  } else {
    y[i] = v;
  }
}

__global__ void RotateHalvesKernel(float* rows, int64_t row_stride, int64_t head_dim, const float* cos, const float* sin) {
  const int64_t t = blockIdx.x, half = head_dim / 2;
  float* v = rows + t * row_stride + blockIdx.y * head_dim;
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    const float co = cos[t * half + i], si = sin[t * half + i], a = v[i], b = v[i + half];
    v[i] = a * co - b * si;
    v[i + half] = b * co + a * si;
  }
}

// A thread a block of kKvFp8Block values of k or v: its scale from the largest magnitude, then each code.
__global__ void StoreFp8KvRowsKernel(const float* k, const float* v, int64_t blocks, int64_t width, Position pos, uint8_t* k_rows,
                                     uint8_t* v_rows) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= 2 * blocks) return;
  const int64_t b = i % blocks, row = b / (width / kKvFp8Block), first = b % (width / kKvFp8Block) * kKvFp8Block;
  const float* from = (i < blocks ? k : v) + row * width + first;
  uint8_t* to = (i < blocks ? k_rows : v_rows) + (At(pos) + row) * (width + width / kKvFp8Block);
  float amax = 0.0f;
  for (int64_t j = 0; j < kKvFp8Block; ++j) amax = fabsf(from[j]) > amax ? fabsf(from[j]) : amax;
  const int e = Fp8KvExponent(amax);
  const float inverse = __uint_as_float(static_cast<uint32_t>(127 - e) << 23);
  for (int64_t j = 0; j < kKvFp8Block; ++j) to[first + j] = Fp8Bits(from[j] * inverse);
  to[width + first / kKvFp8Block] = static_cast<uint8_t>(127 + e);
}

__global__ void StoreKvRowsKernel(const float* k, const float* v, int64_t count, int64_t width, Position pos, void* k_rows,
                                  void* v_rows, KvDtype dtype) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= count) return;
  const int64_t at = At(pos) * width + i;
  if (dtype == KvDtype::kBf16) {
    static_cast<uint16_t*>(k_rows)[at] = Bf16Bits(k[i]);
    static_cast<uint16_t*>(v_rows)[at] = Bf16Bits(v[i]);
  } else {
    static_cast<float*>(k_rows)[at] = k[i];
    static_cast<float*>(v_rows)[at] = v[i];
  }
}

}  // namespace

void StoreKvRows(const float* k, const float* v, int64_t n, int64_t width, Position pos, const KvBuffers& rows, Stream s) {
  if (n > 0 && rows.dtype == KvDtype::kFp8) {
    const int64_t blocks = n * width / kKvFp8Block;
    ANCHORAGE_LAUNCH(StoreFp8KvRowsKernel, Blocks(2 * blocks), kBlock, 0, s)(k, v, blocks, width, pos, static_cast<uint8_t*>(rows.k),
                                                                            static_cast<uint8_t*>(rows.v));
  } else if (n > 0)
    ANCHORAGE_LAUNCH(StoreKvRowsKernel, Blocks(n * width), kBlock, 0, s)(k, v, n * width, width, pos, rows.k, rows.v, rows.dtype);
}

void EmbedRows(const uint16_t* table, const int32_t* ids, int64_t n, int64_t width, float* x, Stream s, const Q8Weights& q8) {
  if (n > 0) ANCHORAGE_LAUNCH(EmbedRowsKernel, static_cast<unsigned>(n), kBlock, 0, s)(table, q8, ids, width, x);
}

void RmsNormRows(const float* x, const float* w1, int64_t n, int64_t width, float eps, float* y, Stream s) {
  if (n > 0) ANCHORAGE_LAUNCH(RmsNormRowsKernel, static_cast<unsigned>(n), kBlock, 0, s)(x, w1, width, eps, y);
}

void SplitBf16(const float* x, int64_t n, int64_t width, int64_t rows, bool low, uint16_t* out, Stream s) {
  if (n > 0) ANCHORAGE_LAUNCH(SplitBf16Kernel, Blocks(n * width), kBlock, 0, s)(x, n * width, rows * width, low, out);
}

void SumHalves(const float* halves, int64_t n, int64_t width, int64_t rows, bool low, float* y, int64_t y_stride, Stream s) {
  if (n > 0) ANCHORAGE_LAUNCH(SumHalvesKernel, Blocks(n * width), kBlock, 0, s)(halves, n, width, rows * width, low, y, y_stride);
}

void Gemv(const uint16_t* w, int64_t rows, int64_t cols, const float* x, int64_t n, float* y, Stream s) {
  if (n > 0 && rows > 0) ANCHORAGE_LAUNCH(GemvKernel, Blocks(rows, kGemvWarps), 32 * kGemvWarps, 0, s)(w, Q8Weights{}, rows, cols, x, n, y);
}

void GemvQ8(const Q8Weights& w, int64_t rows, int64_t cols, const float* x, int64_t n, float* y, Stream s) {
  if (n > 0 && rows > 0) ANCHORAGE_LAUNCH(GemvKernel, Blocks(rows, kGemvWarps), 32 * kGemvWarps, 0, s)(nullptr, w, rows, cols, x, n, y);
}

template <typename Weights>
void LaunchGemmSimt(Weights w, int64_t N, int64_t K, const float* x, int64_t n, float* y, int64_t y_stride, Stream s) {
  if (n <= 0 || N <= 0) return;
  const dim3 grid(static_cast<unsigned>((N + kSimtTile - 1) / kSimtTile), static_cast<unsigned>((n + kSimtTile - 1) / kSimtTile));
  ANCHORAGE_LAUNCH(GemmSimtKernel<Weights>, grid, 256, 0, s)(w, N, K, x, n, y, y_stride);
}

void GemmSimt(const uint16_t* w, int64_t N, int64_t K, const float* x, int64_t n, float* y, int64_t y_stride, Stream s) {
  LaunchGemmSimt(Bf16Rows{w}, N, K, x, n, y, y_stride, s);
}

void GemmSimtQ8(const Q8Weights& w, int64_t N, int64_t K, const float* x, int64_t n, float* y, int64_t y_stride, Stream s) {
  LaunchGemmSimt(Q8Rows{w}, N, K, x, n, y, y_stride, s);
}

void JoinRows(const float* left, const float* right, int64_t n, int64_t width, float* out, Stream s) {
  if (n > 0) ANCHORAGE_LAUNCH(JoinRowsKernel, Blocks(2 * n * width), kBlock, 0, s)(left, right, n, width, out);
}

void AddRows(const float* from, int64_t count, float* to, Stream s) {
  if (count > 0) ANCHORAGE_LAUNCH(AddRowsKernel, Blocks(count), kBlock, 0, s)(from, count, to);
}

void AddRmsNorm(float* x, const float* add, const float* w1, int64_t n, int64_t width, float eps, float* y, Stream s) {
  if (n > 0) ANCHORAGE_LAUNCH(AddRmsNormKernel, static_cast<unsigned>(n), kBlock, 0, s)(x, add, w1, width, eps, y);
}

void SwiGlu(float* gate, const float* up, int64_t count, Stream s) {
  if (count > 0) ANCHORAGE_LAUNCH(SwiGluKernel, Blocks(count), kBlock, 0, s)(gate, up, count);
}

void GemvMany(const GemvSet& set, int64_t cols, const float* x, Stream s) {
  int64_t rows = 0;
  for (int m = 0; m < set.count; ++m) rows += set.rows[m];
  if (rows > 0) ANCHORAGE_LAUNCH(GemvSetKernel, Blocks(rows, kGemvWarps), 32 * kGemvWarps, 0, s)(set, cols, x);
}

void GemvSwiGlu(const uint16_t* gate, const uint16_t* up, int64_t rows, int64_t cols, const float* x, float* y, Stream s,
                const Q8Weights& gate_q8, const Q8Weights& up_q8) {
  if (rows > 0)
    ANCHORAGE_LAUNCH(GemvSwiGluKernel, Blocks(rows, kGemvWarps), 32 * kGemvWarps, 0, s)(gate, up, gate_q8, up_q8, rows, cols, x, y);
}

void ConvNormGatesRows(const ConvNormGates& args, int64_t n, Stream s) {
  if (n <= 0) return;
  const int64_t value_blocks = (args.channels - 2 * args.key_heads * args.dk + 127) / 128;
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(2 * args.key_heads + value_blocks + 1));
  ANCHORAGE_LAUNCH(ConvNormGatesKernel, grid, 128, 0, s)(args);
}

void NextTail(const float* qkv, float* tail, int64_t n, int64_t channels, int64_t taps, Stream s) {
  if (taps > 1) ANCHORAGE_LAUNCH(NextTailKernel, 1, 1024, 0, s)(qkv, tail, n, channels, taps - 1);
}

int64_t GatedDeltaChunkedSharedBytes(const DeltaShape& shape) {
  const int64_t prep = 2 * kC + kC * kC + kC * (shape.dv + shape.dk);
  const int64_t pass = 2 * kStateGroups * kC * kStateColumns + kC * kStateColumns;
  return static_cast<int64_t>(sizeof(float)) * (prep > pass ? prep : pass);
}

int64_t GatedDeltaChunkedScratchFloats(const DeltaShape& shape, int64_t rows) {
  const int64_t chunks = rows / kC + 2;  // a call of `rows` rows from any position spans at most this many chunks
  return chunks * shape.value_heads * ChunkScratchFloats(shape.dk, shape.dv);
}

bool GatedDeltaChunkedSupports(const DeltaShape& shape) {
  return shape.dk % kStateGroups == 0 && shape.dk / kStateGroups <= kMaxSliceRows;
}

void GatedDeltaChunked(const DeltaShape& shape, const float* conv, const float* beta, const float* g, int64_t n,
                       int64_t pos0, float* state, float* out, float* scratch, Stream s) {
  if (n <= 0) return;
  const int64_t first = kC - pos0 % kC;
  const int64_t chunks = n <= first ? 1 : 1 + (n - first + kC - 1) / kC;
  const int prep_bytes = static_cast<int>(sizeof(float) * (2 * kC + kC * kC + kC * (shape.dv + shape.dk)));
  cudaFuncSetAttribute(DeltaChunkPrepKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, prep_bytes);
  ANCHORAGE_LAUNCH(DeltaChunkPrepKernel, dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(shape.value_heads)),
                   kDeltaThreads, prep_bytes, s)(shape, conv, beta, g, n, pos0, scratch);
  const int pass_bytes = static_cast<int>(sizeof(float) * (2 * kStateGroups * kC * kStateColumns + kC * kStateColumns));
  cudaFuncSetAttribute(DeltaStatePassKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, pass_bytes);
  const dim3 grid(static_cast<unsigned>(shape.value_heads), static_cast<unsigned>((shape.dv + kStateColumns - 1) / kStateColumns));
  ANCHORAGE_LAUNCH(DeltaStatePassKernel, grid, kStateColumns * kStateGroups, pass_bytes, s)(shape, conv, n, pos0, scratch, state, out);
}

void GatedDeltaRecurrent(const DeltaShape& shape, const float* conv, const float* beta, const float* g, int64_t n,
                         float* state, float* out, const float* z, const float* norm_w, float eps, Stream s) {
  if (n > 0)
    ANCHORAGE_LAUNCH(GatedDeltaRecurrentKernel, static_cast<unsigned>(shape.value_heads), kDeltaThreads, 0, s)(
        shape, conv, beta, g, n, state, out, z, norm_w, eps);
}

void GatedNorm(float* core, const float* z, const float* w, int64_t n, int64_t heads, int64_t dv, float eps, Stream s) {
  if (n > 0)
    ANCHORAGE_LAUNCH(GatedNormKernel, dim3(static_cast<unsigned>(n), static_cast<unsigned>(heads)), 128, 0, s)(core, z, w, heads, dv, eps);
}

void NormRope(float* rows, int64_t n, int64_t row_stride, int64_t heads, int64_t head_stride, int64_t head_dim,
              const float* w1, float eps, const double* inv_freq, int64_t half, Position pos, bool rows_at_position,
              Stream s, RopeAxes axes) {
  if (n > 0)
    ANCHORAGE_LAUNCH(NormRopeKernel, dim3(static_cast<unsigned>(n), static_cast<unsigned>(heads)), 128, 0, s)(
        rows, row_stride, head_stride, head_dim, w1, eps, inv_freq, half, pos, rows_at_position, axes);
}

namespace {

template <typename KvRows>
void LaunchAttention(const AttentionShape& shape, const float* q, int64_t q_stride, int64_t q_head_stride, int64_t n,
                     Position pos0, KvRows k, KvRows v, const float* gate, float* out, int64_t out_stride, Stream s) {
  const int64_t group = shape.heads / shape.kv_heads;
  const int bytes = static_cast<int>(AttentionSharedBytes(shape));
  cudaFuncSetAttribute(AttentionKernel<KvRows>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  const dim3 grid(static_cast<unsigned>((n + kQueryRows - 1) / kQueryRows), static_cast<unsigned>(shape.kv_heads));
  ANCHORAGE_LAUNCH(AttentionKernel<KvRows>, grid, static_cast<unsigned>(32 * group), bytes, s)(
      shape, q, q_stride, q_head_stride, n, pos0, k, v, gate, out, out_stride);
}

template <typename KvRows>
int LeastMaxThreads(int least, cudaError_t* error) {
  cudaFuncAttributes attributes{};
  const cudaError_t read = cudaFuncGetAttributes(&attributes, AttentionKernel<KvRows>);
  if (read != cudaSuccess) *error = read;
  return attributes.maxThreadsPerBlock < least ? attributes.maxThreadsPerBlock : least;
}

}  // namespace

void Attention(const AttentionShape& shape, const float* q, int64_t q_stride, int64_t q_head_stride, int64_t n,
               Position pos0, const KvBuffers& rows, int64_t kv_width, const float* gate, float* out, int64_t out_stride, Stream s) {
  if (n <= 0) return;
  if (rows.dtype == KvDtype::kFp8)
    LaunchAttention(shape, q, q_stride, q_head_stride, n, pos0, Fp8Kv{static_cast<const uint8_t*>(rows.k), kv_width},
                    Fp8Kv{static_cast<const uint8_t*>(rows.v), kv_width}, gate, out, out_stride, s);
  else if (rows.dtype == KvDtype::kBf16)
    LaunchAttention(shape, q, q_stride, q_head_stride, n, pos0, Bf16Kv{static_cast<const uint16_t*>(rows.k), kv_width},
                    Bf16Kv{static_cast<const uint16_t*>(rows.v), kv_width}, gate, out, out_stride, s);
  else
    LaunchAttention(shape, q, q_stride, q_head_stride, n, pos0, F32Kv{static_cast<const float*>(rows.k), kv_width},
                    F32Kv{static_cast<const float*>(rows.v), kv_width}, gate, out, out_stride, s);
}

void LayerNormRows(const float* x, const float* w, const float* b, int64_t n, int64_t width, float eps, float* y, Stream s) {
  if (n > 0) ANCHORAGE_LAUNCH(LayerNormRowsKernel, static_cast<unsigned>(n), 128, 0, s)(x, w, b, width, eps, y);
}

void BiasActivation(float* y, const float* bias, int64_t n, int64_t width, Activation act, Stream s) {
  if (n > 0) ANCHORAGE_LAUNCH(BiasActivationKernel, Blocks(n * width), kBlock, 0, s)(y, bias, n * width, width, act);
}

void RotateHalves(float* rows, int64_t n, int64_t row_stride, int64_t heads, int64_t head_dim, const float* cos, const float* sin, Stream s) {
  if (n > 0)
    ANCHORAGE_LAUNCH(RotateHalvesKernel, dim3(static_cast<unsigned>(n), static_cast<unsigned>(heads)), 64, 0, s)(rows, row_stride, head_dim, cos, sin);
}

int64_t AttentionSharedBytes(const AttentionShape& shape) {
  return static_cast<int64_t>(sizeof(float)) * AttentionSharedFloats(shape.heads / shape.kv_heads, shape.head_dim);
}

int AttentionMaxThreads(int* threads) {
  cudaError_t error = cudaSuccess;
  int least = 1 << 30;
  least = LeastMaxThreads<F32Kv>(least, &error);
  least = LeastMaxThreads<Bf16Kv>(least, &error);
  least = LeastMaxThreads<Fp8Kv>(least, &error);
  *threads = error == cudaSuccess ? least : 0;
  return error;
}

}  // namespace anchorage::cuda
