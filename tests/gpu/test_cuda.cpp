// The CUDA backend against the CPU backend and against itself: kernels within bounds derived from
// their arithmetic, the whole forward within 1e-3 of the CPU's, resume at every 64-line bit-equal to
// a cold prefill, rows independent of the call, and the same run twice giving the same bits.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <unistd.h>

#include "engine/compute/cpu/attention.h"
#include "engine/compute/cpu/gated_delta.h"
#include "engine/compute/cuda/device.h"
#include "engine/compute/cuda/gemm.h"
#include "engine/compute/cuda/kernels.h"
#include "engine/core/bf16.h"
#include "engine/core/fp8.h"
#include "engine/core/thread_pool.h"
#include "engine/runtime/cuda_backend.h"
#include "engine/runtime/cuda_forward.h"
#include "engine/runtime/cuda_plugin.h"
#include "engine/runtime/forward.h"
#include "engine/runtime/generator.h"
#include "engine/runtime/vision_tower.h"
#include "gpu_check.h"
#include "../engine/reference_forward.h"
#include "../engine/test_runtime_util.h"

#ifdef ANCHORAGE_CUDA_EMULATED
#include <cuda_runtime_api.h>
#endif

namespace {

using namespace anchorage;
using gpu_check::Failure;
using gpu_check::Must;

std::vector<float> RandomFloats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

template <typename T>
cuda::DeviceBuffer ToDevice(const std::vector<T>& host) {
  auto buffer = Must(cuda::DeviceBuffer::Allocate(host.size() * sizeof(T), "test data"), "allocating");
  Must(cuda::CopyToDevice(buffer.data(), host.data(), host.size() * sizeof(T), nullptr), "copying to the device");
  return buffer;
}

std::vector<float> ToHost(const cuda::DeviceBuffer& buffer, size_t floats) {
  std::vector<float> host(floats);
  Must(cuda::CopyToHost(host.data(), buffer.data(), floats * sizeof(float), nullptr), "copying to the host");
  return host;
}

// The largest |a - b|; infinity where either holds a NaN.
float MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) throw Failure{"sizes differ: " + std::to_string(a.size()) + " vs " + std::to_string(b.size())};
  float m = 0.0f;
  for (size_t i = 0; i < a.size(); ++i) {
    const float d = std::fabs(a[i] - b[i]);
    if (!(d <= m)) m = std::isnan(d) ? INFINITY : d;
  }
  return m;
}

template <typename T>
bool SameBits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Row j of bf16 weights w [., K] times x in double: the exact product and the sum of |terms|.
struct DotReference {
  double exact = 0.0, magnitude = 0.0;
};
DotReference Reference(const std::vector<uint16_t>& w, int64_t j, const float* x, int64_t K) {
  DotReference r;
  for (int64_t i = 0; i < K; ++i) {
    const double p = static_cast<double>(Bf16ToFloat(w[static_cast<size_t>(j * K + i)])) * x[i];
    r.exact += p;
    r.magnitude += std::fabs(p);
  }
  return r;
}

// This process's own folder (CTest runs the test's variants at once), removed when it ends.
struct ProcessTempDir {
  std::filesystem::path path = std::filesystem::temp_directory_path() / ("anchorage-test-cuda-" + std::to_string(getpid()));
  ~ProcessTempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
};

std::string TempDir(const std::string& name) {
  static ProcessTempDir process;
  const std::string dir = (process.path / name).string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// y = x W^T through the split products: within sum|w x| (2^-17 + (K + 2) 2^-23) of the double
// product, and each row's bits those of a one-row call.
void GemmMatchesReferenceAndRowsAreIndependent() {
  const int64_t N = 328, K = 264;
  std::vector<float> wf = RandomFloats(static_cast<size_t>(N * K), 1);
  std::vector<uint16_t> w(wf.size());
  for (size_t i = 0; i < wf.size(); ++i) w[i] = FloatToBf16(wf[i]);
  auto gemm = Must(cuda::LtGemm::Create(128, K, N, nullptr), "creating the GEMM");
  cuda::DeviceBuffer dw = ToDevice(w);
  Must(gemm->Prepare(N, K, static_cast<const uint16_t*>(dw.data())), "choosing the algorithm");
  std::printf("       %s", gemm->Describe().c_str());
  for (int64_t n : {1, 2, 3, 17, 100, 128}) {
    std::vector<float> x = RandomFloats(static_cast<size_t>(n * K), 100 + static_cast<uint32_t>(n), -3.0f, 3.0f);
    cuda::DeviceBuffer dx = ToDevice(x);
    auto dy = Must(cuda::DeviceBuffer::Allocate(static_cast<size_t>(n * N) * 4, "y"), "allocating");
    Must(gemm->Run(static_cast<const uint16_t*>(dw.data()), N, K, dx.floats(), n, dy.floats(), N), "running");
    Must(cuda::Synchronize(nullptr, "the product"), "synchronizing");
    const std::vector<float> y = ToHost(dy, static_cast<size_t>(n * N));
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t j = 0; j < N; ++j) {
        const DotReference r = Reference(w, j, x.data() + t * K, K);
        const double bound = r.magnitude * (std::ldexp(1.0, -17) + (K + 2) * std::ldexp(1.0, -23));
        GPU_CHECK_MSG(std::fabs(y[static_cast<size_t>(t * N + j)] - r.exact) <= bound,
                      "row " + std::to_string(t) + " col " + std::to_string(j) + " of " + std::to_string(n));
      }
      // The same row alone.
      std::vector<float> row(x.begin() + t * K, x.begin() + (t + 1) * K);
      cuda::DeviceBuffer drow = ToDevice(row);
      auto dsingle = Must(cuda::DeviceBuffer::Allocate(static_cast<size_t>(N) * 4, "y"), "allocating");
      Must(gemm->Run(static_cast<const uint16_t*>(dw.data()), N, K, drow.floats(), 1, dsingle.floats(), N), "running");
      const std::vector<float> single = ToHost(dsingle, static_cast<size_t>(N));
      GPU_CHECK_MSG(std::memcmp(single.data(), y.data() + t * N, static_cast<size_t>(N) * 4) == 0,
                    "row " + std::to_string(t) + " of " + std::to_string(n) + " differs from the one-row call");
    }
  }
}

// The CUDA-core fallback GEMM: fp32 products in k order, within sum|w x| K 2^-23 of double, and
// each row's bits those of a call of that row alone.
void GemmSimtMatchesReferenceAndRowsAreIndependent() {
  const int64_t N = 130, K = 77, n = 70;
  std::vector<float> wf = RandomFloats(static_cast<size_t>(N * K), 4);
  std::vector<uint16_t> w(wf.size());
  for (size_t i = 0; i < wf.size(); ++i) w[i] = FloatToBf16(wf[i]);
  const std::vector<float> x = RandomFloats(static_cast<size_t>(n * K), 5, -2.0f, 2.0f);
  cuda::DeviceBuffer dw = ToDevice(w), dx = ToDevice(x);
  auto dy = Must(cuda::DeviceBuffer::Allocate(static_cast<size_t>(n * N) * 4, "y"), "allocating");
  const auto* pw = static_cast<const uint16_t*>(dw.data());
  cuda::GemmSimt(pw, N, K, dx.floats(), n, dy.floats(), N, nullptr);
  const std::vector<float> y = ToHost(dy, static_cast<size_t>(n * N));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < N; ++j) {
      const DotReference r = Reference(w, j, x.data() + t * K, K);
      GPU_CHECK_MSG(std::fabs(y[static_cast<size_t>(t * N + j)] - r.exact) <= r.magnitude * K * std::ldexp(1.0, -23),
                    "row " + std::to_string(t) + " col " + std::to_string(j));
    }
  for (int64_t t : {int64_t{0}, int64_t{63}, int64_t{64}, n - 1}) {
    auto drow = Must(cuda::DeviceBuffer::Allocate(static_cast<size_t>(N) * 4, "row"), "allocating");
    cuda::GemmSimt(pw, N, K, dx.floats() + t * K, 1, drow.floats(), N, nullptr);
    const std::vector<float> row = ToHost(drow, static_cast<size_t>(N));
    GPU_CHECK_MSG(std::memcmp(row.data(), y.data() + t * N, static_cast<size_t>(N) * 4) == 0, "row " + std::to_string(t));
  }
}

// The decode GEMV: fp32 products of bf16 weights, within sum|w x| K 2^-23 of double; K = 520 takes
// the 8-wide loads, K = 522 the one-at-a-time loop. 11 rows of x (a group of 8, then 3) each get the
// bits of a one-row call: draft windows rely on it.
void GemvMatchesReference(int64_t K) {
  const int64_t N = 77, n = 11;
  std::vector<float> wf = RandomFloats(static_cast<size_t>(N * K), 2);
  std::vector<uint16_t> w(wf.size());
  for (size_t i = 0; i < wf.size(); ++i) w[i] = FloatToBf16(wf[i]);
  const std::vector<float> x = RandomFloats(static_cast<size_t>(n * K), 3, -2.0f, 2.0f);
  cuda::DeviceBuffer dw = ToDevice(w), dx = ToDevice(x);
  const auto* pw = static_cast<const uint16_t*>(dw.data());
  auto dy = Must(cuda::DeviceBuffer::Allocate(static_cast<size_t>(n * N) * 4, "y"), "allocating");
  auto one = Must(cuda::DeviceBuffer::Allocate(static_cast<size_t>(N) * 4, "y of one row"), "allocating");
  cuda::Gemv(pw, N, K, dx.floats(), n, dy.floats(), nullptr);
  Must(cuda::Synchronize(nullptr, "the GEMV"), "synchronizing");
  const std::vector<float> y = ToHost(dy, static_cast<size_t>(n * N));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < N; ++j) {
      const DotReference r = Reference(w, j, x.data() + t * K, K);
      GPU_CHECK_MSG(std::fabs(y[static_cast<size_t>(t * N + j)] - r.exact) <= r.magnitude * K * std::ldexp(1.0, -23),
                    "row " + std::to_string(t) + ", output " + std::to_string(j));
    }
    cuda::Gemv(pw, N, K, dx.floats() + t * K, 1, one.floats(), nullptr);
    const std::vector<float> alone = ToHost(one, static_cast<size_t>(N));
    GPU_CHECK_MSG(std::memcmp(alone.data(), y.data() + t * N, static_cast<size_t>(N) * 4) == 0, "row " + std::to_string(t) + " alone");
  }
}

// The launches that fuse steps for decode give the bits of the steps one by one.
void FusedLaunchesGiveTheStepsBits() {
  const int64_t K = 264, rows_a = 40, rows_b = 72;
  std::vector<uint16_t> wa(static_cast<size_t>(rows_a * K)), wb(static_cast<size_t>(rows_b * K));
  const std::vector<float> fa = RandomFloats(wa.size(), 61), fb = RandomFloats(wb.size(), 62);
  for (size_t i = 0; i < wa.size(); ++i) wa[i] = FloatToBf16(fa[i]);
  for (size_t i = 0; i < wb.size(); ++i) wb[i] = FloatToBf16(fb[i]);
  const std::vector<float> x = RandomFloats(static_cast<size_t>(K), 63, -2.0f, 2.0f);
  cuda::DeviceBuffer dwa = ToDevice(wa), dwb = ToDevice(wb), dx = ToDevice(x);
  const auto* pa = static_cast<const uint16_t*>(dwa.data());
  const auto* pb = static_cast<const uint16_t*>(dwb.data());
  auto alloc = [](int64_t floats) { return Must(cuda::DeviceBuffer::Allocate(static_cast<size_t>(floats) * 4, "out"), "allocating"); };
  // GemvMany against Gemv.
  cuda::DeviceBuffer ya = alloc(rows_a), yb = alloc(rows_b), set_a = alloc(rows_a), set_b = alloc(rows_b);
  cuda::Gemv(pa, rows_a, K, dx.floats(), 1, ya.floats(), nullptr);
  cuda::Gemv(pb, rows_b, K, dx.floats(), 1, yb.floats(), nullptr);
  cuda::GemvSet set;
  set.count = 2;
  set.w[0] = pa;
  set.rows[0] = rows_a;
  set.y[0] = set_a.floats();
  set.w[1] = pb;
  set.rows[1] = rows_b;
  set.y[1] = set_b.floats();
  cuda::GemvMany(set, K, dx.floats(), nullptr);
  GPU_CHECK(SameBits(ToHost(set_a, rows_a), ToHost(ya, rows_a)));
  GPU_CHECK(SameBits(ToHost(set_b, rows_b), ToHost(yb, rows_b)));
  // GemvSwiGlu against two Gemv and SwiGlu (gate: the first 40 rows of b).
  cuda::DeviceBuffer fused = alloc(rows_a);
  cuda::GemvSwiGlu(pb, pa, rows_a, K, dx.floats(), fused.floats(), nullptr);
  cuda::SwiGlu(yb.floats(), ya.floats(), rows_a, nullptr);
  GPU_CHECK(SameBits(ToHost(fused, rows_a), ToHost(yb, rows_a)));
  // AddRmsNorm against AddRows and RmsNormRows.
  const int64_t n = 5, width = 300;
  const std::vector<float> h = RandomFloats(static_cast<size_t>(n * width), 64), add = RandomFloats(h.size(), 65);
  const std::vector<float> w1 = RandomFloats(static_cast<size_t>(width), 66, 0.5f, 1.5f);
  cuda::DeviceBuffer x1 = ToDevice(h), x2 = ToDevice(h), dadd = ToDevice(add), dw1 = ToDevice(w1), y1 = alloc(n * width),
                     y2 = alloc(n * width);
  cuda::AddRmsNorm(x1.floats(), dadd.floats(), dw1.floats(), n, width, 1e-6f, y1.floats(), nullptr);
  cuda::AddRows(dadd.floats(), n * width, x2.floats(), nullptr);
  cuda::RmsNormRows(x2.floats(), dw1.floats(), n, width, 1e-6f, y2.floats(), nullptr);
  GPU_CHECK(SameBits(ToHost(x1, h.size()), ToHost(x2, h.size())));
  GPU_CHECK(SameBits(ToHost(y1, h.size()), ToHost(y2, h.size())));
}

