// GEMM kernel benchmark: MatMul on every kernel path this CPU runs, at the `small` model's matrix
// shapes, with bf16, FP8 or int8 weights, as GFLOP/s, a fraction of the path's measured peak, and the
// weights' bytes read a second. Prints figures only.
// --decode-rows 1,2,4 runs decode's pattern instead: every shape once for each of 12 layers, then the lm_head,
// each matrix its own (about 600 MB of bf16, past the caches), so the weights stream from memory as in a
// decode step of that many sequences; the row counts take turns, and each prints its best pass.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "engine/compute/cpu/bf16_split.h"
#include "engine/compute/cpu/cpu_features.h"
#include "engine/compute/cpu/matmul.h"
#include "engine/core/bf16.h"
#include "engine/core/thread_pool.h"
#include "bench_util.h"
#include "machine_limits.h"

using namespace anchorage;

namespace {

struct Shape {
  const char* name;
  int64_t n, k;
};

// The small model's projections (output columns n, reduction k).
constexpr Shape kShapes[] = {
    {"gdn in_proj qkv", 6144, 1024}, {"gdn in_proj z", 2048, 1024}, {"gdn out_proj", 1024, 2048},
    {"mlp gate", 3584, 1024},        {"mlp down", 1024, 3584},      {"attn q+gate", 4096, 1024},
};

cpu::PackedMatrix RandomWeights(cpu::WeightFormat format, int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> mantissa(0, 127);
  auto bf16 = [&](int64_t, int64_t) { return static_cast<uint16_t>(0x3c00 + mantissa(rng) + (rng() & 1 ? 0x8000 : 0)); };
  switch (format) {
    case cpu::WeightFormat::kInt8:
      return cpu::PackedMatrix(cpu::PackedQ8::QuantizeInt8(n, k, [&](int64_t j, float* out) {
        for (int64_t i = 0; i < k; ++i) out[i] = Bf16ToFloat(bf16(j, i));
      }));
    case cpu::WeightFormat::kFp8E4m3: {
      std::vector<uint8_t> codes(static_cast<size_t>(n * k));
      for (uint8_t& c : codes) c = static_cast<uint8_t>(rng() % 0x7f) | (rng() & 1 ? 0x80 : 0);
      std::vector<float> scales(static_cast<size_t>(((n + 127) / 128) * ((k + 127) / 128)), 0.01f);
      return cpu::PackedMatrix(*cpu::PackedQ8::FromFp8Blocks(n, k, codes.data(), scales.data(), 128, 128));
    }
    case cpu::WeightFormat::kBf16: break;
  }
  return cpu::PackedMatrix(cpu::PackedBf16::Pack(n, k, bf16));
}

// Passes over 12 layers of kShapes and a 32,768-row lm_head, each row count of rows_list in turn, for rounds rounds.
void DecodeLoop(cpu::KernelPath path, int threads, const std::vector<int>& rows_list, int rounds, double fma_peak) {
  std::vector<cpu::PackedMatrix> matrices;
  double weight_bytes = 0, elements = 0;
  for (int layer = 0; layer < 12; ++layer)
    for (const Shape& s : kShapes) matrices.push_back(RandomWeights(cpu::WeightFormat::kBf16, s.n, s.k, static_cast<uint32_t>(layer * 97 + s.n)));
  matrices.push_back(RandomWeights(cpu::WeightFormat::kBf16, 32768, 1024, 5u));
  for (const auto& w : matrices) {
    weight_bytes += static_cast<double>(w.bytes());
    elements += static_cast<double>(w.rows() * w.cols());
  }
  const int widest = *std::max_element(rows_list.begin(), rows_list.end());
  std::vector<float> x(static_cast<size_t>(widest) * 4096, 0.01f), y(static_cast<size_t>(widest) * 32768);
  ThreadPool pool(threads);
  std::vector<double> best(rows_list.size(), 1e30);
  for (int round = 0; round < rounds; ++round)
    for (size_t i = 0; i < rows_list.size(); ++i) {
      const double t0 = bench::LimitsNow();
      for (const auto& w : matrices) cpu::MatMulOn(path, pool, x.data(), rows_list[i], w.cols(), w, y.data(), w.rows());
      best[i] = std::min(best[i], bench::LimitsNow() - t0);
    }
  std::printf("%s threads %d, decode loop over %.0f MB of bf16 weights, best of %d passes:\n", cpu::PathName(path), threads,
              weight_bytes / 1e6, rounds);
  for (size_t i = 0; i < rows_list.size(); ++i) {
    const double gflops = 2.0 * elements * rows_list[i] / best[i] / 1e9;
    std::printf("  %2d rows: %6.2f ms, weights %.1f GB/s, %.1f GFLOP/s (%.0f%% of the FMA peak)\n", rows_list[i], best[i] * 1e3,
                weight_bytes / best[i] / 1e9, gflops, fma_peak > 0 ? 100 * gflops / (fma_peak * threads) : 0.0);
  }
}

// out = the parsed value, or false with the reason on stderr.
template <typename T>
bool ParsedInto(const Result<T>& parsed, T& out) {
  if (!parsed.ok()) {
    std::fprintf(stderr, "%s\n", parsed.status().message().c_str());
    return false;
  }
  out = *parsed;
  return true;
}

}  // namespace

