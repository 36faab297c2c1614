// The length of the common prefix of two token lists: where a prompt parts from what a cache holds.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>

namespace anchorage {

inline int64_t CommonPrefixLength(std::span<const int32_t> a, std::span<const int32_t> b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return static_cast<int64_t>(i);
}

}  // namespace anchorage
