#include "engine/decide/decide.h"

#include <algorithm>
#include <optional>

#include "engine/core/common_prefix.h"

namespace anchorage {

namespace {

int64_t DownToLine(int64_t tokens) { return tokens / kExactLineTokens * kExactLineTokens; }

// Where a branch's logits-returning call starts: its group's prefix, or the last line at or below its first row.
int64_t LogitsCallStart(const DecideBranch& b, int64_t group_prefix) {
  return std::max(group_prefix, DownToLine(b.logits_from));
}

// Packs the branches that fit into batches, in index order: a question's several branches from its
// prefix, the lone branches of questions from the shared prefix.
void PlanBatches(std::span<const DecideBranch> branches, int64_t groups, const DecideBatching& limits, DecideLayout* layout) {
  std::vector<int64_t> members(static_cast<size_t>(groups), 0);
  for (const DecideBranch& b : branches) ++members[static_cast<size_t>(b.group)];
  std::vector<DecideBatch> open_batches(static_cast<size_t>(groups) + 1);  // one a group, then the shared prefix's
  auto close = [&](DecideBatch& batch) {
    if (batch.members.size() > 1) layout->batches.push_back(std::move(batch));
    batch = DecideBatch{};
  };
  for (size_t i = 0; i < branches.size(); ++i) {
    const DecideBranch& b = branches[i];
    const bool alone = members[static_cast<size_t>(b.group)] == 1;
    const int64_t from = alone ? layout->shared : layout->group_prefix[static_cast<size_t>(b.group)];
    const int64_t n = static_cast<int64_t>(b.ids.size()), rows = n - from, logits_rows = n - b.logits_from;
    if (rows > limits.rows || logits_rows > limits.logits_rows) continue;
    DecideBatch& batch = open_batches[alone ? static_cast<size_t>(groups) : static_cast<size_t>(b.group)];
    if (static_cast<int64_t>(batch.members.size()) == limits.branches || batch.rows + rows > limits.rows ||
        batch.logits_rows + logits_rows > limits.logits_rows)
      close(batch);
    batch.group = alone ? -1 : b.group;
    batch.members.push_back(i);
    batch.rows += rows;
    batch.logits_rows += logits_rows;
  }
  for (DecideBatch& batch : open_batches) close(batch);
}

}  // namespace

DecideBatching DecideBatching::For(const ComputeBackend& forward, int64_t max_batch) {
  constexpr int64_t kLogitsBytes = int64_t{256} << 20;
  if (!forward.has_branches()) return {};
  return {max_batch, forward.grid_tokens(), std::max<int64_t>(1, kLogitsBytes / (forward.vocab_size() * 4))};
}

DecideLayout PlanDecide(std::span<const DecideBranch> branches, int64_t groups, bool reuse, const DecideBatching& batching) {
  DecideLayout layout;
  layout.group_prefix.assign(static_cast<size_t>(groups), 0);
  if (branches.empty()) return layout;
  if (reuse && branches.size() > 1) {
    int64_t shared = static_cast<int64_t>(branches[0].ids.size());
    std::vector<int64_t> group_common(static_cast<size_t>(groups), -1);
    std::vector<const DecideBranch*> first_of(static_cast<size_t>(groups), nullptr);
    for (const DecideBranch& b : branches) {
      shared = std::min({shared, CommonPrefixLength(branches[0].ids, b.ids), b.logits_from});
      const size_t g = static_cast<size_t>(b.group);
      if (first_of[g] == nullptr) first_of[g] = &b;
      const int64_t common = std::min(CommonPrefixLength(first_of[g]->ids, b.ids), b.logits_from);
      group_common[g] = group_common[g] < 0 ? common : std::min(group_common[g], common);
    }
    layout.shared = DownToLine(shared);
    for (size_t g = 0; g < layout.group_prefix.size(); ++g)
      layout.group_prefix[g] = std::max(layout.shared, DownToLine(std::max<int64_t>(0, group_common[g])));
  }
  std::vector<bool> group_seen(static_cast<size_t>(groups), false);
  layout.processed_tokens = layout.shared;
  for (const DecideBranch& b : branches) {
    const int64_t n = static_cast<int64_t>(b.ids.size()), gp = layout.group_prefix[static_cast<size_t>(b.group)];
    if (!group_seen[static_cast<size_t>(b.group)]) {
      group_seen[static_cast<size_t>(b.group)] = true;
      layout.processed_tokens += gp - layout.shared;
    }
    layout.processed_tokens += n - gp;
    layout.logical_tokens += n;
    layout.longest = std::max(layout.longest, n);
    layout.widest_logits = std::max(layout.widest_logits, n - LogitsCallStart(b, gp));
  }
  if (reuse && batching.branches > 1) PlanBatches(branches, groups, batching, &layout);
  return layout;
}

int64_t DecidePeakBytes(const ModelConfig& config, const ComputeBackend& forward, const DecideLayout& layout) {
  const int64_t rows = (layout.longest + SequenceState::kKvRowStep - 1) / SequenceState::kKvRowStep * SequenceState::kKvRowStep;
  const int64_t anchor = SequenceState::AnchorBytes(config);
  const int64_t alone = layout.widest_logits * config.vocab_size * 4 +
                        forward.PrefillWorkspaceBytes(std::min(forward.grid_tokens(), std::max<int64_t>(layout.longest, 1)));
  int64_t widest = 0, rows_most = 0, logits_most = 0;  // each the most of any batch
  for (const DecideBatch& b : layout.batches) {
    widest = std::max(widest, static_cast<int64_t>(b.members.size()));
    rows_most = std::max(rows_most, b.rows);
    logits_most = std::max(logits_most, b.logits_rows);
  }
  const int64_t batched = layout.batches.empty() ? 0
                                                 : forward.BranchesBytes(widest, rows_most, logits_most) + forward.PrefillWorkspaceBytes(rows_most);
  return rows * SequenceState::KvBytesPerToken(config) + 3 * anchor + std::max(alone, batched);
}

Status RunDecide(ComputeBackend& forward, std::span<const DecideBranch> branches, const DecideLayout& layout,
                 const std::function<bool(size_t, std::span<const float>)>& on_branch, const std::function<void()>& between_branches) {
  SequenceState state(forward.config());
  RETURN_IF_ERROR(state.Reserve(layout.longest));
  // The snapshots: the state at the shared prefix and at the group's; branches only write above them.
  auto run = [&](std::span<const int32_t> ids) -> Status {
    if (ids.empty()) return Status::Ok();
    return forward.Prefill(state, ids, LogitsRows::kLast).status();
  };
  for (const DecideBranch& b : branches)
    if (b.logits_from < 0 || b.logits_from >= static_cast<int64_t>(b.ids.size()))
      return InvalidArgument("a decide branch returns logits from " + std::to_string(b.logits_from) + " of " + std::to_string(b.ids.size()) + " ids");
  // A batch goes on from the state's length (the shared or its group's prefix) and leaves the state as it was.
  std::vector<bool> batched(branches.size(), false);
  for (const DecideBatch& batch : layout.batches)
    for (size_t i : batch.members) batched[i] = true;
  auto run_batch = [&](const DecideBatch& batch) -> Status {
    std::vector<PrefillBranch> parts;
    const int64_t from = state.length();
    for (size_t i : batch.members)
      parts.push_back({std::span(branches[i].ids).subspan(static_cast<size_t>(from)), branches[i].logits_from - from});
    ASSIGN_OR_RETURN(std::vector<float> logits, forward.PrefillBranches(state, parts));
    size_t offset = 0;
    for (size_t i : batch.members) {
      const size_t rows = branches[i].ids.size() - static_cast<size_t>(branches[i].logits_from);
      const std::span<const float> mine = std::span<const float>(logits).subspan(offset, rows * static_cast<size_t>(forward.vocab_size()));
      if (!on_branch(i, mine)) return Cancelled("the decide request was cancelled");
      offset += mine.size();
    }
    if (between_branches) between_branches();
    return Status::Ok();
  };
  if (!branches.empty()) RETURN_IF_ERROR(run(std::span(branches[0].ids).first(static_cast<size_t>(layout.shared))));
  const Anchor shared = state.SaveAnchor();
  for (const DecideBatch& batch : layout.batches)
    if (batch.group < 0) RETURN_IF_ERROR(run_batch(batch));
  const int64_t groups = static_cast<int64_t>(layout.group_prefix.size());
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t gp = layout.group_prefix[static_cast<size_t>(g)];
    bool prefix_run = false;
    auto run_group_prefix = [&](std::span<const int32_t> ids) -> Status {
      RETURN_IF_ERROR(state.RestoreAnchor(shared));
      RETURN_IF_ERROR(run(ids.subspan(static_cast<size_t>(layout.shared), static_cast<size_t>(gp - layout.shared))));
      prefix_run = true;
      return Status::Ok();
    };
    for (const DecideBatch& batch : layout.batches) {
      if (batch.group != g) continue;
      if (!prefix_run) RETURN_IF_ERROR(run_group_prefix(branches[batch.members[0]].ids));
      RETURN_IF_ERROR(run_batch(batch));
    }
    std::optional<Anchor> group;
    for (size_t i = 0; i < branches.size(); ++i) {
      const DecideBranch& b = branches[i];
      if (b.group != g || batched[i]) continue;
      const std::span<const int32_t> ids(b.ids);
      if (!prefix_run) RETURN_IF_ERROR(run_group_prefix(ids));
      if (!group) group = state.SaveAnchor();
      else RETURN_IF_ERROR(state.RestoreAnchor(*group));
      const int64_t start = LogitsCallStart(b, gp);
      RETURN_IF_ERROR(run(ids.subspan(static_cast<size_t>(gp), static_cast<size_t>(start - gp))));
      ASSIGN_OR_RETURN(std::vector<float> logits, forward.Prefill(state, ids.subspan(static_cast<size_t>(start)), LogitsRows::kAll));
      const size_t skip = static_cast<size_t>((b.logits_from - start) * forward.vocab_size());
      if (!on_branch(i, std::span<const float>(logits).subspan(skip))) return Cancelled("the decide request was cancelled");
      if (between_branches) between_branches();
    }
  }
  return Status::Ok();
}

}  // namespace anchorage
