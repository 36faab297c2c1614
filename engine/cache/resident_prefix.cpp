#include "engine/cache/resident_prefix.h"

#include <algorithm>
#include <chrono>
#include <initializer_list>
#include <limits>

namespace anchorage {

namespace {

// Where the prompt's last user message starts (its <|im_start|>), tool responses left out; -1 if none.
int64_t LastUserMessageStart(const Tokenizer* tokenizer, const std::vector<int32_t>& ids) {
  if (tokenizer == nullptr) return -1;
  const std::optional<int32_t> im_start = tokenizer->TokenId("<|im_start|>");
  if (!im_start) return -1;
  for (int64_t i = static_cast<int64_t>(ids.size()) - 1; i >= 0; --i) {
    if (ids[i] != *im_start) continue;
    const auto end = ids.begin() + std::min<int64_t>(static_cast<int64_t>(ids.size()), i + 6);
    const std::string head = tokenizer->Decode(std::vector<int32_t>(ids.begin() + i + 1, end));
    if (head.starts_with("user\n") && !head.substr(5).starts_with("<tool_response>")) return i;
  }
  return -1;
}

constexpr double kAssumedPrefillTokensPerS = 740;  // before this process measured a prefill


}  // namespace

const char* CacheSourceName(CacheSource source) {
  switch (source) {
    case CacheSource::kCold: return "cold";
    case CacheSource::kResident: return "resident";
    case CacheSource::kEnd: return "end";
    case CacheSource::kPin: return "pin";
    case CacheSource::kPark: return "park";
    case CacheSource::kStore: return "store";
    case CacheSource::kDisk: return "disk";
    case CacheSource::kSpill: return "spill";
    case CacheSource::kResponse: return "response";
    case CacheSource::kPrepared: return "prepared";
  }
  return "cold";
}

ResidentPrefix::ResidentPrefix(ComputeBackend& forward, const Tokenizer* tokenizer, ResidentOptions options)
    : forward_(forward),
      tokenizer_(tokenizer),
      options_(options),
      state_(forward.config()),
      taint_row_(kNoTaintRow),
      anchors_(options.anchor_budget_bytes),
      store_(options.store_budget_bytes, options.store_entry_cap_bytes),
      anchors_tier_(anchors_, tokenizer),
      end_tier_(end_, tokenizer),
      stash_tier_(stash_, stash_shed_),
      pin_tier_(pin_),
      park_tier_(park_, tokenizer, [this](ParkedSession parked) { InstallPark(std::move(parked)); }),
      store_tier_(store_) {
  ConfigureTiers();
  if (tokenizer_ != nullptr)
    if (auto ids = tokenizer_->Encode("<|im_start|>user", /*parse_special=*/true); ids.ok() && ids->size() >= 2) user_turn_ids_ = std::move(ids).value();
  if (tokenizer_ != nullptr)
    if (auto ids = tokenizer_->Encode("<|im_start|>assistant", /*parse_special=*/true); ids.ok() && ids->size() >= 2)
      answer_turn_ids_ = std::move(ids).value();
}

ResidentPrefix::~ResidentPrefix() { set_disk_cache(nullptr); }

void ResidentPrefix::set_suffix_store(SuffixStore* store) {
  suffix_store_ = store;
  if (store != nullptr) store->Configure(options_.suffix_store_bytes, options_.suffix_store_read_only);
}

void ResidentPrefix::set_session_spill(SessionSpill* spill) {
  spill_ = spill;
  spill_tier_ = spill != nullptr ? std::make_unique<SpillTier>(*spill, tokenizer_) : nullptr;
  ConfigureTiers();
  if (spill_ != nullptr) spill_->set_limits(options_.spill.budget_bytes, options_.spill.ttl_ms, options_.disk.min_free_bytes);
}

bool ResidentPrefix::SpillsOnEviction(int64_t shared_head, const ResumeInfo& info) const {
  const int64_t here = static_cast<int64_t>(rows_.size());
  if (spill_ == nullptr || !options_.spill.enabled || here < options_.spill.min_tokens) return false;
  // Two conversations without a session that open alike share an entry: never overwrite the one this request restores.
  if (info.source == CacheSource::kSpill) {
    const std::optional<SpillOffer> restoring = spill_->Offer(info.served_prompt, {}, info.cached_tokens);
    if (restoring && restoring->id == SessionSpill::EntryId(session_, rows_)) return false;
  }
  const int64_t park_need = RowBytes(here - shared_head) + (ParkedSession::kMaxAnchors + 1) * state_.anchor_bytes();
  return park_need > options_.park_budget_bytes;
}

Status ResidentPrefix::SaveToSpill(const SpillEntry& entry, const SequenceState& state, const std::string& reason, bool drain) {
  const int64_t tokens = static_cast<int64_t>(entry.tokens.size());
  if (guard_ != nullptr && !guard_->SpillMayWrite(drain, tokens)) {
    const std::string why = guard_->NoteSkip();
    ++counters_.spill_skips;
    Emit("drop", "spill", tokens, 0, reason + ": " + why);
    return ResourceExhausted(why);
  }
  auto saved = spill_->Save(entry, state);
  if (!saved.ok()) {
    Emit("drop", "spill", tokens, 0, reason + ": " + saved.status().message());
    return saved.status();
  }
  if (guard_ != nullptr) guard_->Add(saved->bytes_written);
  ++counters_.spill_saves;
  Emit("write", "spill", tokens, saved->bytes_written,
       reason + ": " + std::to_string(saved->blocks_written) + " blocks written, " + std::to_string(saved->blocks_kept) + " kept");
  return Status::Ok();
}

Status ResidentPrefix::SpillResident(const std::string& reason, bool resident) {
  if (spill_ == nullptr || !options_.spill.enabled || rows_.empty()) return Status::Ok();
  SpillEntry entry;
  entry.session = session_;
  entry.tokens = rows_;
  entry.taint_row = taint_row_;
  entry.regions = regions_;
  if (end_ && end_->anchor.length <= static_cast<int64_t>(rows_.size())) entry.end = end_;
  for (const Anchor& a : anchors_.Newest(ParkedSession::kMaxAnchors))
    if (a.length <= static_cast<int64_t>(rows_.size())) entry.anchors.push_back(a);
  std::sort(entry.anchors.begin(), entry.anchors.end(), [](const Anchor& a, const Anchor& b) { return a.length < b.length; });
  if (entry.anchors.empty() && !entry.end) return NotFound("the conversation has no anchor or end to resume from");
  if (state_.length() < static_cast<int64_t>(rows_.size())) state_.SetLength(static_cast<int64_t>(rows_.size()));
  RETURN_IF_ERROR(SaveToSpill(entry, state_, reason, resident));
  if (resident) return spill_->SetResident(SessionSpill::EntryId(entry.session, entry.tokens));
  return Status::Ok();
}

Status ResidentPrefix::SpillParked(const std::string& reason) {
  if (spill_ == nullptr || !options_.spill.enabled || park_.empty()) return Status::Ok();
  const int64_t head = park_.head, top = static_cast<int64_t>(park_.tokens.size());
  // The parked rows below its head are the rows in place; without them the park is not a conversation.
  if (CommonPrefixLength(rows_, park_.tokens) < head || state_.length() < head) return Status::Ok();
  SequenceState whole(forward_.config());
  if (head > 0) {
    ASSIGN_OR_RETURN(KvRows below, state_.CopyRows(0, head));
    RETURN_IF_ERROR(whole.WriteRows(below));
  }
  RETURN_IF_ERROR(whole.WriteRows(park_.rows));
  whole.SetLength(top);
  SpillEntry entry;
  entry.session = park_.session;
  entry.tokens = park_.tokens;
  entry.taint_row = park_.taint_row;
  entry.end = park_.end;
  entry.regions = park_.regions;
  entry.anchors = park_.anchors;
  if (entry.anchors.empty() && !entry.end) return Status::Ok();
  return SaveToSpill(entry, whole, reason, true);
}

Status ResidentPrefix::SpillForStop() {
  const Status parked = SpillParked("planned stop (parked)");
  const Status resident = SpillResident("planned stop", true);
  return resident.ok() ? parked : resident;
}

Status ResidentPrefix::SpillForRemoval() {
  const Status parked = SpillParked("fewer slots (parked)");
  const Status resident = SpillResident("fewer slots");
  return resident.ok() ? parked : resident;
}

Result<bool> ResidentPrefix::ResumeSpilledResident() {
  if (spill_ == nullptr || !options_.spill.enabled) return false;
  const std::optional<std::string> id = spill_->TakeResident();
  if (!id) return false;
  rows_.clear();
  regions_.clear();
  anchors_.Clear();
  end_.reset();
  state_.SetLength(0);
  SpillRestoreReport report;
  auto entry = spill_->Restore(*id, state_, {}, &report);
  if (!entry.ok()) {
    state_.Reset();
    Emit("failed_restore", "spill", 0, 0, entry.status().message() + "; the next request starts cold");
    return entry.status();
  }
  for (const Anchor& a : entry->anchors) anchors_.Put(a);
  rows_ = std::move(entry->tokens);
  regions_ = std::move(entry->regions);
  taint_row_ = entry->taint_row;
  end_ = std::move(entry->end);
  session_ = std::move(entry->session);
  ++counters_.spill_hits;
  Emit("hit", "spill", static_cast<int64_t>(rows_.size()), report.bytes_read, "read back at the start");
  return true;
}

void ResidentPrefix::set_disk_cache(DiskCache* disk) {
  if (disk_ != nullptr) {
    disk_->WaitIdle();  // the last request's lines are written before the state they come from goes
    disk_->Fence(&state_);
    disk_->set_event_sink(nullptr);
  }
  state_.set_growth_lock(nullptr);
  disk_ = disk;
  disk_lines_.clear();
  disk_staged_.clear();
  if (disk_ != nullptr) {
    state_.set_growth_lock(&disk_->growth_lock());
    disk_->set_event_sink(sink_);
    disk_->set_settings(options_.disk);
  }
}

void ResidentPrefix::set_event_sink(CacheEventSink sink) {
  sink_ = std::move(sink);
  if (disk_ != nullptr) disk_->set_event_sink(sink_);
}

int64_t ResidentPrefix::FirstAnswerStart(std::span<const int32_t> prompt) const {
  if (answer_turn_ids_.empty()) return -1;
  const auto it = std::search(prompt.begin(), prompt.end(), answer_turn_ids_.begin(), answer_turn_ids_.end());
  return it == prompt.end() ? -1 : static_cast<int64_t>(it - prompt.begin());
}

double ResidentPrefix::PrefillRate() const {
  return prefill_seconds_ > 0 && prefill_tokens_ >= 256 ? prefill_tokens_ / prefill_seconds_ : kAssumedPrefillTokensPerS;
}

int64_t ResidentPrefix::LastUserStart(std::span<const int32_t> prompt) const {
  if (user_turn_ids_.empty() || prompt.size() < user_turn_ids_.size()) return -1;
  for (size_t i = prompt.size() - user_turn_ids_.size() + 1; i-- > 0;)
    if (std::equal(user_turn_ids_.begin(), user_turn_ids_.end(), prompt.begin() + static_cast<long>(i))) return static_cast<int64_t>(i);
  return -1;
}

bool ResidentPrefix::EditsLastUserMessage(const CacheRequest& request, int64_t common) const {
  // The newest of at least two user turns, with everything before it kept: a first message that
  // differs is as likely another conversation.
  const int64_t last_user = LastUserStart(request.prompt);
  if (last_user <= 0 || common < last_user) return false;
  return LastUserStart(std::span<const int32_t>(request.prompt.data(), static_cast<size_t>(last_user))) >= 0;
}

bool ResidentPrefix::RewritesALaterTurn(const CacheRequest& request, std::span<const int32_t> served, int64_t common) const {
  if (!request.session.empty() || !session_.empty() || user_turn_ids_.empty()) return false;
  const auto user_at = [&](size_t from) {
    return std::search(served.begin() + static_cast<long>(std::min(from, served.size())), served.end(), user_turn_ids_.begin(), user_turn_ids_.end());
  };
  const auto first = user_at(0);
  if (first == served.end()) return false;
  const auto second = user_at(static_cast<size_t>(first - served.begin()) + user_turn_ids_.size());
  return second != served.end() && common >= second - served.begin();
}

bool ResidentPrefix::SameConversation(const CacheRequest& request, int64_t common) const {
  if (!request.session.empty()) return request.session == session_;
  return EditsLastUserMessage(request, common);
}

void ResidentPrefix::ConfigureTiers() {
  responses_->set_enabled(options_.response_cache);
  responses_->set_max_bytes(options_.response_cache_bytes);
  end_tier_.set_options({options_.end_anchor, options_.end_alignment, options_.end_align_reasoning});
  anchors_tier_.set_options({options_.end_alignment, options_.end_align_reasoning});
  if (spill_tier_) {
    spill_tier_->set_cost_check(options_.spill.cost_check);
    spill_tier_->set_alignment({options_.end_anchor, options_.end_alignment, options_.end_align_reasoning});
  }
  park_tier_.set_budget_bytes(options_.park_budget_bytes);
  park_tier_.set_alignment({options_.end_anchor, options_.end_alignment, options_.end_align_reasoning});
  store_tier_.set_enabled(options_.store_enabled);
  for (const auto& peer : peer_store_tiers_) peer->set_enabled(options_.store_enabled);
}

void ResidentPrefix::set_peer_stores(const std::vector<StateStore*>& peers) {
  peer_store_tiers_.clear();
  for (StateStore* store : peers) {
    peer_store_tiers_.push_back(std::make_unique<StoreTier>(*store));
    peer_store_tiers_.back()->set_enabled(options_.store_enabled);
  }
}

void ResidentPrefix::set_options(const ResidentOptions& options) {
  if (disk_ != nullptr) {
    disk_->Fence(&state_);
    disk_->set_settings(options.disk);
  }
  options_ = options;
  if (spill_ != nullptr) spill_->set_limits(options_.spill.budget_bytes, options_.spill.ttl_ms, options_.disk.min_free_bytes);
  if (suffix_store_ != nullptr) suffix_store_->Configure(options_.suffix_store_bytes, options_.suffix_store_read_only);
  ConfigureTiers();
  anchors_.set_budget_bytes(options.anchor_budget_bytes);
  store_.set_limits(options.store_budget_bytes, options.store_entry_cap_bytes);
  if (!options_.store_enabled) store_.Clear();
  if (!options_.enabled) (void)Clear("ram");
  // A lowered ceiling is kept from the next request's end on: a request it refuses changes no tier.
}

SpeculativeOptions ResidentPrefix::Speculative(std::span<const int32_t> history) const {
  SpeculativeOptions s;
  s.max_draft = options_.max_draft;
  s.lookup = options_.lookup_drafts;
  s.mtp = options_.mtp_drafts;
  s.history = history;
  if (options_.suffix_store) s.store = suffix_store_;
  return s;
}

int64_t ResidentPrefix::RowBytes(int64_t rows) const { return rows * state_.kv_bytes_per_token(); }

bool ResidentPrefix::IsGuest(const CacheRequest& request, int64_t resume_at) const {
  const int64_t n = static_cast<int64_t>(request.prompt.size());
  const int64_t resident = static_cast<int64_t>(rows_.size());
  if (resident == 0 || n > options_.guest_max_tokens || resume_at >= resident) return false;
  if (4 * n < resident) return true;
  // A short side request of the resident session that parts early (an agent's title request) is a
  // guest too, so it neither pins nor parks its conversation.
  const int64_t common = CommonPrefixLength(request.prompt, rows_);
  return !request.session.empty() && request.session == session_ && 2 * n < resident && 2 * common < resident;
}

ResidentPrefix::Plan ResidentPrefix::MakePlan(const CacheRequest& request) const {
  Plan p;
  p.info.served_prompt = request.prompt;
  const int64_t n = static_cast<int64_t>(request.prompt.size());
  p.info.reread_tokens = n;
  if (!options_.enabled || n == 0) return p;
  const int64_t limit = n - 1;  // at least one token is forwarded, for the logits
  int64_t best = 0;
  // The tiers in the order the seed asks them; a later one wins only when it resumes later.
  const ResidentRows resident = View();
  // The spill and the disk come last and are weighed: a read off the drive is taken only when it
  // costs less than the prefill it saves.
  std::vector<std::pair<const CacheTier*, CacheSource>> tiers = {
      {&anchors_tier_, CacheSource::kResident}, {&end_tier_, CacheSource::kEnd}, {&pin_tier_, CacheSource::kPin},
      {&park_tier_, CacheSource::kPark},        {&store_tier_, CacheSource::kStore}};
  for (const auto& peer : peer_store_tiers_) tiers.emplace_back(peer.get(), CacheSource::kStore);
  tiers.insert(tiers.end(), {{spill_tier_.get(), CacheSource::kSpill}, {disk_, CacheSource::kDisk}});
  std::string spill_why;  // why the spill's offer was not taken, when it made one
  int64_t spill_offer = 0, ram_best = 0;
  for (const auto& [tier, source] : tiers) {
    if (tier == nullptr || (source == CacheSource::kSpill && !options_.spill.enabled)) continue;
    TierOffer offer = tier->Find(request.prompt, resident, limit);
    if (source == CacheSource::kSpill) {
      spill_offer = offer.resume_length;
      ram_best = best;
    }
    if (offer.resume_length <= best) continue;
    // The spill serves a conversation only where it goes more than a chunk past what RAM serves.
    if (source == CacheSource::kSpill && offer.resume_length <= best + forward_.grid_tokens()) {
      spill_why = "short";
      continue;
    }
    if (offer.restore_seconds > 0 && offer.restore_seconds >= static_cast<double>(offer.resume_length - best) / PrefillRate()) {
      if (source == CacheSource::kDisk) p.declined_by_cost = true;
      if (source == CacheSource::kSpill) spill_why = "slow";
      continue;
    }
    best = offer.resume_length;
    p.info.source = source;
    p.store = source == CacheSource::kStore ? tier : nullptr;
    p.resume_from_end = offer.resume_from_end;
    p.info.aligned = offer.aligned;
    p.info.served_prompt = offer.served_prompt.empty() ? request.prompt : std::move(offer.served_prompt);
    p.offer = std::move(offer);
  }

  // A long prompt that shares at least four chunks with an entry, more than RAM serves, and is not
  // served from the spill: say why (end_no_align: its end not reached and the alignment refused;
  // anchors_below: no end, and its saved anchors below what RAM serves; slow; short).
  if (spill_ != nullptr && options_.spill.enabled && p.info.source != CacheSource::kSpill && n >= options_.spill.min_tokens) {
    const int64_t shares = spill_->LongestCommon(request.prompt);
    if (shares >= 4 * forward_.grid_tokens() && shares > ram_best) {
      if (spill_why.empty())
        spill_why = spill_offer > ram_best ? "slow" : spill_->EndCandidate(request.prompt, rows_, 1) ? "end_no_align" : "anchors_below";
      p.spill_refused = spill_why;
      p.spill_refusal_note = "no entry served: tokens=" + std::to_string(n) + " shares=" + std::to_string(shares) + " offer=" +
                             std::to_string(spill_offer) + " ram=" + std::to_string(ram_best) + " why=" + spill_why;
    }
  }

  p.resume_length = best;
  if (best == 0) p.info.source = CacheSource::kCold;
  p.info.cached_tokens = best;
  p.info.reread_tokens = static_cast<int64_t>(p.info.served_prompt.size()) - best;
  if (p.info.source == CacheSource::kCold || p.info.source == CacheSource::kResident) {
    p.info.guest = IsGuest(request, best);
    if (p.info.guest) {
      const int64_t stash_end = std::min<int64_t>(rows_.size(), n + request.max_new_tokens + options_.guest_margin_rows);
      if (RowBytes(stash_end - best) > options_.stash_budget_bytes) p.info.guest = false;
    }
  }
  return p;
}

ResumeInfo ResidentPrefix::Peek(const CacheRequest& request) const { return MakePlan(request).info; }


void ResidentPrefix::PinHead() {
  const int64_t row_bytes = RowBytes(1);
  if (row_bytes <= 0 || rows_.empty()) return;
  int64_t h = std::min<int64_t>(rows_.size(), options_.pin_budget_bytes / row_bytes);
  std::vector<Anchor> anchors;
  for (int round = 0; round < 8 && h > 0; ++round) {
    anchors = anchors_.Spread(h, PinnedHead::kMaxAnchors);
    int64_t anchor_bytes = 0;
    for (const Anchor& a : anchors) anchor_bytes += a.bytes();
    const int64_t fit = anchor_bytes >= options_.pin_budget_bytes ? 0 : (options_.pin_budget_bytes - anchor_bytes) / row_bytes;
    if (fit >= h) break;
    h = fit;
    anchors.clear();
  }
  std::sort(anchors.begin(), anchors.end(), [](const Anchor& a, const Anchor& b) { return a.length < b.length; });
  if (h <= 0 || anchors.empty()) return;
  // The pin already holds this head (and a new one would add less than a grid chunk): copy nothing.
  const int64_t pinned = static_cast<int64_t>(pin_.tokens.size());
  if (!pin_.empty() && CommonPrefixLength(pin_.tokens, rows_) == pinned && h - pinned < forward_.grid_tokens()) return;
  auto rows = state_.CopyRows(0, h);
  if (!rows.ok()) return;
  pin_.tokens.assign(rows_.begin(), rows_.begin() + h);
  pin_.rows = std::move(rows).value();
  pin_.anchors = std::move(anchors);
  pin_.taint_row = taint_row_;
  pin_.regions = regions_;
  ClipTokenRegions(pin_.regions, h);
  ++counters_.pins;
  Emit("write", "pin", h, pin_.bytes(), "a request of the same session replaced the prompt");
  if (park_.session == session_ && !session_.empty()) park_ = ParkedSession{};  // a compaction drops its own park
}

void ResidentPrefix::ParkResident(int64_t head) {
  std::optional<ParkedSession> parked = park_tier_.CopyAside(View(), head);
  if (!parked) return;
  parked->parks = park_.parks + 1;
  parked->hits = park_.hits;
  InstallPark(std::move(*parked));
}

void ResidentPrefix::InstallPark(ParkedSession parked) {
  park_ = std::move(parked);
  ++counters_.parks;
  Emit("write", "park", static_cast<int64_t>(park_.tokens.size()), park_.bytes(), "session '" + park_.session + "' gave way to another");
}

Status ResidentPrefix::Apply(const CacheRequest& request, Plan& plan) {
  ResumeInfo& info = plan.info;
  const int64_t r = plan.resume_length;
  // After a guest the buffer's length is the guest's; the resident rows below rows_.size() are valid again.
  if (state_.length() != static_cast<int64_t>(rows_.size())) state_.SetLength(static_cast<int64_t>(rows_.size()));

  ResidentRows resident = View();
  TierOffer offer{.resume_length = r, .resume_from_end = plan.resume_from_end, .served_prompt = {}, .aligned = info.aligned, .copy_aside = !plan.skip_copy};
  if (info.source == CacheSource::kPin) {
    RETURN_IF_ERROR(pin_tier_.Restore(request.prompt, offer, resident));
    ++counters_.pin_hits;
  } else if (info.source == CacheSource::kPark) {
    RETURN_IF_ERROR(park_tier_.Restore(request.prompt, offer, resident));
    ++counters_.park_hits;
  } else if (!info.guest) {
    const int64_t c = CommonPrefixLength(info.served_prompt, rows_);
    if (c < static_cast<int64_t>(rows_.size()) && !plan.skip_copy && plan.copy != Plan::Copy::kNone) {
      // This request replaces rows: keep the head of its own session, or park another session's.
      if (plan.copy == Plan::Copy::kPin) PinHead();
      else if (const int64_t head = std::min(r, c); !SpillsOnEviction(head, info) || !SpillResident("eviction").ok()) ParkResident(head);
    }
    if (info.source == CacheSource::kStore) {
      StoreTier* store = &store_tier_;
      for (const auto& peer : peer_store_tiers_)
        if (peer.get() == plan.store) store = peer.get();
      RETURN_IF_ERROR(store->Restore(request.prompt, offer, resident));
      ++counters_.store_hits;
    }
    if (info.source == CacheSource::kSpill) {
      if (Status s = spill_tier_->Restore(info.served_prompt, plan.offer, resident); !s.ok()) {
        plan.restore_failed = true;
        Emit("failed_restore", "spill", r, 0, s.message() + "; the request continues from the rows in place");
        return s;
      }
      const SpillRestoreReport& report = spill_tier_->last_restore();
      Emit("hit", "spill", r, report.bytes_read,
           std::to_string(report.blocks_read) + " blocks read, " + std::to_string(report.blocks_in_place) + " in place");
      ++counters_.spill_hits;
    }
    if (info.source == CacheSource::kDisk) {
      if (Status s = disk_->Restore(request.prompt, plan.offer, resident); !s.ok()) {
        plan.restore_failed = true;  // the state above the kept rows is gone: plan again from what is in place
        return s;
      }
      ++counters_.disk_hits;
    }
  }
  ++counters_.requests;
  if (!plan.spill_refused.empty()) {
    ++counters_.spill_refused[plan.spill_refused];
    if (spill_ != nullptr) spill_->Record(CacheEvent{"refused", "spill", static_cast<int64_t>(request.prompt.size()), 0, plan.spill_refusal_note, std::nullopt, 0});
  }
  if (disk_ != nullptr && disk_->reads()) {
    if (plan.declined_by_cost) disk_->NoteDeclinedByCost();
    if (info.source != CacheSource::kDisk && PrefillUpto(info) - r >= disk_->line_tokens()) disk_->NoteMiss();
  }

  if (info.guest) {
    const int64_t n = static_cast<int64_t>(request.prompt.size());
    const int64_t stash_end = std::min<int64_t>(rows_.size(), n + request.max_new_tokens + options_.guest_margin_rows);
    guest_resume_ = r;
    stash_shed_ = plan.skip_copy;  // without a stash the guest's rows replace the resident ones
    if (!plan.skip_copy) {
      ASSIGN_OR_RETURN(KvRows rows, state_.CopyRows(r, stash_end));
      stash_.rows = std::move(rows);
      ++stash_.uses;
      Emit("write", "stash", stash_end - r, stash_.bytes(), "guest request");
    }
    ++counters_.guests;
  }

  // Restore the state at r.
  const Anchor* anchor = nullptr;
  if (r > 0) {
    if (plan.resume_from_end) anchor = end_ ? &end_->anchor : nullptr;
    else anchor = anchors_.LargestAtOrBelow(r);
    if (anchor == nullptr || anchor->length != r) return Internal("resident prefix: the anchor at " + std::to_string(r) + " went missing");
    if (info.source != CacheSource::kDisk) RETURN_IF_ERROR(state_.RestoreAnchor(*anchor));
  } else {
    state_.Reset();
  }

  if (!info.guest) {
    rows_.resize(std::min<size_t>(rows_.size(), static_cast<size_t>(r)));
    ClipTokenRegions(regions_, r);
    anchors_.DropAbove(r);
    end_.reset();
    if (taint_row_ >= r) taint_row_ = kNoTaintRow;  // every row left is a cold prefill's
    // A prefill resumed off a 64-line runs other delta-rule chunks than a cold one: what it writes is tainted.
    if (r % kExactLineTokens != 0) taint_row_ = std::min(taint_row_, r);
    session_ = request.session;
  }
  if (info.source != CacheSource::kCold && info.source != CacheSource::kDisk && info.source != CacheSource::kSpill)  // they journal their own
    Emit("hit", CacheSourceName(info.source), info.cached_tokens, 0, info.aligned ? "end alignment" : "");
  switch (info.source) {
    case CacheSource::kCold: ++counters_.cold; break;
    case CacheSource::kResident: ++counters_.resident_hits; break;
    case CacheSource::kEnd: ++counters_.end_hits; counters_.aligned_hits += info.aligned; break;
    default: break;
  }
  counters_.cached_tokens += info.cached_tokens;
  counters_.reread_tokens += info.reread_tokens;
  return Status::Ok();
}

int64_t ResidentPrefix::PrefillUpto(const ResumeInfo& info) const {
  const int64_t n = static_cast<int64_t>(info.served_prompt.size());
  const int64_t line = info.guest ? forward_.grid_tokens() : kExactLineTokens;
  return (n - 1) / line * line;
}

std::vector<int64_t> ResidentPrefix::AnchorLines(const std::vector<int32_t>& prompt) const {
  const int64_t n = static_cast<int64_t>(prompt.size());
  std::vector<int64_t> lines;
  if (const int64_t user = LastUserMessageStart(tokenizer_, prompt); user >= kExactLineTokens)
    lines.push_back(user / kExactLineTokens * kExactLineTokens);
  if (const int64_t end = (n - 1) / kExactLineTokens * kExactLineTokens; end > 0 && (lines.empty() || lines.back() != end))
    lines.push_back(end);
  return lines;
}

PrefillCursor ResidentPrefix::StartPrefill(const ResumeInfo& info, int64_t upto, bool take_anchors) const {
  PrefillCursor c;
  c.upto = upto;
  c.take_anchors = take_anchors;
  if (take_anchors) c.lines = AnchorLines(info.served_prompt);
  c.evictions_before = anchors_.evictions();
  return c;
}

Status ResidentPrefix::PrefillStep(const ResumeInfo& info, PrefillCursor& c, DecodeRiders* riders) {
  const int64_t G = forward_.grid_tokens();
  const int64_t at = state_.length();
  int64_t next = std::min(c.upto, (at / G + 1) * G);
  if (riders != nullptr) {  // others wait for their next tokens: a shorter piece, still ending on a 64-line
    const int64_t piece = std::max(kExactLineTokens, forward_.piece_tokens_beside_decodes() / kExactLineTokens * kExactLineTokens);
    next = std::min(next, (at / kExactLineTokens) * kExactLineTokens + piece);
  }
  for (int64_t line : c.lines)
    if (line > at && line < next) next = line;
  for (int64_t line : disk_lines_)
    if (line > at && line < next) next = line;
  std::span<const int32_t> ids(info.served_prompt.data() + at, static_cast<size_t>(next - at));
  const auto started = std::chrono::steady_clock::now();
  auto logits = riders != nullptr ? forward_.PrefillCarrying(state_, ids, nullptr, *riders) : forward_.Prefill(state_, ids, LogitsRows::kLast);
  if (!logits.ok()) return logits.status();
  prefill_tokens_ += static_cast<double>(ids.size());
  prefill_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (c.take_anchors) {
    rows_.insert(rows_.end(), ids.begin(), ids.end());
    const int64_t length = state_.length();
    const bool for_disk = std::find(disk_lines_.begin(), disk_lines_.end(), length) != disk_lines_.end();
    if (length % G == 0 || for_disk || std::find(c.lines.begin(), c.lines.end(), length) != c.lines.end()) {
      anchors_.Put(state_.SaveAnchor());
      if (for_disk) disk_staged_.push_back(state_.SaveAnchor());
      ++c.written;
      c.last_line = length;
    }
  }
  return Status::Ok();
}

void ResidentPrefix::EndPrefill(const PrefillCursor& c) {
  if (c.written > 0) Emit("write", "anchors", c.last_line, c.written * state_.anchor_bytes(), std::to_string(c.written) + " grid anchors");
  if (anchors_.evictions() > c.evictions_before)
    Emit("eviction", "anchors", 0, (anchors_.evictions() - c.evictions_before) * state_.anchor_bytes(),
         std::to_string(anchors_.evictions() - c.evictions_before) + " anchors over the budget");
}

Status ResidentPrefix::PrefillRange(ResumeInfo& info, int64_t upto, bool take_anchors) {
  PrefillCursor cursor = StartPrefill(info, upto, take_anchors);
  while (state_.length() < upto) RETURN_IF_ERROR(PrefillStep(info, cursor));
  EndPrefill(cursor);
  return Status::Ok();
}

void ResidentPrefix::PlanDiskWrites(const CacheRequest& request, const ResumeInfo& info) {
  disk_lines_.clear();
  disk_staged_.clear();
  if (disk_ == nullptr || !disk_->writes() || info.guest) return;
  const int64_t upto = PrefillUpto(info);
  const std::span<const int32_t> prompt(info.served_prompt.data(), static_cast<size_t>(upto));
  AdmissionRequest a;
  a.prompt = prompt;
  a.resume_at = info.cached_tokens;
  a.exact_upto = std::min(taint_row_, upto);
  a.user_start = LastUserMessageStart(tokenizer_, info.served_prompt);
  a.first_answer_start = FirstAnswerStart(prompt);
  // A session's first long request: its short side requests (a title) do not use up the head anchors.
  a.first_of_session = static_cast<int64_t>(info.served_prompt.size()) >= disk_->settings().min_tokens && disk_->FirstOfSession(request.session);
  for (int64_t line : disk_->PlanWrites(a)) {
    if (line > state_.length()) {
      disk_lines_.push_back(line);
    } else if (const Anchor* in_place = anchors_.LargestAtOrBelow(line); in_place != nullptr && in_place->length == line) {
      disk_staged_.push_back(*in_place);  // below the resume point: the anchor already in RAM, a cold prefill's
    }
  }
}

void ResidentPrefix::SubmitDiskWrites(const ResumeInfo& info, const std::string& session) {
  disk_lines_.clear();
  if (disk_ == nullptr || disk_staged_.empty()) return;
  std::sort(disk_staged_.begin(), disk_staged_.end(), [](const Anchor& a, const Anchor& b) { return a.length < b.length; });
  DiskWriteJob job;
  const int64_t top = disk_staged_.back().length;
  job.tokens.assign(info.served_prompt.begin(), info.served_prompt.begin() + top);
  job.anchors = std::move(disk_staged_);
  job.session = session;
  disk_staged_.clear();
  disk_->Submit(std::move(job), state_);
}

Status ResidentPrefix::AdmitAndApply(const CacheRequest& request, Plan& plan, int64_t max_new) {
  if (disk_ != nullptr) disk_->Fence(&state_);  // the writer reads no more rows of the previous request
  for (int attempt = 0;; ++attempt) {
    Status admitted = Admit(request, plan, max_new);
    Status applied = admitted.ok() ? Apply(request, plan) : admitted;
    if (!applied.ok()) committed_bytes_ = 0;  // nothing runs on what was admitted
    if (applied.ok() || !admitted.ok() || !plan.restore_failed || attempt >= 2) return applied;
    plan = MakePlan(request);  // the failed files are gone: resume from what is in place, or cold
  }
}

void ResidentPrefix::FinishGuest() {
  if (stash_shed_) {  // the stash was given back for memory: the guest's rows replaced the resident ones
    rows_.resize(std::min<size_t>(rows_.size(), static_cast<size_t>(guest_resume_)));
    ClipTokenRegions(regions_, guest_resume_);
    anchors_.DropAbove(guest_resume_);
    if (end_ && end_->anchor.length > guest_resume_) end_.reset();
    stash_shed_ = false;
  }
  if (stash_.rows) {
    Status s = state_.WriteRows(*stash_.rows);
    if (!s.ok()) {
      Emit("failed_restore", "stash", stash_.rows->end - stash_.rows->begin, stash_.bytes(), s.message());
      (void)Clear("ram");  // rows we cannot put back are not served
    }
    stash_.rows.reset();
  }
}

void ResidentPrefix::KeepEnd(const ResumeInfo& info, int64_t forwarded, const std::vector<int32_t>& generated) {
  const int64_t n = static_cast<int64_t>(info.served_prompt.size());
  rows_.assign(info.served_prompt.begin(), info.served_prompt.end());
  rows_.insert(rows_.end(), generated.begin(), generated.begin() + forwarded);
  ClipTokenRegions(regions_, n);
  regions_.emplace_back(n, n + forwarded);
  if (forwarded > 0) taint_row_ = std::min(taint_row_, n);
  if (options_.end_anchor && options_.enabled) {
    end_ = EndAnchor{state_.SaveAnchor(), taint_row_, regions_};
    Emit("write", "end", end_->anchor.length, end_->anchor.bytes());
  }
  PutSessionSnapshot();
}

void ResidentPrefix::PutPrefixSnapshot(int64_t prompt_tokens) {
  if (!options_.enabled || !options_.store_enabled || !options_.store_prefix_snapshots) return;
  // The longest grid anchor of this prompt that a cold prefill wrote and that fits the per-entry cap.
  for (int64_t len : [&] { auto v = anchors_.lengths(); std::reverse(v.begin(), v.end()); return v; }()) {
    if (len > prompt_tokens || len > taint_row_ || len > static_cast<int64_t>(rows_.size())) continue;
    const Anchor* a = anchors_.LargestAtOrBelow(len);
    const int64_t bytes = a->bytes() + RowBytes(len);
    if (!store_.Admits(bytes)) continue;
    std::span<const int32_t> key(rows_.data(), static_cast<size_t>(len));
    if (store_.Contains(key)) return;
    store_.MakeRoom(bytes);  // room before the clone, never after
    auto rows = state_.CopyRows(0, len);
    if (!rows.ok()) return;
    store_.Put(StoreEntry{std::vector<int32_t>(key.begin(), key.end()), *a, std::move(rows).value(), kNoTaintRow, false, {}});
    Emit("write", "store", len, bytes, "prefix snapshot");
    return;
  }
}

void ResidentPrefix::PutSessionSnapshot() {
  if (!options_.enabled || !options_.store_enabled || !end_) return;
  const int64_t len = end_->anchor.length;
  if (!MayResumeAtEnd(len, len, end_->taint_row, end_->regions)) return;  // the prefix snapshot serves it
  if (len != static_cast<int64_t>(rows_.size()) || len > state_.length()) {
    ++store_.declined;  // the engine is ahead of (or behind) the committed tokens: nothing is cloned
    return;
  }
  const int64_t bytes = end_->anchor.bytes() + RowBytes(len);
  if (!store_.Admits(bytes)) {
    ++store_.declined;
    return;
  }
  store_.MakeRoom(bytes);
  auto rows = state_.CopyRows(0, len);
  if (!rows.ok()) return;
  store_.Put(StoreEntry{rows_, end_->anchor, std::move(rows).value(), end_->taint_row, true, end_->regions});
  Emit("write", "store", len, bytes, "session snapshot");
}

int64_t ResidentPrefix::ShedFloorBytes() const {
  int64_t bytes = EngineBytes();
  for (const CacheTier* tier : std::initializer_list<const CacheTier*>{&anchors_tier_, &end_tier_, &stash_tier_, &pin_tier_, &park_tier_, &store_tier_})
    bytes -= tier->bytes();
  return bytes;
}

int64_t ResidentPrefix::EngineBytes() const {
  return OwnBytes() + (disk_ != nullptr ? disk_->staged_bytes() : 0) + (outside_bytes_ ? outside_bytes_() : 0);
}

int64_t ResidentPrefix::OwnBytes() const {
  int64_t bytes = state_.allocated_bytes();
  for (const CacheTier* tier : std::initializer_list<const CacheTier*>{&anchors_tier_, &end_tier_, &stash_tier_, &pin_tier_, &park_tier_, &store_tier_})
    bytes += tier->bytes();
  for (const Anchor& a : disk_staged_) bytes += a.bytes();
  return bytes;
}

Status ResidentPrefix::CheckImagesInPlace() {
  const std::span<const int32_t> rows(rows_.data(), static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(rows_.size()), state_.length())));
  if (std::none_of(rows.begin(), rows.end(), IsImageKey)) {
    state_.set_images(nullptr);
    return Status::Ok();
  }
  if (state_.images() != nullptr && state_.images()->Holds(rows)) return Status::Ok();
  return NotFound("the rows in place hold images this state no longer has");
}

