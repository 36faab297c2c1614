#include "engine/server/scheduler.h"

#include <algorithm>
#include <chrono>

namespace anchorage {

namespace {
double MsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

CacheRequest RequestOf(const Job& job) { return {job.prompt_ids(), job.session(), job.sampling().max_tokens, job.context_tokens(), job.images()}; }
}  // namespace

nlohmann::json SlotsJson(const std::vector<SlotSnapshot>& slots) {
  nlohmann::json out = nlohmann::json::array();
  for (const SlotSnapshot& s : slots)
    out.push_back({{"slot", s.index}, {"session", s.session}, {"tokens", s.tokens}, {"bytes", s.bytes}, {"state", s.state}, {"requests", s.requests}});
  return out;
}

std::vector<GeneratedToken> Job::WaitTokens(bool* done) {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return done_ || !tokens_.empty(); });
  std::vector<GeneratedToken> out(tokens_.begin(), tokens_.end());
  tokens_.clear();
  *done = done_ && tokens_.empty();
  return out;
}

Status Job::WaitAdmitted() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return admitted_ || done_; });
  if (admitted_) return admission_;
  return status_.ok() ? Status::Ok() : status_;
}

std::optional<Status> Job::WaitAdmittedFor(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return admitted_ || done_; })) return std::nullopt;
  if (admitted_) return admission_;
  return status_.ok() ? Status::Ok() : status_;
}

void Job::Admit(Status status) {
  {
    std::lock_guard lock(mu_);
    admitted_ = true;
    admission_ = std::move(status);
  }
  cv_.notify_all();
}

void Job::PushToken(const GeneratedToken& token) {
  {
    std::lock_guard lock(mu_);
    tokens_.push_back(token);
  }
  cv_.notify_all();
}

void Job::Finish(Status status, GenerationResult result, RequestFigures stats) {
  {
    std::lock_guard lock(mu_);
    status_ = std::move(status);
    result_ = std::move(result);
    stats_ = std::move(stats);
    done_ = true;
  }
  cv_.notify_all();
}

Scheduler::Scheduler(Model& model, std::unique_ptr<ComputeBackend> forward, SchedulerOptions options)
    : model_(model),
      forward_(std::move(forward)),
      options_(options),
      resident_(*forward_, &model.tokenizer, options.resident),
      applied_options_(options.resident) {
  if (options_.journal != nullptr) {
    Journal* journal = options_.journal;
    journal_sink_ = [journal, this](const CacheEvent& e) {
      CacheEventRow row;
      row.kind = ParseCacheEventKind(e.kind).value_or(CacheEventKind::kWrite);
      row.tier = e.tier;
      row.session = e.session ? *e.session : current_session_;
      row.tokens = e.tokens;
      row.bytes = e.bytes;
      row.reason = e.reason;
      journal->RecordCacheEvent(std::move(row));
    };
  }
  wanted_slots_ = std::max(1, options_.parallel);
  while (static_cast<int>(slots_.size()) < wanted_slots_) AddSlot();
  SharePeerStores();
  cache_stats_ = CombinedStats();
  PublishSlots();
  thread_ = std::thread([this] { EngineLoop(); });
}

void Scheduler::AddSlot() {
  const size_t i = slots_.size();
  ResidentPrefix* cache = &resident_;
  if (i > 0) cache = side_caches_.emplace_back(std::make_unique<ResidentPrefix>(*forward_, &model_.tokenizer, applied_options_)).get();
  Slot& slot = slots_.emplace_back();
  slot.cache = cache;
  slot.options_version = options_version_;
  if (journal_sink_) cache->set_event_sink(journal_sink_);
  if (options_.disk != nullptr) cache->set_disk_cache(options_.disk);
  if (options_.spill != nullptr) cache->set_session_spill(options_.spill);
  if (i > 0) cache->share_response_cache(&resident_.response_cache());
  cache->set_write_guard(options_.write_guard);
  cache->set_suffix_store(options_.suffix_store);
  cache->set_outside_bytes([this, i] { return OutsideBytes(i); });
}

void Scheduler::ResizeSlots() {
  while (static_cast<int>(slots_.size()) < wanted_slots_) AddSlot();
  bool removed = false;
  while (static_cast<int>(slots_.size()) > wanted_slots_ && slots_.size() > 1 && slots_.back().job == nullptr) {
    (void)slots_.back().cache->SpillForRemoval();  // a write that fails journals its own drop
    slots_.pop_back();
    side_caches_.pop_back();  // fences the disk writer's reads of its state
    removed = true;
  }
  // A removed cache let go of the shared disk tier's event sink: slot 0 gives it its own again.
  if (removed && options_.disk != nullptr && journal_sink_) resident_.set_event_sink(journal_sink_);
  SharePeerStores();
}

void Scheduler::SharePeerStores() {
  for (Slot& slot : slots_) {
    std::vector<StateStore*> peers;
    for (Slot& other : slots_)
      if (other.cache != slot.cache) peers.push_back(&other.cache->state_store());
    slot.cache->set_peer_stores(peers);
  }
}

