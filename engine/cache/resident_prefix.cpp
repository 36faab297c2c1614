#include "engine/cache/resident_prefix.h"

#include <algorithm>
#include <limits>

namespace anchorage {

namespace {

constexpr int64_t kNoTaint = std::numeric_limits<int64_t>::max();

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
  }
  return "cold";
}

ResidentPrefix::ResidentPrefix(Forward& forward, const Tokenizer* tokenizer, ResidentOptions options)
    : forward_(forward),
      tokenizer_(tokenizer),
      options_(options),
      state_(forward.config()),
      taint_row_(kNoTaint),
      anchors_(options.anchor_budget_bytes) {}

void ResidentPrefix::set_options(const ResidentOptions& options) {
  options_ = options;
  anchors_.set_budget_bytes(options.anchor_budget_bytes);
  if (!options_.enabled) (void)Clear("all");
}

int64_t ResidentPrefix::RowBytes(int64_t rows) const { return rows * state_.kv_bytes_per_token(); }

bool ResidentPrefix::IsGuest(const CacheRequest& request, int64_t resume_at) const {
  const int64_t n = static_cast<int64_t>(request.prompt.size());
  const int64_t resident = static_cast<int64_t>(rows_.size());
  return resident > 0 && n <= options_.guest_max_tokens && 4 * n < resident && resume_at < resident;
}

ResidentPrefix::Plan ResidentPrefix::MakePlan(const CacheRequest& request) const {
  Plan p;
  p.info.served_prompt = request.prompt;
  const int64_t n = static_cast<int64_t>(request.prompt.size());
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
        const std::string rows_text = tokenizer_->Decode(std::vector<int32_t>(rows_.begin(), rows_.begin() + e));
        const std::string client_text = tokenizer_->Decode(request.prompt);
        if (auto j = AlignCopyWithRows(rows_text, client_text)) {
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

void ResidentPrefix::ParkResident(int64_t head) {
  const int64_t resident = static_cast<int64_t>(rows_.size());
  if (resident <= head) return;
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
  if (top <= head) return;
  anchors.erase(std::remove_if(anchors.begin(), anchors.end(), [&](const Anchor& a) { return a.length > top; }), anchors.end());
  auto rows = state_.CopyRows(head, top);
  if (!rows.ok()) return;
  ParkedSession parked;
  parked.session = session_;
  parked.tokens.assign(rows_.begin(), rows_.begin() + top);
  parked.head = head;
  parked.rows = std::move(rows).value();
  parked.anchors = std::move(anchors);
  parked.end = std::move(end);
  parked.taint_row = taint_row_;
  parked.parks = park_.parks + 1;
  parked.hits = park_.hits;
  park_ = std::move(parked);
  ++counters_.parks;
  Emit("write", "park", top, park_.bytes(), "session '" + park_.session + "' gave way to another");
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
    anchors_.Clear();
    for (const Anchor& a : pin_.anchors) anchors_.Put(a);
    end_.reset();
    taint_row_ = pin_.taint_row;
    ++pin_.hits;
    ++counters_.pin_hits;
  } else if (info.source == CacheSource::kPark) {
    ParkedSession back = std::move(park_);
    park_ = ParkedSession{};
    park_.parks = back.parks;
    park_.hits = back.hits + 1;
    ParkResident(back.head);  // the rows in place take the parked session's place
    RETURN_IF_ERROR(state_.WriteRows(back.rows));
    rows_ = back.tokens;
    anchors_.DropAbove(back.head);
    for (const Anchor& a : back.anchors) anchors_.Put(a);
    end_ = back.end;
    taint_row_ = back.taint_row;
    session_ = back.session;
    ++counters_.park_hits;
  } else if (!info.guest) {
    const int64_t c = CommonPrefix(info.served_prompt, rows_);
    if (c < static_cast<int64_t>(rows_.size())) {
      // This request replaces rows: keep the head of its own session, or park another session's.
      if (!request.session.empty() && request.session == session_) PinHead();
      else ParkResident(r);
    }
  }

  if (info.guest) {
    const int64_t n = static_cast<int64_t>(request.prompt.size());
    const int64_t stash_end = std::min<int64_t>(rows_.size(), n + request.max_new_tokens + options_.guest_margin_rows);
    ASSIGN_OR_RETURN(KvRows rows, state_.CopyRows(r, stash_end));
    stash_.rows = std::move(rows);
    ++stash_.uses;
    Emit("write", "stash", stash_end - r, stash_.bytes(), "guest request");
    ++counters_.guests;
  }

  // Restore the state at r.
  const Anchor* anchor = nullptr;
  if (r > 0) {
    if (plan.resume_from_end) anchor = end_ ? &end_->anchor : nullptr;
    else anchor = anchors_.LargestAtOrBelow(r);
    if (anchor == nullptr || anchor->length != r) return Internal("resident prefix: the anchor at " + std::to_string(r) + " went missing");
    RETURN_IF_ERROR(state_.RestoreAnchor(*anchor));
  } else {
    state_.Reset();
  }

  if (!info.guest) {
    rows_.resize(std::min<size_t>(rows_.size(), static_cast<size_t>(r)));
    anchors_.DropAbove(r);
    end_.reset();
    if (taint_row_ >= r) taint_row_ = kNoTaint;  // every row left is a cold prefill's
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
  if (forwarded > 0) taint_row_ = std::min(taint_row_, n);
  if (options_.end_anchor && options_.enabled) {
    end_ = EndAnchor{state_.SaveAnchor(), taint_row_};
    Emit("write", "end", end_->anchor.length, end_->anchor.bytes());
  }
}

Result<CachedGeneration> ResidentPrefix::Generate(const CacheRequest& request, const SamplingParams& params,
                                                  const TokenCallback& on_token, const std::atomic<bool>* cancel) {
  Plan plan = MakePlan(request);
  RETURN_IF_ERROR(Apply(request, plan));
  ResumeInfo& info = plan.info;
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
                                   params, on_token, cancel);
  if (info.guest) {
    FinishGuest();
  } else if (result.ok()) {
    const int64_t forwarded = std::clamp<int64_t>(state_.length() - n, 0, static_cast<int64_t>(result->tokens.size()));
    KeepEnd(info, forwarded, result->tokens);
  } else {
    rows_.clear();  // the state no longer matches any token list we could name
    anchors_.Clear();
    end_.reset();
  }
  if (!result.ok()) return result.status();
  return CachedGeneration{std::move(info), std::move(result).value()};
}

Result<std::vector<float>> ResidentPrefix::Prefill(const CacheRequest& request, ResumeInfo* info_out) {
  Plan plan = MakePlan(request);
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
  }
  if (info_out) *info_out = info;
  return logits;
}