Result<std::vector<float>> ResidentPrefix::ForkLogits(std::span<const int32_t> context, std::span<const int32_t> extra, int64_t max_reread) {
  RETURN_IF_ERROR(CheckImagesInPlace());
  const int64_t common = CommonPrefixLength(context, rows_);
  const auto parted = rows_.begin() + std::min<int64_t>(common, static_cast<int64_t>(rows_.size()));
  if (std::any_of(parted, rows_.begin() + std::min(rows_.size(), context.size()), IsImageKey))
    return NotFound("the context leaves out images the rows in place hold (a reader without a tower reads them as text)");
  const int64_t length = state_.length();
  std::optional<Anchor> from;
  if (common == static_cast<int64_t>(context.size()) && common == length) from = state_.SaveAnchor();
  else if (const Anchor* a = anchors_.LargestAtOrBelow(std::min(common, length))) from = *a;
  if (!from || static_cast<int64_t>(context.size()) - from->length > max_reread)
    return NotFound("the engine holds no state of this conversation near its point (" + std::to_string(common) + " of " +
                    std::to_string(context.size()) + " ids in place)");
  std::vector<int32_t> ids(context.begin() + from->length, context.end());
  ids.insert(ids.end(), extra.begin(), extra.end());
  if (from->length == length) return forward_.ForkLastLogits(state_, ids);  // the state in place is the fork's start
  std::optional<Result<std::vector<float>>> logits;
  RETURN_IF_ERROR(OnFork(*from, [&] { logits = forward_.Prefill(state_, ids); }));
  return std::move(*logits);
}

