#include "engine/runtime/lookup_drafter.h"

#include <algorithm>

namespace anchorage {

std::vector<int32_t> LookupDraft(std::span<const int32_t> ids, int max_draft, int min_ngram, int max_ngram) {
  const int64_t size = static_cast<int64_t>(ids.size());
  if (max_draft <= 0) return {};
  for (int64_t n = std::min<int64_t>(max_ngram, size - 1); n >= min_ngram; --n) {
    const auto tail = ids.subspan(static_cast<size_t>(size - n));
    for (int64_t at = size - n - 1; at >= 0; --at) {
      if (!std::equal(tail.begin(), tail.end(), ids.begin() + at)) continue;
      const int64_t from = at + n, to = std::min(size, from + max_draft);
      return {ids.begin() + from, ids.begin() + to};
    }
  }
  return {};
}

}  // namespace anchorage
