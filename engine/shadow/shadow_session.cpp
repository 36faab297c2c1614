#include "engine/shadow/shadow_session.h"

#include <algorithm>

#include "engine/core/common_prefix.h"

namespace anchorage {

ShadowSession::ShadowSession(const ModelConfig& config, int64_t grid_tokens) : grid_(grid_tokens), state_(config) {}

ShadowFeed ShadowSession::Feed(std::span<const int32_t> ids, bool prompt_end) {
  ShadowFeed feed;
  feed.common = CommonPrefixLength(ids, ids_);
  if (feed.common < committed()) {
    const int64_t before = committed();
    while (!checkpoints_.empty() && checkpoints_.back().length > feed.common) checkpoints_.pop_back();
    if (checkpoints_.empty()) state_.Reset();
    else (void)state_.RestoreAnchor(checkpoints_.back());  // same shapes and a length within the capacity: cannot fail
    feed.rolled_back = before - committed();
  }
  std::erase_if(pending_checkpoints_, [&](int64_t line) { return line > feed.common; });
  ids_.assign(ids.begin(), ids.end());
  if (prompt_end) {
    const int64_t line = known() / grid_ * grid_;
    if (line > 0 && std::find(pending_checkpoints_.begin(), pending_checkpoints_.end(), line) == pending_checkpoints_.end())
      pending_checkpoints_.push_back(line);
    KeepCheckpointIfDue();
  }
  feed.resumed_at = committed();
  return feed;
}

void ShadowSession::Append(std::span<const int32_t> ids) { ids_.insert(ids_.end(), ids.begin(), ids.end()); }

Result<bool> ShadowSession::ReadChunk(Forward& forward) {
  if (backlog() < grid_) return false;
  const int64_t at = committed();
  auto logits = forward.Prefill(state_, std::span<const int32_t>(ids_).subspan(static_cast<size_t>(at), static_cast<size_t>(grid_)));
  if (!logits.ok()) return logits.status();
  KeepCheckpointIfDue();
  return true;
}

void ShadowSession::KeepCheckpointIfDue() {
  auto due = std::find(pending_checkpoints_.begin(), pending_checkpoints_.end(), committed());
  if (due == pending_checkpoints_.end()) return;
  pending_checkpoints_.erase(due);
  if (!checkpoints_.empty() && checkpoints_.back().length == committed()) return;
  checkpoints_.push_back(state_.SaveAnchor());
  if (static_cast<int>(checkpoints_.size()) > kMaxCheckpoints) checkpoints_.pop_front();
}

Result<std::vector<float>> ShadowSession::ForkLogits(Forward& forward, int64_t upto, std::span<const int32_t> extra) {
  upto = std::clamp(upto, committed(), known());
  std::vector<int32_t> fork_ids(ids_.begin() + committed(), ids_.begin() + upto);
  fork_ids.insert(fork_ids.end(), extra.begin(), extra.end());
  return forward.ForkLastLogits(state_, fork_ids);
}

Status ShadowSession::Adopt(std::vector<int32_t> ids, std::vector<Anchor> checkpoints, std::vector<int64_t> pending_checkpoints) {
  if (committed() % grid_ != 0 || committed() > static_cast<int64_t>(ids.size()))
    return InvalidArgument("a shadow state must end on a grid line within its ids");
  for (const Anchor& c : checkpoints)
    if (c.length % grid_ != 0 || c.length > committed() || c.bytes() != state_.anchor_bytes())
      return InvalidArgument("a shadow checkpoint must lie on a grid line below the state's end");
  ids_ = std::move(ids);
  checkpoints_.assign(std::make_move_iterator(checkpoints.begin()), std::make_move_iterator(checkpoints.end()));
  pending_checkpoints_ = std::move(pending_checkpoints);
  return Status::Ok();
}

int64_t ShadowSession::bytes() const {
  int64_t b = state_.allocated_bytes() + static_cast<int64_t>(ids_.capacity() * sizeof(int32_t));
  for (const Anchor& c : checkpoints_) b += c.bytes();
  return b;
}

}  // namespace anchorage
