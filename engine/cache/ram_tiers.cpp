#include "engine/cache/ram_tiers.h"

#include <algorithm>

namespace anchorage {

namespace {

// Whether ids hold an image row from `from` on: alignment compares decoded text, which cannot see images.
bool ImageRowsFrom(std::span<const int32_t> ids, int64_t from) {
  return std::any_of(ids.begin() + std::min<int64_t>(from, static_cast<int64_t>(ids.size())), ids.end(), IsImageKey);
}

}  // namespace

TierOffer AnchorsTier::Find(std::span<const int32_t> prompt, const ResidentRows& resident, int64_t limit) const {
  const int64_t common = CommonPrefixLength(prompt, resident.rows);
  TierOffer offer;
  const int64_t reach = std::min(common, limit);
  const Anchor* a = anchors_.LargestAtOrBelow(reach);
  if (a != nullptr && !MayResumeAt(a->length, common, resident.taint_row, resident.regions))
    a = anchors_.LargestAtOrBelow(std::min(reach, resident.taint_row));
  if (a != nullptr && a->length > 0) offer.resume_length = a->length;
  if (std::optional<TierOffer> aligned = FindAligned(prompt, resident, limit, offer.resume_length)) return std::move(*aligned);
  return offer;
}

std::optional<TierOffer> AnchorsTier::FindAligned(std::span<const int32_t> prompt, const ResidentRows& resident, int64_t limit, int64_t plain) const {
  // Only generated text is re-rendered: the anchors above a whole generation region, past the common prefix.
  if (!options_.alignment || tokenizer_ == nullptr || resident.regions.empty()) return std::nullopt;
  const int64_t common = CommonPrefixLength(prompt, resident.rows);
  if (ImageRowsFrom(prompt, common) || ImageRowsFrom(resident.rows, common)) return std::nullopt;
  std::vector<int64_t> lines;
  for (int64_t length : anchors_.lengths())
    if (length > std::max(plain, common) && length <= std::min<int64_t>(limit, resident.rows.size()) && MayResumeAt(length, length, resident.taint_row, resident.regions))
      lines.push_back(length);
  if (lines.empty()) return std::nullopt;
  std::sort(lines.begin(), lines.end());
  // The rows' text decoded a piece at a time between region bounds and anchor lines, so each is a byte offset.
  std::vector<int64_t> cuts = lines;
  for (const auto& [begin, end] : resident.regions) cuts.insert(cuts.end(), {begin, end});
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  std::string rows_text;
  AlignOptions align;
  align.reasoning_pass = options_.reasoning_pass;
  std::vector<size_t> checkpoints;
  std::vector<std::pair<size_t, size_t>> byte_regions(resident.regions.size());
  int64_t at = 0;
  for (int64_t cut : cuts) {
    if (cut > lines.back()) break;
    rows_text += tokenizer_->Decode(std::vector<int32_t>(resident.rows.begin() + at, resident.rows.begin() + cut));
    at = cut;
    for (size_t r = 0; r < resident.regions.size(); ++r) {
      if (resident.regions[r].first == cut) byte_regions[r].first = rows_text.size();
      if (resident.regions[r].second == cut) byte_regions[r].second = rows_text.size();
    }
    if (std::binary_search(lines.begin(), lines.end(), cut)) checkpoints.push_back(rows_text.size());
  }
  for (size_t r = 0; r < resident.regions.size(); ++r)
    if (resident.regions[r].second <= lines.back()) align.regions.push_back(byte_regions[r]);
  if (align.regions.empty()) return std::nullopt;  // an empty list would make the whole text one region
  const std::string client_text = tokenizer_->Decode(std::vector<int32_t>(prompt.begin(), prompt.end()));
  const auto reached = AlignedCheckpoints(rows_text, client_text, align, checkpoints);
  for (auto it = reached.rbegin(); it != reached.rend(); ++it) {
    const int64_t line = lines[static_cast<size_t>(std::find(checkpoints.begin(), checkpoints.end(), it->first) - checkpoints.begin())];
    auto tail = tokenizer_->Encode(std::string_view(client_text).substr(it->second), /*parse_special=*/true);
    if (!tail.ok() || tail->empty()) continue;
    TierOffer offer;
    offer.served_prompt.assign(resident.rows.begin(), resident.rows.begin() + line);
    offer.served_prompt.insert(offer.served_prompt.end(), tail->begin(), tail->end());
    offer.resume_length = line;
    offer.aligned = true;
    return offer;
  }
  return std::nullopt;
}

std::string EndTier::RowsText(const std::vector<int32_t>& rows, int64_t length, std::vector<std::pair<size_t, size_t>>* byte_regions) const {
  // Decoded a segment at a time, so each generation region's bytes are known.
  std::string text;
  int64_t at = 0;
  auto decode = [&](int64_t from, int64_t to) { text += tokenizer_->Decode(std::vector<int32_t>(rows.begin() + from, rows.begin() + to)); };
  for (const auto& [begin, end] : end_->regions) {
    if (begin < at || end > length) break;
    decode(at, begin);
    const size_t text_begin = text.size();
    decode(begin, end);
    byte_regions->emplace_back(text_begin, text.size());
    at = end;
  }
  decode(at, length);
  return text;
}

TierOffer EndTier::Find(std::span<const int32_t> prompt, const ResidentRows& resident, int64_t limit) const {
  TierOffer offer;
  if (!end_ || !options_.enabled) return offer;
  const int64_t e = end_->anchor.length;
  if (e > static_cast<int64_t>(resident.rows.size())) return offer;
  const int64_t common = CommonPrefixLength(prompt, resident.rows);
  if (!MayResumeAtEnd(e, std::max(common, e), end_->taint_row, end_->regions)) return offer;
  if (common >= e) {
    if (e <= limit) {
      offer.resume_length = e;
      offer.resume_from_end = true;
    }
    return offer;
  }
  if (!options_.alignment || tokenizer_ == nullptr) return offer;
  if (ImageRowsFrom(prompt, common) || ImageRowsFrom(resident.rows, common)) return offer;
  AlignOptions align;
  align.reasoning_pass = options_.reasoning_pass;
  const std::string rows_text = RowsText(resident.rows, e, &align.regions);
  const std::string client_text = tokenizer_->Decode(std::vector<int32_t>(prompt.begin(), prompt.end()));
  const std::optional<size_t> j = AlignCopyWithRows(rows_text, client_text, align);
  if (!j) return offer;
  auto tail = tokenizer_->Encode(std::string_view(client_text).substr(*j), /*parse_special=*/true);
  if (!tail.ok() || tail->empty()) return offer;
  offer.served_prompt.assign(resident.rows.begin(), resident.rows.begin() + e);
  offer.served_prompt.insert(offer.served_prompt.end(), tail->begin(), tail->end());
  offer.resume_length = e;
  offer.resume_from_end = true;
  offer.aligned = true;
  return offer;
}

ShedUnit EndTier::ShedOne() {
  if (!end_) return {};
  const ShedUnit unit{end_->anchor.bytes(), end_->anchor.length};
  end_.reset();
  return unit;
}

ShedUnit StashTier::ShedOne() {
  if (!stash_.rows) return {};
  const ShedUnit unit{stash_.bytes(), 0};
  stash_.rows.reset();
  shed_flag_ = true;
  return unit;
}

TierOffer PinTier::Find(std::span<const int32_t> prompt, const ResidentRows& resident, int64_t limit) const {
  TierOffer offer;
  if (pin_.empty()) return offer;
  const int64_t cp = CommonPrefixLength(prompt, pin_.tokens);
  if (cp <= CommonPrefixLength(prompt, resident.rows)) return offer;  // the rows in place serve as much
  for (auto it = pin_.anchors.rbegin(); it != pin_.anchors.rend(); ++it) {
    if (it->length <= std::min(cp, limit) && MayResumeAt(it->length, cp, pin_.taint_row, pin_.regions)) {
      offer.resume_length = it->length;
      offer.restore_bytes = pin_.bytes();
      break;
    }
  }
  return offer;
}

Status PinTier::Restore(std::span<const int32_t>, const TierOffer&, ResidentRows& resident) {
  RETURN_IF_ERROR(resident.state.WriteRows(pin_.rows));
  resident.rows = pin_.tokens;
  resident.regions = pin_.regions;
  resident.anchors.Clear();
  for (const Anchor& a : pin_.anchors) resident.anchors.Put(a);
  resident.end.reset();
  resident.taint_row = pin_.taint_row;
  ++pin_.hits;
  return Status::Ok();
}

ShedUnit PinTier::ShedOne() {
  if (pin_.empty()) return {};
  const ShedUnit unit{pin_.bytes(), static_cast<int64_t>(pin_.tokens.size())};
  pin_ = PinnedHead{};
  return unit;
}

TierOffer ParkTier::Find(std::span<const int32_t> prompt, const ResidentRows& resident, int64_t limit) const {
  TierOffer offer;
  if (park_.empty() || CommonPrefixLength(resident.rows, park_.tokens) < park_.head) return offer;  // the shared head must be in place
  const int64_t cq = CommonPrefixLength(prompt, park_.tokens);
  const int64_t reach = std::min(cq, limit);
  if (cq > CommonPrefixLength(prompt, resident.rows)) {
    for (const Anchor& a : park_.anchors)
      if (a.length <= reach && MayResumeAt(a.length, cq, park_.taint_row, park_.regions)) offer.resume_length = std::max(offer.resume_length, a.length);
    if (park_.end && park_.end->anchor.length <= reach && park_.end->anchor.length > offer.resume_length &&
        MayResumeAtEnd(park_.end->anchor.length, cq, park_.end->taint_row, park_.end->regions)) {
      offer.resume_length = park_.end->anchor.length;
      offer.resume_from_end = true;
    }
  }
  // A copy that re-rendered the parked conversation (earlier reasoning left out) reaches the end by alignment.
  if (park_.end && park_.end->anchor.length > std::max(cq, offer.resume_length) && alignment_.enabled && alignment_.alignment && tokenizer_ != nullptr) {
    std::optional<EndAnchor> end = park_.end;
    EndTier aligner(end, tokenizer_);
    aligner.set_options(alignment_);
    std::vector<TokenRegion> regions = park_.regions;
    int64_t taint = park_.taint_row;
    std::string session;
    const ResidentRows view{resident.state, park_.tokens, resident.anchors, end, regions, taint, session};
    if (TierOffer aligned = aligner.Find(prompt, view, limit); aligned.aligned && aligned.resume_length == end->anchor.length) offer = std::move(aligned);
  }
  if (offer.resume_length > 0) offer.restore_bytes = park_.bytes();
  return offer;
}

std::optional<ParkedSession> ParkTier::CopyAside(const ResidentRows& resident, int64_t head) const {
  const int64_t here = static_cast<int64_t>(resident.rows.size());
  if (here <= head) return std::nullopt;
  const int64_t row_bytes = resident.state.kv_bytes_per_token();
  std::vector<Anchor> anchors;
  for (const Anchor& a : resident.anchors.Newest(ParkedSession::kMaxAnchors))
    if (a.length > head) anchors.push_back(a);
  std::sort(anchors.begin(), anchors.end(), [](const Anchor& a, const Anchor& b) { return a.length < b.length; });
  auto anchor_bytes_upto = [&](int64_t len) {
    int64_t b = 0;
    for (const Anchor& a : anchors)
      if (a.length <= len) b += a.bytes();
    return b;
  };
  int64_t top = here;
  std::optional<EndAnchor> end;
  if (resident.end && resident.end->anchor.length <= here && resident.end->anchor.length > head &&
      row_bytes * (here - head) + anchor_bytes_upto(here) + resident.end->anchor.bytes() <= budget_bytes_) {
    end = resident.end;
  } else {
    // The rows up to the newest anchor that fits.
    top = 0;
    for (const Anchor& a : anchors)
      if (row_bytes * (a.length - head) + anchor_bytes_upto(a.length) <= budget_bytes_) top = a.length;
  }
  if (top <= head) return std::nullopt;
  anchors.erase(std::remove_if(anchors.begin(), anchors.end(), [&](const Anchor& a) { return a.length > top; }), anchors.end());
  auto rows = resident.state.CopyRows(head, top);
  if (!rows.ok()) return std::nullopt;
  ParkedSession parked;
  parked.session = resident.session;
  parked.tokens.assign(resident.rows.begin(), resident.rows.begin() + top);
  parked.head = head;
  parked.rows = std::move(rows).value();
  parked.anchors = std::move(anchors);
  parked.end = std::move(end);
  parked.taint_row = resident.taint_row;
  parked.regions = resident.regions;
  ClipTokenRegions(parked.regions, top);
  return parked;
}

Status ParkTier::Restore(std::span<const int32_t>, const TierOffer& offer, ResidentRows& resident) {
  std::optional<ParkedSession> outgoing = offer.copy_aside ? CopyAside(resident, park_.head) : std::nullopt;
  RETURN_IF_ERROR(resident.state.WriteRows(park_.rows));
  ParkedSession back = std::move(park_);
  park_ = ParkedSession{};
  park_.parks = back.parks;
  park_.hits = back.hits + 1;
  if (outgoing) {
    outgoing->parks = back.parks + 1;
    outgoing->hits = back.hits + 1;
    install_(std::move(*outgoing));
  }
  resident.rows = back.tokens;
  resident.anchors.DropAbove(back.head);
  for (const Anchor& a : back.anchors) resident.anchors.Put(a);
  resident.end = back.end;
  resident.regions = back.regions;
  resident.taint_row = back.taint_row;
  resident.session = back.session;
  return Status::Ok();
}

ShedUnit ParkTier::ShedOne() {
  if (park_.empty()) return {};
  const ShedUnit unit{park_.bytes(), static_cast<int64_t>(park_.tokens.size())};
  park_ = ParkedSession{};
  return unit;
}

bool StoreTier::Usable(const StoreEntry& e) {
  const int64_t length = static_cast<int64_t>(e.tokens.size());
  return !e.session || MayResumeAtEnd(length, length, e.taint_row, e.regions);
}

TierOffer StoreTier::Find(std::span<const int32_t> prompt, const ResidentRows&, int64_t limit) const {
  TierOffer offer;
  if (!enabled_) return offer;
  if (const StoreEntry* e = store_.Peek(prompt, limit, Usable)) {
    offer.resume_length = static_cast<int64_t>(e->tokens.size());
    offer.resume_from_end = e->session;
    offer.restore_bytes = e->bytes();
  }
  return offer;
}

Status StoreTier::Restore(std::span<const int32_t> prompt, const TierOffer& offer, ResidentRows& resident) {
  const StoreEntry* e = store_.Lookup(prompt, offer.resume_length, Usable);
  if (e == nullptr || static_cast<int64_t>(e->tokens.size()) != offer.resume_length)
    return Internal("state store: the entry of " + std::to_string(offer.resume_length) + " tokens went missing");
  RETURN_IF_ERROR(resident.state.WriteRows(e->rows));
  resident.rows = e->tokens;
  resident.anchors.Clear();
  resident.end.reset();
  resident.regions = e->regions;
  if (e->session) resident.end = EndAnchor{e->anchor, e->taint_row, e->regions};
  else resident.anchors.Put(e->anchor);
  resident.taint_row = e->session ? e->taint_row : kNoTaintRow;
  return Status::Ok();
}

ShedUnit StoreTier::ShedOne() {
  const int64_t before = store_.bytes();
  if (!store_.DropOldest()) return {};
  return {before - store_.bytes(), 0};
}

}  // namespace anchorage
