// Many questions over one observation: the branches of a decide request share their token prefixes,
// which run once. Every split sits on a multiple of 64 tokens, so each branch's logits are the bits
// an independent prefill of its whole prompt writes.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "engine/core/status.h"
#include "engine/runtime/forward.h"

namespace anchorage {

// One branch: its whole prompt, the question it belongs to, and the first position whose logits it needs.
struct DecideBranch {
  std::vector<int32_t> ids;
  int64_t group = 0;        // branches of one group (a question) may share a longer prefix
  int64_t logits_from = 0;  // rows [logits_from, ids.size()) are returned; at most ids.size() - 1
};

// Branches run in one forward over their stacked rows (Forward::PrefillBranches).
struct DecideBatch {
  int64_t group = -1;          // -1: they go on from the shared prefix; else from that group's prefix
  std::vector<size_t> members; // branch indexes, ascending
  int64_t rows = 0;            // stacked rows
  int64_t logits_rows = 0;
};

// Where the branches split: every branch runs from its group's prefix on, alone or in a batch.
struct DecideLayout {
  int64_t shared = 0;                // ids every branch shares, run once (a multiple of 64)
  std::vector<int64_t> group_prefix; // per group: ids its branches share, from shared on, run once a group
  int64_t logical_tokens = 0;        // what independent requests would forward
  int64_t processed_tokens = 0;      // what this layout forwards
  int64_t longest = 0;               // the longest branch
  int64_t widest_logits = 0;         // most logits rows one branch returns
  std::vector<DecideBatch> batches;  // the branches that run batched; the others run alone
};

// How big a batch may be. The default runs every branch alone.
struct DecideBatching {
  int64_t branches = 1;     // at most this many branches a batch
  int64_t rows = 0;         // stacked rows
  int64_t logits_rows = 0;  // logits rows (held together until the batch's branches have seen them)

  // Up to max_batch branches, a grid chunk of rows and 256 MiB of logits; one where the backend has no branches.
  static DecideBatching For(const ComputeBackend& forward, int64_t max_batch);
};

// The layout of branches (groups numbered 0..groups-1). reuse false: every branch alone from 0.
// With reuse and batching: branches of a question with several go on from its prefix in batches,
// the lone branches of the others from the shared prefix; what fits no batch runs alone.
DecideLayout PlanDecide(std::span<const DecideBranch> branches, int64_t groups, bool reuse, const DecideBatching& batching = {});

// Bytes a run of the layout allocates at its peak: one state at the longest branch, three anchors,
// one branch's logits and the prefill workspace, or the widest batch's.
int64_t DecidePeakBytes(const ModelConfig& config, const ComputeBackend& forward, const DecideLayout& layout);

// Runs the layout: on_branch(index, logits [rows, vocab] of positions logits_from..) once per branch,
// groups in order. Stops at the first error (the forward's) or when on_branch returns false.
// between_branches (optional) runs after each branch: the forward may serve others there, since the
// run's states are its own.
Status RunDecide(ComputeBackend& forward, std::span<const DecideBranch> branches, const DecideLayout& layout,
                 const std::function<bool(size_t, std::span<const float>)>& on_branch,
                 const std::function<void()>& between_branches = nullptr);

}  // namespace anchorage
