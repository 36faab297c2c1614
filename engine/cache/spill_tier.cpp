#include "engine/cache/spill_tier.h"

#include <algorithm>

namespace anchorage {

namespace {

// The rows in place a restore may keep: below the taint, a cold prefill's like the entry's.
std::span<const int32_t> Exact(const ResidentRows& resident) {
  return std::span<const int32_t>(resident.rows).subspan(0, static_cast<size_t>(std::min<int64_t>(resident.rows.size(), resident.taint_row)));
}

}  // namespace

TierOffer SpillTier::Find(std::span<const int32_t> prompt, const ResidentRows& resident, int64_t limit) const {
  TierOffer offer;
  if (const std::optional<SpillOffer> o = spill_.Offer(prompt, Exact(resident), limit)) {
    offer.resume_length = o->resume_length;
    offer.resume_from_end = o->from_end;
    offer.restore_bytes = o->read_bytes;
  }
  // An entry whose end the copy does not reach token for token: end alignment on the entry's tokens.
  if (alignment_.enabled && alignment_.alignment && tokenizer_ != nullptr) {
    if (auto c = spill_.EndCandidate(prompt, Exact(resident), offer.resume_length + 1); c && c->end_length > offer.resume_length) {
      std::optional<EndAnchor> end = EndAnchor{Anchor{c->end_length, {}}, c->end_taint_row, c->end_regions};
      EndTier aligner(end, tokenizer_);
      aligner.set_options(alignment_);
      std::vector<TokenRegion> regions = c->end_regions;
      int64_t taint = c->end_taint_row;
      std::string session;
      const ResidentRows view{resident.state, c->tokens, resident.anchors, end, regions, taint, session};
      TierOffer aligned = aligner.Find(prompt, view, limit);
      if (aligned.resume_length == c->end_length && aligned.aligned) {
        offer = std::move(aligned);
        offer.restore_bytes = c->read_bytes;
      }
    }
  }
  if (offer.resume_length > 0 && cost_check_)
    offer.restore_seconds = std::max(1e-9, static_cast<double>(offer.restore_bytes) / spill_.RestoreBytesPerSecond());
  return offer;
}

Status SpillTier::Restore(std::span<const int32_t> prompt, const TierOffer& offer, ResidentRows& resident) {
  // prompt is the one served: after end alignment, the entry's own tokens up to its end, then the copy's new text.
  const std::span<const int32_t> exact = Exact(resident);
  const std::optional<SpillOffer> o = spill_.Offer(prompt, exact, offer.resume_length);
  if (!o || o->resume_length != offer.resume_length) return NotFound("session spill: the entry offered is gone");
  // Blocks below this are the prompt's and the entry's both: the restore leaves them as they are.
  const int64_t untouched = std::min(CommonPrefixLength(exact, prompt), offer.resume_length) / kSpillBlockRows * kSpillBlockRows;
  auto entry = spill_.Restore(o->id, resident.state, exact, &last_, offer.resume_length);
  if (!entry.ok()) {
    resident.rows.resize(std::min<size_t>(resident.rows.size(), static_cast<size_t>(untouched)));
    ClipTokenRegions(resident.regions, untouched);
    resident.anchors.DropAbove(untouched);
    resident.end.reset();
    return entry.status();
  }
  resident.anchors.DropAbove(CommonPrefixLength(exact, entry->tokens));
  for (const Anchor& a : entry->anchors) resident.anchors.Put(a);
  resident.rows = std::move(entry->tokens);
  resident.regions = std::move(entry->regions);
  resident.taint_row = entry->taint_row;
  resident.end = std::move(entry->end);
  resident.session = std::move(entry->session);
  return Status::Ok();
}

}  // namespace anchorage