// Inputs of the delta rule as the conv leaves them: q and k L2-normalised (q also / sqrt(dk)).
struct DeltaCase {
  cuda::DeltaShape shape{2, 4, 128, 128, 0};
  int64_t n = 150;
  std::vector<float> conv, beta, g;
  DeltaCase() {
    shape.channels = 2 * shape.key_heads * shape.dk + shape.value_heads * shape.dv;
    conv = RandomFloats(static_cast<size_t>(n * shape.channels), 7);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < 2 * shape.key_heads; ++h) {
        float* v = conv.data() + t * shape.channels + h * shape.dk;
        double sq = 0.0;
        for (int64_t i = 0; i < shape.dk; ++i) sq += v[i] * v[i];
        const float scale = static_cast<float>(1.0 / std::sqrt(sq)) * (h < shape.key_heads ? 1.0f / std::sqrt(128.0f) : 1.0f);
        for (int64_t i = 0; i < shape.dk; ++i) v[i] *= scale;
      }
    beta = RandomFloats(static_cast<size_t>(n * shape.value_heads), 8, 0.05f, 0.95f);
    g = RandomFloats(static_cast<size_t>(n * shape.value_heads), 9, -0.5f, -0.001f);
  }
  cpu::DeltaInputs Inputs(int64_t t, int64_t h) const {
    const int64_t kh = h / (shape.value_heads / shape.key_heads), KD = shape.key_heads * shape.dk;
    cpu::DeltaInputs in;
    in.q = conv.data() + t * shape.channels + kh * shape.dk;
    in.k = conv.data() + t * shape.channels + KD + kh * shape.dk;
    in.v = conv.data() + t * shape.channels + 2 * KD + h * shape.dv;
    in.q_stride = in.k_stride = in.v_stride = shape.channels;
    in.beta = beta.data() + t * shape.value_heads + h;
    in.g = g.data() + t * shape.value_heads + h;
    in.beta_stride = in.g_stride = shape.value_heads;
    return in;
  }
};

// The chunked and recurrent delta rule against the CPU's, chunks on the same absolute lines.
void GatedDeltaMatchesCpu() {
  const DeltaCase c;
  const cuda::DeltaShape& sh = c.shape;
  const int64_t VD = sh.value_heads * sh.dv, state_floats = sh.value_heads * sh.dk * sh.dv;
  const std::vector<float> state0 = RandomFloats(static_cast<size_t>(state_floats), 10, -0.1f, 0.1f);
  for (bool chunked : {true, false}) {
    const int64_t pos0 = 37;
    std::vector<float> cpu_state = state0, cpu_out(static_cast<size_t>(c.n * VD));
    for (int64_t h = 0; h < sh.value_heads; ++h) {
      float* S = cpu_state.data() + h * sh.dk * sh.dv;
      for (int64_t t = 0; t < c.n;) {
        const int64_t m = chunked ? std::min(c.n - t, 64 - (pos0 + t) % 64) : c.n - t;
        if (chunked) cpu::GatedDeltaChunk(c.Inputs(t, h), m, sh.dk, sh.dv, S, cpu_out.data() + t * VD + h * sh.dv, VD);
        else cpu::GatedDeltaRecurrent(c.Inputs(t, h), m, sh.dk, sh.dv, S, cpu_out.data() + t * VD + h * sh.dv, VD);
        t += m;
      }
    }
    cuda::DeviceBuffer dconv = ToDevice(c.conv), dbeta = ToDevice(c.beta), dg = ToDevice(c.g), dstate = ToDevice(state0);
    auto dout = Must(cuda::DeviceBuffer::Allocate(static_cast<size_t>(c.n * VD) * 4, "out"), "allocating");
    auto scratch = Must(cuda::DeviceBuffer::Allocate(static_cast<size_t>(cuda::GatedDeltaChunkedScratchFloats(sh, c.n)) * 4, "scratch"),
                        "allocating");
    if (chunked)
      cuda::GatedDeltaChunked(sh, dconv.floats(), dbeta.floats(), dg.floats(), c.n, pos0, dstate.floats(), dout.floats(),
                              scratch.floats(), nullptr);
    else
      cuda::GatedDeltaRecurrent(sh, dconv.floats(), dbeta.floats(), dg.floats(), c.n, dstate.floats(), dout.floats(), nullptr,
                                nullptr, 0.0f, nullptr);
    Must(cuda::Synchronize(nullptr, "the delta rule"), "synchronizing");
    if (!chunked) {  // the recurrence with the gated norm fused gives the bits of the two launches
      const std::vector<float> z = RandomFloats(static_cast<size_t>(c.n * VD), 14);
      const std::vector<float> norm_w = RandomFloats(static_cast<size_t>(sh.dv), 15, 0.5f, 1.5f);
      cuda::DeviceBuffer dz = ToDevice(z), dnorm = ToDevice(norm_w), dstate2 = ToDevice(state0);
      auto fused = Must(cuda::DeviceBuffer::Allocate(static_cast<size_t>(c.n * VD) * 4, "out"), "allocating");
      cuda::GatedDeltaRecurrent(sh, dconv.floats(), dbeta.floats(), dg.floats(), c.n, dstate2.floats(), fused.floats(), dz.floats(),
                                dnorm.floats(), 1e-6f, nullptr);
      auto separate = Must(cuda::DeviceBuffer::Allocate(static_cast<size_t>(c.n * VD) * 4, "out"), "allocating");
      Must(cuda::CopyOnDevice(separate.data(), dout.data(), static_cast<size_t>(c.n * VD) * 4, nullptr), "copying");
      cuda::GatedNorm(separate.floats(), dz.floats(), dnorm.floats(), c.n, sh.value_heads, sh.dv, 1e-6f, nullptr);
      GPU_CHECK(SameBits(ToHost(fused, cpu_out.size()), ToHost(separate, cpu_out.size())));
    }
    const float out_diff = MaxAbsDiff(ToHost(dout, cpu_out.size()), cpu_out);
    const float state_diff = MaxAbsDiff(ToHost(dstate, cpu_state.size()), cpu_state);
    std::printf("       delta rule (%s): max |out diff| %.3g, max |state diff| %.3g\n", chunked ? "chunked" : "recurrent", out_diff, state_diff);
    GPU_CHECK(out_diff <= 1e-4f);
    GPU_CHECK(state_diff <= 1e-4f);
  }
}

// Prefill attention against the CPU's, and each query row's bits those of a call of that row alone.
void AttentionMatchesCpuAndRowsAreIndependent() {
  const cuda::AttentionShape shape{4, 2, 256, 1.0f / 16.0f};
  const int64_t pos0 = 45, n = 70, KW = shape.kv_heads * shape.head_dim, QW = 2 * shape.heads * shape.head_dim;
  const std::vector<float> q = RandomFloats(static_cast<size_t>(n * QW), 11, -2.0f, 2.0f);
  const std::vector<float> k = RandomFloats(static_cast<size_t>((pos0 + n) * KW), 12, -2.0f, 2.0f);
  const std::vector<float> v = RandomFloats(static_cast<size_t>((pos0 + n) * KW), 13);
  const int64_t OW = shape.heads * shape.head_dim;
  std::vector<float> cpu_out(static_cast<size_t>(n * OW));
  ThreadPool pool(1);
  const cpu::AttentionShape cpu_shape{shape.heads, shape.kv_heads, shape.head_dim, shape.scale};
  cpu::AttentionPrefill(pool, cpu_shape, q.data(), QW, 2 * shape.head_dim, n, pos0, cpu::KvSource{k.data(), v.data(), KW},
                        cpu_out.data(), OW);
  cuda::DeviceBuffer dq = ToDevice(q), dk = ToDevice(k), dv = ToDevice(v);
  auto dout = Must(cuda::DeviceBuffer::Allocate(cpu_out.size() * 4, "out"), "allocating");
  const cuda::KvBuffers rows{dk.data(), dv.data(), KvDtype::kF32};
  cuda::Attention(shape, dq.floats(), QW, 2 * shape.head_dim, n, cuda::Position{pos0}, rows, KW, nullptr, dout.floats(), OW, nullptr);
  Must(cuda::Synchronize(nullptr, "attention"), "synchronizing");
  const std::vector<float> out = ToHost(dout, cpu_out.size());
  const float diff = MaxAbsDiff(out, cpu_out);
  std::printf("       attention: max |diff| %.3g\n", diff);
  GPU_CHECK(diff <= 1e-5f);
  for (int64_t t : {int64_t{0}, int64_t{1}, int64_t{31}, n - 1}) {
    auto drow = Must(cuda::DeviceBuffer::Allocate(static_cast<size_t>(OW) * 4, "row"), "allocating");
    cuda::Attention(shape, dq.floats() + t * QW, QW, 2 * shape.head_dim, 1, cuda::Position{pos0 + t}, rows, KW, nullptr, drow.floats(),
                    OW, nullptr);
    const std::vector<float> row = ToHost(drow, static_cast<size_t>(OW));
    GPU_CHECK_MSG(std::memcmp(row.data(), out.data() + t * OW, static_cast<size_t>(OW) * 4) == 0, "query row " + std::to_string(t));
  }
}

// bf16 K/V rows: stored as the CPU rounds them (ties to even, NaN quieted, infinities and subnormals), at a
// position read from device memory; attention over them gives the bits of fp32 rows holding the same values.
void Bf16RowsMatchTheCpusRounding() {
  std::vector<float> values = RandomFloats(2 * 3 * 40, 17, -3.0f, 3.0f);
  const float specials[] = {1.00390625f, 1.01171875f, -1.00390625f, INFINITY, -INFINITY, NAN, 1e-40f, -3e-39f, 3.4e38f, 0.0f, -0.0f};
  std::copy(std::begin(specials), std::end(specials), values.begin());
  const int64_t width = 40, n = 3, offset = 2;
  cuda::DeviceBuffer dk = ToDevice(std::vector<float>(values.begin(), values.begin() + n * width));
  cuda::DeviceBuffer dv = ToDevice(std::vector<float>(values.begin() + n * width, values.end()));
  auto k16 = Must(cuda::DeviceBuffer::Allocate(static_cast<size_t>((offset + n) * width * 2), "K rows"), "allocating");
  auto v16 = Must(cuda::DeviceBuffer::Allocate(static_cast<size_t>((offset + n) * width * 2), "V rows"), "allocating");
  cuda::DeviceBuffer step = ToDevice(std::vector<float>(2, 0.0f));  // an int64 position of 0
  cuda::StoreKvRows(dk.floats(), dv.floats(), n, width, cuda::Position{offset, static_cast<const int64_t*>(step.data())},
                    cuda::KvBuffers{k16.data(), v16.data(), KvDtype::kBf16}, nullptr);
  Must(cuda::Synchronize(nullptr, "storing rows"), "synchronizing");
  std::vector<uint16_t> k_bits(static_cast<size_t>((offset + n) * width)), v_bits(k_bits.size());
  Must(cuda::CopyToHost(k_bits.data(), k16.data(), k_bits.size() * 2, nullptr), "reading K");
  Must(cuda::CopyToHost(v_bits.data(), v16.data(), v_bits.size() * 2, nullptr), "reading V");
  for (int64_t i = 0; i < n * width; ++i) {
    GPU_CHECK_MSG(k_bits[static_cast<size_t>(offset * width + i)] == FloatToBf16(values[static_cast<size_t>(i)]), "K value " + std::to_string(i));
    GPU_CHECK_MSG(v_bits[static_cast<size_t>(offset * width + i)] == FloatToBf16(values[static_cast<size_t>(n * width + i)]),
                  "V value " + std::to_string(i));
  }
  const cuda::AttentionShape shape{4, 2, 64, 0.125f};
  const int64_t pos0 = 40, rows = 50, KW = shape.kv_heads * shape.head_dim, QW = 2 * shape.heads * shape.head_dim, OW = shape.heads * shape.head_dim;
  const std::vector<float> q = RandomFloats(static_cast<size_t>(rows * QW), 18, -2.0f, 2.0f);
  std::vector<float> k = RandomFloats(static_cast<size_t>((pos0 + rows) * KW), 19, -2.0f, 2.0f), v = RandomFloats(k.size(), 20);
  std::vector<uint16_t> k_rounded(k.size()), v_rounded(v.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k_rounded[i] = FloatToBf16(k[i]);
    v_rounded[i] = FloatToBf16(v[i]);
    k[i] = Bf16ToFloat(k_rounded[i]);
    v[i] = Bf16ToFloat(v_rounded[i]);
  }
  cuda::DeviceBuffer dq = ToDevice(q), wide_k = ToDevice(k), wide_v = ToDevice(v);
  auto narrow_k = Must(cuda::DeviceBuffer::Allocate(k_rounded.size() * 2, "bf16 K"), "allocating");
  auto narrow_v = Must(cuda::DeviceBuffer::Allocate(v_rounded.size() * 2, "bf16 V"), "allocating");
  Must(cuda::CopyToDevice(narrow_k.data(), k_rounded.data(), k_rounded.size() * 2, nullptr), "writing K");
  Must(cuda::CopyToDevice(narrow_v.data(), v_rounded.data(), v_rounded.size() * 2, nullptr), "writing V");
  auto wide_out = Must(cuda::DeviceBuffer::Allocate(static_cast<size_t>(rows * OW) * 4, "out"), "allocating");
  auto narrow_out = Must(cuda::DeviceBuffer::Allocate(static_cast<size_t>(rows * OW) * 4, "out"), "allocating");
  cuda::Attention(shape, dq.floats(), QW, 2 * shape.head_dim, rows, cuda::Position{pos0}, cuda::KvBuffers{wide_k.data(), wide_v.data(), KvDtype::kF32},
                  KW, nullptr, wide_out.floats(), OW, nullptr);
  cuda::Attention(shape, dq.floats(), QW, 2 * shape.head_dim, rows, cuda::Position{pos0},
                  cuda::KvBuffers{narrow_k.data(), narrow_v.data(), KvDtype::kBf16}, KW, nullptr, narrow_out.floats(), OW, nullptr);
  Must(cuda::Synchronize(nullptr, "attention"), "synchronizing");
  GPU_CHECK(SameBits(ToHost(wide_out, static_cast<size_t>(rows * OW)), ToHost(narrow_out, static_cast<size_t>(rows * OW))));
}

