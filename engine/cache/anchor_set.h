// Anchors: clones of every GDN recurrent state and conv tail at grid lines, under a byte budget.
// The newest kProtectedAnchors are never evicted, because the next turn resumes near the end.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "engine/runtime/sequence_state.h"

namespace anchorage {

class AnchorSet {
 public:
  static constexpr int kProtectedAnchors = 4;

  explicit AnchorSet(int64_t budget_bytes = 0) : budget_bytes_(budget_bytes) {}

  // Keeps an anchor (replacing one at the same length), then evicts the oldest unprotected ones over budget.
  void Put(Anchor anchor);
  // The anchor with the largest length <= max_length, or null.
  const Anchor* LargestAtOrBelow(int64_t max_length) const;
  // Drops every anchor above max_length (their rows were overwritten).
  void DropAbove(int64_t max_length);
  void Clear();
  // Drops the oldest anchor, protected or not (memory shedding); returns its bytes, 0 when empty.
  int64_t DropOldest();

  // Up to `count` anchors at or below max_length, spread evenly over the lengths, as copies.
  std::vector<Anchor> Spread(int64_t max_length, int count) const;
  // The newest `count` anchors (by insertion), as copies.
  std::vector<Anchor> Newest(int count) const;

  void set_budget_bytes(int64_t b);
  int64_t budget_bytes() const { return budget_bytes_; }
  int64_t bytes() const { return bytes_; }
  size_t size() const { return anchors_.size(); }
  int64_t evictions() const { return evictions_; }
  std::vector<int64_t> lengths() const;

 private:
  struct Entry {
    Anchor anchor;
    uint64_t serial = 0;  // insertion order
  };
  void Evict();

  int64_t budget_bytes_;
  int64_t bytes_ = 0;
  int64_t evictions_ = 0;
  uint64_t next_serial_ = 0;
  std::map<int64_t, Entry> anchors_;  // by length
};

}  // namespace anchorage
