#include "engine/cache/state_store.h"

#include <algorithm>

namespace anchorage {

namespace {
bool IsPrefix(std::span<const int32_t> key, std::span<const int32_t> prompt) {
  return key.size() <= prompt.size() && std::equal(key.begin(), key.end(), prompt.begin());
}
}  // namespace

void StateStore::MakeRoom(int64_t bytes) {
  while (!entries_.empty() && bytes_ + bytes > budget_bytes_) {
    DropOldest();
    ++evictions;
  }
}

bool StateStore::DropOldest() {
  if (entries_.empty()) return false;
  bytes_ -= entries_.back().bytes();
  entries_.pop_back();
  return true;
}

void StateStore::Put(StoreEntry entry) {
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->tokens == entry.tokens) {
      bytes_ -= it->bytes();
      entries_.erase(it);
      break;
    }
  }
  bytes_ += entry.bytes();
  entries_.push_front(std::move(entry));
  ++puts;
}

bool StateStore::Contains(std::span<const int32_t> tokens) const {
  for (const StoreEntry& e : entries_)
    if (e.tokens.size() == tokens.size() && std::equal(e.tokens.begin(), e.tokens.end(), tokens.begin())) return true;
  return false;
}

const StoreEntry* StateStore::Peek(std::span<const int32_t> prompt, int64_t max_length, const Usable& usable) const {
  const StoreEntry* best = nullptr;
  for (const StoreEntry& e : entries_) {
    const int64_t len = static_cast<int64_t>(e.tokens.size());
    if (len == 0 || len > max_length || (best && len <= static_cast<int64_t>(best->tokens.size()))) continue;
    if (IsPrefix(e.tokens, prompt) && (!usable || usable(e))) best = &e;
  }
  return best;
}

const StoreEntry* StateStore::Lookup(std::span<const int32_t> prompt, int64_t max_length, const Usable& usable) {
  const StoreEntry* found = Peek(prompt, max_length, usable);
  if (found == nullptr) {
    ++misses;
    return nullptr;
  }
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (&*it == found) {
      entries_.splice(entries_.begin(), entries_, it);
      break;
    }
  }
  ++hits;
  return &entries_.front();
}

void StateStore::Clear() {
  entries_.clear();
  bytes_ = 0;
}

void StateStore::set_limits(int64_t budget_bytes, int64_t entry_cap_bytes) {
  budget_bytes_ = budget_bytes;
  entry_cap_bytes_ = entry_cap_bytes;
  MakeRoom(0);
}

}  // namespace anchorage
