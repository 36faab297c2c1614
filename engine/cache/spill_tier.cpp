#include "engine/cache/spill_tier.h"

#include <algorithm>

namespace anchorage {

TierOffer SpillTier::Find(std::span<const int32_t> prompt, const ResidentRows& resident, int64_t limit) const {
  TierOffer offer;
  const std::optional<SpillOffer> o = spill_.Offer(prompt, resident.rows, limit);
  if (!o) return offer;
  offer.resume_length = o->resume_length;
  offer.resume_from_end = o->from_end;
  offer.restore_bytes = o->read_bytes;
  if (cost_check_) offer.restore_seconds = std::max(1e-9, static_cast<double>(o->read_bytes) / spill_.RestoreBytesPerSecond());
  return offer;
}

Status SpillTier::Restore(std::span<const int32_t> prompt, const TierOffer& offer, ResidentRows& resident) {
  const std::optional<SpillOffer> o = spill_.Offer(prompt, resident.rows, offer.resume_length);
  if (!o || o->resume_length != offer.resume_length) return NotFound("session spill: the entry offered is gone");
  // Blocks below this are the prompt's and the entry's both: the restore leaves them as they are.
  const int64_t untouched = std::min(CommonPrefixLength(resident.rows, prompt), offer.resume_length) / kSpillBlockRows * kSpillBlockRows;
  auto entry = spill_.Restore(o->id, resident.state, resident.rows, &last_);
  if (!entry.ok()) {
    resident.rows.resize(std::min<size_t>(resident.rows.size(), static_cast<size_t>(untouched)));
    ClipTokenRegions(resident.regions, untouched);
    resident.anchors.DropAbove(untouched);
    resident.end.reset();
    return entry.status();
  }
  resident.anchors.DropAbove(CommonPrefixLength(resident.rows, entry->tokens));
  for (const Anchor& a : entry->anchors) resident.anchors.Put(a);
  resident.rows = std::move(entry->tokens);
  resident.regions = std::move(entry->regions);
  resident.taint_row = entry->taint_row;
  resident.end = std::move(entry->end);
  resident.session = std::move(entry->session);
  return Status::Ok();
}

}  // namespace anchorage
