// Helpers of the cache tests: deterministic token lists and list surgery.
#pragma once

#include <cstdint>
#include <vector>

namespace anchorage::testing {

// n pseudo-random ids in [3, vocab - 13), the same for the same seed.
inline std::vector<int32_t> Tokens(uint64_t seed, size_t n, int32_t vocab) {
  std::vector<int32_t> out;
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    out.push_back(static_cast<int32_t>(s % static_cast<uint64_t>(vocab - 16)) + 3);
  }
  return out;
}

inline std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

inline std::vector<int32_t> Head(const std::vector<int32_t>& a, size_t n) { return {a.begin(), a.begin() + static_cast<long>(n)}; }

}  // namespace anchorage::testing