Status ResidentPrefix::OnFork(const Anchor& from, const std::function<void()>& fn) {
  if (disk_ != nullptr) disk_->Fence(&state_);  // the writer reads no more rows of the previous request
  ASSIGN_OR_RETURN(KvRows above, state_.CopyRows(from.length, state_.length()));
  const Anchor in_place = state_.SaveAnchor();
  RETURN_IF_ERROR(state_.RestoreAnchor(from));
  fn();
  // Back to the bits before the fork, whatever fn did.
  Status rows_back = state_.WriteRows(above);
  Status state_back = state_.RestoreAnchor(in_place);
  if (rows_back.ok() && state_back.ok()) return Status::Ok();
  ForgetRows();
  return Internal("the fork could not put the engine's state back");
}

void ResidentPrefix::ForgetRows() {
  rows_.clear();
  regions_.clear();
  anchors_.Clear();
  end_.reset();
}

ResidentRows ResidentPrefix::View() { return ResidentRows{state_, rows_, anchors_, end_, regions_, taint_row_, session_}; }
// Tiers only read through a const view (Find is const); the references are the same members.
ResidentRows ResidentPrefix::View() const { return const_cast<ResidentPrefix*>(this)->View(); }

int64_t ResidentPrefix::PrefillPeakBytes(int64_t prompt_tokens, int64_t resume_at, int64_t max_new) const {
  const int64_t chunk = std::min(forward_.grid_tokens(), std::max<int64_t>(1, prompt_tokens - resume_at));
  const int64_t rows_after = prompt_tokens + max_new;
  const int64_t step = SequenceState::kKvRowStep;
  const int64_t capacity_after = (rows_after + step - 1) / step * step;
  const int64_t kv_growth = std::max<int64_t>(0, capacity_after - state_.capacity()) * state_.kv_bytes_per_token();
  return forward_.PrefillWorkspaceBytes(chunk) + kv_growth;
}