// fp8 K/V rows: stored with the CPU's bytes (a block's power-of-two scale from its largest magnitude, NaN ignored,
// infinity and subnormal maxima clamped; codes to nearest, ties to even); attention over them gives the bits of fp32
// rows holding code x scale.
void Fp8RowsMatchTheCpusQuantizer() {
  const int64_t width = 64, n = 4, offset = 2, row_bytes = KvRowBytes(KvDtype::kFp8, width);
  std::vector<float> values = RandomFloats(static_cast<size_t>(2 * n * width), 21, -3.0f, 3.0f);
  const float ties[] = {448.0f, 1.0625f, 1.1875f, -1.0625f, 0.0029296875f, 432.0f, -0.0f, 0.0f, 0.0009765625f, -0.0048828125f};
  std::copy(std::begin(ties), std::end(ties), values.begin());  // row 0, block 0: scale 1, halfway values
  values[static_cast<size_t>(width + 40)] = INFINITY;           // row 1, block 1
  values[static_cast<size_t>(2 * width + 3)] = NAN;             // row 2, block 0
  for (int64_t i = 32; i < 64; ++i) values[static_cast<size_t>(2 * width + i)] = (i % 2 ? 1e-40f : -3e-39f);  // row 2, block 1: subnormal
  for (int64_t i = 0; i < 32; ++i) values[static_cast<size_t>(3 * width + i)] = 3e38f * (i % 3 ? 1.0f : -0.5f);  // row 3, block 0: huge
  cuda::DeviceBuffer dk = ToDevice(std::vector<float>(values.begin(), values.begin() + n * width));
  cuda::DeviceBuffer dv = ToDevice(std::vector<float>(values.begin() + n * width, values.end()));
  auto k8 = Must(cuda::DeviceBuffer::Allocate(static_cast<size_t>((offset + n) * row_bytes), "K rows"), "allocating");
  auto v8 = Must(cuda::DeviceBuffer::Allocate(static_cast<size_t>((offset + n) * row_bytes), "V rows"), "allocating");
  cuda::DeviceBuffer step = ToDevice(std::vector<float>(2, 0.0f));  // an int64 position of 0
  cuda::StoreKvRows(dk.floats(), dv.floats(), n, width, cuda::Position{offset, static_cast<const int64_t*>(step.data())},
                    cuda::KvBuffers{k8.data(), v8.data(), KvDtype::kFp8}, nullptr);
  Must(cuda::Synchronize(nullptr, "storing rows"), "synchronizing");
  std::vector<uint8_t> k_bytes(static_cast<size_t>((offset + n) * row_bytes)), v_bytes(k_bytes.size());
  Must(cuda::CopyToHost(k_bytes.data(), k8.data(), k_bytes.size(), nullptr), "reading K");
  Must(cuda::CopyToHost(v_bytes.data(), v8.data(), v_bytes.size(), nullptr), "reading V");
  std::vector<uint8_t> k_cpu(static_cast<size_t>(n * row_bytes)), v_cpu(k_cpu.size());
  cpu::StoreKvRows(values.data(), n, width, KvDtype::kFp8, k_cpu.data());
  cpu::StoreKvRows(values.data() + n * width, n, width, KvDtype::kFp8, v_cpu.data());
  for (int64_t i = 0; i < n * row_bytes; ++i) {
    GPU_CHECK_MSG(k_bytes[static_cast<size_t>(offset * row_bytes + i)] == k_cpu[static_cast<size_t>(i)], "K byte " + std::to_string(i));
    GPU_CHECK_MSG(v_bytes[static_cast<size_t>(offset * row_bytes + i)] == v_cpu[static_cast<size_t>(i)], "V byte " + std::to_string(i));
  }
  GPU_CHECK(k_cpu[1] == 0x38 && k_cpu[2] == 0x3a && k_cpu[4] == 0x02 && k_cpu[5] == 0x7e && k_cpu[8] == 0x00 && k_cpu[9] == 0x82);
  const cuda::AttentionShape shape{4, 2, 64, 0.125f};
  const int64_t pos0 = 40, rows = 50, KW = shape.kv_heads * shape.head_dim, QW = 2 * shape.heads * shape.head_dim, OW = shape.heads * shape.head_dim;
  const int64_t kv_rows = pos0 + rows, kv_row_bytes = KvRowBytes(KvDtype::kFp8, KW);
  const std::vector<float> q = RandomFloats(static_cast<size_t>(rows * QW), 22, -2.0f, 2.0f);
  std::vector<float> k = RandomFloats(static_cast<size_t>(kv_rows * KW), 23, -2.0f, 2.0f), v = RandomFloats(k.size(), 24);
  std::vector<uint8_t> k_coded(static_cast<size_t>(kv_rows * kv_row_bytes)), v_coded(k_coded.size());
  cpu::StoreKvRows(k.data(), kv_rows, KW, KvDtype::kFp8, k_coded.data());
  cpu::StoreKvRows(v.data(), kv_rows, KW, KvDtype::kFp8, v_coded.data());
  const cpu::KvSource coded(KvDtype::kFp8, k_coded.data(), v_coded.data(), KW);
  for (int64_t i = 0; i < kv_rows * KW; ++i) {
    k[static_cast<size_t>(i)] = coded.ValueAt(coded.key(i / KW), i % KW);
    v[static_cast<size_t>(i)] = coded.ValueAt(coded.value(i / KW), i % KW);
  }
  cuda::DeviceBuffer dq = ToDevice(q), wide_k = ToDevice(k), wide_v = ToDevice(v);
  auto narrow_k = Must(cuda::DeviceBuffer::Allocate(k_coded.size(), "fp8 K"), "allocating");
  auto narrow_v = Must(cuda::DeviceBuffer::Allocate(v_coded.size(), "fp8 V"), "allocating");
  Must(cuda::CopyToDevice(narrow_k.data(), k_coded.data(), k_coded.size(), nullptr), "writing K");
  Must(cuda::CopyToDevice(narrow_v.data(), v_coded.data(), v_coded.size(), nullptr), "writing V");
  auto wide_out = Must(cuda::DeviceBuffer::Allocate(static_cast<size_t>(rows * OW) * 4, "out"), "allocating");
  auto narrow_out = Must(cuda::DeviceBuffer::Allocate(static_cast<size_t>(rows * OW) * 4, "out"), "allocating");
  cuda::Attention(shape, dq.floats(), QW, 2 * shape.head_dim, rows, cuda::Position{pos0}, cuda::KvBuffers{wide_k.data(), wide_v.data(), KvDtype::kF32},
                  KW, nullptr, wide_out.floats(), OW, nullptr);
  cuda::Attention(shape, dq.floats(), QW, 2 * shape.head_dim, rows, cuda::Position{pos0},
                  cuda::KvBuffers{narrow_k.data(), narrow_v.data(), KvDtype::kFp8}, KW, nullptr, narrow_out.floats(), OW, nullptr);
  Must(cuda::Synchronize(nullptr, "attention"), "synchronizing");
  GPU_CHECK(SameBits(ToHost(wide_out, static_cast<size_t>(rows * OW)), ToHost(narrow_out, static_cast<size_t>(rows * OW))));
}

// The K/V rows' dtype Load gives both forwards; a case sets it for its run with KvRowsOf.
KvDtype g_kv_dtype = KvDtype::kF32;
// Whether Load's CUDA forward runs fast products; a case sets it for its run with FastProducts.
bool g_fast_products = false;
std::function<void()> FastProducts(std::function<void()> run) {
  return [run] {
    struct Restore {
      ~Restore() { g_fast_products = false; }
    } restore;
    g_fast_products = true;
    run();
  };
}
std::function<void()> KvRowsOf(KvDtype dtype, std::function<void()> run) {
  return [dtype, run] {
    struct Restore {
      ~Restore() { g_kv_dtype = KvDtype::kF32; }
    } restore;
    g_kv_dtype = dtype;
    run();
  };
}

struct Pair {
  std::unique_ptr<testing::LoadedWeights> model;
  std::unique_ptr<Forward> cpu;
  std::unique_ptr<CudaForward> gpu;
};

// int8: both forwards make the matrices int8 at load (--weights int8).
Pair Load(TinyModelSize size, int64_t grid = 1024, GeneratedDtype dtype = GeneratedDtype::kBf16, bool int8 = false) {
  Pair p;
  const std::string name = std::string(TinyModelSizeName(size)) + (dtype == GeneratedDtype::kFp8 ? "-fp8" : "");
  p.model = Must(testing::MakeModel(size, 5, TempDir(name), dtype), "generating the model");
  p.model->config.kv_dtype = g_kv_dtype;
  ForwardOptions cpu_options;
  cpu_options.grid_tokens = grid;
  cpu_options.int8_weights = int8;
  p.cpu = Must(Forward::Create(p.model->config, p.model->weights, cpu_options), "creating the CPU forward");
  CudaForwardOptions gpu_options;
  gpu_options.grid_tokens = grid;
  gpu_options.int8_weights = int8;
  gpu_options.fast_products = g_fast_products;
  p.gpu = Must(CudaForward::Create(p.model->config, p.model->weights, gpu_options), "creating the CUDA forward");
  return p;
}

// Fast products (each activation rounded to bf16 once, no low part): the tiny forward's logits lie
// within 0.197 of the fp64 reference at the median over the rows and within 2 at worst, differ from the
// exact products' (something was rounded), and the state fingerprint is fast's own.
void FastProductsStayNearTheReference() {
  Pair exact = Load(TinyModelSize::kTiny);
  g_fast_products = true;
  Pair fast = Load(TinyModelSize::kTiny);
  g_fast_products = false;
  const int64_t V = fast.model->config.vocab_size, n = 150;
  const std::vector<int32_t> ids = testing::RandomIds(n, V, 91);
  const auto ref = reference::Logits(fast.model->config, fast.model->weights, ids);
  auto fast_state = Must(fast.gpu->NewState(), "a device state");
  auto exact_state = Must(exact.gpu->NewState(), "a device state");
  const std::vector<float> got = Must(fast.gpu->Prefill(*fast_state, ids, LogitsRows::kAll), "fast prefill");
  const std::vector<float> exact_logits = Must(exact.gpu->Prefill(*exact_state, ids, LogitsRows::kAll), "exact prefill");
  std::vector<double> distances;
  for (int64_t t = 0; t < n; ++t) {
    double d = 0.0;
    for (int64_t i = 0; i < V; ++i) d = std::max(d, std::abs(double(got[size_t(t * V + i)]) - ref[size_t(t * V + i)]));
    distances.push_back(d);
  }
  std::vector<double> sorted = distances;
  std::sort(sorted.begin(), sorted.end());
  std::printf("       fast products: |logits - fp64 reference| median %.3g, max %.3g over %lld rows\n", sorted[size_t(n / 2)], sorted.back(),
              static_cast<long long>(n));
  GPU_CHECK(sorted[size_t(n / 2)] <= 0.197);
  GPU_CHECK(sorted.back() <= 2.0);  // the worst row amplifies its roundings most (1.3 measured on the emulator, 0.59 on the CPU's)
  GPU_CHECK(!SameBits(got, exact_logits));
  GPU_CHECK(fast.gpu->StateFingerprint("model") != exact.gpu->StateFingerprint("model"));
}

// Prefill and decode logits within `absolute` + `relative` x max |logit| of the CPU forward's. The
// split products lose up to 2^-18 of each activation, which the tiny model's large logits (about 20)
// carry into ~1e-3.
void ForwardMatchesCpu(TinyModelSize size, float absolute, float relative, GeneratedDtype dtype = GeneratedDtype::kBf16, bool int8 = false) {
  Pair p = Load(size, 1024, dtype, int8);
  const std::vector<int32_t> ids = testing::RandomIds(300, p.model->config.vocab_size, 21);
  SequenceState cpu_state(p.model->config);
  auto gpu_state = Must(p.gpu->NewState(), "a device state");
  std::vector<float> cpu_logits = Must(p.cpu->Prefill(cpu_state, ids, LogitsRows::kAll), "CPU prefill");
  std::vector<float> gpu_logits = Must(p.gpu->Prefill(*gpu_state, ids, LogitsRows::kAll), "GPU prefill");
  float worst = MaxAbsDiff(cpu_logits, gpu_logits), largest = 0.0f;
  const auto note_largest = [&largest](const std::vector<float>& logits) {
    for (float v : logits) largest = std::max(largest, std::fabs(v));
  };
  note_largest(cpu_logits);
  for (int32_t id : {3, 17, 99, 5}) {
    cpu_logits = Must(p.cpu->Decode(cpu_state, id), "CPU decode");
    gpu_logits = Must(p.gpu->Decode(*gpu_state, id), "GPU decode");
    worst = std::max(worst, MaxAbsDiff(cpu_logits, gpu_logits));
    note_largest(cpu_logits);
  }
  const float bound = absolute + relative * largest;
  std::printf("       %s%s%s: max |logit diff| vs CPU over a 300-token prefill and 4 decodes: %.3g (max |logit| %.3g, bound %.3g)\n",
              TinyModelSizeName(size), dtype == GeneratedDtype::kFp8 ? " fp8" : int8 ? " int8" : "",
              g_kv_dtype == KvDtype::kBf16 ? " (bf16 K/V rows)" : "", worst, largest, bound);
  GPU_CHECK(worst <= bound);
  GPU_CHECK(p.gpu->WeightsDescription() == p.cpu->WeightsDescription());
}

// Resumed at every 64-line of a 700-token prompt (through a host copy of the state, as an anchor
// travels), the state and the last logits equal a cold prefill's bit for bit.
void ResumeAtEvery64LineIsBitEqual(TinyModelSize size, int64_t grid, GeneratedDtype dtype = GeneratedDtype::kBf16, bool int8 = false) {
  Pair p = Load(size, grid, dtype, int8);
  const ModelConfig& c = p.model->config;
  const std::vector<int32_t> ids = testing::RandomIds(700, c.vocab_size, 31);
  auto cold = Must(p.gpu->NewState(), "a device state");
  const std::vector<float> cold_logits = Must(p.gpu->Prefill(*cold, ids), "cold prefill");
  SequenceState cold_host(c);
  Must(cold->Download(cold_host), "downloading");
  for (int64_t line = 64; line < 700; line += 64) {
    auto first = Must(p.gpu->NewState(), "a device state");
    Must(p.gpu->Prefill(*first, std::span(ids).first(static_cast<size_t>(line))), "prefill to the line");
    SequenceState anchor(c);
    Must(first->Download(anchor), "downloading the anchor");
    auto resumed = Must(p.gpu->NewState(), "a device state");
    Must(resumed->Upload(anchor), "uploading the anchor");
    const std::vector<float> logits = Must(p.gpu->Prefill(*resumed, std::span(ids).subspan(static_cast<size_t>(line))), "resume");
    SequenceState host(c);
    Must(resumed->Download(host), "downloading");
    GPU_CHECK_MSG(host.BitEqual(cold_host), "state resumed at " + std::to_string(line));
    GPU_CHECK_MSG(SameBits(logits, cold_logits), "logits resumed at " + std::to_string(line));
  }
}

// The same prefill and decodes twice: the same bits.
void SameRunTwiceIsBitEqual(TinyModelSize size) {
  Pair p = Load(size);
  const std::vector<int32_t> ids = testing::RandomIds(333, p.model->config.vocab_size, 41);
  std::vector<std::vector<float>> runs[2];
  SequenceState hosts[2] = {SequenceState(p.model->config), SequenceState(p.model->config)};
  for (int r = 0; r < 2; ++r) {
    auto state = Must(p.gpu->NewState(), "a device state");
    runs[r].push_back(Must(p.gpu->Prefill(*state, ids, LogitsRows::kAll), "prefill"));
    for (int32_t id : {1, 2, 3, 4, 5, 6, 7, 8}) runs[r].push_back(Must(p.gpu->Decode(*state, id), "decode"));
    auto copy = Must(state->Clone(), "cloning");
    Must(copy->Download(hosts[r]), "downloading");
  }
  for (size_t i = 0; i < runs[0].size(); ++i) GPU_CHECK_MSG(SameBits(runs[0][i], runs[1][i]), "call " + std::to_string(i));
  GPU_CHECK(hosts[0].BitEqual(hosts[1]));
}