anchorage::CacheStats Scheduler::CombinedStats() const {
  anchorage::CacheStats stats = resident_.Stats();
  for (const auto& side : side_caches_) {
    const anchorage::CacheStats s = side->Stats();
    const PreparedStats own = stats.prepared;
    if (s.prepared.entries > 0) stats.prepared = s.prepared;
    stats.prepared.written = own.written + s.prepared.written;
    stats.prepared.served = own.served + s.prepared.served;
    stats.prepared.stopped = own.stopped + s.prepared.stopped;
    stats.prepared.refused = own.refused + s.prepared.refused;
  }
  return stats;
}

int64_t Scheduler::OutsideBytes(size_t slot) const {
  int64_t bytes = options_.shadow != nullptr ? options_.shadow->resident_bytes() : 0;
  for (size_t i = 0; i < slots_.size(); ++i)
    if (i != slot && slots_[i].cache != nullptr) bytes += slots_[i].cache->HeldBytes();
  return bytes;
}

Scheduler::~Scheduler() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
    for (auto& [job, t] : queue_) job->Cancel();
  }
  cv_.notify_all();
  thread_.join();
}

Status Scheduler::Submit(std::shared_ptr<Job> job) {
  {
    std::lock_guard lock(mu_);
    if (draining_ || stop_) return Cancelled("the server is shutting down");
    const bool engine_free = queue_.empty() && running_slots_ < static_cast<int>(slots_.size());
    if (!engine_free && queue_.size() >= options_.max_queue)
      return ResourceExhausted("the queue is full (" + std::to_string(queue_.size()) + " requests waiting)");
    const int64_t free_slots = static_cast<int64_t>(slots_.size()) - running_slots_;  // the first that many queued find one
    job->set_queue_position(std::max<int64_t>(0, static_cast<int64_t>(queue_.size()) + 1 - free_slots));
    queue_.emplace_back(std::move(job), std::chrono::steady_clock::now());
  }
  cv_.notify_all();
  return Status::Ok();
}

void Scheduler::BeginDrain() {
  std::lock_guard lock(mu_);
  draining_ = true;
}

void Scheduler::WaitIdle() {
  std::unique_lock lock(mu_);
  idle_cv_.wait(lock, [&] { return queue_.empty() && running_slots_ == 0; });
}

size_t Scheduler::queue_depth() const {
  std::lock_guard lock(mu_);
  return queue_.size();
}

size_t Scheduler::QueuePosition(const Job* job) const {
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < queue_.size(); ++i)
    if (queue_[i].first.get() == job) return i + 1;
  return 0;
}

bool Scheduler::busy() const {
  {
    std::lock_guard lock(mu_);
    if (running_slots_ > 0) return true;
  }
  return lock_.held_for_request();
}

bool Scheduler::draining() const {
  std::lock_guard lock(mu_);
  return draining_;
}

RequestFigures Scheduler::last_stats() const {
  std::lock_guard lock(mu_);
  return last_stats_;
}

void Scheduler::SetResidentOptions(const ResidentOptions& options) {
  std::lock_guard lock(mu_);
  pending_options_ = options;
  prepare_looked_ = false;
}

void Scheduler::SetParallel(int slots) {
  std::lock_guard lock(mu_);
  pending_parallel_ = std::max(1, slots);
}

void Scheduler::ApplyPendingOptions() {
  std::optional<ResidentOptions> options;
  {
    std::lock_guard lock(mu_);
    options.swap(pending_options_);
    if (pending_parallel_) wanted_slots_ = *std::exchange(pending_parallel_, std::nullopt);
  }
  if (static_cast<int>(slots_.size()) != wanted_slots_) {
    ResizeSlots();
    PublishSlots();
  }
  if (options) {
    applied_options_ = *options;
    ++options_version_;
  }
  for (Slot& slot : slots_)
    if (slot.job == nullptr) InstallOptions(slot);
}

void Scheduler::InstallOptions(Slot& slot) {
  if (slot.options_version == options_version_) return;
  slot.cache->set_options(applied_options_);
  slot.options_version = options_version_;
}

std::vector<SlotSnapshot> Scheduler::Slots() const {
  std::lock_guard lock(mu_);
  return slot_snapshots_;
}

int Scheduler::busy_slots() const {
  std::lock_guard lock(mu_);
  return running_slots_;
}

Scheduler::DecodeCounts Scheduler::decode_counts() const {
  std::lock_guard lock(mu_);
  return decode_counts_;
}

void Scheduler::PublishSlots() {
  std::vector<SlotSnapshot> snapshots;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& slot = slots_[i];
    SlotSnapshot s;
    s.index = static_cast<int>(i);
    s.session = slot.job != nullptr ? slot.job->session() : slot.cache->session();
    s.tokens = slot.cache->state().length();
    s.bytes = slot.cache->HeldBytes();
    s.state = slot.job == nullptr ? "idle" : slot.turn != nullptr && slot.turn->task == nullptr && !slot.turn->replayed ? "prefill" : "decode";
    s.requests = slot.requests;
    snapshots.push_back(std::move(s));
  }
  std::lock_guard lock(mu_);
  slot_snapshots_ = std::move(snapshots);
}

