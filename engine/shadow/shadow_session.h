// One session's shadow state: K/V rows and GDN state of every token the session holds, advanced
// only in whole grid chunks at absolute multiples of the grid, so after any number of turns it
// equals a fresh grid prefill of the same ids bit for bit. Ids past the last line wait as the
// pending tail. The engine thread owns it.
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <vector>

#include "engine/core/status.h"
#include "engine/runtime/forward.h"
#include "engine/runtime/sequence_state.h"

namespace anchorage {

// What Feed did with the session's new ids.
struct ShadowFeed {
  int64_t common = 0;       // ids shared with what the session held
  int64_t rolled_back = 0;  // committed rows given up (0 when nothing differed below them)
  int64_t resumed_at = 0;   // the committed length after the feed
};

class ShadowSession {
 public:
  static constexpr int kMaxCheckpoints = 6;

  ShadowSession(const ModelConfig& config, int64_t grid_tokens);

  // The session now holds ids (a turn's served prompt, or it with the output so far). Where they
  // differ from what was read, goes back to the newest checkpoint at or below the first differing
  // id (K/V rows below stay valid), or to the start. prompt_end: ids end a turn's prompt, so the
  // recurrent state at the last line at or below their end is kept as a checkpoint once read.
  ShadowFeed Feed(std::span<const int32_t> ids, bool prompt_end);
  // Appends ids the session gained (the output as it comes).
  void Append(std::span<const int32_t> ids);
  // Reads the next whole chunk; false (nothing read) when less than a grid of ids is pending.
  Result<bool> ReadChunk(Forward& forward);

  // The last row's logits of ids [committed, upto) and then extra, on a fork that never writes the
  // committed state (Forward::PrefillBranches). upto is clamped to [committed, known].
  Result<std::vector<float>> ForkLogits(Forward& forward, int64_t upto, std::span<const int32_t> extra);

  // A disk load reads the rows into mutable_state(), then adopts the ids and checkpoints that go with them.
  SequenceState& mutable_state() { return state_; }
  Status Adopt(std::vector<int32_t> ids, std::vector<Anchor> checkpoints, std::vector<int64_t> pending_checkpoints);

  int64_t grid_tokens() const { return grid_; }
  int64_t committed() const { return state_.length(); }
  int64_t known() const { return static_cast<int64_t>(ids_.size()); }
  int64_t backlog() const { return known() - committed(); }
  // Less than one chunk is waiting: the next question sees every id.
  bool fresh() const { return backlog() < grid_; }
  const std::vector<int32_t>& ids() const { return ids_; }
  const SequenceState& state() const { return state_; }
  const std::deque<Anchor>& checkpoints() const { return checkpoints_; }
  const std::vector<int64_t>& pending_checkpoints() const { return pending_checkpoints_; }
  // State buffers, checkpoints and ids.
  int64_t bytes() const;

 private:
  void KeepCheckpointIfDue();

  int64_t grid_;
  SequenceState state_;
  std::vector<int32_t> ids_;
  std::deque<Anchor> checkpoints_;          // ascending by length, at most kMaxCheckpoints
  std::vector<int64_t> pending_checkpoints_;  // lines to checkpoint once the reader reaches them
};

}  // namespace anchorage