// A state that grows past its first 1,024 rows while it holds rows keeps them: 960 tokens (a 64-line)
// and then 140 more equal 1,100 in one call; a clone equals its source.
void GrowingAndCloningKeepTheState() {
  Pair p = Load(TinyModelSize::kTiny);
  const ModelConfig& c = p.model->config;
  const std::vector<int32_t> ids = testing::RandomIds(1100, c.vocab_size, 51);
  auto whole = Must(p.gpu->NewState(), "a device state");
  const std::vector<float> whole_logits = Must(p.gpu->Prefill(*whole, ids), "prefill 1100");
  auto grown = Must(p.gpu->NewState(), "a device state");
  Must(p.gpu->Prefill(*grown, std::span(ids).first(960)), "prefill 960");
  GPU_CHECK(grown->capacity() == 1024);
  const std::vector<float> grown_logits = Must(p.gpu->Prefill(*grown, std::span(ids).subspan(960)), "prefill 140 more");
  GPU_CHECK(grown->capacity() == 2048);
  SequenceState a(c), b(c), copy_host(c);
  Must(whole->Download(a), "downloading");
  Must(grown->Download(b), "downloading");
  GPU_CHECK(a.BitEqual(b));
  GPU_CHECK(SameBits(whole_logits, grown_logits));
  auto copy = Must(grown->Clone(), "cloning");
  Must(copy->Download(copy_host), "downloading the clone");
  GPU_CHECK(copy_host.BitEqual(b));
  const std::vector<float> next = Must(p.gpu->Decode(*grown, 7), "decode");
  const std::vector<float> next_of_copy = Must(p.gpu->Decode(*copy, 7), "decode on the clone");
  GPU_CHECK(SameBits(next, next_of_copy));
}

// The tiers' primitives on the device: an anchor at a 64-line kept on the device, or taken to the host
// with its K/V rows and brought back into a fresh state, resumes to a cold prefill's bits; the host
// anchor equals SequenceState's of the same state; a mis-sized anchor is refused without change.
void AnchorsAndRowsResumeExactly() {
  Pair p = Load(TinyModelSize::kTiny);
  const ModelConfig& c = p.model->config;
  const std::vector<int32_t> ids = testing::RandomIds(700, c.vocab_size, 71);
  const auto ids_from = [&ids](size_t from, size_t to) { return std::span(ids).subspan(from, to - from); };
  auto cold = Must(p.gpu->NewState(), "a device state");
  const std::vector<float> cold_logits = Must(p.gpu->Prefill(*cold, ids), "cold prefill");
  SequenceState cold_host(c);
  Must(cold->Download(cold_host), "downloading");

  auto x = Must(p.gpu->NewState(), "a device state");
  Must(p.gpu->Prefill(*x, ids_from(0, 320)), "prefill to 320");
  const DeviceAnchor device_anchor = Must(x->SaveAnchor(), "a device anchor");
  const Anchor host_anchor = Must(x->SaveHostAnchor(), "a host anchor");
  const KvRows rows = Must(x->CopyRows(0, 320), "K/V rows");
  SequenceState at_320(c);
  Must(x->Download(at_320), "downloading");
  const Anchor expected = at_320.SaveAnchor();
  GPU_CHECK(host_anchor.length == 320 && SameBits(host_anchor.data, expected.data));
  const KvRows expected_rows = Must(at_320.CopyRows(0, 320), "host K/V rows");
  GPU_CHECK(SameBits(rows.data, expected_rows.data));

  Must(p.gpu->Prefill(*x, ids_from(320, 500)), "going on past the anchor");
  Anchor wrong = host_anchor;
  wrong.data.pop_back();
  GPU_CHECK(!x->RestoreHostAnchor(wrong).ok());
  GPU_CHECK(x->length() == 500);
  Must(x->RestoreAnchor(device_anchor), "restoring the device anchor");
  GPU_CHECK(x->length() == 320);
  const std::vector<float> resumed = Must(p.gpu->Prefill(*x, ids_from(320, 700)), "resuming");
  SequenceState x_host(c);
  Must(x->Download(x_host), "downloading");
  GPU_CHECK(x_host.BitEqual(cold_host));
  GPU_CHECK(SameBits(resumed, cold_logits));

  auto y = Must(p.gpu->NewState(), "a device state");
  GPU_CHECK(!y->RestoreHostAnchor(host_anchor).ok());  // its K/V rows are not there yet
  GPU_CHECK(y->length() == 0);
  Must(y->WriteRows(rows), "writing K/V rows");
  Must(y->RestoreHostAnchor(host_anchor), "restoring the host anchor");
  const std::vector<float> from_host = Must(p.gpu->Prefill(*y, ids_from(320, 700)), "resuming from the host");
  SequenceState y_host(c);
  Must(y->Download(y_host), "downloading");
  GPU_CHECK(y_host.BitEqual(cold_host));
  GPU_CHECK(SameBits(from_host, cold_logits));
}

// Puts from's rows and anchor into to, as a cache tier restores a state.
void PutInPlace(SequenceState& to, const SequenceState& from) {
  Must(to.WriteRows(Must(from.CopyRows(0, from.length()), "K/V rows")), "writing the rows");
  Must(to.RestoreAnchor(from.SaveAnchor()), "restoring the anchor");
}

std::unique_ptr<CudaBackend> Backend(const testing::LoadedWeights& model, int64_t grid = 1024) {
  CudaForwardOptions options;
  options.grid_tokens = grid;
  return Must(CudaBackend::Create(model.config, model.weights, options), "creating the CUDA backend");
}

// A host state's device copy as the caches see it: the backend's prefill and decode on host states
// give CudaForward's bits on a device state, and a state resumed on the host (its K/V rows written
// and an anchor restored, as a tier restores) at every 64-line equals a cold prefill bit for bit.
void BackendOnHostStatesResumesExactly() {
  Pair p = Load(TinyModelSize::kTiny);
  const ModelConfig& c = p.model->config;
  const auto backend = Backend(*p.model);
  const std::vector<int32_t> ids = testing::RandomIds(700, c.vocab_size, 37);
  auto device = Must(p.gpu->NewState(), "a device state");
  std::vector<float> device_logits = Must(p.gpu->Prefill(*device, ids), "CudaForward prefill");
  SequenceState cold(c);
  std::vector<float> cold_logits = Must(backend->Prefill(cold, ids), "backend prefill");
  GPU_CHECK(SameBits(cold_logits, device_logits));
  SequenceState downloaded(c);
  Must(device->Download(downloaded), "downloading");
  GPU_CHECK(cold.BitEqual(downloaded));
  for (int32_t id : {5, 77, 300}) {
    device_logits = Must(p.gpu->Decode(*device, id), "CudaForward decode");
    GPU_CHECK(SameBits(Must(backend->Decode(cold, id), "backend decode"), device_logits));
  }
  Must(device->Download(downloaded), "downloading");
  const SequenceState copied = cold;  // a copy pulls the recurrent part the device holds
  GPU_CHECK(copied.mirror() == nullptr && copied.BitEqual(downloaded));

  SequenceState reference(c);
  cold_logits = Must(backend->Prefill(reference, ids), "cold prefill");
  for (int64_t line = 64; line < 700; line += 64) {
    SequenceState first(c);
    Must(backend->Prefill(first, std::span(ids).first(static_cast<size_t>(line))), "prefill to the line");
    SequenceState resumed(c);
    PutInPlace(resumed, first);
    const std::vector<float> logits = Must(backend->Prefill(resumed, std::span(ids).subspan(static_cast<size_t>(line))), "resume");
    GPU_CHECK_MSG(resumed.BitEqual(reference), "state resumed at " + std::to_string(line));
    GPU_CHECK_MSG(SameBits(logits, cold_logits), "logits resumed at " + std::to_string(line));
  }
}

// A prompt with two images (3 x 5 rows at row 20, 4 x 2 at row 60, across the 64-line) through the backend
// on host states: logits within 1e-3 x max |logit| of the CPU forward's, decodes after the images too (their
// shifted positions), resumed at each grid line bit-equal to the cold prefill, and an image key id without
// its image refused.
void ImagesMatchTheCpuAndResumeExactly() {
  Pair p = Load(TinyModelSize::kTiny);
  const ModelConfig& c = p.model->config;
  const auto backend = Backend(*p.model, 64);
  std::vector<int32_t> ids = testing::RandomIds(150, c.vocab_size, 41);
  std::vector<std::shared_ptr<const PromptImage>> catalog;
  for (auto [row, rows, columns] : {std::tuple<int64_t, int64_t, int64_t>{20, 3, 5}, {60, 4, 2}}) {
    auto image = std::make_shared<PromptImage>();
    image->digest = "cuda image at " + std::to_string(row);
    image->rows = rows;
    image->columns = columns;
    image->key_ids = ImageKeyIds(image->digest, rows * columns);
    image->embeddings = std::make_shared<const std::vector<float>>(RandomFloats(static_cast<size_t>(rows * columns * c.hidden_size), uint32_t(row)));
    std::copy(image->key_ids.begin(), image->key_ids.end(), ids.begin() + row);
    catalog.push_back(image);
  }
  const auto located = Must(PromptImages::Locate(ids, catalog), "locating the images");
  SequenceState refused(c);
  GPU_CHECK(!backend->Prefill(refused, ids).ok() && refused.length() == 0);
  SequenceState cpu(c), gpu(c);
  cpu.set_images(located);
  gpu.set_images(located);
  std::vector<float> want = Must(p.cpu->Prefill(cpu, ids, LogitsRows::kAll), "CPU prefill");
  std::vector<float> got = Must(backend->Prefill(gpu, ids, LogitsRows::kAll), "backend prefill");
  float worst = MaxAbsDiff(want, got), largest = 0.0f;
  for (float v : want) largest = std::max(largest, std::fabs(v));
  for (int32_t id : {3, 17}) worst = std::max(worst, MaxAbsDiff(Must(p.cpu->Decode(cpu, id), "CPU decode"), Must(backend->Decode(gpu, id), "decode")));
  std::printf("       images: max |logit diff| vs CPU over 150 rows and 2 decodes: %.3g (max |logit| %.3g)\n", worst, largest);
  GPU_CHECK(worst <= 1e-3f * largest);
  SequenceState cold(c);
  cold.set_images(located);
  const std::vector<float> cold_logits = Must(backend->Prefill(cold, ids), "cold prefill");
  for (int64_t line : {64, 128}) {
    SequenceState first(c);
    first.set_images(located);
    Must(backend->Prefill(first, std::span(ids).first(static_cast<size_t>(line))), "prefill to the line");
    SequenceState resumed = first;
    const std::vector<float> logits = Must(backend->Prefill(resumed, std::span(ids).subspan(static_cast<size_t>(line))), "resume");
    GPU_CHECK_MSG(SameBits(logits, cold_logits), "logits resumed at " + std::to_string(line));
    GPU_CHECK_MSG(resumed.BitEqual(cold), "state resumed at " + std::to_string(line));
  }
}

// The vision tower on the device against the CPU's: within 1e-4 x max(1, max |row|) for one frame and
// for two (each attends within itself), the same bits on a second run, and the bidirectional attention's
// rows the same bits when fewer query rows are asked for.
void VisionTowerMatchesTheCpus() {
  Pair p = Load(TinyModelSize::kTiny);
  const VisionConfig& v = *p.model->config.vision;
  const auto backend = Backend(*p.model);
  GPU_CHECK_MSG(backend->has_vision_tower(), "no tower on the device: " + backend->VisionTowerNote());
  GPU_CHECK(backend->StateKey("m") != backend->forward().StateFingerprint("m"));  // the tower's products are in the key
  ThreadPool pool(2);
  const auto cpu = Must(VisionTower::Create(v, *p.model->weights.vision, pool), "the CPU tower");
  for (const ImageGrid grid : {ImageGrid{1, 6, 10}, ImageGrid{2, 4, 4}}) {
    const std::vector<float> patches = RandomFloats(static_cast<size_t>(grid.patches() * v.patch_values()), uint32_t(grid.h));
    const std::vector<float> want = Must(cpu->Encode(grid, patches), "the CPU tower's rows");
    const std::vector<float> got = Must(backend->EncodeImage(grid, patches), "the device tower's rows");
    float largest = 1.0f;
    for (float x : want) largest = std::max(largest, std::fabs(x));
    const float worst = MaxAbsDiff(want, got);
    std::printf("       tower %lld x %lld x %lld: max |row diff| vs CPU %.3g (max |row| %.3g)\n", static_cast<long long>(grid.t),
                static_cast<long long>(grid.h), static_cast<long long>(grid.w), worst, largest);
    GPU_CHECK(worst <= 1e-4f * largest);
    GPU_CHECK(SameBits(got, Must(backend->EncodeImage(grid, patches), "the device tower again")));
  }
  GPU_CHECK(!backend->EncodeImage(ImageGrid{1, 5, 4}, std::vector<float>(static_cast<size_t>(20 * v.patch_values()))).ok());

  const int64_t n = 45, heads = 3, hd = 16, width = 3 * heads * hd;
  const std::vector<float> rows = RandomFloats(static_cast<size_t>(n * width), 77, -2.0f, 2.0f);
  const auto on_device = ToDevice(rows);
  auto out = Must(cuda::DeviceBuffer::Allocate(static_cast<size_t>(n * heads * hd) * 4, "attention rows"), "allocating");
  cuda::AttentionShape shape{heads, heads, hd, 0.25f};
  shape.keys = n;
  const float* base = on_device.floats();
  const cuda::KvBuffers kv{const_cast<float*>(base + heads * hd), const_cast<float*>(base + 2 * heads * hd), KvDtype::kF32};
  cuda::Attention(shape, base, width, hd, n, cuda::Position{}, kv, width, nullptr, out.floats(), heads * hd, nullptr);
  const std::vector<float> all = ToHost(out, static_cast<size_t>(n * heads * hd));
  cuda::Attention(shape, base + 13 * width, width, hd, 5, cuda::Position{}, kv, width, nullptr, out.floats(), heads * hd, nullptr);
  const std::vector<float> five = ToHost(out, static_cast<size_t>(5 * heads * hd));
  GPU_CHECK(std::memcmp(five.data(), all.data() + 13 * heads * hd, five.size() * sizeof(float)) == 0);
  std::vector<float> reference(all.size());
  const cpu::AttentionShape cpu_shape{heads, heads, hd, 0.25f};
  cpu::AttentionBidirectional(pool, cpu_shape, rows.data(), width, hd, n, n, cpu::KvSource(rows.data() + heads * hd, rows.data() + 2 * heads * hd, width),
                              reference.data(), heads * hd);
  GPU_CHECK(MaxAbsDiff(reference, all) <= 1e-5f);
}

