// The parked session: when another session replaces the resident prompt, the rows above the shared
// head, the newest anchors and the end anchor are kept aside and swapped back when it returns.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/cache/end_anchor.h"
#include "engine/runtime/sequence_state.h"

namespace anchorage {

struct ParkedSession {
  static constexpr int kMaxAnchors = 4;
  std::string session;
  std::vector<int32_t> tokens;   // the parked prompt's tokens up to rows.end
  int64_t head = 0;              // rows below this are shared with the resident prompt and stay in place
  KvRows rows;                   // rows [head, tokens.size())
  std::vector<Anchor> anchors;   // lengths in (head, tokens.size()]
  std::optional<EndAnchor> end;  // kept when the rows up to it fit
  int64_t taint_row = 0;
  std::vector<TokenRegion> regions;  // the generation regions below tokens.size()
  int64_t parks = 0;
  int64_t hits = 0;
  bool empty() const { return tokens.empty(); }
  int64_t bytes() const;
};

}  // namespace anchorage