CacheStats Scheduler::CacheStats() const {
  anchorage::CacheStats stats;
  {
    std::lock_guard lock(mu_);
    stats = cache_stats_;
  }
  if (options_.disk != nullptr) {  // the writer goes on between requests: read it live
    stats.disk_enabled = true;
    stats.disk = options_.disk->Stats();
  }
  if (options_.spill != nullptr) {
    stats.spill_enabled = true;
    stats.spill = options_.spill->stats();
    stats.spill_entries = options_.spill->Entries();
    stats.spill_events = options_.spill->RecentEvents();
  }
  if (options_.write_guard != nullptr) stats.write_guard = options_.write_guard->Stats();
  if (options_.shadow != nullptr) {  // the reader goes on in idle windows: read it live
    const int64_t shadow_bytes = options_.shadow->resident_bytes();
    stats.memory.engine_bytes += shadow_bytes - stats.memory.shadow_bytes;
    stats.memory.shadow_bytes = shadow_bytes;
  }
  return stats;
}

nlohmann::json Scheduler::CacheStatsJson(bool with_titles) const {
  const anchorage::CacheStats cache = CacheStats();
  nlohmann::json stats = ToJson(cache);
  if (with_titles && options_.spill != nullptr)
    for (size_t i = 0; i < cache.spill_entries.size(); ++i) stats["spill"]["list"][i]["title"] = options_.spill->Title(cache.spill_entries[i].id);
  stats["slots"] = SlotsJson(Slots());
  RowCostModel costs;
  {
    std::lock_guard lock(mu_);
    costs = row_costs_seen_;
  }
  double fixed_ms = 0, row_ms = 0;
  nlohmann::json& drafts = stats["drafts_beside_others"];
  drafts["fitted"] = costs.Fit(&fixed_ms, &row_ms);
  drafts["step_fixed_ms"] = fixed_ms;
  drafts["step_row_ms"] = row_ms;
  for (int rows : {2, 4, 8}) drafts["break_even_at_" + std::to_string(rows) + "_rows"] = costs.BreakEven(rows);
  return stats;
}

template <typename Fn>
auto Scheduler::BetweenRequests(const std::string& session, Fn&& fn) {
  lock_.LockForRequest();
  ApplyPendingOptions();
  current_session_ = session;
  auto result = fn();
  anchorage::CacheStats stats = CombinedStats();
  PublishSlots();
  lock_.UnlockRequest();
  std::lock_guard lock(mu_);
  cache_stats_ = std::move(stats);
  last_request_ = std::chrono::steady_clock::now();
  prepare_looked_ = false;
  return result;
}

Status Scheduler::ClearCache(const std::string& tier) {
  return BetweenRequests("", [&] {
    if (tier == "shadow") return options_.shadow != nullptr ? options_.shadow->Clear() : InvalidArgument("no shadow model is loaded: tier shadow holds nothing");
    Status s = resident_.Clear(tier);
    // The disk and the spill are shared: slot 0 cleared them; the other slots clear their own RAM tiers.
    if (s.ok() && tier != "disk" && tier != "spill")
      for (auto& side : side_caches_)
        if (s.ok()) s = side->Clear(tier == "all" ? "ram" : tier);
    if (s.ok() && tier == "all" && options_.shadow != nullptr) s = options_.shadow->Clear();
    return s;
  });
}

Result<ShadowAnswer> Scheduler::AskShadow(const std::string& session, const std::string& question, const std::vector<std::string>& choices, int wait_ms) {
  if (options_.shadow == nullptr) return Unsupported("no shadow model is loaded (start with --shadow-model DIR)");
  ASSIGN_OR_RETURN(ShadowQuestion q, options_.shadow->PrepareQuestion(question, choices));
  RETURN_IF_ERROR(options_.shadow->WaitFresh(session, wait_ms));
  lock_.LockForRequest();
  auto answer = options_.shadow->Ask(session, q);
  lock_.UnlockRequest();
  return answer;
}

std::optional<std::vector<int32_t>> Scheduler::ConversationRecord(const std::string& session) {
  return BetweenRequests(session, [&] {
    // The slot the session ran on last: another may keep an older turn of it.
    const Slot* last = nullptr;
    for (const Slot& slot : slots_)
      if (slot.cache->session() == session && (last == nullptr || slot.last_used > last->last_used)) last = &slot;
    if (last != nullptr)
      if (auto record = last->cache->EndRecord(session)) return record;
    return resident_.EndRecord(session);
  });
}