bool ResidentPrefix::Shed(int64_t extra, int64_t limit, const std::string& reason, Plan* plan) {
  auto fits = [&] { return EngineBytes() + extra <= limit; };
  auto count = [&](const std::string& tier, int64_t tokens, int64_t bytes) {
    ++counters_.sheds[tier];
    Emit("shed", tier, tokens, bytes, reason);
  };
  // Cheapest first; a plan's own copy is given up at its tier's place.
  const std::pair<CacheTier*, Plan::Copy> order[] = {{&store_tier_, Plan::Copy::kNone}, {&anchors_tier_, Plan::Copy::kNone},
                                                     {&end_tier_, Plan::Copy::kNone},   {&stash_tier_, Plan::Copy::kStash},
                                                     {&park_tier_, Plan::Copy::kPark},  {&pin_tier_, Plan::Copy::kPin}};
  for (const auto& [tier, planned] : order) {
    while (!fits()) {
      const ShedUnit unit = tier->ShedOne();
      if (unit.bytes == 0 && unit.tokens == 0) break;
      count(tier->name(), unit.tokens, unit.bytes);
    }
    if (!fits() && plan != nullptr && plan->copy == planned && planned != Plan::Copy::kNone && !plan->skip_copy) {
      extra -= plan->copy_bytes;
      plan->skip_copy = true;
      count(tier->name(), 0, plan->copy_bytes);
    }
  }
  return fits();
}

