#include "engine/cache/resident_prefix.h"

#include <algorithm>
#include <limits>

namespace anchorage {

namespace {

constexpr int64_t kNoTaint = std::numeric_limits<int64_t>::max();

// Drops the regions at or above limit and cuts the one that straddles it.
void ClipRegions(std::vector<TokenRegion>& regions, int64_t limit) {
  regions.erase(std::remove_if(regions.begin(), regions.end(), [&](const TokenRegion& r) { return r.first >= limit; }), regions.end());
  for (TokenRegion& r : regions) r.second = std::min(r.second, limit);
}

int64_t CommonPrefix(std::span<const int32_t> a, std::span<const int32_t> b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return static_cast<int64_t>(i);
}

}  // namespace

const char* CacheSourceName(CacheSource source) {
  switch (source) {
    case CacheSource::kCold: return "cold";
    case CacheSource::kResident: return "resident";
    case CacheSource::kEnd: return "end";
    case CacheSource::kPin: return "pin";
    case CacheSource::kPark: return "park";
    case CacheSource::kStore: return "store";
  }
  return "cold";
}

ResidentPrefix::ResidentPrefix(Forward& forward, const Tokenizer* tokenizer, ResidentOptions options)
    : forward_(forward),
      tokenizer_(tokenizer),
      options_(options),
      state_(forward.config()),
      taint_row_(kNoTaint),
      anchors_(options.anchor_budget_bytes),
      store_(options.store_budget_bytes, options.store_entry_cap_bytes) {
  if (tokenizer_ != nullptr)
    if (auto ids = tokenizer_->Encode("<|im_start|>user", /*parse_special=*/true); ids.ok() && ids->size() >= 2) user_turn_ids_ = std::move(ids).value();
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

bool ResidentPrefix::SameConversation(const CacheRequest& request, int64_t common) const {
  if (!request.session.empty()) return request.session == session_;
  return EditsLastUserMessage(request, common);
}

void ResidentPrefix::set_options(const ResidentOptions& options) {
  options_ = options;
  anchors_.set_budget_bytes(options.anchor_budget_bytes);
  store_.set_limits(options.store_budget_bytes, options.store_entry_cap_bytes);
  if (!options_.store_enabled) store_.Clear();
  if (!options_.enabled) (void)Clear("all");
  Shed(0, options_.memory_ceiling_bytes - options_.memory_slack_bytes, "the memory ceiling was lowered");
}

int64_t ResidentPrefix::RowBytes(int64_t rows) const { return rows * state_.kv_bytes_per_token(); }

bool ResidentPrefix::IsGuest(const CacheRequest& request, int64_t resume_at) const {
  const int64_t n = static_cast<int64_t>(request.prompt.size());
  const int64_t resident = static_cast<int64_t>(rows_.size());
  if (resident == 0 || n > options_.guest_max_tokens || resume_at >= resident) return false;
  if (4 * n < resident) return true;
  // A short side request of the resident session that parts early (an agent's title request) is a
  // guest too, so it neither pins nor parks its conversation.
  const int64_t common = CommonPrefix(request.prompt, rows_);
  return !request.session.empty() && request.session == session_ && 2 * n < resident && 2 * common < resident;
}

ResidentPrefix::Plan ResidentPrefix::MakePlan(const CacheRequest& request) const {
  Plan p;
  p.info.served_prompt = request.prompt;
  const int64_t n = static_cast<int64_t>(request.prompt.size());
  p.info.reread_tokens = n;
  if (!options_.enabled || n == 0) return p;
  const int64_t limit = n - 1;  // at least one token is forwarded, for the logits
  const int64_t c = CommonPrefix(request.prompt, rows_);
  int64_t best = 0;

  if (const Anchor* a = anchors_.LargestAtOrBelow(std::min(c, limit)); a != nullptr && a->length > 0) {
    best = a->length;
    p.info.source = CacheSource::kResident;
  }

  if (end_ && options_.end_anchor) {
    const int64_t e = end_->anchor.length;
    if (e <= static_cast<int64_t>(rows_.size()) && e > best) {
      if (c >= e && e <= limit) {
        best = e;
        p.info.source = CacheSource::kEnd;
        p.resume_from_end = true;
      } else if (c < e && options_.end_alignment && tokenizer_ != nullptr) {
        AlignOptions align;
        align.reasoning_pass = options_.end_align_reasoning;
        const std::string rows_text = RowsText(e, &align.regions);
        const std::string client_text = tokenizer_->Decode(request.prompt);
        if (auto j = AlignCopyWithRows(rows_text, client_text, align)) {
          auto tail = tokenizer_->Encode(std::string_view(client_text).substr(*j), /*parse_special=*/true);
          if (tail.ok() && !tail->empty()) {
            std::vector<int32_t> served(rows_.begin(), rows_.begin() + e);
            served.insert(served.end(), tail->begin(), tail->end());
            p.info.served_prompt = std::move(served);
            p.info.aligned = true;
            p.info.source = CacheSource::kEnd;
            p.resume_from_end = true;
            best = e;
          }
        }
      }
    }
  }

  if (!pin_.empty()) {
    const int64_t cp = CommonPrefix(request.prompt, pin_.tokens);
    if (cp > c) {
      for (auto it = pin_.anchors.rbegin(); it != pin_.anchors.rend(); ++it) {
        if (it->length <= std::min(cp, limit)) {
          if (it->length > best) {
            best = it->length;
            p.info.source = CacheSource::kPin;
            p.info.served_prompt = request.prompt;
            p.info.aligned = false;
            p.resume_from_end = false;
          }
          break;
        }
      }
    }
  }

  if (!park_.empty() && CommonPrefix(rows_, park_.tokens) >= park_.head) {
    const int64_t cq = CommonPrefix(request.prompt, park_.tokens);
    if (cq > c) {
      const int64_t reach = std::min(cq, limit);
      int64_t park_best = 0;
      bool park_end = false;
      for (const Anchor& a : park_.anchors)
        if (a.length <= reach) park_best = std::max(park_best, a.length);
      if (park_.end && park_.end->anchor.length <= reach && park_.end->anchor.length > park_best) {
        park_best = park_.end->anchor.length;
        park_end = true;
      }
      if (park_best > best) {
        best = park_best;
        p.info.source = CacheSource::kPark;
        p.info.served_prompt = request.prompt;
        p.info.aligned = false;
        p.resume_from_end = park_end;
      }
    }
  }

  if (options_.store_enabled) {
    if (const StoreEntry* e = store_.Peek(request.prompt, limit); e != nullptr && static_cast<int64_t>(e->tokens.size()) > best) {
      best = static_cast<int64_t>(e->tokens.size());
      p.info.source = CacheSource::kStore;
      p.info.served_prompt = request.prompt;
      p.info.aligned = false;
      p.resume_from_end = e->session;
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

std::string ResidentPrefix::RowsText(int64_t length, std::vector<std::pair<size_t, size_t>>* byte_regions) const {
  // Decoded a segment at a time, so each generation region's bytes are known.
  std::string text;
  int64_t at = 0;
  auto decode = [&](int64_t from, int64_t to) { text += tokenizer_->Decode(std::vector<int32_t>(rows_.begin() + from, rows_.begin() + to)); };
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
  if (!pin_.empty() && CommonPrefix(pin_.tokens, rows_) == pinned && h - pinned < forward_.grid_tokens()) return;
  auto rows = state_.CopyRows(0, h);
  if (!rows.ok()) return;
  pin_.tokens.assign(rows_.begin(), rows_.begin() + h);
  pin_.rows = std::move(rows).value();
  pin_.anchors = std::move(anchors);
  pin_.taint_row = taint_row_;
  ++counters_.pins;
  Emit("write", "pin", h, pin_.bytes(), "a request of the same session replaced the prompt");
  if (park_.session == session_ && !session_.empty()) park_ = ParkedSession{};  // a compaction drops its own park
}

std::optional<ParkedSession> ResidentPrefix::MakePark(int64_t head) const {
  const int64_t resident = static_cast<int64_t>(rows_.size());
  if (resident <= head) return std::nullopt;
  std::vector<Anchor> anchors;
  for (const Anchor& a : anchors_.Newest(ParkedSession::kMaxAnchors))
    if (a.length > head) anchors.push_back(a);
  std::sort(anchors.begin(), anchors.end(), [](const Anchor& a, const Anchor& b) { return a.length < b.length; });
  auto anchor_bytes_upto = [&](int64_t len) {
    int64_t b = 0;
    for (const Anchor& a : anchors)
      if (a.length <= len) b += a.bytes();
    return b;
  };
  int64_t top = resident;
  std::optional<EndAnchor> end;
  if (end_ && end_->anchor.length <= resident && end_->anchor.length > head &&
      RowBytes(resident - head) + anchor_bytes_upto(resident) + end_->anchor.bytes() <= options_.park_budget_bytes) {
    end = end_;
  } else {
    // The rows up to the newest anchor that fits.
    top = 0;
    for (const Anchor& a : anchors)
      if (RowBytes(a.length - head) + anchor_bytes_upto(a.length) <= options_.park_budget_bytes) top = a.length;
  }
  if (top <= head) return std::nullopt;
  anchors.erase(std::remove_if(anchors.begin(), anchors.end(), [&](const Anchor& a) { return a.length > top; }), anchors.end());
  auto rows = state_.CopyRows(head, top);
  if (!rows.ok()) return std::nullopt;
  ParkedSession parked;
  parked.session = session_;
  parked.tokens.assign(rows_.begin(), rows_.begin() + top);
  parked.head = head;
  parked.rows = std::move(rows).value();
  parked.anchors = std::move(anchors);
  parked.end = std::move(end);
  parked.taint_row = taint_row_;
  return parked;
}

void ResidentPrefix::ParkResident(int64_t head) {
  std::optional<ParkedSession> parked = MakePark(head);
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
  ++counters_.requests;
  // After a guest the buffer's length is the guest's; the resident rows below rows_.size() are valid again.
  if (state_.length() != static_cast<int64_t>(rows_.size())) state_.SetLength(static_cast<int64_t>(rows_.size()));

  if (info.source == CacheSource::kPin) {
    RETURN_IF_ERROR(state_.WriteRows(pin_.rows));
    rows_ = pin_.tokens;
    regions_.clear();
    anchors_.Clear();
    for (const Anchor& a : pin_.anchors) anchors_.Put(a);
    end_.reset();
    taint_row_ = pin_.taint_row;
    ++pin_.hits;
    ++counters_.pin_hits;
  } else if (info.source == CacheSource::kPark) {
    // The rows in place are copied aside before the parked rows overwrite them; a failed write
    // leaves both where they were.
    std::optional<ParkedSession> resident = plan.skip_copy ? std::nullopt : MakePark(park_.head);
    RETURN_IF_ERROR(state_.WriteRows(park_.rows));
    ParkedSession back = std::move(park_);
    park_ = ParkedSession{};
    if (resident) {
      resident->parks = back.parks + 1;
      resident->hits = back.hits + 1;
      InstallPark(std::move(*resident));
    } else {
      park_.parks = back.parks;
      park_.hits = back.hits + 1;
    }
    rows_ = back.tokens;
    anchors_.DropAbove(back.head);
    for (const Anchor& a : back.anchors) anchors_.Put(a);
    end_ = back.end;
    regions_ = back.end ? back.end->regions : std::vector<TokenRegion>{};
    taint_row_ = back.taint_row;
    session_ = back.session;
    ++counters_.park_hits;
  } else if (!info.guest) {
    const int64_t c = CommonPrefix(info.served_prompt, rows_);
    if (c < static_cast<int64_t>(rows_.size()) && !plan.skip_copy && plan.copy != Plan::Copy::kNone) {
      // This request replaces rows: keep the head of its own session, or park another session's.
      if (plan.copy == Plan::Copy::kPin) PinHead();
      else ParkResident(std::min(r, c));
    }
    if (info.source == CacheSource::kStore) {
      const StoreEntry* e = store_.Lookup(request.prompt, r);
      if (e == nullptr || static_cast<int64_t>(e->tokens.size()) != r) return Internal("state store: the entry of " + std::to_string(r) + " tokens went missing");
      RETURN_IF_ERROR(state_.WriteRows(e->rows));
      rows_ = e->tokens;
      anchors_.Clear();
      end_.reset();
      regions_.clear();
      if (e->session) end_ = EndAnchor{e->anchor, e->taint_row, {}};
      else anchors_.Put(e->anchor);
      taint_row_ = e->session ? e->taint_row : kNoTaint;
      ++counters_.store_hits;
    }
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
    else if (info.source == CacheSource::kStore) anchor = anchors_.LargestAtOrBelow(r);
    else anchor = anchors_.LargestAtOrBelow(r);
    if (anchor == nullptr || anchor->length != r) return Internal("resident prefix: the anchor at " + std::to_string(r) + " went missing");
    RETURN_IF_ERROR(state_.RestoreAnchor(*anchor));
  } else {
    state_.Reset();
  }

  if (!info.guest) {
    rows_.resize(std::min<size_t>(rows_.size(), static_cast<size_t>(r)));
    ClipRegions(regions_, r);
    anchors_.DropAbove(r);
    end_.reset();
    if (taint_row_ >= r) taint_row_ = kNoTaint;  // every row left is a cold prefill's
    // A prefill resumed off the grid runs other chunks than a cold one: what it writes is tainted.
    if (r % forward_.grid_tokens() != 0) taint_row_ = std::min(taint_row_, r);
    session_ = request.session;
  }
  if (info.source != CacheSource::kCold)
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

Status ResidentPrefix::PrefillRange(ResumeInfo& info, int64_t upto, bool take_anchors) {
  const int64_t G = forward_.grid_tokens();
  const int64_t evictions_before = anchors_.evictions();
  int64_t written = 0, last_line = 0;
  while (state_.length() < upto) {
    const int64_t at = state_.length();
    const int64_t next = std::min(upto, (at / G + 1) * G);
    std::span<const int32_t> ids(info.served_prompt.data() + at, static_cast<size_t>(next - at));
    auto logits = forward_.Prefill(state_, ids, LogitsRows::kLast);
    if (!logits.ok()) return logits.status();
    if (take_anchors) {
      rows_.insert(rows_.end(), ids.begin(), ids.end());
      if (state_.length() % G == 0) {
        anchors_.Put(state_.SaveAnchor());
        ++written;
        last_line = state_.length();
      }
    }
  }
  if (written > 0) Emit("write", "anchors", last_line, written * state_.anchor_bytes(), std::to_string(written) + " grid anchors");
  if (anchors_.evictions() > evictions_before)
    Emit("eviction", "anchors", 0, (anchors_.evictions() - evictions_before) * state_.anchor_bytes(),
         std::to_string(anchors_.evictions() - evictions_before) + " anchors over the budget");
  return Status::Ok();
}

void ResidentPrefix::FinishGuest() {
  if (stash_shed_) {  // the stash was given back for memory: the guest's rows replaced the resident ones
    rows_.resize(std::min<size_t>(rows_.size(), static_cast<size_t>(guest_resume_)));
    ClipRegions(regions_, guest_resume_);
    anchors_.DropAbove(guest_resume_);
    if (end_ && end_->anchor.length > guest_resume_) end_.reset();
    stash_shed_ = false;
  }
  if (stash_.rows) {
    Status s = state_.WriteRows(*stash_.rows);
    if (!s.ok()) {
      Emit("failed_restore", "stash", stash_.rows->end - stash_.rows->begin, stash_.bytes(), s.message());
      (void)Clear("all");  // rows we cannot put back are not served
    }
    stash_.rows.reset();
  }
}

void ResidentPrefix::KeepEnd(const ResumeInfo& info, int64_t forwarded, const std::vector<int32_t>& generated) {
  const int64_t n = static_cast<int64_t>(info.served_prompt.size());
  rows_.assign(info.served_prompt.begin(), info.served_prompt.end());
  rows_.insert(rows_.end(), generated.begin(), generated.begin() + forwarded);
  ClipRegions(regions_, n);
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
    store_.Put(StoreEntry{std::vector<int32_t>(key.begin(), key.end()), *a, std::move(rows).value(), kNoTaint, false});
    Emit("write", "store", len, bytes, "prefix snapshot");
    return;
  }
}

void ResidentPrefix::PutSessionSnapshot() {
  if (!options_.enabled || !options_.store_enabled || !end_) return;
  const int64_t len = end_->anchor.length;
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
  store_.Put(StoreEntry{rows_, end_->anchor, std::move(rows).value(), end_->taint_row, true});
  Emit("write", "store", len, bytes, "session snapshot");
}

int64_t ResidentPrefix::EngineBytes() const {
  return state_.allocated_bytes() + anchors_.bytes() + (end_ ? end_->anchor.bytes() : 0) + stash_.bytes() + pin_.bytes() +
         park_.bytes() + store_.bytes();
}

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
  auto skip_planned = [&](Plan::Copy kind, const char* tier) {
    if (fits() || plan == nullptr || plan->copy != kind || plan->skip_copy) return;
    extra -= plan->copy_bytes;
    plan->skip_copy = true;
    count(tier, 0, plan->copy_bytes);
  };
  while (!fits() && store_.size() > 0) {
    const int64_t before = store_.bytes();
    store_.DropOldest();
    count("store", 0, before - store_.bytes());
  }
  while (!fits() && anchors_.size() > 0) {
    const int64_t b = anchors_.DropOldest();
    count("anchors", 0, b);
  }
  if (!fits() && end_) {
    const int64_t b = end_->anchor.bytes();
    const int64_t len = end_->anchor.length;
    end_.reset();
    count("end", len, b);
  }
  if (!fits() && stash_.rows) {
    const int64_t b = stash_.bytes();
    stash_.rows.reset();
    stash_shed_ = true;
    count("stash", 0, b);
  }
  skip_planned(Plan::Copy::kStash, "stash");
  if (!fits() && !park_.empty()) {
    const int64_t b = park_.bytes();
    const int64_t len = static_cast<int64_t>(park_.tokens.size());
    park_ = ParkedSession{};
    count("park", len, b);
  }
  skip_planned(Plan::Copy::kPark, "park");
  if (!fits() && !pin_.empty()) {
    const int64_t b = pin_.bytes();
    const int64_t len = static_cast<int64_t>(pin_.tokens.size());
    pin_ = PinnedHead{};
    count("pin", len, b);
  }
  skip_planned(Plan::Copy::kPin, "pin");
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
  const int64_t c = CommonPrefix(plan.info.served_prompt, rows_);
  if (c >= resident || EditsLastUserMessage(request, c)) return;
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
  auto need_of = [&](Plan& p) {
    PlanCopy(request, p);
    return PrefillPeakBytes(static_cast<int64_t>(p.info.served_prompt.size()), p.info.cached_tokens, max_new) + p.copy_bytes;
  };
  int64_t need = need_of(plan);
  if (EngineBytes() + need <= limit) return Status::Ok();
  const std::string reason = "a prefill needs " + std::to_string(need) + " bytes";
  // A request that cannot fit even cold, with every cache given back and nothing copied, is refused before any tier changes.
  const int64_t cold_need = PrefillPeakBytes(n, 0, max_new);
  if (state_.allocated_bytes() + std::min(need - plan.copy_bytes, cold_need) <= limit) {
    if (Shed(need, limit, reason, &plan)) {
      // Shedding may have taken what the plan resumes from: plan again, keeping a given-up copy given up.
      Plan again = MakePlan(request);
      const int64_t again_need = need_of(again);
      again.skip_copy = plan.skip_copy && again.copy == plan.copy;
      if (EngineBytes() + again_need - (again.skip_copy ? again.copy_bytes : 0) <= limit || Shed(again_need, limit, reason, &again)) {
        plan = std::move(again);
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

Result<CachedGeneration> ResidentPrefix::Generate(const CacheRequest& request, const SamplingParams& params,
                                                  const TokenCallback& on_token, const std::atomic<bool>* cancel,
                                                  const std::function<void(const ResumeInfo&)>& on_admitted) {
  Plan plan = MakePlan(request);
  // The context holds the prompt as served (end alignment can make it longer than the client's) and the output.
  const int64_t context = request.context_tokens > 0 ? request.context_tokens : forward_.config().max_position_embeddings;
  const int64_t served = static_cast<int64_t>(plan.info.served_prompt.size());
  if (served >= context)
    return OutOfRange("the prompt holds " + std::to_string(served) + " tokens as served; this server's context limit is " + std::to_string(context) + " tokens");
  SamplingParams fitted = params;
  fitted.max_tokens = std::min(params.max_tokens, context - served);
  RETURN_IF_ERROR(Admit(request, plan, fitted.max_tokens));
  RETURN_IF_ERROR(Apply(request, plan));
  ResumeInfo& info = plan.info;
  if (on_admitted) on_admitted(info);
  const int64_t n = static_cast<int64_t>(info.served_prompt.size());
  const int64_t G = forward_.grid_tokens();
  Status prefilled = PrefillRange(info, std::max(state_.length(), (n - 1) / G * G), !info.guest);
  if (!prefilled.ok()) {
    if (info.guest) FinishGuest();
    return prefilled;
  }
  Generator generator(forward_, tokenizer_);
  const int64_t start = state_.length();
  auto result = generator.Generate(state_, std::span<const int32_t>(info.served_prompt.data() + start, static_cast<size_t>(n - start)),
                                   fitted, on_token, cancel);
  if (info.guest) {
    FinishGuest();
  } else if (result.ok()) {
    const int64_t forwarded = std::clamp<int64_t>(state_.length() - n, 0, static_cast<int64_t>(result->tokens.size()));
    rows_.assign(info.served_prompt.begin(), info.served_prompt.end());
    PutPrefixSnapshot(n);
    KeepEnd(info, forwarded, result->tokens);
  } else {
    rows_.clear();  // the state no longer matches any token list we could name
    regions_.clear();
    anchors_.Clear();
    end_.reset();
  }
  Shed(0, options_.memory_ceiling_bytes - options_.memory_slack_bytes, "over the memory ceiling after a request");
  if (!result.ok()) return result.status();
  return CachedGeneration{std::move(info), std::move(result).value()};
}

Result<std::vector<float>> ResidentPrefix::Prefill(const CacheRequest& request, ResumeInfo* info_out) {
  Plan plan = MakePlan(request);
  RETURN_IF_ERROR(Admit(request, plan, 0));
  RETURN_IF_ERROR(Apply(request, plan));
  ResumeInfo& info = plan.info;
  const int64_t n = static_cast<int64_t>(info.served_prompt.size());
  const int64_t G = forward_.grid_tokens();
  RETURN_IF_ERROR(PrefillRange(info, std::max(state_.length(), (n - 1) / G * G), !info.guest));
  const int64_t start = state_.length();
  auto logits = forward_.Prefill(state_, std::span<const int32_t>(info.served_prompt.data() + start, static_cast<size_t>(n - start)));
  if (info.guest) {
    FinishGuest();
  } else if (logits.ok()) {
    rows_.insert(rows_.end(), info.served_prompt.begin() + start, info.served_prompt.end());
    if (state_.length() % G == 0) anchors_.Put(state_.SaveAnchor());
    PutPrefixSnapshot(n);
  }
  Shed(0, options_.memory_ceiling_bytes - options_.memory_slack_bytes, "over the memory ceiling after a request");
  if (info_out) *info_out = info;
  return logits;
}

Result<ResumeInfo> ResidentPrefix::Prewarm(const CacheRequest& request) {
  Plan plan = MakePlan(request);
  if (plan.info.guest || plan.info.source == CacheSource::kCold || plan.info.source == CacheSource::kResident ||
      plan.info.source == CacheSource::kEnd)
    return plan.info;  // nothing to bring: already in place, or no tier holds it
  RETURN_IF_ERROR(Admit(request, plan, 0));
  RETURN_IF_ERROR(Apply(request, plan));
  // The rows and state are in place; the restored end stays the end, so the request resumes there.
  if (plan.resume_from_end) end_ = EndAnchor{state_.SaveAnchor(), taint_row_, regions_};
  plan.info.source = plan.resume_from_end ? CacheSource::kEnd : CacheSource::kResident;
  return plan.info;
}

Status ResidentPrefix::Clear(const std::string& tier) {
  const bool all = tier == "all" || tier == "ram" || tier == "resident";
  if (!all && tier != "anchors" && tier != "end" && tier != "stash" && tier != "pin" && tier != "park" && tier != "store")
    return InvalidArgument("unknown cache tier '" + tier + "'; the tiers are " + kCacheTierNames);
  if (all || tier == "store") store_.Clear();
  if (all || tier == "anchors") anchors_.Clear();
  if (all || tier == "end") end_.reset();
  if (all || tier == "stash") stash_.rows.reset();
  if (all || tier == "pin") pin_ = PinnedHead{};
  if (all || tier == "park") park_ = ParkedSession{};
  Emit("clear", tier, static_cast<int64_t>(rows_.size()), 0, "by request");
  if (all) {
    rows_.clear();
    regions_.clear();
    taint_row_ = kNoTaint;
    session_.clear();
    state_.Reset();
  }
  return Status::Ok();
}

CacheStats ResidentPrefix::Stats() const {
  const auto& k = counters_;
  CacheStats s;
  s.resident = {static_cast<int64_t>(rows_.size()), RowBytes(static_cast<int64_t>(rows_.size())), taint_row_ == kNoTaint ? -1 : taint_row_,
                session_, k.requests, k.cold, k.cached_tokens, k.reread_tokens};
  s.anchors = {static_cast<int64_t>(anchors_.size()), anchors_.bytes(), anchors_.budget_bytes(), k.resident_hits, anchors_.evictions(), anchors_.lengths()};
  s.end = {end_ ? 1 : 0, end_ ? end_->anchor.bytes() : 0, end_ ? end_->anchor.length : 0, k.end_hits, k.aligned_hits};
  s.stash = {stash_.rows ? 1 : 0, stash_.bytes(), options_.stash_budget_bytes, k.guests};
  s.pin = {pin_.empty() ? 0 : 1, static_cast<int64_t>(pin_.tokens.size()), pin_.bytes(), options_.pin_budget_bytes, k.pins, k.pin_hits};
  s.park = {park_.empty() ? 0 : 1, static_cast<int64_t>(park_.tokens.size()), park_.bytes(), options_.park_budget_bytes, k.parks, k.park_hits, park_.session};
  s.store = {static_cast<int64_t>(store_.size()), store_.bytes(), store_.budget_bytes(), store_.entry_cap_bytes(), k.store_hits, store_.misses,
             store_.puts, store_.evictions, store_.declined};
  s.memory = {EngineBytes(), state_.allocated_bytes(), options_.memory_ceiling_bytes, options_.memory_peak_bytes, options_.memory_slack_bytes,
              k.refused, k.sheds};
  return s;
}

}  // namespace anchorage
