#include "engine/cache/disk_cache.h"

#include <algorithm>
#include <chrono>

#include "engine/cache/disk_files.h"

namespace anchorage {
namespace {

constexpr size_t kRecentEvents = 32;
constexpr size_t kSessionsRemembered = 4096;
constexpr double kAssumedReadBytesPerS = 1e9;  // before this process measured a restore

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

CacheEvent DiskEvent(std::string kind, int64_t tokens, int64_t bytes, std::string reason) {
  CacheEvent e;
  e.kind = std::move(kind);
  e.tier = "disk";
  e.tokens = tokens;
  e.bytes = bytes;
  e.reason = std::move(reason);
  return e;
}

AdmissionOptions AdmissionOf(int64_t line_tokens, const DiskCacheSettings& s) {
  AdmissionOptions a;
  a.line_tokens = line_tokens;
  a.admit_after = s.admit_after;
  a.min_tokens = s.min_tokens;
  return a;
}

}  // namespace

const char* DiskModeName(DiskMode mode) {
  switch (mode) {
    case DiskMode::kOff: return "off";
    case DiskMode::kRead: return "read";
    case DiskMode::kReadWrite: return "readwrite";
  }
  return "off";
}

std::optional<DiskMode> ParseDiskMode(std::string_view name) {
  for (DiskMode m : {DiskMode::kOff, DiskMode::kRead, DiskMode::kReadWrite})
    if (name == DiskModeName(m)) return m;
  return std::nullopt;
}

DiskCache::DiskCache(DiskEnv& env, std::unique_ptr<DiskTier> tier, DiskAdmission admission, int64_t line_tokens, DiskCacheSettings settings)
    : env_(env), tier_(std::move(tier)), line_tokens_(line_tokens), settings_(settings), admission_(std::move(admission)) {
  writer_ = std::thread([this] { WriterLoop(); });
}

Result<std::unique_ptr<DiskCache>> DiskCache::Open(DiskEnv& env, const ModelConfig& config, std::string fingerprint, std::string dir,
                                                   int64_t line_tokens, DiskCacheSettings settings) {
  DiskTierOptions options;
  options.dir = dir;
  options.line_tokens = line_tokens;
  options.budget_bytes = settings.budget_bytes;
  options.ttl_days = settings.ttl_days;
  options.min_free_bytes = settings.min_free_bytes;
  ASSIGN_OR_RETURN(std::unique_ptr<DiskTier> tier, DiskTier::Open(env, config, std::move(fingerprint), options));
  DiskAdmission admission = DiskAdmission::Open(env, dir + "/counts.json", AdmissionOf(line_tokens, settings));
  std::unique_ptr<DiskCache> cache(new DiskCache(env, std::move(tier), std::move(admission), line_tokens, settings));
  // A file that could not be read is named in the journal, with its line served cold.
  for (const std::string& problem : cache->tier_->corrupt_at_open())
    cache->Record(DiskEvent("failed_restore", 0, 0, problem + "; deleted at start, its prefix is read cold"));
  return cache;
}

DiskCache::~DiskCache() {
  Fence();
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  writer_.join();
  SaveCounts();
}

void DiskCache::set_settings(const DiskCacheSettings& settings) {
  {
    std::lock_guard lock(mu_);
    settings_ = settings;
    admission_.set_limits(settings.admit_after, settings.min_tokens);
  }
  tier_->set_limits(settings.budget_bytes, settings.ttl_days, settings.min_free_bytes);
  if (WriteGuard* g = guard_.load()) g->set_budget(settings.write_budget_bytes);
  ReportEvictions(std::nullopt);
}

void DiskCache::set_write_guard(WriteGuard* guard) {
  guard_ = guard;
  if (guard != nullptr) guard->set_budget(settings().write_budget_bytes);
}

void DiskCache::ReportEvictions(const std::optional<std::string>& session) {
  const DiskTierStats t = tier_->stats();
  int64_t evicted = 0, expired = 0, bytes = 0;
  {
    std::lock_guard lock(mu_);
    evicted = t.evicted_files - reported_evicted_;
    expired = t.expired_files - reported_expired_;
    bytes = t.evicted_bytes - reported_evicted_bytes_;
    reported_evicted_ = t.evicted_files;
    reported_expired_ = t.expired_files;
    reported_evicted_bytes_ = t.evicted_bytes;
  }
  if (evicted + expired == 0) return;
  CacheEvent e = DiskEvent("eviction", 0, bytes,
                           std::to_string(evicted) + " files for the budget or the free-space floor, " + std::to_string(expired) +
                               " unused past the TTL");
  e.session = session;
  Record(std::move(e));
}

DiskCacheSettings DiskCache::settings() const {
  std::lock_guard lock(mu_);
  return settings_;
}

bool DiskCache::reads() const { return settings().mode != DiskMode::kOff; }
bool DiskCache::writes() const { return settings().mode == DiskMode::kReadWrite; }

void DiskCache::set_event_sink(CacheEventSink sink) {
  std::deque<CacheEvent> unsent;
  {
    std::lock_guard lock(mu_);
    sink_ = sink;
    if (sink) unsent.swap(unsent_);
  }
  for (const CacheEvent& e : unsent) sink(e);  // what happened before there was a journal to tell
}

void DiskCache::Record(CacheEvent event) {
  event.tier = "disk";
  if (event.time_ms == 0) event.time_ms = NowMs();
  CacheEventSink sink;
  {
    std::lock_guard lock(mu_);
    recent_.push_back(event);
    while (recent_.size() > kRecentEvents) recent_.pop_front();
    sink = sink_;
    if (!sink && unsent_.size() < kRecentEvents) unsent_.push_back(event);
  }
  if (sink) sink(event);
}

int64_t DiskCache::FindLine(std::span<const int32_t> prompt, int64_t max_length) const {
  if (!reads() || static_cast<int64_t>(prompt.size()) < line_tokens_) return 0;
  return tier_->Find(prompt, max_length);
}

int64_t DiskCache::KeepRows(std::span<const int32_t> prompt, const ResidentRows& resident, int64_t line) const {
  const int64_t in_place = std::min<int64_t>({CommonPrefixLength(prompt, resident.rows), resident.taint_row, line});
  return in_place / line_tokens_ * line_tokens_;
}

TierOffer DiskCache::Find(std::span<const int32_t> prompt, const ResidentRows& resident, int64_t limit) const {
  TierOffer offer;
  const int64_t line = FindLine(prompt, limit);
  if (line == 0) return offer;
  const int64_t keep = KeepRows(prompt, resident, line);
  offer.resume_length = line;
  offer.restore_bytes = tier_->RestoreBytes(prompt, line, keep);
  if (settings().cost_check) offer.restore_seconds = std::max(1e-9, RestoreSeconds(prompt, line, keep));
  return offer;
}

Status DiskCache::Restore(std::span<const int32_t> prompt, const TierOffer& offer, ResidentRows& resident) {
  const int64_t line = offer.resume_length;
  const int64_t keep = KeepRows(prompt, resident, line);
  Status restored = RestoreLine(prompt, line, resident.state, keep);
  // Rows below keep are untouched either way; above it the state is the disk's or nothing.
  resident.rows.resize(std::min<size_t>(resident.rows.size(), static_cast<size_t>(keep)));
  ClipTokenRegions(resident.regions, keep);
  resident.anchors.DropAbove(keep);
  resident.end.reset();
  RETURN_IF_ERROR(restored);
  resident.rows.assign(prompt.begin(), prompt.begin() + line);
  resident.anchors.Put(resident.state.SaveAnchor());
  resident.taint_row = kNoTaintRow;
  return Status::Ok();
}

double DiskCache::RestoreSeconds(std::span<const int32_t> prompt, int64_t line, int64_t keep_rows) const {
  const double rate = tier_->stats().read_bytes_per_s();
  return static_cast<double>(tier_->RestoreBytes(prompt, line, keep_rows)) / (rate > 0 ? rate : kAssumedReadBytesPerS);
}

Status DiskCache::RestoreLine(std::span<const int32_t> prompt, int64_t line, SequenceState& state, int64_t keep_rows) {
  const DiskTierStats before = tier_->stats();
  Status s = tier_->Restore(prompt, line, state, keep_rows);
  const DiskTierStats after = tier_->stats();
  if (!s.ok()) {
    Record(DiskEvent("failed_restore", line, 0, s.message() + "; the request continues from the rows in place"));
    return s;
  }
  {
    std::lock_guard lock(mu_);
    ++hits_;
  }
  Record(DiskEvent("hit", line, after.bytes_read - before.bytes_read,
                   "read " + std::to_string((line - keep_rows) / line_tokens_) + " chunks and the anchor"));
  return Status::Ok();
}

std::vector<int64_t> DiskCache::PlanWrites(AdmissionRequest request) {
  std::vector<int64_t> lines;
  {
    std::lock_guard lock(mu_);
    if (settings_.mode == DiskMode::kOff) return {};
    lines = admission_.Plan(request);  // counts even when only reading: the count is the work the tier would save
    counts_dirty_ = true;
    if (settings_.mode != DiskMode::kReadWrite) return {};
  }
  if (WriteGuard* g = guard_.load(); g != nullptr && !lines.empty() && !g->TierMayWrite()) {
    const std::string why = g->NoteSkip();
    {
      std::lock_guard lock(mu_);
      ++skipped_by_write_budget_;
    }
    Record(DiskEvent("drop", lines.back(), 0, why + ": " + std::to_string(lines.size()) + " lines not written"));
    return {};
  }
  const std::vector<std::string> hashes = PrefixHashes(request.prompt, line_tokens_);
  std::erase_if(lines, [&](int64_t line) { return tier_->HasFile(AnchorFileName(hashes[static_cast<size_t>(line / line_tokens_) - 1])); });
  return lines;
}

bool DiskCache::FirstOfSession(const std::string& session) {
  if (session.empty()) return false;
  std::lock_guard lock(mu_);
  if (!sessions_.insert(session).second) return false;
  sessions_order_.push_back(session);
  while (sessions_order_.size() > kSessionsRemembered) {
    sessions_.erase(sessions_order_.front());
    sessions_order_.pop_front();
  }
  return true;
}

void DiskCache::Submit(DiskWriteJob job, const SequenceState& state) {
  if (job.anchors.empty()) return;
  {
    std::lock_guard lock(mu_);
    for (const Anchor& a : job.anchors) staged_bytes_ += a.bytes();
    queue_.push_back(Pending{std::move(job), &state, EpochOf(&state)});
    ++jobs_;
  }
  cv_.notify_all();
}

uint64_t DiskCache::EpochOf(const SequenceState* state) const {
  const auto it = state_epochs_.find(state);
  return epoch_ + (it == state_epochs_.end() ? 0 : it->second);
}

void DiskCache::Fence(const SequenceState* state) {
  std::unique_lock moving(growth_lock_);  // waits for a chunk being copied
  std::lock_guard lock(mu_);
  if (state == nullptr) ++epoch_;
  else ++state_epochs_[state];
}

void DiskCache::WaitIdle() {
  std::unique_lock lock(mu_);
  idle_cv_.wait(lock, [&] { return queue_.empty() && !writing_; });
}

Status DiskCache::Clear() {
  Fence();
  WaitIdle();
  Status s = tier_->Clear();
  {
    std::lock_guard lock(mu_);
    admission_.Clear();
    counts_dirty_ = true;
  }
  SaveCounts();
  Record(DiskEvent("clear", 0, 0, "by request"));
  return s;
}

int64_t DiskCache::staged_bytes() const {
  std::lock_guard lock(mu_);
  return staged_bytes_;
}

void DiskCache::SaveCounts() {
  std::string text, path;
  {
    std::lock_guard lock(mu_);
    if (!counts_dirty_) return;
    counts_dirty_ = false;
    text = admission_.Serialize();
    path = admission_.path();
  }
  (void)WriteFileCrashSafe(env_, path, text);  // counts are advice: a failed save costs a later admission
}

void DiskCache::WriterLoop() {
  while (true) {
    Pending pending;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      pending = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
    }
    const int64_t written_before = tier_->stats().bytes_written;
    Write(pending);
    if (WriteGuard* g = guard_.load()) g->Add(tier_->stats().bytes_written - written_before);
    SaveCounts();
    {
      std::lock_guard lock(mu_);
      for (const Anchor& a : pending.job.anchors) staged_bytes_ -= a.bytes();
      writing_ = false;
    }
    idle_cv_.notify_all();
  }
}