void ResidentPrefix::PlanCopy(const CacheRequest& request, Plan& plan) const {
  const int64_t anchor_bytes = state_.anchor_bytes();
  const int64_t resident = static_cast<int64_t>(rows_.size());
  auto park = [&](int64_t head) {
    plan.copy = Plan::Copy::kPark;
    plan.copy_bytes = std::min(options_.park_budget_bytes, RowBytes(resident - head) + (ParkedSession::kMaxAnchors + 1) * anchor_bytes);
  };
  plan.copy = Plan::Copy::kNone;
  plan.copy_bytes = 0;
  if (plan.info.guest) {
    const int64_t n = static_cast<int64_t>(request.prompt.size());
    plan.copy = Plan::Copy::kStash;
    plan.copy_bytes = RowBytes(std::min<int64_t>(resident, n + request.max_new_tokens + options_.guest_margin_rows) - plan.resume_length);
    return;
  }
  if (plan.info.source == CacheSource::kPark) return park(park_.head);
  if (plan.info.source == CacheSource::kPin) return;
  const int64_t c = CommonPrefixLength(plan.info.served_prompt, rows_);
  if (c >= resident || EditsLastUserMessage(request, c) || RewritesALaterTurn(request, plan.info.served_prompt, c)) return;
  if (SameConversation(request, c)) {
    plan.copy = Plan::Copy::kPin;
    plan.copy_bytes = std::min(options_.pin_budget_bytes, RowBytes(resident) + PinnedHead::kMaxAnchors * anchor_bytes);
    return;
  }
  park(std::min(plan.resume_length, c));
}