Result<DecideLayout> Scheduler::Decide(std::span<const DecideBranch> branches, int64_t groups, bool reuse, int64_t max_batch,
                                       const std::function<bool(size_t, std::span<const float>)>& on_branch) {
  const DecideLayout layout = PlanDecide(branches, groups, reuse, DecideBatching::For(*forward_, max_batch));
  const auto start = std::chrono::steady_clock::now();
  Result<DecideLayout> ran = BetweenRequests("", [&]() -> Result<DecideLayout> {
    const ResidentOptions& o = resident_.options();
    const int64_t need = DecidePeakBytes(model_.config, *forward_, layout);
    const int64_t limit = o.memory_peak_bytes - o.memory_slack_bytes;
    if (resident_.EngineBytes() + need > limit)
      return ResourceExhausted("the decide request needs " + std::to_string(need) + " bytes beyond the engine's " +
                               std::to_string(resident_.EngineBytes()) + "; the peak limit less slack is " + std::to_string(limit) + " bytes");
    RETURN_IF_ERROR(forward_->FitsDevice(nullptr, layout.longest));
    // A long decide lets requests that arrive go first between its branches: its states are its own.
    RETURN_IF_ERROR(RunDecide(*forward_, branches, layout, on_branch, [this] { lock_.YieldToWaiting(); }));
    return layout;
  });
  if (options_.journal != nullptr) {
    RequestRow row;
    row.model = options_.model_id;
    row.route = "/v1/decide";
    const StatusCode code = ran.ok() ? StatusCode::kOk : ran.status().code();
    row.status = ran.ok() ? 200 : code == StatusCode::kResourceExhausted ? 503 : code == StatusCode::kCancelled ? 499 : 500;
    row.error = ran.ok() ? "" : ran.status().message();
    row.figures.prompt_tokens = layout.logical_tokens;
    row.figures.served_prompt_tokens = layout.logical_tokens;
    row.figures.reread_tokens = layout.processed_tokens;
    row.figures.cached_tokens = layout.logical_tokens - layout.processed_tokens;
    row.figures.prefill_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    row.figures.cache_source = "request";
    row.cache_tier = reuse ? "request" : "none";
    row.finish_reason = std::to_string(groups) + " questions, " + std::to_string(branches.size()) + " branches";
    options_.journal->RecordRequest(std::move(row));
  }
  return ran;
}

Status Scheduler::WriteShadowForStop() {
  if (options_.shadow == nullptr) return Status::Ok();
  return BetweenRequests("", [&] { return options_.shadow->WriteAll(); });
}

void Scheduler::ShadowIdle() {
  if (!lock_.TryLockForIdle()) return;
  if (options_.shadow->HasIdleWork()) {
    auto should_stop = [this] {
      std::lock_guard lock(mu_);
      return stop_ || !queue_.empty() || lock_.ShouldYield();
    };
    constexpr int64_t kMainForkRereadTokens = 1024;
    options_.shadow->IdleWork(should_stop, [this](std::span<const int32_t> context, std::span<const int32_t> question) {
      return resident_.ForkLogits(context, question, kMainForkRereadTokens);
    });
  }
  lock_.UnlockIdle();
}

void Scheduler::NoteCompaction(const CompactionRequest& request, const SamplingParams& sampling, int64_t context_tokens) {
  std::lock_guard lock(mu_);
  noted_compaction_ = NotedCompaction{request, sampling, context_tokens};
  prepare_looked_ = false;
}

void Scheduler::PrepareIdle() {
  std::optional<NotedCompaction> noted;
  double idle_ms = 0;
  {
    std::lock_guard lock(mu_);
    if (!noted_compaction_ || prepare_looked_ || stop_ || draining_) return;
    noted = noted_compaction_;
    idle_ms = MsSince(last_request_);
  }
  if (!lock_.TryLockForIdle()) return;
  ApplyPendingOptions();
  // The conversation of the slot used last: the one whose compaction is likely next.
  ResidentPrefix& cache = *std::max_element(slots_.begin(), slots_.end(), [](const Slot& a, const Slot& b) { return a.last_used < b.last_used; })->cache;
  const ResidentOptions& o = cache.options();
  if (!o.compaction_prepare || idle_ms < o.compaction_idle_s * 1000) {
    lock_.UnlockIdle();
    return;
  }
  const std::string session = cache.session();
  const std::optional<std::vector<int32_t>> record = cache.EndRecord(session);
  std::vector<int32_t> ids;
  // A conversation that already ends in these instructions is a compaction itself: nothing to write.
  if (record && static_cast<int64_t>(record->size()) >= o.compaction_min_tokens &&
      model_.tokenizer.Decode(*record).find(noted->request.instructions) == std::string::npos)
    if (auto continuation = ContinuationIds(*record, noted->request, model_.chat_template, model_.tokenizer); continuation.ok())
      ids = std::move(continuation).value();
  const std::vector<int32_t>* prepared = cache.prepared_prompt();
  if (!ids.empty() && ids != prepare_failed_ && (prepared == nullptr || *prepared != ids)) {
    current_session_ = session;
    auto should_stop = [this] {
      std::lock_guard lock(mu_);
      return stop_ || draining_ || !queue_.empty() || lock_.ShouldYield();
    };
    Status written = cache.WriteAhead(session, ids, noted->sampling, noted->context_tokens, should_stop);
    if (!written.ok() && written.code() != StatusCode::kCancelled) prepare_failed_ = ids;
    anchorage::CacheStats stats = CombinedStats();
    std::lock_guard lock(mu_);
    cache_stats_ = std::move(stats);
    if (written.code() != StatusCode::kCancelled) prepare_looked_ = true;
  } else {
    std::lock_guard lock(mu_);
    prepare_looked_ = true;
  }
  lock_.UnlockIdle();
}

