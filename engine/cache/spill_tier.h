// The session spill as a tier of the resident prefix: it offers the entry that resumes a prompt
// furthest (at its end anchor, held to the greedy gate like the end in RAM, or at a saved grid
// anchor) with the read's cost, and reads the entry's blocks above the rows in place straight
// into the state. A copy that does not hold an entry's rows up to its end (a client that leaves
// earlier reasoning out) is aligned on the entry's own tokens as the end tier aligns it in RAM.
// It holds no memory.
#pragma once

#include "engine/cache/cache_tier.h"
#include "engine/cache/ram_tiers.h"
#include "engine/cache/session_spill.h"
#include "engine/text/tokenizer.h"

namespace anchorage {

class SpillTier : public CacheTier {
 public:
  SpillTier(SessionSpill& spill, const Tokenizer* tokenizer) : spill_(spill), tokenizer_(tokenizer) {}
  const char* name() const override { return "spill"; }
  TierOffer Find(std::span<const int32_t> prompt, const ResidentRows& resident, int64_t limit) const override;
  // Puts the entry's rows, anchors, end, taint, regions and session in place. On failure the entry
  // is gone and the rows in place are cut to the blocks the restore did not touch.
  Status Restore(std::span<const int32_t> prompt, const TierOffer& offer, ResidentRows& resident) override;
  int64_t bytes() const override { return 0; }
  ShedUnit ShedOne() override { return {}; }

  void set_cost_check(bool on) { cost_check_ = on; }
  void set_alignment(EndTier::Options options) { alignment_ = options; }
  const SpillRestoreReport& last_restore() const { return last_; }

 private:
  SessionSpill& spill_;
  const Tokenizer* tokenizer_;
  EndTier::Options alignment_;
  bool cost_check_ = true;
  SpillRestoreReport last_;
};

}  // namespace anchorage