Status ResidentPrefix::Admit(const CacheRequest& request, Plan& plan, int64_t max_new) {
  const int64_t limit = options_.memory_peak_bytes - options_.memory_slack_bytes;
  const int64_t n = static_cast<int64_t>(request.prompt.size());
  // A GPU backend's copy of the state must fit its device too (the caches live in host memory).
  if (Status fits = forward_.FitsDevice(&state_, static_cast<int64_t>(plan.info.served_prompt.size()) + max_new); !fits.ok()) {
    ++counters_.refused;
    return fits;
  }
  auto need_of = [&](Plan& p) {
    PlanCopy(request, p);
    return PrefillPeakBytes(static_cast<int64_t>(p.info.served_prompt.size()), p.info.cached_tokens, max_new) + p.copy_bytes;
  };
  int64_t need = need_of(plan);
  if (EngineBytes() + need <= limit) {
    committed_bytes_ = OwnBytes() + need;
    return Status::Ok();
  }
  const std::string reason = "a prefill needs " + std::to_string(need) + " bytes";
  // Shedding goes ahead only where it is sure to fit the request, even where it takes what the plan
  // resumes from (planned again, cold at worst): otherwise the request is refused before any tier changes.
  const int64_t cold_need = PrefillPeakBytes(n, 0, max_new);
  if (ShedFloorBytes() + std::max(need - plan.copy_bytes, cold_need) <= limit) {
    if (Shed(need, limit, reason, &plan)) {
      // Shedding may have taken what the plan resumes from: plan again, keeping a given-up copy given up.
      Plan again = MakePlan(request);
      const int64_t again_need = need_of(again);
      again.skip_copy = plan.skip_copy && again.copy == plan.copy;
      if (EngineBytes() + again_need - (again.skip_copy ? again.copy_bytes : 0) <= limit || Shed(again_need, limit, reason, &again)) {
        plan = std::move(again);
        committed_bytes_ = OwnBytes() + again_need;
        return Status::Ok();
      }
    }
  }
  ++counters_.refused;
  Emit("drop", "memory", n, need, "a prefill did not fit the memory peak");
  return ResourceExhausted("the prefill needs " + std::to_string(need) + " bytes beyond the engine's " + std::to_string(EngineBytes()) +
                           " and the peak limit is " + std::to_string(options_.memory_peak_bytes) + " bytes (slack " +
                           std::to_string(options_.memory_slack_bytes) + ")");
}

int64_t ResidentPrefix::ContextLimit(int64_t context_tokens) const {
  return context_tokens > 0 ? context_tokens : forward_.config().max_position_embeddings;
}

bool ResidentPrefix::PreparedAnswerFits(const CacheRequest& request, const SamplingParams& params) const {
  if (!prepared_ || !options_.compaction_prepare) return false;
  const int64_t context = ContextLimit(request.context_tokens);
  SamplingParams fitted = params;
  fitted.max_tokens = std::min<int64_t>(params.max_tokens, context - static_cast<int64_t>(request.prompt.size()));
  return PreparedAnswerServes(*prepared_, request.prompt, fitted);
}

Result<CachedGeneration> ResidentPrefix::Generate(const CacheRequest& request, const SamplingParams& params,
                                                  const TokenCallback& on_token, const std::atomic<bool>* cancel,
                                                  const std::function<void(const ResumeInfo&)>& on_admitted) {
  ASSIGN_OR_RETURN(std::unique_ptr<ResidentTurn> turn, Begin(request, params, on_token, cancel, on_admitted));
  while (true) {
    ASSIGN_OR_RETURN(const bool more, PrefillPiece(*turn));
    if (!more) break;
  }
  if (turn->task)
    while (turn->task->Step()) turn->task->DecodeAlone();
  return End(*turn);
}

Result<std::unique_ptr<ResidentTurn>> ResidentPrefix::Begin(const CacheRequest& request, const SamplingParams& params, TokenCallback on_token,
                                                            const std::atomic<bool>* cancel,
                                                            const std::function<void(const ResumeInfo&)>& on_admitted) {
  auto turn = std::make_unique<ResidentTurn>();
  turn->request = request;
  turn->on_token = std::move(on_token);
  turn->cancel = cancel;
  // The context holds the prompt as served (end alignment can make it longer than the client's) and the output.
  const int64_t context = ContextLimit(request.context_tokens);
  if (responses_->enabled()) turn->response_key = ResponseCache::KeyOf(request.prompt, params, std::to_string(context));
  if (PreparedAnswerFits(request, params)) {
    ++prepared_counts_.served;
    ASSIGN_OR_RETURN(turn->replayed, Replay(request, prepared_->response, CacheSource::kPrepared, turn->on_token, on_admitted));
    return turn;
  }
  if (turn->response_key)
    if (std::shared_ptr<const CachedResponse> hit = responses_->Find(*turn->response_key)) {
      ASSIGN_OR_RETURN(turn->replayed, Replay(request, *hit, CacheSource::kResponse, turn->on_token, on_admitted));
      return turn;
    }
  Plan plan = MakePlan(request);
  const int64_t served = static_cast<int64_t>(plan.info.served_prompt.size());
  if (served >= context)
    return OutOfRange("the prompt holds " + std::to_string(served) + " tokens as served; this server's context limit is " + std::to_string(context) + " tokens");
  // Where the images are among the rows as served: the forward reads their rows and every row's position from them.
  std::shared_ptr<const PromptImages> images;
  if (std::any_of(plan.info.served_prompt.begin(), plan.info.served_prompt.end(), IsImageKey)) {
    ASSIGN_OR_RETURN(images, PromptImages::Locate(plan.info.served_prompt, request.images));
  }
  turn->params = params;
  turn->params.max_tokens = std::min(params.max_tokens, context - served);
  RETURN_IF_ERROR(AdmitAndApply(request, plan, turn->params.max_tokens));
  state_.set_images(std::move(images));
  turn->info = std::move(plan.info);
  if (on_admitted) on_admitted(turn->info);
  PlanDiskWrites(request, turn->info);
  turn->cursor = StartPrefill(turn->info, std::max(state_.length(), PrefillUpto(turn->info)), !turn->info.guest);
  return turn;
}