Status Scheduler::SpillForStop() {
  return BetweenRequests("", [&] {
    // Every slot's conversations; slot 0's last, so it is the one the next start reads back.
    Status s = Status::Ok();
    for (auto& side : side_caches_)
      if (Status side_spilled = side->SpillForStop(); s.ok()) s = side_spilled;
    if (Status own = resident_.SpillForStop(); s.ok()) s = own;
    return s;
  });
}

Result<bool> Scheduler::ResumeSpilled() {
  return BetweenRequests("", [&] { return resident_.ResumeSpilledResident(); });
}

Result<ResumeInfo> Scheduler::PrewarmCache(const CacheRequest& request) {
  return BetweenRequests(request.session, [&] { return resident_.Prewarm(request); });
}

double Scheduler::measured_prefill_rate() const {
  std::lock_guard lock(mu_);
  return prefill_seconds_ > 0 ? prefill_tokens_ / prefill_seconds_ : 0.0;
}

Result<ResumeInfo> Scheduler::PeekCache(const CacheRequest& request, int wait_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
  {
    std::unique_lock lock(mu_);
    while (true) {
      if (!idle_cv_.wait_until(lock, deadline, [&] { return running_slots_ == 0 && queue_.empty(); })) return ResourceExhausted("the engine is busy");
      if (lock_.TryLockForIdle()) break;
      // Held between requests (a clear, a prewarm): those end without a signal here, so look again shortly.
      if (idle_cv_.wait_until(lock, std::min(deadline, std::chrono::steady_clock::now() + std::chrono::milliseconds(5))) == std::cv_status::timeout &&
          std::chrono::steady_clock::now() >= deadline)
        return ResourceExhausted("the engine is busy");
    }
  }
  ResumeInfo info = resident_.Peek(request);
  lock_.UnlockIdle();
  return info;
}

void Scheduler::EngineLoop() {
  bool holding = false;  // the engine lock, held while any slot runs
  while (true) {
    {
      std::unique_lock lock(mu_);
      if (running_slots_ == 0) {
        auto ready = [&] { return stop_ || !queue_.empty(); };
        if (!cv_.wait_for(lock, std::chrono::milliseconds(200), ready)) {
          lock.unlock();
          // Idle work looks for something to do every 0.2 s while no request runs or waits.
          if (options_.shadow != nullptr) ShadowIdle();
          PrepareIdle();
          bool resize = false;
          {
            std::lock_guard guard(mu_);
            resize = pending_parallel_.has_value();
          }
          if (resize && lock_.TryLockForIdle()) {  // an idle engine takes a new slot count at once
            ApplyPendingOptions();
            lock_.UnlockIdle();
          }
          continue;
        }
        if (stop_ && queue_.empty()) return;
      }
    }
    if (!holding) {
      lock_.LockForRequest();
      holding = true;
    }
    ApplyPendingOptions();
    // Free slots take queued jobs; while a command waits for the engine, the running ones finish first
    // (the first job of a round starts: the engine had the lock first).
    while (!waiting_for_memory_ && (active_slots() == 0 || lock_.waiting_requests() == 0)) {
      std::pair<std::shared_ptr<Job>, std::chrono::steady_clock::time_point> next;
      {
        std::lock_guard lock(mu_);
        if (queue_.empty()) break;
        next = queue_.front();
      }
      Slot* slot = PickSlot(*next.first);
      if (slot == nullptr) break;
      {
        std::lock_guard lock(mu_);
        queue_.pop_front();
        ++running_slots_;
      }
      if (!StartJob(*slot, next.first, MsSince(next.second))) {
        std::lock_guard lock(mu_);
        if (next.first->queue_position() == 0) next.first->set_queue_position(1);  // it waits for memory, next in line
        queue_.push_front(next);
        break;
      }
    }
    StepSlots();
    PublishSlots();
    bool idle = false;
    {
      std::lock_guard lock(mu_);
      idle = running_slots_ == 0;
      if (idle) {
        last_request_ = std::chrono::steady_clock::now();
        prepare_looked_ = false;
      }
    }
    if (idle && holding) {
      lock_.UnlockRequest();
      holding = false;
      idle_cv_.notify_all();
    }
  }
}

void Scheduler::FreeSlot(Slot& slot) {
  slot.job.reset();
  slot.turn.reset();
  slot.last_used = std::chrono::steady_clock::now();
  waiting_for_memory_ = false;  // what it held is free: the queue's head may fit now
  std::lock_guard lock(mu_);
  --running_slots_;
}

