// A small harness for the GPU tests, which must build where Qt is absent: named cases, checks that
// name their file and line, and CTest's skip code (77) where no CUDA device can be used.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/status.h"

namespace gpu_check {

inline constexpr int kSkipped = 77;

struct Failure {
  std::string what;
};

#define GPU_CHECK(cond)                                                                                     \
  do {                                                                                                      \
    if (!(cond)) throw ::gpu_check::Failure{std::string(__FILE__ ":") + std::to_string(__LINE__) + ": " #cond}; \
  } while (false)

#define GPU_CHECK_MSG(cond, message)                                                                          \
  do {                                                                                                        \
    if (!(cond))                                                                                              \
      throw ::gpu_check::Failure{std::string(__FILE__ ":") + std::to_string(__LINE__) + ": " #cond ": " + (message)}; \
  } while (false)

// Unwraps a Result or fails the case with its status.
template <typename T>
T Must(anchorage::Result<T> r, const char* what) {
  if (!r.ok()) throw Failure{std::string(what) + ": " + r.status().message()};
  return std::move(*r);
}
inline void Must(const anchorage::Status& s, const char* what) {
  if (!s.ok()) throw Failure{std::string(what) + ": " + s.message()};
}

using Case = std::pair<std::string, std::function<void()>>;

// Whether name holds one of the |-separated texts of filter.
inline bool Selected(const std::string& name, const std::string& filter) {
  for (size_t from = 0;;) {
    const size_t bar = filter.find('|', from);
    if (name.find(filter.substr(from, bar == std::string::npos ? std::string::npos : bar - from)) != std::string::npos) return true;
    if (bar == std::string::npos) return false;
    from = bar + 1;
  }
}

// Runs every case (those whose names hold one of $GPU_CHECK_ONLY's |-separated texts where it is set,
// less those holding one of $GPU_CHECK_SKIP's), printing PASS or FAIL with the reason; returns the
// process's exit code.
inline int RunCases(const std::vector<Case>& cases) {
  const char* only = std::getenv("GPU_CHECK_ONLY");
  const char* skip = std::getenv("GPU_CHECK_SKIP");
  int failed = 0, run = 0;
  for (const auto& [name, body] : cases) {
    if (only != nullptr && !Selected(name, only)) continue;
    if (skip != nullptr && Selected(name, skip)) continue;
    ++run;
    try {
      body();
      std::printf("PASS   %s\n", name.c_str());
    } catch (const Failure& f) {
      ++failed;
      std::printf("FAIL   %s: %s\n", name.c_str(), f.what.c_str());
    }
    std::fflush(stdout);
  }
  std::printf("%d passed, %d failed\n", run - failed, failed);
  return failed == 0 ? 0 : 1;
}

}  // namespace gpu_check