Result<bool> ResidentPrefix::PrefillPiece(ResidentTurn& turn, DecodeRiders* riders) {
  if (turn.replayed || turn.task) return false;
  ResumeInfo& info = turn.info;
  if (state_.length() < turn.cursor.upto) {
    if (Status s = PrefillStep(info, turn.cursor, riders); !s.ok()) {
      committed_bytes_ = 0;
      disk_lines_.clear();
      disk_staged_.clear();
      if (info.guest) FinishGuest();
      return s;
    }
    if (state_.length() < turn.cursor.upto) return true;
  }
  EndPrefill(turn.cursor);
  SubmitDiskWrites(info, turn.request.session);
  const int64_t n = static_cast<int64_t>(info.served_prompt.size());
  const int64_t start = state_.length();
  TokenCallback keep_token = turn.on_token;
  if (turn.response_key)
    keep_token = [&turn](const GeneratedToken& t) {
      turn.written.tokens.push_back(t);
      return turn.on_token ? turn.on_token(t) : true;
    };
  turn.task = std::make_unique<GenerationTask>(
      forward_, tokenizer_, state_, std::vector<int32_t>(info.served_prompt.begin() + start, info.served_prompt.begin() + n), turn.params,
      std::move(keep_token), turn.cancel, Speculative(std::span<const int32_t>(info.served_prompt.data(), static_cast<size_t>(start))));
  (void)turn.task->Prefill(riders != nullptr && !riders->taken ? riders : nullptr);  // a failure ends the task: End reports it
  return false;
}

Result<CachedGeneration> ResidentPrefix::End(ResidentTurn& turn) {
  if (turn.replayed) return std::move(*turn.replayed);
  if (!turn.task) return Internal("the request's prefill did not finish");
  ResumeInfo& info = turn.info;
  const int64_t n = static_cast<int64_t>(info.served_prompt.size());
  auto result = turn.task->Finish();
  if (result.ok() && turn.response_key && result->finish != FinishReason::kCancelled) {
    turn.written.result = *result;
    responses_->Insert(*turn.response_key, std::move(turn.written));
  }
  if (result.ok() && suffix_store_ != nullptr && options_.suffix_store && !options_.suffix_store_read_only) {
    // The store holds token ids only: what follows the last image row.
    const auto last_image = std::find_if(info.served_prompt.rbegin(), info.served_prompt.rend(), IsImageKey);
    std::vector<int32_t> read_and_written(last_image.base(), info.served_prompt.end());
    read_and_written.insert(read_and_written.end(), result->tokens.begin(), result->tokens.end());
    if (Status s = suffix_store_->Append(read_and_written); !s.ok()) Emit("drop", "suffix", static_cast<int64_t>(read_and_written.size()), 0, s.message());
  }
  if (info.guest) {
    FinishGuest();
  } else if (result.ok()) {
    const int64_t forwarded = std::clamp<int64_t>(state_.length() - n, 0, static_cast<int64_t>(result->tokens.size()));
    rows_.assign(info.served_prompt.begin(), info.served_prompt.end());
    PutPrefixSnapshot(n);
    KeepEnd(info, forwarded, result->tokens);
  } else {
    ForgetRows();
  }
  committed_bytes_ = 0;
  Shed(0, options_.memory_ceiling_bytes - options_.memory_slack_bytes, "over the memory ceiling after a request");
  if (!result.ok()) return result.status();
  return CachedGeneration{std::move(info), std::move(result).value()};
}

std::optional<std::vector<int32_t>> ResidentPrefix::EndRecord(const std::string& session) const {
  if (!options_.enabled || session.empty()) return std::nullopt;
  if (session == session_ && end_ && end_->anchor.length == static_cast<int64_t>(rows_.size())) return rows_;
  // Parked: its rows come back with the end anchor when the continuation's prompt asks for them.
  if (session == park_.session && park_.end && park_.end->anchor.length == static_cast<int64_t>(park_.tokens.size())) return park_.tokens;
  // Spilled: the spill tier restores it, end anchor included, for the continuation's prompt.
  if (spill_ != nullptr && options_.spill.enabled) return spill_->EndRecord(session);
  return std::nullopt;
}

Result<CachedGeneration> ResidentPrefix::Replay(const CacheRequest& request, const CachedResponse& response, CacheSource source,
                                                const TokenCallback& on_token, const std::function<void(const ResumeInfo&)>& on_admitted) {
  CachedGeneration out;
  out.resume.source = source;
  out.resume.cached_tokens = static_cast<int64_t>(request.prompt.size());
  out.resume.served_prompt = request.prompt;
  if (on_admitted) on_admitted(out.resume);
  ++counters_.requests;
  counters_.cached_tokens += out.resume.cached_tokens;
  if (source == CacheSource::kPrepared) Emit("hit", "prepared", out.resume.cached_tokens, response.bytes(), "a compaction written ahead");
  else Emit("hit", "response", out.resume.cached_tokens, response.bytes(), "an identical greedy request");
  out.generation = response.result;
  for (size_t i = 0; i < response.tokens.size(); ++i) {
    if (!on_token || on_token(response.tokens[i]) || i + 1 == response.tokens.size()) continue;
    // The client went away: the answer stops where a live one would have.
    out.generation.tokens.resize(i + 1);
    out.generation.text.clear();
    for (size_t j = 0; j <= i; ++j) out.generation.text += response.tokens[j].text;
    out.generation.finish = FinishReason::kCancelled;
    break;
  }
  return out;
}

Status ResidentPrefix::WriteAhead(const std::string& session, std::span<const int32_t> ids, const SamplingParams& params,
                                  int64_t context_tokens, const std::function<bool()>& should_stop) {
  if (session.empty() || session != session_ || !end_ || end_->anchor.length != static_cast<int64_t>(rows_.size()) ||
      state_.length() < end_->anchor.length)
    return NotFound("the rows in place are not session " + session + "'s conversation at its end anchor");
  const int64_t e = end_->anchor.length, n = static_cast<int64_t>(ids.size()), length = state_.length();
  if (n <= e || !std::equal(rows_.begin(), rows_.end(), ids.begin())) return InvalidArgument("the ids do not continue the conversation in place");
  RETURN_IF_ERROR(CheckImagesInPlace());
  const int64_t context = ContextLimit(context_tokens);
  if (n >= context) return OutOfRange("the continuation holds " + std::to_string(n) + " tokens; the context limit is " + std::to_string(context));
  SamplingParams fitted = params;
  fitted.max_tokens = std::min(params.max_tokens, context - n);
  const int64_t need = PrefillPeakBytes(n, e, fitted.max_tokens) + RowBytes(length - e);
  if (EngineBytes() + need > options_.memory_peak_bytes - options_.memory_slack_bytes) {
    ++prepared_counts_.refused;
    Emit("drop", "prepared", n, need, "writing ahead would not fit the memory peak");
    return ResourceExhausted("writing ahead needs " + std::to_string(need) + " bytes beyond the engine's " + std::to_string(EngineBytes()));
  }
  const auto started = std::chrono::steady_clock::now();
  CachedResponse written;
  bool stopped = false;
  Result<GenerationResult> result = Cancelled("stopped in the prefill");
  RETURN_IF_ERROR(OnFork(end_->anchor, [&] {
    // Cut where a live request's prefill cuts (grid and exact lines), so the bits are the same.
    Status prefilled = Status::Ok();
    const int64_t G = forward_.grid_tokens(), upto = std::max(e, (n - 1) / kExactLineTokens * kExactLineTokens);
    while (prefilled.ok() && state_.length() < upto && !(stopped = should_stop())) {
      const int64_t at = state_.length(), next = std::min(upto, (at / G + 1) * G);
      prefilled = forward_.Prefill(state_, ids.subspan(static_cast<size_t>(at), static_cast<size_t>(next - at))).status();
    }
    if (!prefilled.ok()) {
      result = prefilled;
    } else if (!stopped) {
      const int64_t start = state_.length();
      const auto rest = ids.subspan(static_cast<size_t>(start));
      GenerationTask task(forward_, tokenizer_, state_, std::vector<int32_t>(rest.begin(), rest.end()), fitted, [&](const GeneratedToken& t) {
        written.tokens.push_back(t);
        return !(stopped = should_stop());
      }, nullptr, Speculative(ids.first(static_cast<size_t>(start))));
      result = RunGeneration(task);
    }
  }));
  if (stopped || (result.ok() && result->finish == FinishReason::kCancelled)) {
    ++prepared_counts_.stopped;
    Emit("drop", "prepared", static_cast<int64_t>(written.tokens.size()), 0, "stopped: a request came");
    return Cancelled("a request came before the answer was written");
  }
  if (!result.ok()) return result.status();
  written.result = std::move(result).value();
  ++prepared_counts_.written;
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
  Emit("write", "prepared", static_cast<int64_t>(written.tokens.size()), written.bytes(),
       "a compaction of session " + session + " written ahead in " + std::to_string(static_cast<int64_t>(ms)) + " ms");
  prepared_ = PreparedAnswer{session, std::vector<int32_t>(ids.begin(), ids.end()), fitted, std::move(written)};
  return Status::Ok();
}