int Scheduler::active_slots() const {
  int n = 0;
  for (const Slot& slot : slots_) n += slot.job != nullptr ? 1 : 0;
  return n;
}

Scheduler::Slot* Scheduler::PickSlot(const Job& job) {
  std::vector<Slot*> idle;
  for (Slot& slot : slots_)
    if (slot.job == nullptr) idle.push_back(&slot);
  // A long request of a session that runs on a busy slot waits for that slot, which holds its rows:
  // elsewhere it would prefill what that slot resumes. A short one (a title, a guest) goes on.
  if (!job.session().empty() && static_cast<int64_t>(job.prompt_ids().size()) > applied_options_.guest_max_tokens)
    for (const Slot& slot : slots_)
      if (slot.job != nullptr && (slot.job->session() == job.session() || slot.cache->session() == job.session())) return nullptr;
  if (idle.size() <= 1) return idle.empty() ? nullptr : idle.front();
  const CacheRequest request = RequestOf(job);
  for (Slot* slot : idle)
    if (slot->cache->PreparedAnswerFits(request, job.sampling())) return slot;
  // The slot whose own RAM tiers serve the most of the prompt (the disk and the spill serve every
  // slot alike), the session's own slot first among equals.
  Slot* best = nullptr;
  int64_t best_cached = 0;
  bool best_session = false;
  for (Slot* slot : idle) {
    const ResumeInfo info = slot->cache->Peek(request);
    const bool in_place = info.source != CacheSource::kDisk && info.source != CacheSource::kSpill && info.source != CacheSource::kCold;
    const int64_t cached = in_place ? info.cached_tokens : 0;
    const bool session = !job.session().empty() && slot->cache->session() == job.session();
    if (best == nullptr || cached > best_cached || (cached == best_cached && session && !best_session)) {
      best = slot;
      best_cached = cached;
      best_session = session;
    }
  }
  if (best_cached > 0 || best_session) return best;
  for (Slot* slot : idle)
    if (slot->cache->rows().empty()) return slot;
  return *std::min_element(idle.begin(), idle.end(), [](const Slot* a, const Slot* b) { return a->last_used < b->last_used; });
}

bool Scheduler::StartJob(Slot& slot, std::shared_ptr<Job> job, double queue_ms) {
  InstallOptions(slot);
  slot.job = job;
  slot.stats = {};
  slot.stats.queue_ms = queue_ms;
  slot.stats.queue_position = job->queue_position();
  slot.stats.prompt_tokens = static_cast<int64_t>(job->prompt_ids().size());
  slot.stats.image_tokens = ImageRows(job->images());
  slot.order = ++started_jobs_;
  slot.have_first = false;
  if (job->cancel_flag().load()) {
    job->Admit(Cancelled("cancelled before it started"));
    FreeSlot(slot);
    FinishJob(*job, Cancelled("cancelled before it started"), {}, slot.stats);
    return true;
  }
  slot.start = std::chrono::steady_clock::now();
  const CacheRequest request = RequestOf(*job);
  current_session_ = job->session();
  SamplingParams sampling = job->sampling();
  if (options_.reply_script && sampling.forced_ids.empty())
    if (auto scripted = options_.reply_script->ReplyFor(job->prompt_ids())) sampling.forced_ids = std::move(*scripted);
  ShadowReader* shadow = options_.shadow;
  Job* j = job.get();
  auto begin = [&] {
    return slot.cache->Begin(
      request, sampling,
      [this, &slot, j, shadow](const GeneratedToken& token) {
        if (!slot.have_first) {
          slot.first_token = std::chrono::steady_clock::now();
          slot.have_first = true;
        }
        j->PushToken(token);
        if (shadow != nullptr) {  // between two decode steps: the turn's output, then the reader's ration
          shadow->NoteOutput(j->session(), std::span(&token.sampled.id, 1));
          shadow->ReadRationed(j->session(), MsSince(slot.first_token));
        }
        return !j->cancel_flag().load();
      },
      &job->cancel_flag(), [j, shadow](const ResumeInfo& info) {
        j->Admit(Status::Ok());
        if (shadow != nullptr) shadow->BeginTurn(j->session(), info.served_prompt);
      });
  };
  auto turn = begin();
  if (!turn.ok() && turn.status().code() == StatusCode::kResourceExhausted) {
    // Idle slots give their memory back first (their conversations to the spill), then it is tried
    // again; only where that makes room: a request that cannot fit takes nothing from them. A slot
    // that gives keeps its state's anchor-sized part.
    const size_t index = static_cast<size_t>(&slot - slots_.data());
    int64_t beside = OutsideBytes(index);
    std::vector<Slot*> givers;
    for (Slot& other : slots_)
      if (&other != &slot && other.job == nullptr && other.cache->OwnBytes() > other.cache->state().anchor_bytes()) {
        beside -= other.cache->OwnBytes() - other.cache->state().anchor_bytes();
        givers.push_back(&other);
      }
    if (!givers.empty() && slot.cache->WouldFitBeside(request, job->sampling().max_tokens, beside)) {
      for (Slot* other : givers) other->cache->GiveBack("slot " + std::to_string(index) + "'s request needs the memory");
      turn = begin();
    }
  }
  if (!turn.ok()) {
    // Memory other slots hold comes back when they end: the job waits for it at the head of the queue.
    if (turn.status().code() == StatusCode::kResourceExhausted && active_slots() > 1) {
      FreeSlot(slot);
      waiting_for_memory_ = true;
      return false;
    }
    job->Admit(turn.status());
    RecordJob(*job, slot.stats, 500, turn.status().ToString(), "error");
    FreeSlot(slot);
    FinishJob(*job, turn.status(), {}, slot.stats);
    return true;
  }
  slot.turn = std::move(turn).value();
  if (slot.turn->replayed) EndJob(slot);
  return true;
}

