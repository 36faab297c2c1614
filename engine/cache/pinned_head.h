// The pinned head: before a request too long to be a guest replaces the resident prompt of its own
// session (a compaction), the head's K/V rows and up to 8 anchors spread over it are kept aside.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/cache/end_anchor.h"
#include "engine/runtime/sequence_state.h"

namespace anchorage {

struct PinnedHead {
  static constexpr int kMaxAnchors = 8;
  std::vector<int32_t> tokens;   // the head's tokens; its rows are rows.begin .. rows.end
  KvRows rows;
  std::vector<Anchor> anchors;   // ascending by length, all <= tokens.size()
  int64_t taint_row = 0;
  std::vector<TokenRegion> regions;  // the generation regions below tokens.size()
  int64_t hits = 0;
  bool empty() const { return tokens.empty(); }
  int64_t bytes() const;
};

}  // namespace anchorage