// Usage: anchorage-bench-matmul [--rows M] [--threads 1,2] [--seconds S] [--path NAME] [--weights bf16|fp8-e4m3|int8]
//                              [--decode-rows 1,2,4] [--precision exact|fast]
int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  int64_t rows = 1024;
  double min_seconds = 1.0;
  std::vector<int> thread_counts = {1, 2};
  std::vector<int> decode_rows;
  bool only_path = false;
  cpu::WeightFormat format = cpu::WeightFormat::kBf16;
  cpu::Precision precision = cpu::Precision::kExact;
  for (int i = 1; i + 1 < argc; ++i) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--rows") rows = std::atoll(v.c_str());
    else if (a == "--path") {
      auto path = cpu::PathFromName(v);
      Status set = path.ok() ? cpu::SetActivePath(*path) : path.status();
      if (!set.ok()) {
        std::fprintf(stderr, "%s\n", set.message().c_str());
        return 2;
      }
      only_path = true;
    }
    else if (a == "--seconds") min_seconds = std::atof(v.c_str());
    else if (a == "--weights") {
      if (!ParsedInto(cpu::WeightFormatFromName(v), format)) return 2;
    }
    else if (a == "--threads") thread_counts = bench::NumberList(v);
    else if (a == "--decode-rows") decode_rows = bench::NumberList(v);
    else if (a == "--precision") {
      if (!ParsedInto(cpu::PrecisionFromName(v), precision)) return 2;
    }
  }
  const cpu::KernelPath chosen = cpu::ActivePath();
  cpu::SetPrecision(precision);
  if (only_path) (void)cpu::SetActivePath(chosen);
  const cpu::CpuFeatures& f = cpu::DetectCpu();
  const bench::Peaks peaks = bench::MeasurePeaks(f);
  std::printf("machine: %s (%s family %d model %d); kernel families: %s\n", f.brand.c_str(), f.vendor.c_str(), f.family,
              f.model, cpu::DescribeKernelFamilies(f).c_str());
  std::printf("limits: fp32 FMA %.1f GFLOP/s a core (%s)", peaks.fma, f.avx512f ? "avx512" : "avx2");
  if (peaks.bf16_dot > 0) std::printf("; bf16 dot %.1f GFLOP/s a core", peaks.bf16_dot);
  if (peaks.amx > 0) std::printf("; AMX bf16 %.1f GFLOP/s a core", peaks.amx);
  std::printf("\n");
  if (!decode_rows.empty()) {
    for (cpu::KernelPath path : cpu::AvailablePaths())
      if (!only_path || path == cpu::ActivePath())
        for (int threads : thread_counts) DecodeLoop(path, threads, decode_rows, 5, peaks.fma);
    return 0;
  }
  std::printf("rows %lld, weights %s, precision %s\n", static_cast<long long>(rows), cpu::WeightFormatName(format),
              cpu::PrecisionName(precision));

  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (cpu::KernelPath path : cpu::AvailablePaths()) {
    if (only_path && path != cpu::ActivePath()) continue;
    const double peak = peaks.Of(path);
    for (int threads : thread_counts) {
      ThreadPool pool(threads);
      double all_flops = 0, all_secs = 0, all_bytes = 0;
      for (const Shape& s : kShapes) {
        const cpu::PackedMatrix w = RandomWeights(format, s.n, s.k, static_cast<uint32_t>(s.n * 31 + s.k));
        std::vector<float> x(static_cast<size_t>(rows * s.k)), y(static_cast<size_t>(rows * s.n));
        for (float& v : x) v = u(rng);
        cpu::MatMulOn(path, pool, x.data(), rows, s.k, w, y.data(), s.n);  // warm the caches and the split buffer
        int calls = 0;
        const double t0 = bench::LimitsNow();
        double secs = 0;
        do {
          cpu::MatMulOn(path, pool, x.data(), rows, s.k, w, y.data(), s.n);
          ++calls;
          secs = bench::LimitsNow() - t0;
        } while (secs < min_seconds);
        const double flops = 2.0 * static_cast<double>(rows * s.n * s.k) * calls;
        const double bytes = static_cast<double>(w.bytes()) * calls;
        all_flops += flops;
        all_bytes += bytes;
        all_secs += secs;
        const double gflops = flops / secs / 1e9;
        std::printf("%-12s threads %d  %-16s n %5lld k %5lld: %7.1f GFLOP/s, %3.0f%% of the path's peak, weights %.1f GB/s\n",
                    cpu::PathName(path), threads, s.name, static_cast<long long>(s.n), static_cast<long long>(s.k), gflops,
                    peak > 0 ? 100 * gflops / (peak * threads) : 0.0, bytes / secs / 1e9);
      }
      const double gflops = all_flops / all_secs / 1e9;
      std::printf("%-12s threads %d  all shapes: %.1f GFLOP/s, %.0f%% of the path's peak, weights %.1f GB/s\n", cpu::PathName(path),
                  threads, gflops, peak > 0 ? 100 * gflops / (peak * threads) : 0.0, all_bytes / all_secs / 1e9);
    }
  }
  return 0;
}