Result<std::vector<float>> ResidentPrefix::Prefill(const CacheRequest& request, ResumeInfo* info_out) {
  Plan plan = MakePlan(request);
  RETURN_IF_ERROR(AdmitAndApply(request, plan, 0));
  ResumeInfo& info = plan.info;
  const int64_t n = static_cast<int64_t>(info.served_prompt.size());
  const int64_t G = forward_.grid_tokens();
  PlanDiskWrites(request, info);
  if (Status s = PrefillRange(info, std::max(state_.length(), PrefillUpto(info)), !info.guest); !s.ok()) {
    committed_bytes_ = 0;
    disk_lines_.clear();
    disk_staged_.clear();
    return s;
  }
  SubmitDiskWrites(info, request.session);
  const int64_t start = state_.length();
  auto logits = forward_.Prefill(state_, std::span<const int32_t>(info.served_prompt.data() + start, static_cast<size_t>(n - start)));
  if (info.guest) {
    FinishGuest();
  } else if (logits.ok()) {
    rows_.insert(rows_.end(), info.served_prompt.begin() + start, info.served_prompt.end());
    if (state_.length() % G == 0) anchors_.Put(state_.SaveAnchor());
    PutPrefixSnapshot(n);
  }
  committed_bytes_ = 0;
  Shed(0, options_.memory_ceiling_bytes - options_.memory_slack_bytes, "over the memory ceiling after a request");
  if (info_out) *info_out = info;
  return logits;
}

Result<ResumeInfo> ResidentPrefix::Prewarm(const CacheRequest& request) {
  Plan plan = MakePlan(request);
  if (plan.info.guest || plan.info.source == CacheSource::kCold || plan.info.source == CacheSource::kResident ||
      plan.info.source == CacheSource::kEnd)
    return plan.info;  // nothing to bring: already in place, or no tier holds it
  RETURN_IF_ERROR(AdmitAndApply(request, plan, 0));
  committed_bytes_ = 0;  // nothing is forwarded
  // The rows and state are in place; the restored end stays the end, so the request resumes there.
  if (plan.resume_from_end) end_ = EndAnchor{state_.SaveAnchor(), taint_row_, regions_};
  plan.info.source = plan.resume_from_end ? CacheSource::kEnd : CacheSource::kResident;
  return plan.info;
}

bool ResidentPrefix::WouldFitBeside(const CacheRequest& request, int64_t max_tokens, int64_t outside) const {
  const int64_t n = static_cast<int64_t>(request.prompt.size());
  const int64_t max_new = std::max<int64_t>(0, std::min(max_tokens, ContextLimit(request.context_tokens) - n));
  const int64_t own_floor = ShedFloorBytes() - (outside_bytes_ ? outside_bytes_() : 0);
  const int64_t cold_need = PrefillPeakBytes(n, 0, max_new);
  return own_floor + outside + cold_need <= options_.memory_peak_bytes - options_.memory_slack_bytes;
}

void ResidentPrefix::GiveBack(const std::string& reason) {
  if (!rows_.empty()) (void)SpillResident(reason);  // a failed save is journaled; the rows go either way
  const int64_t bytes = OwnBytes(), tokens = static_cast<int64_t>(rows_.size());
  if (disk_ != nullptr) disk_->Fence(&state_);
  store_.Clear();
  stash_.rows.reset();
  pin_ = PinnedHead{};
  park_ = ParkedSession{};
  prepared_.reset();
  ForgetRows();  // the rows, regions, anchors and end anchor
  taint_row_ = kNoTaintRow;
  session_.clear();
  state_.Release();
  Emit("shed", "slot", tokens, bytes - OwnBytes(), reason);
}

Status ResidentPrefix::Clear(const std::string& tier) {
  const bool all = tier == "all" || tier == "ram" || tier == "resident";
  if (!all && tier != "anchors" && tier != "end" && tier != "stash" && tier != "pin" && tier != "park" && tier != "store" && tier != "disk" &&
      tier != "spill" && tier != "response" && tier != "prepared")
    return InvalidArgument("unknown cache tier '" + tier + "'; the tiers are " + kCacheTierNames);
  if (tier == "spill" && spill_ == nullptr) return InvalidArgument("this server runs without a session spill");
  if ((tier == "spill" || tier == "all") && spill_ != nullptr) RETURN_IF_ERROR(spill_->Clear());
  if (tier == "spill") {
    Emit("clear", "spill", 0, 0, "by request");
    return Status::Ok();
  }
  if (disk_ != nullptr) disk_->Fence(&state_);
  if (tier == "disk" && disk_ == nullptr) return InvalidArgument("this server runs without a disk tier (--disk-cache off)");
  if ((tier == "disk" || tier == "all") && disk_ != nullptr) RETURN_IF_ERROR(disk_->Clear());
  if (tier == "disk") return Status::Ok();
  if (all || tier == "store") store_.Clear();
  if (all || tier == "anchors") anchors_.Clear();
  if (all || tier == "end") end_.reset();
  if (all || tier == "stash") stash_.rows.reset();
  if (all || tier == "pin") pin_ = PinnedHead{};
  if (all || tier == "park") park_ = ParkedSession{};
  if (all || tier == "response") responses_->Clear();
  if (all || tier == "prepared") prepared_.reset();
  Emit("clear", tier, static_cast<int64_t>(rows_.size()), 0, "by request");
  if (all) {
    rows_.clear();
    regions_.clear();
    taint_row_ = kNoTaintRow;
    session_.clear();
    state_.Reset();
  }
  return Status::Ok();
}

CacheStats ResidentPrefix::Stats() const {
  const auto& k = counters_;
  CacheStats s;
  s.spill_refused = k.spill_refused;
  s.response = responses_->Stats();
  s.prepared = prepared_counts_;
  s.prepared.enabled = options_.compaction_prepare;
  if (prepared_) {
    s.prepared.entries = 1;
    s.prepared.session = prepared_->session;
    s.prepared.prompt_tokens = static_cast<int64_t>(prepared_->prompt.size());
    s.prepared.tokens = static_cast<int64_t>(prepared_->response.tokens.size());
    s.prepared.bytes = prepared_->response.bytes();
  }
  s.resident = {static_cast<int64_t>(rows_.size()), RowBytes(static_cast<int64_t>(rows_.size())), taint_row_ == kNoTaintRow ? -1 : taint_row_,
                session_, k.requests, k.cold, k.cached_tokens, k.reread_tokens};
  s.anchors = {static_cast<int64_t>(anchors_.size()), anchors_.bytes(), anchors_.budget_bytes(), k.resident_hits, anchors_.evictions(), anchors_.lengths()};
  s.end = {end_ ? 1 : 0, end_ ? end_->anchor.bytes() : 0, end_ ? end_->anchor.length : 0, k.end_hits, k.aligned_hits};
  s.stash = {stash_.rows ? 1 : 0, stash_.bytes(), options_.stash_budget_bytes, k.guests};
  s.pin = {pin_.empty() ? 0 : 1, static_cast<int64_t>(pin_.tokens.size()), pin_.bytes(), options_.pin_budget_bytes, k.pins, k.pin_hits};
  s.park = {park_.empty() ? 0 : 1, static_cast<int64_t>(park_.tokens.size()), park_.bytes(), options_.park_budget_bytes, k.parks, k.park_hits, park_.session};
  s.store = {static_cast<int64_t>(store_.size()), store_.bytes(), store_.budget_bytes(), store_.entry_cap_bytes(), k.store_hits, store_.misses,
             store_.puts, store_.evictions, store_.declined};
  s.memory = {EngineBytes(), state_.allocated_bytes(), options_.memory_ceiling_bytes, options_.memory_peak_bytes, options_.memory_slack_bytes,
              k.refused, k.sheds, outside_bytes_ ? outside_bytes_() : 0, forward_.device_name(), forward_.DeviceBytes()};
  if (suffix_store_ != nullptr)
    s.suffix = {options_.suffix_store, suffix_store_->bytes(), suffix_store_->max_bytes(), static_cast<int64_t>(suffix_store_->log().size()),
                suffix_store_->read_only()};
  return s;
}

}  // namespace anchorage
