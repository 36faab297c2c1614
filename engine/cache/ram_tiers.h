// The RAM tiers behind CacheTier: the resident anchors, the end anchor (with end alignment), the
// guest stash, the pinned head, the parked session and the state store. Each works on data
// ResidentPrefix owns; ResidentPrefix asks them in turn and writes their copies.
#pragma once

#include <functional>
#include <optional>

#include "engine/cache/cache_tier.h"
#include "engine/cache/guest_stash.h"
#include "engine/cache/parked_session.h"
#include "engine/cache/pinned_head.h"
#include "engine/cache/state_store.h"
#include "engine/text/tokenizer.h"

namespace anchorage {

// Grid anchors of the rows in place: the request keeps its common prefix and resumes at the
// largest anchor within it. A copy that re-rendered generated text and then parts from the rows (an
// edited reply) is aligned as the end anchor's copies are, and resumes at the largest anchor the
// alignment reached, served with the rows' own tokens up to there.
class AnchorsTier : public CacheTier {
 public:
  struct Options {
    bool alignment = true;
    bool reasoning_pass = true;
  };
  AnchorsTier(AnchorSet& anchors, const Tokenizer* tokenizer) : anchors_(anchors), tokenizer_(tokenizer) {}
  void set_options(Options options) { options_ = options; }
  const char* name() const override { return "anchors"; }
  TierOffer Find(std::span<const int32_t> prompt, const ResidentRows& resident, int64_t limit) const override;
  Status Restore(std::span<const int32_t>, const TierOffer&, ResidentRows&) override { return Status::Ok(); }  // already in place
  int64_t bytes() const override { return anchors_.bytes(); }
  ShedUnit ShedOne() override { return {anchors_.size() > 0 ? anchors_.DropOldest() : 0, 0}; }

 private:
  // The aligned offer above `plain` (a resume point), or none.
  std::optional<TierOffer> FindAligned(std::span<const int32_t> prompt, const ResidentRows& resident, int64_t limit, int64_t plain) const;

  AnchorSet& anchors_;
  const Tokenizer* tokenizer_;
  Options options_;
};

// The end anchor of the rows in place; a copy that re-rendered the conversation is served by
// end alignment with the rows' own tokens.
class EndTier : public CacheTier {
 public:
  struct Options {
    bool enabled = true;
    bool alignment = true;
    bool reasoning_pass = true;
  };
  EndTier(std::optional<EndAnchor>& end, const Tokenizer* tokenizer) : end_(end), tokenizer_(tokenizer) {}
  void set_options(Options options) { options_ = options; }
  const char* name() const override { return "end"; }
  TierOffer Find(std::span<const int32_t> prompt, const ResidentRows& resident, int64_t limit) const override;
  Status Restore(std::span<const int32_t>, const TierOffer&, ResidentRows&) override { return Status::Ok(); }  // already in place
  int64_t bytes() const override { return end_ ? end_->anchor.bytes() : 0; }
  ShedUnit ShedOne() override;

 private:
  // The rows' text up to length, with the end's generation regions as byte offsets into it.
  std::string RowsText(const std::vector<int32_t>& rows, int64_t length, std::vector<std::pair<size_t, size_t>>* byte_regions) const;

  std::optional<EndAnchor>& end_;
  const Tokenizer* tokenizer_;
  Options options_;
};

// The guest stash: never a resume point; shedding it loses the rows a guest overwrote.
class StashTier : public CacheTier {
 public:
  StashTier(GuestStash& stash, bool& shed_flag) : stash_(stash), shed_flag_(shed_flag) {}
  const char* name() const override { return "stash"; }
  TierOffer Find(std::span<const int32_t>, const ResidentRows&, int64_t) const override { return {}; }
  Status Restore(std::span<const int32_t>, const TierOffer&, ResidentRows&) override { return Status::Ok(); }
  int64_t bytes() const override { return stash_.bytes(); }
  ShedUnit ShedOne() override;

 private:
  GuestStash& stash_;
  bool& shed_flag_;  // set when the running guest's stash is given back
};

// The pinned head of the resident session, kept before a compaction replaced it.
class PinTier : public CacheTier {
 public:
  explicit PinTier(PinnedHead& pin) : pin_(pin) {}
  const char* name() const override { return "pin"; }
  TierOffer Find(std::span<const int32_t> prompt, const ResidentRows& resident, int64_t limit) const override;
  Status Restore(std::span<const int32_t> prompt, const TierOffer& offer, ResidentRows& resident) override;
  int64_t bytes() const override { return pin_.bytes(); }
  ShedUnit ShedOne() override;

 private:
  PinnedHead& pin_;
};

// Another session's rows above the head it shares with the rows in place; restoring swaps them.
class ParkTier : public CacheTier {
 public:
  ParkTier(ParkedSession& park, const Tokenizer* tokenizer, std::function<void(ParkedSession)> install)
      : park_(park), tokenizer_(tokenizer), install_(std::move(install)) {}
  void set_budget_bytes(int64_t bytes) { budget_bytes_ = bytes; }
  // The parked end serves a re-rendered copy by end alignment on the parked tokens, as the end tier does.
  void set_alignment(EndTier::Options options) { alignment_ = options; }
  const char* name() const override { return "park"; }
  TierOffer Find(std::span<const int32_t> prompt, const ResidentRows& resident, int64_t limit) const override;
  // Copies the rows in place aside (when the offer allows), writes the parked rows over them, then
  // installs the copy as the new park; a failed write leaves both as they were.
  Status Restore(std::span<const int32_t> prompt, const TierOffer& offer, ResidentRows& resident) override;
  int64_t bytes() const override { return park_.bytes(); }
  ShedUnit ShedOne() override;
  // A copy of the rows in place above head, as much as the budget holds; none when nothing fits.
  std::optional<ParkedSession> CopyAside(const ResidentRows& resident, int64_t head) const;

 private:
  ParkedSession& park_;
  const Tokenizer* tokenizer_;
  std::function<void(ParkedSession)> install_;  // makes a copy the park (counts and journals it)
  int64_t budget_bytes_ = 0;
  EndTier::Options alignment_;
};

// The state store's snapshots: prefix snapshots (a cold prefill's rows) and session snapshots.
class StoreTier : public CacheTier {
 public:
  explicit StoreTier(StateStore& store) : store_(store) {}
  void set_enabled(bool enabled) { enabled_ = enabled; }
  const char* name() const override { return "store"; }
  TierOffer Find(std::span<const int32_t> prompt, const ResidentRows& resident, int64_t limit) const override;
  Status Restore(std::span<const int32_t> prompt, const TierOffer& offer, ResidentRows& resident) override;
  int64_t bytes() const override { return store_.bytes(); }
  ShedUnit ShedOne() override;
  // Whether an entry may serve: a session snapshot only where MayResumeAtEnd allows its end.
  static bool Usable(const StoreEntry& e);

 private:
  StateStore& store_;
  bool enabled_ = true;
};

}  // namespace anchorage