void Scheduler::StepSlots() {
  // A slot running alone drafts. Beside others, where the backend batches windows (it keeps one open
  // on every state), a slot drafts while its drafts are kept often enough to pay for their rows in the
  // batch (RowCostModel); else it decodes plainly. The tokens are the same either way.
  const bool batches_windows = forward_->has_window_batches();
  int decoding = 0;
  for (const Slot& slot : slots_) decoding += slot.turn != nullptr && slot.turn->task != nullptr ? 1 : 0;
  const bool alone = active_slots() == 1;
  const DraftsBesideOthers beside = applied_options_.drafts_beside_others;
  const double break_even = beside == DraftsBesideOthers::kOn ? -1.0 : beside == DraftsBesideOthers::kOff ? 2.0 : row_costs_.BreakEven(decoding);
  for (Slot& slot : slots_)
    if (slot.turn != nullptr && slot.turn->task != nullptr) {
      GenerationTask& task = *slot.turn->task;
      task.set_may_draft(alone || (batches_windows && task.draft_acceptance() > break_even));
      task.set_defer_windows(batches_windows);
    }
  Slot* prefilling = nullptr;
  for (Slot& slot : slots_)
    if (slot.turn != nullptr && slot.turn->task == nullptr && (prefilling == nullptr || slot.order < prefilling->order)) prefilling = &slot;
  // Every decoding slot picks its token; the plain decodes that follow ride the prefill piece's
  // forward where the backend carries them, else they run as one batch.
  std::vector<Slot*> batch;
  for (Slot& slot : slots_) {
    if (slot.turn == nullptr || slot.turn->task == nullptr) continue;
    current_session_ = slot.job->session();
    if (!slot.turn->task->Step()) {
      EndJob(slot);
      continue;
    }
    if (!slot.turn->task->pending_rows().empty()) batch.push_back(&slot);
  }
  std::vector<SequenceState*> states;
  std::vector<int32_t> ids;
  std::vector<std::vector<int32_t>> rows;  // each slot's decode id, or its window's ids
  std::vector<int64_t> lengths;
  bool windows = false;
  for (Slot* slot : batch) {
    GenerationTask& task = *slot->turn->task;
    states.push_back(&task.state());
    rows.push_back(task.pending_rows());
    windows = windows || rows.back().size() > 1;
    ids.push_back(rows.back().front());
    lengths.push_back(states.back()->length());
  }
  const size_t vocab = static_cast<size_t>(forward_->vocab_size());
  auto hand_back = [&](const std::vector<float>& logits) {
    size_t row = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
      batch[i]->turn->task->Forwarded(std::vector<float>(logits.begin() + static_cast<std::ptrdiff_t>(row * vocab),
                                                         logits.begin() + static_cast<std::ptrdiff_t>((row + rows[i].size()) * vocab)));
      row += rows[i].size();
    }
  };
  DecodeRiders riders{states, ids};  // plain decodes only: windows run in their own batch
  if (prefilling != nullptr) {
    current_session_ = prefilling->job->session();
    if (Result<bool> more = prefilling->cache->PrefillPiece(*prefilling->turn, batch.empty() || windows ? nullptr : &riders); !more.ok()) {
      const std::shared_ptr<Job> job = prefilling->job;
      RecordJob(*job, prefilling->stats, 500, more.status().ToString(), "error");
      FreeSlot(*prefilling);
      FinishJob(*job, more.status(), {}, prefilling->stats);
    }
  }
  const auto counted = [&](bool batched) {  // the counts, and the row costs for the stats
    std::lock_guard lock(mu_);
    row_costs_seen_ = row_costs_;
    ++decode_counts_.steps;
    if (!batched) return;
    decode_counts_.batched_rows += static_cast<int64_t>(batch.size());
    for (const std::vector<int32_t>& r : rows)
      if (r.size() > 1) decode_counts_.batched_window_rows += static_cast<int64_t>(r.size());
  };
  if (riders.taken) {
    counted(true);
    return hand_back(riders.logits);
  }
  if (batch.empty()) return;
  int64_t forwarded = 0;
  for (const std::vector<int32_t>& r : rows) forwarded += static_cast<int64_t>(r.size());
  const auto start = std::chrono::steady_clock::now();
  const auto measured = [&] {
    row_costs_.Record(forwarded, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    counted(batch.size() > 1);
  };
  if (batch.size() == 1) {
    batch.front()->turn->task->DecodeAlone();
    return measured();
  }
  Result<std::vector<float>> logits = windows ? forward_->DecodeWindowsBatch(states, rows) : forward_->DecodeBatch(states, ids);
  if (logits.ok()) {
    measured();
    return hand_back(*logits);
  }
  // A refused batch (one state's rows did not fit) fails only the slots that fail alone.
  bool untouched = true;
  for (size_t i = 0; i < batch.size(); ++i) untouched = untouched && states[i]->length() == lengths[i];
  for (Slot* slot : batch) {
    if (untouched) slot->turn->task->DecodeAlone();
    else slot->turn->task->Forwarded(logits.status());
  }
}