// Host copies through a staging buffer smaller than a row (every copy in many pieces) or through
// none give the same bits as the default's.
void StagingInPiecesGivesTheSameBits() {
  Pair p = Load(TinyModelSize::kTiny);
  const ModelConfig& c = p.model->config;
  const auto whole = Backend(*p.model);
  const std::vector<int32_t> ids = testing::RandomIds(400, c.vocab_size, 67);
  SequenceState reference(c);
  const std::vector<float> logits = Must(whole->Prefill(reference, ids), "prefill");
  for (int64_t staging : {int64_t{1000}, int64_t{0}}) {
    CudaForwardOptions options;
    options.staging_bytes = staging;
    const auto backend = Must(CudaBackend::Create(c, p.model->weights, options), "a backend with another staging");
    SequenceState first(c);
    Must(backend->Prefill(first, std::span(ids).first(192)), "prefill to 192");
    SequenceState resumed(c);
    PutInPlace(resumed, first);
    GPU_CHECK_MSG(SameBits(Must(backend->Prefill(resumed, std::span(ids).subspan(192)), "resume"), logits), "staging " + std::to_string(staging));
    GPU_CHECK_MSG(resumed.BitEqual(reference), "staging " + std::to_string(staging));
  }
}

// What the host writes into a state its device copy already holds reaches the device: another
// conversation's rows and anchor restored into it, and an earlier anchor of its own.
void HostWritesReachTheDeviceCopy() {
  Pair p = Load(TinyModelSize::kTiny);
  const ModelConfig& c = p.model->config;
  const auto backend = Backend(*p.model);
  const std::vector<int32_t> x = testing::RandomIds(400, c.vocab_size, 41), y = testing::RandomIds(400, c.vocab_size, 43);
  SequenceState y_cold(c);
  const std::vector<float> y_logits = Must(backend->Prefill(y_cold, y), "cold prefill of y");
  SequenceState y_at_192(c);
  Must(backend->Prefill(y_at_192, std::span(y).first(192)), "y to 192");

  SequenceState state(c);
  Must(backend->Prefill(state, std::span(x).first(256)), "x to 256");
  const Anchor x_at_256 = state.SaveAnchor();
  PutInPlace(state, y_at_192);
  GPU_CHECK(SameBits(Must(backend->Prefill(state, std::span(y).subspan(192)), "y from 192"), y_logits));
  GPU_CHECK(state.BitEqual(y_cold));

  SequenceState x_cold(c);
  const std::vector<float> x_logits = Must(backend->Prefill(x_cold, x), "cold prefill of x");
  SequenceState again(c);
  Must(backend->Prefill(again, std::span(x).first(256)), "x to 256");
  Must(backend->Prefill(again, std::span(y).first(100)), "going on with other ids");
  Must(again.RestoreAnchor(x_at_256), "back to x at 256");  // its rows below 256 are x's still
  GPU_CHECK(SameBits(Must(backend->Prefill(again, std::span(x).subspan(256)), "x from 256"), x_logits));
  GPU_CHECK(again.BitEqual(x_cold));
}

// A fork's logits equal a prefill on a copy, and the state keeps its bits, the rows above its length
// included: a prefill after the fork resumes exactly. At grid 1,024 its 90 ids are a branch; at grid
// 64 they run from a device anchor.
void ForkKeepsTheState(int64_t grid) {
  Pair p = Load(TinyModelSize::kTiny);
  const ModelConfig& c = p.model->config;
  const auto backend = Backend(*p.model, grid);
  const std::vector<int32_t> ids = testing::RandomIds(500, c.vocab_size, 47), extra = testing::RandomIds(90, c.vocab_size, 53);
  SequenceState cold(c);
  const std::vector<float> cold_logits = Must(backend->Prefill(cold, ids), "cold prefill");
  SequenceState state(c);
  Must(backend->Prefill(state, std::span(ids).first(192)), "prefill to 192");
  const Anchor at_192 = state.SaveAnchor();
  Must(backend->Prefill(state, std::span(ids).subspan(192, 128)), "prefill to 320");
  const Anchor at_320 = state.SaveAnchor();
  Must(state.RestoreAnchor(at_192), "back to 192");  // rows 192..320 stay valid above the length
  const SequenceState& view = state;  // reads that tell the device copy nothing
  const std::vector<float> above(view.k_rows(0) + 192 * view.kv_width(), view.k_rows(0) + 320 * view.kv_width());

  SequenceState copy(c);
  PutInPlace(copy, state);
  const std::vector<float> expected = Must(backend->Prefill(copy, extra), "prefill on a copy");
  const SequenceState before = state;
  GPU_CHECK(SameBits(Must(backend->ForkLastLogits(state, extra), "fork"), expected));
  GPU_CHECK(state.BitEqual(before) && state.length() == 192);
  const std::vector<float> above_after(view.k_rows(0) + 192 * view.kv_width(), view.k_rows(0) + 320 * view.kv_width());
  GPU_CHECK(SameBits(above, above_after));
  Must(state.RestoreAnchor(at_320), "on to 320");  // over the rows the fork wrote on the device
  GPU_CHECK(SameBits(Must(backend->Prefill(state, std::span(ids).subspan(320)), "resume after the fork"), cold_logits));
  GPU_CHECK(state.BitEqual(cold));

  // After a fork from 192 the host goes on past the device copy's capacity (its rows to 960 kept,
  // rows and an anchor put in place above them, as a tier restores): the copy grows, and every row
  // above 192 comes from the host.
  const std::vector<int32_t> longer = testing::RandomIds(1100, c.vocab_size, 59);
  SequenceState long_cold(c);
  const std::vector<float> long_logits = Must(backend->Prefill(long_cold, longer), "cold prefill of 1,100");
  SequenceState grown(c);
  Must(backend->Prefill(grown, std::span(longer).first(192)), "to 192");
  const Anchor grown_at_192 = grown.SaveAnchor();
  Must(backend->Prefill(grown, std::span(longer).subspan(192, 768)), "to 960");
  Must(grown.RestoreAnchor(grown_at_192), "back to 192");
  Must(backend->ForkLastLogits(grown, extra), "a fork at 192");
  SequenceState at_1088(c);
  Must(backend->Prefill(at_1088, std::span(longer).first(1088)), "another state to 1,088");
  grown.SetLength(960);  // a growth keeps the rows below the length
  Must(grown.WriteRows(Must(at_1088.CopyRows(960, 1088), "rows 960..1088")), "writing rows 960..1088");
  Must(grown.RestoreAnchor(at_1088.SaveAnchor()), "the anchor at 1,088");
  GPU_CHECK(SameBits(Must(backend->Prefill(grown, std::span(longer).subspan(1088)), "on from 1,088"), long_logits));
  GPU_CHECK(grown.BitEqual(long_cold));
}

#ifndef ANCHORAGE_CUDA_EMULATED
// The plugin the server loads (built beside this test) gives the linked backend's bits.
Result<std::unique_ptr<ComputeBackend>> PluginBackend(const testing::LoadedWeights& model) {
  if (std::getenv("ANCHORAGE_CUDA_PLUGIN") == nullptr) setenv("ANCHORAGE_CUDA_PLUGIN", ANCHORAGE_CUDA_PLUGIN_BUILT, 1);
  CudaPluginRequest request;
  request.config = &model.config;
  request.weights = &model.weights;
  return LoadCudaBackend(request);
}

void ThePluginGivesTheLinkedBackendsBits() {
  Pair p = Load(TinyModelSize::kTiny);
  const ModelConfig& c = p.model->config;
  const auto plugin = Must(PluginBackend(*p.model), "loading the CUDA plugin");
  GPU_CHECK(std::string(plugin->device_name()) == "cuda");
  const auto linked = Backend(*p.model);
  GPU_CHECK(plugin->StateKey("m") == linked->StateKey("m"));
  const std::vector<int32_t> ids = testing::RandomIds(300, c.vocab_size, 61);
  SequenceState a(c), b(c);
  GPU_CHECK(SameBits(Must(plugin->Prefill(a, ids), "plugin prefill"), Must(linked->Prefill(b, ids), "linked prefill")));
  GPU_CHECK(SameBits(Must(plugin->Decode(a, 9), "plugin decode"), Must(linked->Decode(b, 9), "linked decode")));
  GPU_CHECK(a.BitEqual(b));
}
#endif

// Decode through a captured graph gives the bits of decode launch by launch, also across the state's
// growth past 1,024 rows (which recaptures the graph).
void DecodeGraphsGiveTheLaunchesBits() {
  auto model = Must(testing::MakeModel(TinyModelSize::kTiny, 5, TempDir("graphs")), "generating");
  CudaForwardOptions with, without;
  without.decode_graphs = false;
  auto graphed = Must(CudaForward::Create(model->config, model->weights, with), "creating");
  auto launched = Must(CudaForward::Create(model->config, model->weights, without), "creating");
  const std::vector<int32_t> ids = testing::RandomIds(1020, model->config.vocab_size, 81);
  auto a = Must(graphed->NewState(), "a device state");
  auto b = Must(launched->NewState(), "a device state");
  Must(graphed->Prefill(*a, ids), "prefill");
  Must(launched->Prefill(*b, ids), "prefill");
  for (int32_t id = 1; id <= 8; ++id) {
    const std::vector<float> la = Must(graphed->Decode(*a, id), "decode through the graph");
    const std::vector<float> lb = Must(launched->Decode(*b, id), "decode launch by launch");
    GPU_CHECK_MSG(SameBits(la, lb), "decode step " + std::to_string(id));
  }
  std::printf("       decode: %s\n", graphed->DecodeLaunches().c_str());
  GPU_CHECK(graphed->DecodeLaunches() == "one captured graph a token");
  GPU_CHECK(a->capacity() == 2048);
  SequenceState ha(model->config), hb(model->config);
  Must(a->Download(ha), "downloading");
  Must(b->Download(hb), "downloading");
  GPU_CHECK(ha.BitEqual(hb));
}

// Branches from one state in one forward over their stacked rows: each branch's logits rows have the
// bits of a Prefill (kAll) of it on a copy, the state keeps its bits and goes on exactly after them;
// with grid 64 they run in two passes (40, then 50 and 7 rows). A branch past the grid, or logits
// from past its rows, is refused.
void BranchesGiveEachBranchAlonesBits() {
  Pair p = Load(TinyModelSize::kTiny, 64);
  const ModelConfig& c = p.model->config;
  const int64_t V = c.vocab_size;
  auto state = Must(p.gpu->NewState(), "a device state");
  Must(p.gpu->Prefill(*state, testing::RandomIds(150, V, 71)), "prefill");
  const std::vector<std::vector<int32_t>> ids = {testing::RandomIds(40, V, 72), testing::RandomIds(50, V, 73), testing::RandomIds(7, V, 74)};
  const std::vector<int64_t> from = {0, 37, 6};
  std::vector<PrefillBranch> branches;
  std::vector<float> alone;
  for (size_t i = 0; i < ids.size(); ++i) {
    branches.push_back({ids[i], from[i]});
    auto copy = Must(state->Clone(), "cloning");
    const std::vector<float> all = Must(p.gpu->Prefill(*copy, ids[i], LogitsRows::kAll), "a branch alone");
    alone.insert(alone.end(), all.begin() + from[i] * V, all.end());
  }
  auto untouched = Must(state->Clone(), "cloning");
  SequenceState before(c), after(c);
  Must(state->Download(before), "downloading");
  GPU_CHECK(SameBits(Must(p.gpu->PrefillBranches(*state, branches), "branches"), alone));
  Must(state->Download(after), "downloading");
  GPU_CHECK(after.BitEqual(before));
  const std::vector<int32_t> more = testing::RandomIds(30, V, 75);
  GPU_CHECK(SameBits(Must(p.gpu->Prefill(*state, more), "going on"), Must(p.gpu->Prefill(*untouched, more), "going on")));
  const std::vector<int32_t> past_grid = testing::RandomIds(65, V, 76);
  GPU_CHECK(!p.gpu->PrefillBranches(*state, std::vector<PrefillBranch>{{past_grid, 0}}).ok());
  GPU_CHECK(!p.gpu->PrefillBranches(*state, std::vector<PrefillBranch>{{ids[2], 7}}).ok());
}

// The backend's branches on a host state: each branch alone's logits through the backend, the host
// state unchanged, and a prefill after them resumes exactly; branches from an earlier anchor of the
// state overwrite the copy's rows above it, so the host's later anchor resumes from its own rows.
void BackendBranchesLeaveTheHostState() {
  Pair p = Load(TinyModelSize::kTiny);
  const ModelConfig& c = p.model->config;
  const auto backend = Backend(*p.model);
  const int64_t V = c.vocab_size;
  SequenceState host(c);
  const std::vector<int32_t> prompt = testing::RandomIds(200, V, 81);
  Must(backend->Prefill(host, std::span(prompt).first(128)), "prefill to 128");
  const Anchor at_128 = host.SaveAnchor();
  Must(backend->Prefill(host, std::span(prompt).subspan(128)), "prefill to 200");
  const std::vector<std::vector<int32_t>> ids = {testing::RandomIds(30, V, 82), testing::RandomIds(12, V, 83)};
  const std::vector<int64_t> from = {29, 0};
  std::vector<PrefillBranch> branches;
  std::vector<float> alone;
  for (size_t i = 0; i < ids.size(); ++i) {
    branches.push_back({ids[i], from[i]});
    SequenceState copy = host;
    const std::vector<float> all = Must(backend->Prefill(copy, ids[i], LogitsRows::kAll), "a branch alone");
    alone.insert(alone.end(), all.begin() + from[i] * V, all.end());
  }
  SequenceState before = host;
  GPU_CHECK(SameBits(Must(backend->PrefillBranches(host, branches), "branches"), alone));
  GPU_CHECK(host.BitEqual(before));
  const std::vector<int32_t> more = testing::RandomIds(30, V, 84);
  const std::vector<float> went_on = Must(backend->Prefill(before, more), "going on");
  GPU_CHECK(SameBits(Must(backend->Prefill(host, more), "going on"), went_on));
  GPU_CHECK(host.BitEqual(before));

  SequenceState again(c);
  Must(backend->Prefill(again, prompt), "prefill to 200");
  const Anchor at_200 = again.SaveAnchor();
  Must(again.RestoreAnchor(at_128), "back to 128");
  Must(backend->PrefillBranches(again, branches), "branches from 128");
  Must(again.RestoreAnchor(at_200), "on to 200 over the host's rows");
  GPU_CHECK(SameBits(Must(backend->Prefill(again, more), "going on from 200"), went_on));
}