void DiskCache::Write(Pending& p) {
  const int64_t G = line_tokens_;
  const std::span<const int32_t> tokens(p.job.tokens);
  const std::vector<std::string> hashes = PrefixHashes(tokens, G);
  auto event = [&](const char* kind, int64_t line, int64_t bytes, std::string reason) {
    CacheEvent e = DiskEvent(kind, line, bytes, std::move(reason));
    e.session = p.job.session;
    Record(std::move(e));
  };
  for (const Anchor& anchor : p.job.anchors) {
    const int64_t bytes_before = tier_->stats().bytes_written;
    int64_t chunks = 0;
    for (int64_t c = 0; c < anchor.length / G; ++c) {
      if (tier_->HasFile(ChunkFileName(hashes[static_cast<size_t>(c)]))) continue;
      KvRows rows;
      {
        std::shared_lock reading(growth_lock_);
        bool open = false;
        {
          std::lock_guard lock(mu_);
          open = p.epoch == EpochOf(p.state);
          if (open) staged_bytes_ += G * p.state->kv_bytes_per_token();
        }
        if (!open) {
          {
            std::lock_guard lock(mu_);
            ++dropped_jobs_;
          }
          event("drop", anchor.length, 0,
                "the next request came before rows " + std::to_string(c * G) + " to " + std::to_string(anchor.length) +
                    " were copied out (window closed); the anchor at " + std::to_string(anchor.length) + " and the lines above it are not written");
          return;
        }
        rows = p.state->CopyRowsFromReader(c * G, (c + 1) * G);
      }
      const Status s = tier_->PutChunk(tokens, rows);
      {
        std::lock_guard lock(mu_);
        staged_bytes_ -= G * p.state->kv_bytes_per_token();
      }
      if (!s.ok()) {
        {
          std::lock_guard lock(mu_);
          ++dropped_jobs_;
        }
        event("drop", anchor.length, 0, "a chunk write failed: " + s.message());
        return;
      }
      ++chunks;
    }
    if (Status s = tier_->PutAnchor(tokens, anchor); !s.ok()) {
      {
        std::lock_guard lock(mu_);
        ++dropped_jobs_;
      }
      event("drop", anchor.length, 0, "the anchor write failed: " + s.message());
      return;
    }
    event("write", anchor.length, tier_->stats().bytes_written - bytes_before,
          std::to_string(chunks) + " chunks and the anchor at " + std::to_string(anchor.length));
    ReportEvictions(p.job.session);
  }
}

DiskCacheStats DiskCache::Stats() const {
  DiskCacheStats s;
  s.tier = tier_->stats();
  const DiskTierOptions o = tier_->options();
  s.dir = o.dir;
  s.budget_bytes = o.budget_bytes;
  s.min_free_bytes = o.min_free_bytes;
  s.ttl_days = o.ttl_days;
  s.free_bytes = tier_->FreeBytes();
  s.top = tier_->TopPrefixes(10);
  s.misses = misses_.load();
  s.declined_by_cost = declined_by_cost_.load();
  std::lock_guard lock(mu_);
  s.mode = DiskModeName(settings_.mode);
  s.staged_bytes = staged_bytes_;
  s.hits = hits_;
  s.jobs = jobs_;
  s.dropped_jobs = dropped_jobs_;
  s.skipped_by_write_budget = skipped_by_write_budget_;
  s.recent.assign(recent_.begin(), recent_.end());
  return s;
}

}  // namespace anchorage
