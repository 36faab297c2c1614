// One decode step's attention at the `small` model's shape (8 heads, 2 kv heads, head_dim 256) per kernel path,
// K/V dtype and context: the decode kernels against the same row run as a one-row prefill (the panel path), with
// the K/V bytes a step reads as a fraction of the stream rate and the products as a fraction of the FMA peak.
//   anchorage-bench-attention [--threads N] [--contexts 512,2048,8192,32768] [--heads H --kv-heads K --head-dim D]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "engine/compute/cpu/attention.h"
#include "engine/compute/cpu/cpu_features.h"
#include "engine/compute/cpu/matmul.h"
#include "engine/core/thread_pool.h"
#include "bench_util.h"
#include "machine_limits.h"

using namespace anchorage;

namespace {

// Seconds a call of fn takes: the best of 5 rounds of enough calls to fill 0.2 s.
template <class Fn>
double SecondsACall(Fn fn) {
  fn();
  int calls = 1;
  for (double t0 = bench::LimitsNow(); bench::LimitsNow() - t0 < 0.05; ++calls) fn();
  calls = std::max(1, calls * 4);
  double best = 1e30;
  for (int round = 0; round < 5; ++round) {
    const double t0 = bench::LimitsNow();
    for (int i = 0; i < calls; ++i) fn();
    best = std::min(best, (bench::LimitsNow() - t0) / calls);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2;
  std::vector<int64_t> contexts = {512, 2048, 8192, 32768};
  cpu::AttentionShape shape{8, 2, 256, 1.0f / 16.0f};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--threads") threads = std::atoi(v.c_str());
    else if (a == "--contexts") contexts = bench::NumberList<int64_t>(v);
    else if (a == "--heads") shape.num_heads = std::atoll(v.c_str());
    else if (a == "--kv-heads") shape.num_kv_heads = std::atoll(v.c_str());
    else if (a == "--head-dim") shape.head_dim = std::atoll(v.c_str());
    else {
      std::fprintf(stderr, "usage: anchorage-bench-attention [--threads N] [--contexts A,B,..] [--heads H --kv-heads K --head-dim D]\n");
      return 2;
    }
  }
  shape.scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
  const cpu::CpuFeatures& f = cpu::DetectCpu();
  const bench::Peaks peaks = bench::MeasurePeaks(f);
  const double stream = bench::StreamGBs(std::vector<float>(size_t(64) << 20, 1.0f), threads);
  std::printf("machine: %s (%s family %d model %d); kernel families: %s\n", f.brand.c_str(), f.vendor.c_str(), f.family, f.model,
              cpu::DescribeKernelFamilies(f).c_str());
  std::printf("limits: fp32 FMA %.1f GFLOP/s a core (%s); stream read %.1f GB/s with %d threads\n", peaks.fma,
              f.avx512f ? "avx512" : "avx2", stream, threads);
  std::printf("shape: %lld heads, %lld kv heads, head_dim %lld; %d threads; one layer's step\n", static_cast<long long>(shape.num_heads),
              static_cast<long long>(shape.num_kv_heads), static_cast<long long>(shape.head_dim), threads);
  ThreadPool pool(threads);
  const int64_t kv_stride = shape.num_kv_heads * shape.head_dim, q_size = shape.num_heads * shape.head_dim;
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> q(static_cast<size_t>(q_size)), out(static_cast<size_t>(q_size));
  for (float& x : q) x = d(rng);
  for (cpu::KernelPath path : cpu::AvailablePaths()) {
    if (cpu::ArithmeticOf(path) != cpu::Arithmetic::kFp32Fma || !cpu::SetActivePath(path).ok()) continue;
    for (KvDtype dtype : {KvDtype::kF32, KvDtype::kBf16, KvDtype::kFp8}) {
      for (int64_t length : contexts) {
        std::vector<float> values(static_cast<size_t>(length * kv_stride));
        for (float& x : values) x = d(rng);
        std::vector<uint8_t> k(values.size() * 4), v(values.size() * 4);
        cpu::StoreKvRows(values.data(), length, kv_stride, dtype, k.data());
        for (float& x : values) x = d(rng);
        cpu::StoreKvRows(values.data(), length, kv_stride, dtype, v.data());
        const cpu::KvSource kv(dtype, k.data(), v.data(), kv_stride);
        const double decode = SecondsACall([&] { cpu::AttentionDecode(pool, shape, q.data(), shape.head_dim, length, kv, out.data()); });
        const double panels = SecondsACall([&] {
          cpu::AttentionPrefill(pool, shape, q.data(), q_size, shape.head_dim, 1, length - 1, kv, out.data(), q_size);
        });
        const double bytes = 2.0 * static_cast<double>(length * KvRowBytes(dtype, kv_stride));
        const double flops = 4.0 * static_cast<double>(length * q_size);
        std::printf("%-9s %-4s context %6lld: decode %8.1f us (%3.0f%% of the stream rate, %3.0f%% of the FMA peak); as a one-row prefill %8.1f us (%.2fx)\n",
                    cpu::PathName(path), KvDtypeName(dtype), static_cast<long long>(length), decode * 1e6,
                    100.0 * bytes / decode / 1e9 / stream, 100.0 * flops / decode / 1e9 / (peaks.fma * threads), panels * 1e6, panels / decode);
      }
    }
  }
  return 0;
}