// A draft window's rows are Decode's bits, and KeepDraft of k rows leaves k Decode calls' state: every
// row's logits, the state after 0, 1, 9 and 25 kept rows (one window grows the state past 1,024 rows),
// and the next decode after it. A closed window and a window past the most rows are refused.
void DraftWindowRowsAreDecodeSteps(GeneratedDtype dtype) {
  Pair p = Load(TinyModelSize::kTiny, 1024, dtype);
  const ModelConfig& c = p.model->config;
  const int64_t V = c.vocab_size;
  const std::vector<int32_t> ids = testing::RandomIds(25, V, 4);
  for (const int64_t prompt_length : {int64_t{150}, int64_t{1010}}) {
    const std::vector<int32_t> prompt = testing::RandomIds(static_cast<size_t>(prompt_length), V, 3);
    auto base = Must(p.gpu->NewState(), "a device state");
    Must(p.gpu->Prefill(*base, prompt), "prefill");
    // The decoded reference: each step's logits, and the state after the kept counts.
    const std::vector<int64_t> kept_counts = prompt_length == 150 ? std::vector<int64_t>{0, 1, 9, 25} : std::vector<int64_t>{17};
    std::vector<std::vector<float>> step_logits;
    std::vector<std::unique_ptr<DeviceState>> after(26);
    auto stepped = Must(base->Clone(), "cloning");
    after[0] = Must(stepped->Clone(), "cloning");
    for (size_t i = 0; i < ids.size(); ++i) {
      step_logits.push_back(Must(p.gpu->Decode(*stepped, ids[i]), "decode"));
      after[i + 1] = Must(stepped->Clone(), "cloning");
    }
    for (const int64_t kept : kept_counts) {
      auto windowed = Must(base->Clone(), "cloning");
      const std::vector<float> window = Must(p.gpu->DraftWindow(*windowed, ids), "a draft window");
      GPU_CHECK(windowed->length() == prompt_length + 25);
      for (size_t i = 0; i < ids.size(); ++i)
        GPU_CHECK_MSG(std::memcmp(window.data() + i * V, step_logits[i].data(), static_cast<size_t>(V) * 4) == 0,
                      "window row " + std::to_string(i) + " at " + std::to_string(prompt_length));
      Must(p.gpu->KeepDraft(*windowed, kept), "keeping the rows");
      GPU_CHECK(!p.gpu->KeepDraft(*windowed, 0).ok());  // the window is closed
      SequenceState got(c), want(c);
      Must(windowed->Download(got), "downloading");
      Must(after[static_cast<size_t>(kept)]->Download(want), "downloading");
      GPU_CHECK_MSG(got.BitEqual(want), "state after keeping " + std::to_string(kept) + " rows at " + std::to_string(prompt_length));
      auto reference = Must(after[static_cast<size_t>(kept)]->Clone(), "cloning");
      GPU_CHECK_MSG(SameBits(Must(p.gpu->Decode(*windowed, 5), "decode after the window"), Must(p.gpu->Decode(*reference, 5), "decode")),
                    "the decode after keeping " + std::to_string(kept));
    }
  }
  auto state = Must(p.gpu->NewState(), "a device state");
  Must(p.gpu->Prefill(*state, ids), "prefill");
  GPU_CHECK(!p.gpu->DraftWindow(*state, testing::RandomIds(CudaForward::kMaxDraftRows + 1, V, 5)).ok());
  GPU_CHECK(state->length() == 25);
}

// A decode batch on the device: each row the bits of its state's Decode alone and each state after it
// its decoded self, three steps in a row, over host states unlike each other: one at 1,024 rows (the
// batch grows its device copy), one just restored on the host from an anchor, one with images before
// its rows (they turn at shifted positions), one with no device copy yet. One state alone is Decode; a
// batch with a bad id changes no state. With graphs, a batch of other states (or the same ones grown)
// captures anew; the replayed steps give the launches' bits.
void DecodeBatchRowsAreDecodeSteps(bool graphs) {
  Pair p = Load(TinyModelSize::kTiny);
  const ModelConfig& c = p.model->config;
  const auto backend = Backend(*p.model, 64);
  backend->forward().set_decode_graphs(graphs);
  const int64_t V = c.vocab_size;
  std::vector<int32_t> pictured = testing::RandomIds(90, V, 51);
  auto image = std::make_shared<PromptImage>();
  image->digest = "batch image";
  image->rows = 3;
  image->columns = 4;
  image->key_ids = ImageKeyIds(image->digest, 12);
  image->embeddings = std::make_shared<const std::vector<float>>(RandomFloats(static_cast<size_t>(12 * c.hidden_size), 52));
  std::copy(image->key_ids.begin(), image->key_ids.end(), pictured.begin() + 10);
  const std::vector<std::shared_ptr<const PromptImage>> catalog = {image};
  const auto located = Must(PromptImages::Locate(pictured, catalog), "locating the image");

  std::vector<SequenceState> batched;
  for (int i = 0; i < 4; ++i) batched.emplace_back(c);
  Must(backend->Prefill(batched[0], testing::RandomIds(1024, V, 53)), "prefill to 1,024");
  Must(backend->Prefill(batched[1], testing::RandomIds(200, V, 54)), "prefill to 200");
  Must(batched[1].RestoreAnchor(batched[1].SaveAnchor()), "a host write");
  batched[2].set_images(located);
  Must(backend->Prefill(batched[2], pictured), "prefill with an image");
  Must(p.cpu->Prefill(batched[3], testing::RandomIds(70, V, 55)), "prefill on the CPU");  // no device copy
  std::vector<SequenceState> alone = batched;
  std::vector<SequenceState*> states;
  for (SequenceState& s : batched) states.push_back(&s);

  const std::vector<int32_t> bad = {3, 4, static_cast<int32_t>(V), 5};
  GPU_CHECK(!backend->DecodeBatch(states, bad).ok());
  for (size_t i = 0; i < states.size(); ++i) GPU_CHECK_MSG(batched[i].BitEqual(alone[i]), "state " + std::to_string(i) + " after a bad id");

  for (int step = 0; step < 5; ++step) {
    const std::vector<size_t> which = step == 3 ? std::vector<size_t>{2, 0} : std::vector<size_t>{0, 1, 2, 3};  // step 3: two of them
    std::vector<SequenceState*> some;
    for (size_t i : which) some.push_back(states[i]);
    const std::vector<int32_t> ids = testing::RandomIds(which.size(), V, 60 + step);
    const std::vector<float> logits = Must(backend->DecodeBatch(some, ids), "a decode batch");
    for (size_t j = 0; j < which.size(); ++j) {
      const size_t i = which[j];
      const std::vector<float> want = Must(backend->Decode(alone[i], ids[j]), "a decode alone");
      GPU_CHECK_MSG(std::memcmp(logits.data() + j * V, want.data(), static_cast<size_t>(V) * 4) == 0,
                    "state " + std::to_string(i) + "'s row at step " + std::to_string(step));
      GPU_CHECK_MSG(batched[i].BitEqual(alone[i]), "state " + std::to_string(i) + " after step " + std::to_string(step));
    }
  }
  GPU_CHECK_MSG(backend->forward().DecodeLaunches() == (graphs ? "one captured graph a token" : "launch by launch"),
                backend->forward().DecodeLaunches());
  SequenceState* one[] = {&batched[2]};
  const int32_t id = 9;
  GPU_CHECK(SameBits(Must(backend->DecodeBatch(one, std::span(&id, 1)), "a batch of one"), Must(backend->Decode(alone[2], id), "decode")));
  GPU_CHECK(batched[2].BitEqual(alone[2]));
}

// Decodes and draft windows of several host states in one batch: each row the bits of its own Decode or
// DraftWindow, each window kept (in another order than opened) leaving its DraftWindow's state, the
// decoded state advanced, a closed or never opened window refused. Windows of 40 and 30 rows take
// more than the first pass's 65 rows (grid 64). A bad id changes
// no state. A window opened and kept on another state meanwhile closes none of them. Then, after every
// window is kept, a plain decode of each state gives Decode's bits.
void WindowsOfSeveralStatesInOneBatch() {
  Pair p = Load(TinyModelSize::kTiny);
  const ModelConfig& c = p.model->config;
  const auto backend = Backend(*p.model, 64);
  const int64_t V = c.vocab_size;
  const std::vector<int64_t> lengths = {150, 70, 64, 9, 1000};
  const std::vector<std::vector<int32_t>> rows = {testing::RandomIds(6, V, 9), {11}, testing::RandomIds(40, V, 10),
                                                  testing::RandomIds(30, V, 12), testing::RandomIds(9, V, 13)};
  const std::vector<int64_t> kept = {4, 1, 33, 0, 9};
  std::vector<SequenceState> batched, alone;
  for (size_t i = 0; i < lengths.size(); ++i) {
    batched.emplace_back(c);
    Must(backend->Prefill(batched.back(), testing::RandomIds(static_cast<size_t>(lengths[i]), V, 20 + uint32_t(i))), "prefill");
  }
  alone = batched;
  std::vector<SequenceState*> states;
  for (SequenceState& s : batched) states.push_back(&s);
  std::vector<std::vector<int32_t>> bad = rows;
  bad[2][1] = static_cast<int32_t>(V);
  GPU_CHECK(!backend->DecodeWindowsBatch(states, bad).ok());
  for (size_t i = 0; i < states.size(); ++i) GPU_CHECK_MSG(batched[i].BitEqual(alone[i]), "state " + std::to_string(i) + " after a bad id");

  std::vector<float> want;  // each state's own Decode or window (kept at once: a window alone closes the others)
  for (size_t i = 0; i < states.size(); ++i) {
    const std::vector<float> own = rows[i].size() == 1 ? Must(backend->Decode(alone[i], rows[i][0]), "decode alone")
                                                       : Must(backend->DraftWindow(alone[i], rows[i]), "a window alone");
    want.insert(want.end(), own.begin(), own.end());
    if (rows[i].size() > 1) Must(backend->KeepDraft(alone[i], kept[i]), "keeping a window alone");
  }
  const std::vector<float> logits = Must(backend->DecodeWindowsBatch(states, rows), "decodes and windows in one batch");
  GPU_CHECK(logits.size() == want.size());
  int64_t row = 0;
  for (size_t i = 0; i < states.size(); ++i)
    for (size_t r = 0; r < rows[i].size(); ++r, ++row)
      GPU_CHECK_MSG(std::memcmp(logits.data() + row * V, want.data() + row * V, static_cast<size_t>(V) * 4) == 0,
                    "state " + std::to_string(i) + " row " + std::to_string(r));
  GPU_CHECK(batched[1].BitEqual(alone[1]));  // the decoded state
  GPU_CHECK(!backend->KeepDraft(batched[1], 1).ok());
  SequenceState other(c);  // a window elsewhere meanwhile leaves the batch's windows open (a slot walks its window over steps)
  Must(backend->Prefill(other, testing::RandomIds(30, V, 40)), "prefill");
  Must(backend->DraftWindow(other, testing::RandomIds(4, V, 41)), "another state's window");
  Must(backend->KeepDraft(other, 2), "keeping it");
  for (size_t i : {4, 2, 0, 3}) {
    Must(backend->KeepDraft(batched[i], kept[i]), "keeping a window of the batch");
    GPU_CHECK_MSG(batched[i].BitEqual(alone[i]), "state " + std::to_string(i) + " after keeping " + std::to_string(kept[i]) + " rows");
    GPU_CHECK(!backend->KeepDraft(batched[i], 0).ok());
  }
  for (size_t i = 0; i < states.size(); ++i)
    GPU_CHECK_MSG(SameBits(Must(backend->Decode(batched[i], 7), "a decode after"), Must(backend->Decode(alone[i], 7), "a decode after")),
                  "the decode after state " + std::to_string(i) + "'s window");
}

// The backend's draft windows on host states: the host state keeps its length and bits while the
// window is open, KeepDraft writes back the kept rows alone (the state then equals as many decodes),
// a host write in between makes KeepDraft refuse, and the generator with drafts picks plain decoding's
// tokens into the same state, lookup drafts all right, all wrong and partly right, and the MTP head's.
void BackendDraftWindowsKeepHostStates() {
  Pair p = Load(TinyModelSize::kTiny);
  const ModelConfig& c = p.model->config;
  const auto backend = Backend(*p.model);
  const int64_t V = c.vocab_size;
  const std::vector<int32_t> prompt = testing::RandomIds(200, V, 7), ids = testing::RandomIds(6, V, 8);
  SequenceState stepped(c), windowed(c);
  Must(backend->Prefill(stepped, prompt), "prefill");
  Must(backend->Prefill(windowed, prompt), "prefill");
  for (int i = 0; i < 4; ++i) Must(backend->Decode(stepped, ids[static_cast<size_t>(i)]), "decode");
  const SequenceState before = windowed;
  Must(backend->DraftWindow(windowed, ids), "a draft window");
  GPU_CHECK(windowed.length() == 200 && windowed.mirror_rows() == 200);
  Must(backend->KeepDraft(windowed, 4), "keeping 4 rows");
  GPU_CHECK(windowed.length() == 204);
  GPU_CHECK(windowed.BitEqual(stepped));  // the recurrent part pulled from the device, the rows written back
  GPU_CHECK(!backend->KeepDraft(windowed, 1).ok());

  SequenceState changed = before;
  Must(backend->DraftWindow(changed, ids), "a draft window");
  Must(changed.RestoreAnchor(before.SaveAnchor()), "a host write");
  GPU_CHECK(!backend->KeepDraft(changed, 2).ok());
  GPU_CHECK(changed.BitEqual(before));

  // A window from an earlier anchor of the state writes the copy's rows above it: after none of it is
  // kept, the host's later anchor goes on from its own rows.
  SequenceState rolled(c);
  Must(backend->Prefill(rolled, std::span(prompt).first(128)), "prefill to 128");
  const Anchor at_128 = rolled.SaveAnchor();
  Must(backend->Prefill(rolled, std::span(prompt).subspan(128)), "prefill to 200");
  const Anchor at_200 = rolled.SaveAnchor();
  SequenceState reference = rolled;
  const std::vector<float> went_on = Must(backend->Prefill(reference, ids), "going on from 200");
  Must(rolled.RestoreAnchor(at_128), "back to 128");
  Must(backend->DraftWindow(rolled, ids), "a window at 128");
  Must(backend->KeepDraft(rolled, 0), "keeping none of it");
  Must(rolled.RestoreAnchor(at_200), "on to 200 over the host's rows");
  GPU_CHECK(SameBits(Must(backend->Prefill(rolled, ids), "going on from 200"), went_on));

  Generator generator(*backend, nullptr);
  std::vector<int32_t> block = testing::RandomIds(30, V, 21), copy = block;
  copy.insert(copy.end(), block.begin(), block.begin() + 5);
  SamplingParams all_right;
  all_right.temperature = 0;
  all_right.max_tokens = 24;
  all_right.forced_ids.assign(block.begin() + 5, block.begin() + 29);  // the reply repeats the prompt: every draft is right
  SamplingParams partly = all_right;
  for (size_t i = 10; i < partly.forced_ids.size(); ++i) partly.forced_ids[i] = (partly.forced_ids[i] + 3) % static_cast<int32_t>(V);
  SamplingParams wrong = all_right;
  wrong.max_tokens = 3;
  wrong.forced_ids = {block[5], static_cast<int32_t>((block[6] + 1) % V), block[0]};
  SamplingParams free_run = all_right;
  free_run.forced_ids.clear();
  for (const SamplingParams* params : {&all_right, &partly, &wrong, &free_run}) {
    SequenceState plain_state(c), draft_state(c);
    const std::span<const int32_t> head = std::span(copy).first(copy.size() - 1), last = std::span(copy).last(1);
    Must(backend->Prefill(plain_state, head), "prefill");
    Must(backend->Prefill(draft_state, head), "prefill");
    const GenerationResult plain = Must(generator.Generate(plain_state, last, *params, nullptr), "plain decoding");
    SpeculativeOptions spec;
    spec.max_draft = 8;
    spec.history = head;
    const GenerationResult drafted = Must(generator.Generate(draft_state, last, *params, nullptr, nullptr, spec), "decoding with drafts");
    GPU_CHECK(drafted.tokens == plain.tokens);
    GPU_CHECK(draft_state.BitEqual(plain_state));
    if (params != &free_run) GPU_CHECK(drafted.drafted_tokens > 0);
    if (params == &all_right) GPU_CHECK(drafted.accepted_tokens == drafted.drafted_tokens);
    if (params == &wrong) GPU_CHECK(drafted.accepted_tokens == 0);
    if (params == &partly) GPU_CHECK(drafted.accepted_tokens > 0 && drafted.accepted_tokens < drafted.drafted_tokens);
  }
  // The MTP head drafting where lookup finds nothing (random prompts): plain decoding's tokens and state.
  int64_t head_drafts = 0;
  for (uint32_t seed : {51u, 52u}) {
    const std::vector<int32_t> prompt = testing::RandomIds(150, V, seed);
    const std::span<const int32_t> head = std::span(prompt).first(149), last = std::span(prompt).last(1);
    SequenceState plain_state(c), draft_state(c);
    Must(backend->Prefill(plain_state, head), "prefill");
    Must(backend->Prefill(draft_state, head), "prefill");
    const GenerationResult plain = Must(generator.Generate(plain_state, last, free_run, nullptr), "plain decoding");
    SpeculativeOptions spec;
    spec.max_draft = 4;
    spec.lookup = false;
    spec.mtp = true;
    spec.history = head;
    const GenerationResult drafted = Must(generator.Generate(draft_state, last, free_run, nullptr, nullptr, spec), "MTP drafts");
    GPU_CHECK(drafted.tokens == plain.tokens);
    GPU_CHECK(draft_state.BitEqual(plain_state));
    head_drafts += drafted.drafted_tokens;
  }
  GPU_CHECK(head_drafts > 0);
}

