// The one interface every cache tier offers the resident prefix (the RAM tiers, the disk, and the
// session spill to come): find what it would serve, restore it, say its bytes, shed them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/cache/anchor_set.h"
#include "engine/cache/end_anchor.h"
#include "engine/core/common_prefix.h"
#include "engine/core/status.h"
#include "engine/runtime/forward.h"
#include "engine/runtime/sequence_state.h"

namespace anchorage {

// A cache event for the journal: kind is hit, write, eviction, drop, failed_restore, shed or clear.
struct CacheEvent {
  std::string kind;
  std::string tier;
  int64_t tokens = 0;
  int64_t bytes = 0;
  std::string reason;
  std::optional<std::string> session;  // set by a thread other than the engine's: the session it served
  int64_t time_ms = 0;                 // set where it is kept for the console
};
using CacheEventSink = std::function<void(const CacheEvent&)>;

inline constexpr int64_t kNoTaintRow = INT64_MAX;  // no row of the rows in place was written by a decode

// The rows in place: what a tier plans against and restores into. Owned by ResidentPrefix.
struct ResidentRows {
  SequenceState& state;
  std::vector<int32_t>& rows;         // tokens whose K/V rows are valid in state
  AnchorSet& anchors;
  std::optional<EndAnchor>& end;
  std::vector<TokenRegion>& regions;  // spans of rows generations wrote
  int64_t& taint_row;
  std::string& session;
};

// What a tier would serve a prompt.
struct TierOffer {
  int64_t resume_length = 0;           // the request resumes here; 0: nothing to offer
  bool resume_from_end = false;        // the state there is an end anchor (held to the greedy gate)
  std::vector<int32_t> served_prompt;  // set when the tier serves other tokens than the client's (end alignment)
  bool aligned = false;
  int64_t restore_bytes = 0;           // what the restore copies into the rows in place (its cost; 0: already there)
  double restore_seconds = 0;          // a read off the drive: taken only when it costs less than the prefill it saves; 0: not weighed
  bool copy_aside = true;              // the restore may keep what it replaces (a park swap); off when memory is short
};

// Memory one ShedOne gave back, for the journal.
struct ShedUnit {
  int64_t bytes = 0;
  int64_t tokens = 0;
};

class CacheTier {
 public:
  virtual ~CacheTier() = default;
  virtual const char* name() const = 0;
  // What it would serve prompt, resuming at most at limit, given the rows in place; changes nothing.
  virtual TierOffer Find(std::span<const int32_t> prompt, const ResidentRows& resident, int64_t limit) const = 0;
  // Puts the offer's rows, anchors, end, taint and session in place (the state at resume_length is
  // restored by the caller, or by a tier that reads it straight into the state). On failure the rows
  // in place and the tier are as they were, except that a tier reading into the state may have cut
  // the rows in place back to what it kept (the caller plans again from there).
  virtual Status Restore(std::span<const int32_t> prompt, const TierOffer& offer, ResidentRows& resident) = 0;
  virtual int64_t bytes() const = 0;
  // Gives back its cheapest unit (an entry, or the whole tier); {0, 0} when it holds nothing.
  virtual ShedUnit ShedOne() = 0;
};

// Whether a state at length, computed on rows the prompt shares up to common, may serve it. At or below
// the taint row it is a cold prefill's. Above it (a decode or an off-line resume wrote rows below it),
// only a prompt that holds a whole generation region below length continues text this engine
// generated, which the greedy gate covers; any other prompt would get bits no cold prefill computes.
inline bool MayResumeAt(int64_t length, int64_t common, int64_t taint_row, const std::vector<TokenRegion>& regions) {
  if (length <= taint_row) return true;
  const int64_t covered = std::min(common, length);
  return std::any_of(regions.begin(), regions.end(), [&](const TokenRegion& r) { return r.first < r.second && r.second <= covered; });
}

// Whether an end anchor (a state where a generation stopped) may serve a prompt that holds it whole.
// A cold prefill's own state off a 64-line (the generation forwarded nothing) is not offered: a prefill
// resumed there runs other delta-rule chunks than a cold one, and the anchor at the 64-line below
// serves the same prompt exactly. A decode-written one is held to MayResumeAt.
inline bool MayResumeAtEnd(int64_t length, int64_t common, int64_t taint_row, const std::vector<TokenRegion>& regions) {
  if (length <= taint_row) return length % kExactLineTokens == 0;
  return MayResumeAt(length, common, taint_row, regions);
}

// Drops the regions at or above limit and cuts the one that straddles it.
inline void ClipTokenRegions(std::vector<TokenRegion>& regions, int64_t limit) {
  std::erase_if(regions, [&](const TokenRegion& r) { return r.first >= limit; });
  for (TokenRegion& r : regions) r.second = std::min(r.second, limit);
}

}  // namespace anchorage
