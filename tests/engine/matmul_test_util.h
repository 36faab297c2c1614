// Helpers shared by the GEMM tests.
#pragma once

#include <QtTest>

#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "engine/compute/cpu/matmul.h"

namespace anchorage::testing {

// matmul(y, ldy) writes m rows of n columns into rows 3 columns wider than n; those extra columns must
// stay untouched. Returns the [m, n] rows.
inline std::vector<float> RunIntoWideRows(int64_t m, int64_t n, const std::function<void(float* y, int64_t ldy)>& matmul) {
  const int64_t ldy = n + 3;
  std::vector<float> y(static_cast<size_t>(m * ldy), -7.0f);
  matmul(y.data(), ldy);
  std::vector<float> out(static_cast<size_t>(m * n));
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t j = n; j < ldy; ++j)
      if (y[r * ldy + j] != -7.0f) qFatal("column %lld of row %lld was written past n", (long long)j, (long long)r);
    std::memcpy(out.data() + r * n, y.data() + r * ldy, static_cast<size_t>(n) * 4);
  }
  return out;
}

// Every kernel path, the emulated ones too (a test skips those the CPU lacks).
inline constexpr cpu::KernelPath kPaths[] = {cpu::KernelPath::kPortable,     cpu::KernelPath::kAvx2Fma,
                                             cpu::KernelPath::kAvx512F,      cpu::KernelPath::kAvx512Bf16,
                                             cpu::KernelPath::kAmxBf16,      cpu::KernelPath::kEmulated16,
                                             cpu::KernelPath::kEmulatedBf16, cpu::KernelPath::kEmulatedAmx};

inline bool SameBits(const float* a, const float* b, size_t count) { return std::memcmp(a, b, count * 4) == 0; }

// count values from a standard normal distribution.
inline std::vector<float> NormalValues(int64_t count, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> out(static_cast<size_t>(count));
  for (auto& v : out) v = d(rng);
  return out;
}

}  // namespace anchorage::testing