// The MTP head on the device against the CPU's: the head starts at 100 (the prefix before has no rows
// of it), the same rows are committed and waiting after a prefill (in one call and in two; at grid 64
// the second call's first chunk commits 65 rows, in two pieces), a decode and a kept draft window, and drafts' head logits
// are within 1e-3 x max |logit| of the CPU head's; the same run twice gives the same bits.
void MtpHeadMatchesTheCpus() {
  Pair p = Load(TinyModelSize::kTiny, 64);
  const ModelConfig& c = p.model->config;
  const int64_t V = c.vocab_size;
  GPU_CHECK(p.gpu->has_mtp());
  const std::vector<int32_t> prompt = testing::RandomIds(300, V, 91), window = testing::RandomIds(5, V, 92);
  SequenceState cpu_state(c);
  MtpState cpu_mtp;
  Must(p.cpu->Prefill(cpu_state, std::span(prompt).first(100)), "CPU prefill to 100");
  Must(p.cpu->Prefill(cpu_state, std::span(prompt).subspan(100), LogitsRows::kLast, &cpu_mtp), "CPU prefill to 300");
  Must(p.cpu->Decode(cpu_state, window[0], &cpu_mtp), "CPU decode");
  Must(p.cpu->DraftWindow(cpu_state, window, &cpu_mtp), "CPU window");
  Must(p.cpu->KeepDraft(cpu_state, 3), "CPU keeps 3 rows");
  // Rows 299 to 303 wait: the prefill's last, the decode's, the window's kept three; then the ids after each.
  const std::vector<int32_t> pending_ids = {window[0], window[0], window[1], window[2], window[3]};
  std::vector<float> cpu_logits;
  const std::vector<int32_t> cpu_drafts = Must(p.cpu->MtpDraft(cpu_mtp, pending_ids, 3, V, &cpu_logits), "CPU drafts");
  std::vector<float> runs[2];
  for (int run = 0; run < 2; ++run) {
    auto state = Must(p.gpu->NewState(), "a device state");
    MtpState mtp;
    Must(p.gpu->Prefill(*state, std::span(prompt).first(100)), "GPU prefill to 100");
    Must(p.gpu->Prefill(*state, std::span(prompt).subspan(100, 28), LogitsRows::kLast, &mtp), "GPU prefill to 128");
    Must(p.gpu->Prefill(*state, std::span(prompt).subspan(128), LogitsRows::kLast, &mtp), "GPU prefill to 300");
    GPU_CHECK(mtp.begin == 100 && mtp.rows == 199 && mtp.pending_rows == 1);
    Must(p.gpu->Decode(*state, window[0], &mtp), "GPU decode");
    Must(p.gpu->DraftWindow(*state, window, &mtp), "GPU window");
    Must(p.gpu->KeepDraft(*state, 3), "GPU keeps 3 rows");
    GPU_CHECK(mtp.rows == 199 && mtp.pending_rows == 5);
    const std::vector<int32_t> drafts = Must(p.gpu->MtpDraft(mtp, pending_ids, 3, V, &runs[run]), "GPU drafts");
    GPU_CHECK(mtp.begin == cpu_mtp.begin && mtp.rows == cpu_mtp.rows && mtp.pending_rows == 0);
    float largest = 0.0f;
    for (float x : cpu_logits) largest = std::max(largest, std::fabs(x));
    const float diff = MaxAbsDiff(runs[run], cpu_logits);
    if (run == 0) std::printf("       MTP head: max |logit diff| vs CPU over 3 drafts %.3g (max |logit| %.3g)\n", diff, largest);
    GPU_CHECK_MSG(diff <= 1e-3f * largest, std::to_string(diff));
    GPU_CHECK(drafts == cpu_drafts);
  }
  GPU_CHECK(SameBits(runs[0], runs[1]));
  // Waiting rows that are not on this device (the CPU's) are refused, not read.
  SequenceState other(c);
  MtpState cpu_rows;
  Must(p.cpu->Prefill(other, std::span(prompt).first(20), LogitsRows::kLast, &cpu_rows), "CPU prefill");
  GPU_CHECK(cpu_rows.pending_rows == 1 && !p.gpu->MtpDraft(cpu_rows, std::span(prompt).subspan(20, 1), 2, V).ok());
  GPU_CHECK(!p.gpu->MtpCommit(cpu_rows, std::span(prompt).subspan(20, 1)).ok());
}

#ifdef ANCHORAGE_CUDA_EMULATED
// A device with no room for the MTP head's rows: prefill and decode go on with the bits of a run
// without the head, which gives its rows up for good (a new MtpState starts once there is room), and
// so does a draft; the forward counts the head's device bytes while an MtpState holds them.
void MtpRowsGiveWayOnAFullDevice() {
  Pair p = Load(TinyModelSize::kTiny, 64);
  const int64_t V = p.model->config.vocab_size;
  const std::vector<int32_t> prompt = testing::RandomIds(300, V, 93);
  auto plain = Must(p.gpu->NewState(), "a device state");
  auto headed = Must(p.gpu->NewState(), "a device state");
  Must(headed->Reserve(1024), "reserving");
  const std::vector<float> want = Must(p.gpu->Prefill(*plain, prompt), "prefill");
  const std::vector<float> want_next = Must(p.gpu->Decode(*plain, 7), "decode");
  const int64_t counted = p.gpu->mtp_bytes();
  size_t free = 0, total = 0;
  Must(cuda::CudaStatus(cudaMemGetInfo(&free, &total), "reading"), "the device's memory");
  const size_t size = simtSetDeviceBytes(total - free);  // full: every allocation fails
  MtpState mtp;
  auto got = p.gpu->Prefill(*headed, prompt, LogitsRows::kLast, &mtp);
  auto next = p.gpu->Decode(*headed, 7, &mtp);
  simtSetDeviceBytes(size);
  GPU_CHECK_MSG(got.ok() && next.ok(), got.ok() ? next.status().message() : got.status().message());
  GPU_CHECK(SameBits(*got, want) && SameBits(*next, want_next));
  GPU_CHECK(mtp.gave_up && mtp.begin == -1 && mtp.pending_rows == 0 && p.gpu->mtp_bytes() == counted);
  Must(p.gpu->Decode(*headed, 8, &mtp), "decode with room");
  GPU_CHECK(mtp.gave_up && mtp.pending_rows == 0 && p.gpu->mtp_bytes() == counted);
  MtpState fresh;
  Must(p.gpu->Decode(*headed, 9, &fresh), "decode with a new head");
  GPU_CHECK(fresh.begin == 302 && fresh.pending_rows == 1 && p.gpu->mtp_bytes() > counted);
  // A draft whose K/V rows find no room gives the head up too, and returns no drafts.
  Must(cuda::CudaStatus(cudaMemGetInfo(&free, &total), "reading"), "the device's memory");
  simtSetDeviceBytes(total - free);
  const std::vector<int32_t> next_id = {11};
  auto drafts = p.gpu->MtpDraft(fresh, next_id, 2, V);
  simtSetDeviceBytes(size);
  GPU_CHECK_MSG(drafts.ok(), drafts.status().message());
  GPU_CHECK(drafts->empty() && fresh.gave_up && fresh.pending_rows == 0 && p.gpu->mtp_bytes() == counted);
}
#endif

// Bad ids (none, negative, past the vocabulary) are refused with the index named and change nothing.
void BadIdsChangeNothing() {
  Pair p = Load(TinyModelSize::kTiny);
  const ModelConfig& c = p.model->config;
  auto state = Must(p.gpu->NewState(), "a device state");
  Must(p.gpu->Prefill(*state, testing::RandomIds(100, c.vocab_size, 91)), "prefill");
  SequenceState before(c), after(c);
  Must(state->Download(before), "downloading");
  const std::vector<int32_t> past_vocab = {1, 2, static_cast<int32_t>(c.vocab_size)};
  auto refused = p.gpu->Prefill(*state, past_vocab);
  GPU_CHECK(!refused.ok());
  GPU_CHECK_MSG(refused.status().message().find("at index 2") != std::string::npos, refused.status().message());
  GPU_CHECK(!p.gpu->Prefill(*state, std::vector<int32_t>{}).ok());
  GPU_CHECK(!p.gpu->Decode(*state, -1).ok());
  Must(state->Download(after), "downloading");
  GPU_CHECK(after.BitEqual(before));
}

// FP8 weights in the kernels: every e4m3 code widens to its exact value (all 256 against the CPU's
// decoding, NaN for NaN); the GEMV (8-wide loads with blocks of 32 columns, and one at a time with blocks
// of 25) and the CUDA-core GEMM within sum|w x| (K + 1) 2^-23 of the double product of codes times
// scales, each row a one-row call's bits; the fused decode launches give the GEMV's bits.
void Fp8ProductsMatchTheReference() {
  {
    std::vector<uint8_t> codes(256 * 8, 0);
    for (int j = 0; j < 256; ++j) codes[static_cast<size_t>(j * 8)] = static_cast<uint8_t>(j);
    const std::vector<float> one_scale(256, 1.0f), x = {1, 0, 0, 0, 0, 0, 0, 0};
    cuda::DeviceBuffer dq = ToDevice(codes), ds = ToDevice(one_scale), dx = ToDevice(x);
    auto dy = Must(cuda::DeviceBuffer::Allocate(256 * 4, "y"), "allocating");
    const cuda::Q8Weights w{static_cast<const uint8_t*>(dq.data()), ds.floats(), 1, 8, 1};
    cuda::GemvQ8(w, 256, 8, dx.floats(), 1, dy.floats(), nullptr);
    const std::vector<float> y = ToHost(dy, 256);
    for (int j = 0; j < 256; ++j) {
      const float want = Fp8E4m3ToFloat(static_cast<uint8_t>(j)), got = y[static_cast<size_t>(j)];
      GPU_CHECK_MSG(std::isnan(want) ? std::isnan(got) : want == got, "code " + std::to_string(j));  // -0 sums to +0
    }
  }
  for (const auto& [K, block_rows, block_cols] : {std::tuple<int64_t, int64_t, int64_t>{264, 16, 32}, {250, 7, 25}}) {
    const int64_t N = 77, n = 11, scale_cols = (K + block_cols - 1) / block_cols, scale_rows = (N + block_rows - 1) / block_rows;
    std::mt19937 rng(static_cast<uint32_t>(K));
    std::vector<uint8_t> codes(static_cast<size_t>(N * K));
    for (uint8_t& q : codes) {
      do q = static_cast<uint8_t>(rng() & 0xff);
      while (Fp8E4m3IsNan(q));
    }
    const std::vector<float> scales = RandomFloats(static_cast<size_t>(scale_rows * scale_cols), 5, 1.0f / 512, 1.0f / 64);
    const std::vector<float> x = RandomFloats(static_cast<size_t>(n * K), 6, -2.0f, 2.0f);
    cuda::DeviceBuffer dq = ToDevice(codes), ds = ToDevice(scales), dx = ToDevice(x);
    const cuda::Q8Weights w{static_cast<const uint8_t*>(dq.data()), ds.floats(), block_rows, block_cols, scale_cols};
    auto alloc = [](int64_t floats) { return Must(cuda::DeviceBuffer::Allocate(static_cast<size_t>(floats) * 4, "out"), "allocating"); };
    cuda::DeviceBuffer gemv = alloc(n * N), gemm = alloc(n * N), one = alloc(N), one_gemm = alloc(N);
    cuda::GemvQ8(w, N, K, dx.floats(), n, gemv.floats(), nullptr);
    cuda::GemmSimtQ8(w, N, K, dx.floats(), n, gemm.floats(), N, nullptr);
    const std::vector<float> y = ToHost(gemv, static_cast<size_t>(n * N)), z = ToHost(gemm, static_cast<size_t>(n * N));
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t j = 0; j < N; ++j) {
        double exact = 0.0, magnitude = 0.0;
        for (int64_t k = 0; k < K; ++k) {
          const double wv = static_cast<double>(Fp8E4m3ToFloat(codes[static_cast<size_t>(j * K + k)])) *
                            scales[static_cast<size_t>((j / block_rows) * scale_cols + k / block_cols)];
          exact += wv * x[static_cast<size_t>(t * K + k)];
          magnitude += std::fabs(wv * x[static_cast<size_t>(t * K + k)]);
        }
        const double bound = magnitude * static_cast<double>(K + 1) * std::ldexp(1.0, -23);
        const std::string where = "K " + std::to_string(K) + ", row " + std::to_string(t) + ", output " + std::to_string(j);
        GPU_CHECK_MSG(std::fabs(y[static_cast<size_t>(t * N + j)] - exact) <= bound, "gemv " + where);
        GPU_CHECK_MSG(std::fabs(z[static_cast<size_t>(t * N + j)] - exact) <= bound, "gemm " + where);
      }
      cuda::GemvQ8(w, N, K, dx.floats() + t * K, 1, one.floats(), nullptr);
      cuda::GemmSimtQ8(w, N, K, dx.floats() + t * K, 1, one_gemm.floats(), N, nullptr);
      GPU_CHECK_MSG(std::memcmp(ToHost(one, static_cast<size_t>(N)).data(), y.data() + t * N, static_cast<size_t>(N) * 4) == 0,
                    "gemv row " + std::to_string(t) + " alone");
      GPU_CHECK_MSG(std::memcmp(ToHost(one_gemm, static_cast<size_t>(N)).data(), z.data() + t * N, static_cast<size_t>(N) * 4) == 0,
                    "gemm row " + std::to_string(t) + " alone");
    }
    // The fused decode launches over FP8 weights: GemvMany and GemvSwiGlu give GemvQ8's bits.
    cuda::DeviceBuffer set_out = alloc(N), swiglu = alloc(N), up = alloc(N);
    cuda::GemvSet set;
    set.count = 1;
    set.q8[0] = w;
    set.rows[0] = N;
    set.y[0] = set_out.floats();
    cuda::GemvMany(set, K, dx.floats(), nullptr);
    cuda::GemvQ8(w, N, K, dx.floats(), 1, one.floats(), nullptr);
    GPU_CHECK(SameBits(ToHost(set_out, static_cast<size_t>(N)), ToHost(one, static_cast<size_t>(N))));
    cuda::GemvSwiGlu(nullptr, nullptr, N, K, dx.floats(), swiglu.floats(), nullptr, w, w);
    cuda::GemvQ8(w, N, K, dx.floats(), 1, up.floats(), nullptr);
    cuda::SwiGlu(one.floats(), up.floats(), N, nullptr);
    GPU_CHECK(SameBits(ToHost(swiglu, static_cast<size_t>(N)), ToHost(one, static_cast<size_t>(N))));
  }
}