Status ResidentPrefix::Clear(const std::string& tier) {
  const bool all = tier == "all" || tier == "ram" || tier == "resident";
  if (!all && tier != "anchors" && tier != "end" && tier != "stash" && tier != "pin" && tier != "park")
    return InvalidArgument("unknown cache tier '" + tier + "' (anchors, end, stash, pin, park, resident, ram, all)");
  if (all || tier == "anchors") anchors_.Clear();
  if (all || tier == "end") end_.reset();
  if (all || tier == "stash") stash_.rows.reset();
  if (all || tier == "pin") pin_ = PinnedHead{};
  if (all || tier == "park") park_ = ParkedSession{};
  Emit("clear", tier, static_cast<int64_t>(rows_.size()), 0, "by request");
  if (all) {
    rows_.clear();
    taint_row_ = kNoTaint;
    session_.clear();
    state_.Reset();
  }
  return Status::Ok();
}

nlohmann::json ResidentPrefix::Stats() const {
  const auto& k = counters_;
  return {
      {"resident", {{"rows", rows_.size()}, {"row_bytes", RowBytes(static_cast<int64_t>(rows_.size()))}, {"taint_row", taint_row_ == kNoTaint ? -1 : taint_row_},
                    {"session", session_}, {"requests", k.requests}, {"cold", k.cold}, {"cached_tokens", k.cached_tokens}, {"reread_tokens", k.reread_tokens}}},
      {"anchors", {{"entries", anchors_.size()}, {"bytes", anchors_.bytes()}, {"budget_bytes", anchors_.budget_bytes()}, {"hits", k.resident_hits},
                   {"evictions", anchors_.evictions()}, {"lengths", anchors_.lengths()}}},
      {"end", {{"entries", end_ ? 1 : 0}, {"bytes", end_ ? end_->anchor.bytes() : 0}, {"length", end_ ? end_->anchor.length : 0}, {"hits", k.end_hits},
               {"aligned_hits", k.aligned_hits}}},
      {"stash", {{"entries", stash_.rows ? 1 : 0}, {"bytes", stash_.bytes()}, {"budget_bytes", options_.stash_budget_bytes}, {"guests", k.guests}}},
      {"pin", {{"entries", pin_.empty() ? 0 : 1}, {"tokens", pin_.tokens.size()}, {"bytes", pin_.bytes()}, {"budget_bytes", options_.pin_budget_bytes},
               {"pins", k.pins}, {"hits", k.pin_hits}}},
      {"park", {{"entries", park_.empty() ? 0 : 1}, {"session", park_.session}, {"tokens", park_.tokens.size()}, {"bytes", park_.bytes()},
                {"budget_bytes", options_.park_budget_bytes}, {"parks", k.parks}, {"hits", k.park_hits}}},
  };
}

}  // namespace anchorage
