#include "engine/cache/anchor_set.h"

#include <algorithm>

namespace anchorage {

void AnchorSet::Put(Anchor anchor) {
  const int64_t length = anchor.length;
  auto it = anchors_.find(length);
  if (it != anchors_.end()) {
    bytes_ -= it->second.anchor.bytes();
    anchors_.erase(it);
  }
  bytes_ += anchor.bytes();
  anchors_[length] = Entry{std::move(anchor), next_serial_++};
  Evict();
}

void AnchorSet::Evict() {
  while (bytes_ > budget_bytes_ && static_cast<int>(anchors_.size()) > kProtectedAnchors) {
    // The oldest entry outside the newest kProtectedAnchors.
    std::vector<uint64_t> serials;
    for (const auto& [len, e] : anchors_) serials.push_back(e.serial);
    std::sort(serials.begin(), serials.end());
    const uint64_t oldest = serials.front();
    for (auto it = anchors_.begin(); it != anchors_.end(); ++it) {
      if (it->second.serial == oldest) {
        bytes_ -= it->second.anchor.bytes();
        anchors_.erase(it);
        ++evictions_;
        break;
      }
    }
  }
}

const Anchor* AnchorSet::LargestAtOrBelow(int64_t max_length) const {
  auto it = anchors_.upper_bound(max_length);
  if (it == anchors_.begin()) return nullptr;
  return &std::prev(it)->second.anchor;
}

void AnchorSet::DropAbove(int64_t max_length) {
  for (auto it = anchors_.upper_bound(max_length); it != anchors_.end();) {
    bytes_ -= it->second.anchor.bytes();
    it = anchors_.erase(it);
  }
}

int64_t AnchorSet::DropOldest() {
  if (anchors_.empty()) return 0;
  auto oldest = anchors_.begin();
  for (auto it = anchors_.begin(); it != anchors_.end(); ++it)
    if (it->second.serial < oldest->second.serial) oldest = it;
  const int64_t b = oldest->second.anchor.bytes();
  bytes_ -= b;
  anchors_.erase(oldest);
  return b;
}

void AnchorSet::Clear() {
  anchors_.clear();
  bytes_ = 0;
}

std::vector<Anchor> AnchorSet::Spread(int64_t max_length, int count) const {
  std::vector<const Anchor*> eligible;
  for (const auto& [len, e] : anchors_)
    if (len <= max_length) eligible.push_back(&e.anchor);
  std::vector<Anchor> out;
  if (eligible.empty() || count <= 0) return out;
  const size_t n = eligible.size();
  const size_t take = std::min(n, static_cast<size_t>(count));
  for (size_t i = 0; i < take; ++i) {
    size_t index = n - 1 - (take == 1 ? 0 : i * (n - 1) / (take - 1));  // always include the largest
    if (!out.empty() && out.back().length == eligible[index]->length) continue;
    out.push_back(*eligible[index]);
  }
  return out;
}

std::vector<Anchor> AnchorSet::Newest(int count) const {
  std::vector<const Entry*> entries;
  for (const auto& [len, e] : anchors_) entries.push_back(&e);
  std::sort(entries.begin(), entries.end(), [](const Entry* a, const Entry* b) { return a->serial > b->serial; });
  std::vector<Anchor> out;
  for (int i = 0; i < count && i < static_cast<int>(entries.size()); ++i) out.push_back(entries[i]->anchor);
  return out;
}

void AnchorSet::set_budget_bytes(int64_t b) {
  budget_bytes_ = b;
  Evict();
}

std::vector<int64_t> AnchorSet::lengths() const {
  std::vector<int64_t> out;
  for (const auto& [len, e] : anchors_) out.push_back(len);
  return out;
}

}  // namespace anchorage