void Scheduler::EndJob(Slot& slot) {
  const std::shared_ptr<Job> held = slot.job;  // the slot is free before the client is answered
  Job& job = *held;
  RequestFigures& stats = slot.stats;
  current_session_ = job.session();
  auto result = slot.cache->End(*slot.turn);
  const auto end = std::chrono::steady_clock::now();
  auto release = [&] {
    ++slot.requests;
    FreeSlot(slot);
  };
  if (!result.ok()) {
    job.Admit(result.status());
    RecordJob(job, stats, 500, result.status().ToString(), "error");
    release();
    FinishJob(job, result.status(), {}, stats);
    return;
  }
  stats.completion_tokens = static_cast<int64_t>(result->generation.tokens.size());
  stats.drafted_tokens = result->generation.drafted_tokens;
  stats.accepted_tokens = result->generation.accepted_tokens;
  stats.cached_tokens = result->resume.cached_tokens;
  stats.reread_tokens = result->resume.reread_tokens;
  stats.served_prompt_tokens = static_cast<int64_t>(result->resume.served_prompt.size());
  stats.cache_source = CacheSourceName(result->resume.source);
  if (job.client_prompt_tokens() > 0) {  // usage speaks of the client's prompt; the anchorage block of the served one
    stats.prompt_tokens = job.client_prompt_tokens();
    if (result->resume.source != CacheSource::kPrepared) stats.cache_source = "continuation";
  }
  if (slot.have_first) {
    stats.ttft_ms = std::chrono::duration<double, std::milli>(slot.first_token - slot.start).count() + stats.queue_ms;
    stats.prefill_ms = std::chrono::duration<double, std::milli>(slot.first_token - slot.start).count();
    double decode_s = std::chrono::duration<double>(end - slot.first_token).count();
    if (stats.completion_tokens > 1 && decode_s > 0) stats.decode_tokens_per_s = (stats.completion_tokens - 1) / decode_s;
    if (stats.reread_tokens > 0 && stats.prefill_ms > 0) {
      std::lock_guard lock(mu_);
      prefill_tokens_ += static_cast<double>(stats.reread_tokens);
      prefill_seconds_ += stats.prefill_ms / 1000.0;
    }
  }
  RecordJob(job, stats, 200, "", job.FinishReasonOf(result->generation));
  release();
  FinishJob(job, Status::Ok(), std::move(result->generation), stats);
}

void Scheduler::FinishJob(Job& job, Status status, GenerationResult result, const RequestFigures& figures) {
  // Published before the client is answered, so a stats read that follows its response never sees
  // older tiers or its slot still busy.
  anchorage::CacheStats stats = CombinedStats();
  PublishSlots();
  {
    std::lock_guard lock(mu_);
    cache_stats_ = std::move(stats);
    last_stats_ = figures;
  }
  job.Finish(std::move(status), std::move(result), figures);
}

void Scheduler::RecordJob(const Job& job, const RequestFigures& s, int status, const std::string& error, const std::string& finish) {
  if (options_.journal == nullptr) return;
  RequestRow row;
  for (size_t i = 0; i < slots_.size(); ++i)
    if (slots_[i].job.get() == &job) row.slot = static_cast<int>(i);
  row.session = job.session();
  row.model = options_.model_id;
  row.route = job.route();
  row.status = status;
  row.error = error;
  row.figures = s;
  // Of the client's prompt, as usage's prompt_tokens_details.cached_tokens (the engine's resume point counts the served one).
  row.figures.cached_tokens = std::max<int64_t>(0, s.prompt_tokens - s.reread_tokens);
  row.cache_tier = s.cache_source == "disk" || s.cache_source == "spill" ? s.cache_source : s.cached_tokens > 0 ? "ram" : "none";
  row.finish_reason = finish;
  row.precision = options_.precision;
  options_.journal->RecordRequest(std::move(row));
}

}  // namespace anchorage