void FingerprintNamesTheBackend() {
  Pair p = Load(TinyModelSize::kTiny);
  const std::string kernels = p.gpu->KernelSet();
  std::printf("       kernel set: %s", kernels.c_str());
  GPU_CHECK(kernels.find(p.gpu->device().name) != std::string::npos);
  GPU_CHECK(p.gpu->StateFingerprint("model") != Forward::StateFingerprint("model"));
  GPU_CHECK(p.gpu->StateFingerprint("model") != p.gpu->StateFingerprint("other model"));
}

}  // namespace

int main() {
  auto device = cuda::FindDevice(0);
  if (!device.ok()) {
    // Without a device the backend must say why, not crash: the engine then runs on the CPU.
    auto model = testing::MakeModel(TinyModelSize::kTiny, 5, TempDir("nodevice"));
    if (!model.ok()) {
      std::printf("FAIL   generating the tiny model: %s\n", model.status().message().c_str());
      return 1;
    }
    auto gpu = CudaForward::Create((*model)->config, (*model)->weights, CudaForwardOptions{});
    if (gpu.ok() || gpu.status().message() != device.status().message()) {
      std::printf("FAIL   CudaForward::Create without a device: %s\n", gpu.ok() ? "succeeded" : gpu.status().message().c_str());
      return 1;
    }
#ifndef ANCHORAGE_CUDA_EMULATED
    auto plugin = PluginBackend(**model);  // it loads here too, and says the same
    if (plugin.ok() || plugin.status().message() != device.status().message()) {
      std::printf("FAIL   the CUDA plugin without a device: %s\n", plugin.ok() ? "made a backend" : plugin.status().message().c_str());
      return 1;
    }
#endif
    std::printf("SKIP   every GPU case: %s\n", device.status().message().c_str());
    return gpu_check::kSkipped;
  }
  std::printf("device: %s\n", device->Describe().c_str());
#ifdef ANCHORAGE_CUDA_EMULATED
  // The emulator runs a thread at a time: the small model's cases would take many minutes.
  constexpr bool kSmallCases = false;
  std::printf("SKIP   the small model's cases: this is the SIMT emulator\n");
#else
  constexpr bool kSmallCases = true;
#endif
  std::vector<gpu_check::Case> cases = {
      {"gemm matches the double reference; rows independent of the call", GemmMatchesReferenceAndRowsAreIndependent},
      {"cuda-core gemm matches the double reference; rows independent of the call", GemmSimtMatchesReferenceAndRowsAreIndependent},
      {"gemv matches the double reference (8-wide loads)", [] { GemvMatchesReference(520); }},
      {"gemv matches the double reference (odd width)", [] { GemvMatchesReference(522); }},
      {"fused launches give the steps' bits", FusedLaunchesGiveTheStepsBits},
      {"gated delta rule matches the CPU's", GatedDeltaMatchesCpu},
      {"attention matches the CPU's; rows independent of the call", AttentionMatchesCpuAndRowsAreIndependent},
      {"tiny forward within 1e-4 x max |logit| of the CPU's", [] { ForwardMatchesCpu(TinyModelSize::kTiny, 0.0f, 1e-4f); }},
      {"tiny: resume at every 64-line is bit-equal (grid 1024)", [] { ResumeAtEvery64LineIsBitEqual(TinyModelSize::kTiny, 1024); }},
      {"tiny: the same run twice is bit-equal", [] { SameRunTwiceIsBitEqual(TinyModelSize::kTiny); }},
      {"growing and cloning keep the state", GrowingAndCloningKeepTheState},
      {"anchors and K/V rows resume exactly, on the device and through the host", AnchorsAndRowsResumeExactly},
      {"decode through a captured graph gives the launches' bits", DecodeGraphsGiveTheLaunchesBits},
      {"draft window rows are decode steps; keeping k rows equals k decodes", [] { DraftWindowRowsAreDecodeSteps(GeneratedDtype::kBf16); }},
      {"fp8: draft window rows are decode steps; keeping k rows equals k decodes", [] { DraftWindowRowsAreDecodeSteps(GeneratedDtype::kFp8); }},
      {"branches in one forward give each branch alone's bits", BranchesGiveEachBranchAlonesBits},
      {"the MTP head matches the CPU's", MtpHeadMatchesTheCpus},
#ifdef ANCHORAGE_CUDA_EMULATED
      {"the MTP head's rows give way on a full device", MtpRowsGiveWayOnAFullDevice},
#endif
      {"bad ids change nothing", BadIdsChangeNothing},
      {"images: the CPU's logits and positions, resumed exactly", ImagesMatchTheCpuAndResumeExactly},
      {"the vision tower matches the CPU's; bidirectional attention rows independent of the call", VisionTowerMatchesTheCpus},
      {"the backend on host states gives CudaForward's bits and resumes exactly", BackendOnHostStatesResumesExactly},
      {"host writes reach a state's device copy", HostWritesReachTheDeviceCopy},
      {"host copies in pieces of a small staging buffer, or none, give the same bits", StagingInPiecesGivesTheSameBits},
      {"a fork on the device keeps the state (a branch)", [] { ForkKeepsTheState(1024); }},
      {"a fork on the device keeps the state (past the grid: from a device anchor)", [] { ForkKeepsTheState(64); }},
      {"the backend's draft windows keep host states; drafts give plain decoding's tokens", BackendDraftWindowsKeepHostStates},
      {"a decode batch gives each state's Decode bits", [] { DecodeBatchRowsAreDecodeSteps(false); }},
      {"a decode batch through captured graphs gives each state's Decode bits", [] { DecodeBatchRowsAreDecodeSteps(true); }},
      {"decode batch: windows of several states in one batch give each alone's bits", WindowsOfSeveralStatesInOneBatch},
      {"the backend's branches leave the host state", BackendBranchesLeaveTheHostState},
#ifndef ANCHORAGE_CUDA_EMULATED
      {"the plugin gives the linked backend's bits", ThePluginGivesTheLinkedBackendsBits},
#endif
      {"fp8 products match the double reference; rows independent of the call", Fp8ProductsMatchTheReference},
      {"fp8 tiny forward within 1e-4 x max |logit| of the CPU's", [] { ForwardMatchesCpu(TinyModelSize::kTiny, 0.0f, 1e-4f, GeneratedDtype::kFp8); }},
      {"fp8 tiny: resume at every 64-line is bit-equal (grid 256)", [] { ResumeAtEvery64LineIsBitEqual(TinyModelSize::kTiny, 256, GeneratedDtype::kFp8); }},
      {"int8 tiny forward within 1e-3 x max |logit| of the CPU's int8 forward",
       [] { ForwardMatchesCpu(TinyModelSize::kTiny, 0.0f, 1e-3f, GeneratedDtype::kBf16, true); }},
      {"int8 tiny: resume at every 64-line is bit-equal (grid 256)",
       [] { ResumeAtEvery64LineIsBitEqual(TinyModelSize::kTiny, 256, GeneratedDtype::kBf16, true); }},
      {"the fingerprint names the backend", FingerprintNamesTheBackend},
      {"bf16 K/V rows match the CPU's rounding; attention over them matches fp32 rows of their values", Bf16RowsMatchTheCpusRounding},
      {"bf16 K/V rows: tiny forward within 1e-4 x max |logit| of the CPU's bf16 forward",
       KvRowsOf(KvDtype::kBf16, [] { ForwardMatchesCpu(TinyModelSize::kTiny, 0.0f, 1e-4f); })},
      {"bf16 K/V rows: tiny resume at every 64-line is bit-equal (grid 256)",
       KvRowsOf(KvDtype::kBf16, [] { ResumeAtEvery64LineIsBitEqual(TinyModelSize::kTiny, 256); })},
      {"bf16 K/V rows: anchors and K/V rows resume exactly, on the device and through the host", KvRowsOf(KvDtype::kBf16, AnchorsAndRowsResumeExactly)},
      {"bf16 K/V rows: the backend on host states gives CudaForward's bits and resumes exactly",
       KvRowsOf(KvDtype::kBf16, BackendOnHostStatesResumesExactly)},
      {"bf16 K/V rows: decode through a captured graph gives the launches' bits", KvRowsOf(KvDtype::kBf16, DecodeGraphsGiveTheLaunchesBits)},
      {"bf16 K/V rows: draft window rows are decode steps; keeping k rows equals k decodes",
       KvRowsOf(KvDtype::kBf16, [] { DraftWindowRowsAreDecodeSteps(GeneratedDtype::kBf16); })},
      {"bf16 K/V rows: branches in one forward give each branch alone's bits", KvRowsOf(KvDtype::kBf16, BranchesGiveEachBranchAlonesBits)},
      {"fp8 K/V rows match the CPU's quantizer; attention over them matches fp32 rows of their values", Fp8RowsMatchTheCpusQuantizer},
      {"fast products: the tiny forward near the fp64 reference, its fingerprint its own", FastProductsStayNearTheReference},
      {"fast products: tiny resume at every 64-line is bit-equal (grid 256)", FastProducts([] { ResumeAtEvery64LineIsBitEqual(TinyModelSize::kTiny, 256); })},
      // The backends' K values differ in their last bits; one at a code's rounding boundary takes the next code.
      {"fp8 K/V rows: tiny forward within 1e-3 x max |logit| of the CPU's fp8 forward",
       KvRowsOf(KvDtype::kFp8, [] { ForwardMatchesCpu(TinyModelSize::kTiny, 0.0f, 1e-3f); })},
      {"fp8 K/V rows: tiny resume at every 64-line is bit-equal (grid 256)",
       KvRowsOf(KvDtype::kFp8, [] { ResumeAtEvery64LineIsBitEqual(TinyModelSize::kTiny, 256); })},
      {"fp8 K/V rows: anchors and K/V rows resume exactly, on the device and through the host", KvRowsOf(KvDtype::kFp8, AnchorsAndRowsResumeExactly)},
      {"fp8 K/V rows: the backend on host states gives CudaForward's bits and resumes exactly",
       KvRowsOf(KvDtype::kFp8, BackendOnHostStatesResumesExactly)},
      {"fp8 K/V rows: decode through a captured graph gives the launches' bits", KvRowsOf(KvDtype::kFp8, DecodeGraphsGiveTheLaunchesBits)},
      {"fp8 K/V rows: draft window rows are decode steps; keeping k rows equals k decodes",
       KvRowsOf(KvDtype::kFp8, [] { DraftWindowRowsAreDecodeSteps(GeneratedDtype::kBf16); })},
      {"fp8 K/V rows: branches in one forward give each branch alone's bits", KvRowsOf(KvDtype::kFp8, BranchesGiveEachBranchAlonesBits)},
      {"bf16 K/V rows: the fingerprint names the dtype", KvRowsOf(KvDtype::kBf16, [] {
         Pair bf16 = Load(TinyModelSize::kTiny);
         g_kv_dtype = KvDtype::kF32;
         Pair f32 = Load(TinyModelSize::kTiny);
         GPU_CHECK(bf16.gpu->StateFingerprint("model") != f32.gpu->StateFingerprint("model"));
         auto state = Must(bf16.gpu->NewState(), "a device state");
         Must(state->Reserve(64), "reserving");
         auto wide = Must(f32.gpu->NewState(), "a device state");
         Must(wide->Reserve(64), "reserving");
         GPU_CHECK(wide->allocated_bytes() - state->allocated_bytes() == wide->capacity() * SequenceState::KvBytesPerToken(bf16.model->config));
         KvRows f32_rows;  // rows of the other dtype are refused
         f32_rows.end = 1;
         f32_rows.data.resize(static_cast<size_t>(4 * SequenceState::KvBytesPerToken(f32.model->config)));
         GPU_CHECK(!state->WriteRows(f32_rows).ok());
       })},
  };
  if (kSmallCases) {
    cases.push_back({"small forward within 1e-3 of the CPU's", [] { ForwardMatchesCpu(TinyModelSize::kSmall, 1e-3f, 0.0f); }});
    cases.push_back({"small: resume at every 64-line is bit-equal (grid 256)", [] { ResumeAtEvery64LineIsBitEqual(TinyModelSize::kSmall, 256); }});
    cases.push_back({"small: the same run twice is bit-equal", [] { SameRunTwiceIsBitEqual(TinyModelSize::kSmall); }});
  }
  return gpu_check::RunCases(cases);
}
