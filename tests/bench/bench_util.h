// Shared pieces of the benchmarks: the generated model folder, timing and percentiles.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/model/model_config.h"
#include "engine/model/tiny_model.h"

namespace anchorage::bench {

// Generates (once) and returns a model folder of `size` under /tmp/anchorage-bench.
inline std::string ModelFolder(const std::string& size) {
  const std::string dir = "/tmp/anchorage-bench/" + size + "-seed1";
  if (!std::filesystem::exists(dir + "/model.safetensors")) {
    auto parsed = ParseTinyModelSize(size);
    if (!parsed.ok() || !GenerateTinyModel(*parsed, 1, dir).ok()) {
      std::fprintf(stderr, "cannot generate the %s model in %s\n", size.c_str(), dir.c_str());
      std::exit(1);
    }
  }
  return dir;
}

// "1,2,4" as {1, 2, 4}; an empty string as none.
template <class T = int>
std::vector<T> NumberList(const std::string& v) {
  std::vector<T> out;
  for (size_t p = 0; p < v.size();) {
    out.push_back(static_cast<T>(std::atoll(v.c_str() + p)));
    p = v.find(',', p);
    if (p == std::string::npos) break;
    ++p;
  }
  return out;
}

// Prints the error and returns the exit status of a failed benchmark.
inline int Fail(const Status& s) {
  std::fprintf(stderr, "%s\n", s.ToString().c_str());
  return 1;
}

// Token ids that look like a prompt: spread over the vocabulary, none of the special ones; salt varies them.
inline std::vector<int32_t> PromptIds(const ModelConfig& c, int64_t n, uint32_t salt = 0) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(3 + ((i + salt * 7919u) * 2654435761u) % static_cast<size_t>(c.vocab_size - 16));
  return ids;
}

inline double NowMs() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double at = p * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(at);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (at - static_cast<double>(lo));
}

}  // namespace anchorage::bench
