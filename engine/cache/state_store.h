// The state store: whole snapshots (recurrent state, conv tails and K/V rows) keyed by the tokens
// that produced them. Prefix snapshots come from prefill grid lines (a cold prefill's bits); session
// snapshots hold the state at the end of a turn (decode wrote part of it: the greedy gate).
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <span>
#include <string>
#include <vector>

#include "engine/runtime/sequence_state.h"

namespace anchorage {

struct StoreEntry {
  std::vector<int32_t> tokens;  // rows [0, tokens.size()) and the state at tokens.size()
  Anchor anchor;
  KvRows rows;
  int64_t taint_row = 0;        // lowest decode-written row; tokens.size() or more for a prefix snapshot
  bool session = false;         // a session snapshot (end of a turn), else a prefix snapshot
  std::vector<std::pair<int64_t, int64_t>> regions;  // a session snapshot's generation regions
  int64_t bytes() const { return anchor.bytes() + rows.bytes(); }
};

class StateStore {
 public:
  StateStore(int64_t budget_bytes, int64_t entry_cap_bytes) : budget_bytes_(budget_bytes), entry_cap_bytes_(entry_cap_bytes) {}

  // Whether a snapshot of this many bytes may be stored at all (under the per-entry cap and the budget).
  bool Admits(int64_t bytes) const { return bytes <= entry_cap_bytes_ && bytes <= budget_bytes_; }
  // Evicts least recently used entries until `bytes` more fit; call before cloning a snapshot.
  void MakeRoom(int64_t bytes);
  // Stores an entry (replacing one with the same tokens). The caller made room first.
  void Put(StoreEntry entry);
  bool Contains(std::span<const int32_t> tokens) const;

  // The longest entry whose tokens are a prefix of prompt and no longer than max_length, compared
  // element by element, that usable (where given) accepts; null when none. Marks it used.
  using Usable = std::function<bool(const StoreEntry&)>;
  const StoreEntry* Lookup(std::span<const int32_t> prompt, int64_t max_length, const Usable& usable = nullptr);
  const StoreEntry* Peek(std::span<const int32_t> prompt, int64_t max_length, const Usable& usable = nullptr) const;

  // Drops the least recently used entry; false when empty.
  bool DropOldest();
  void Clear();
  void set_limits(int64_t budget_bytes, int64_t entry_cap_bytes);

  int64_t bytes() const { return bytes_; }
  size_t size() const { return entries_.size(); }
  int64_t budget_bytes() const { return budget_bytes_; }
  int64_t entry_cap_bytes() const { return entry_cap_bytes_; }
  int64_t hits = 0, misses = 0, puts = 0, evictions = 0, declined = 0;

 private:
  int64_t budget_bytes_;
  int64_t entry_cap_bytes_;
  int64_t bytes_ = 0;
  std::list<StoreEntry> entries_;  // most recently used first
};

}  // namespace anchorage
