#include "engine/server/scheduler.h"

#include <chrono>

namespace anchorage {

namespace {
double MsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}
}  // namespace

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
      cache_stats_(resident_.Stats()) {
  if (options_.journal != nullptr) {
    Journal* journal = options_.journal;
    resident_.set_event_sink([journal, this](const CacheEvent& e) {
      CacheEventRow row;
      row.kind = ParseCacheEventKind(e.kind).value_or(CacheEventKind::kWrite);
      row.tier = e.tier;
      row.session = e.session ? *e.session : current_session_;
      row.tokens = e.tokens;
      row.bytes = e.bytes;
      row.reason = e.reason;
      journal->RecordCacheEvent(std::move(row));
    });
  }
  if (options_.disk != nullptr) resident_.set_disk_cache(options_.disk);
  if (options_.spill != nullptr) resident_.set_session_spill(options_.spill);
  resident_.set_write_guard(options_.write_guard);
  resident_.set_suffix_store(options_.suffix_store);
  if (options_.shadow != nullptr) resident_.set_outside_bytes([shadow = options_.shadow] { return shadow->resident_bytes(); });
  thread_ = std::thread([this] { EngineLoop(); });
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
    const bool engine_free = queue_.empty() && !running_job_;
    if (!engine_free && queue_.size() >= options_.max_queue)
      return ResourceExhausted("the queue is full (" + std::to_string(queue_.size()) + " requests waiting)");
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
  idle_cv_.wait(lock, [&] { return queue_.empty() && !running_job_; });
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
    if (running_job_) return true;
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

void Scheduler::ApplyPendingOptions() {
  std::optional<ResidentOptions> options;
  {
    std::lock_guard lock(mu_);
    options.swap(pending_options_);
  }
  if (options) resident_.set_options(*options);
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

template <typename Fn>
auto Scheduler::BetweenRequests(const std::string& session, Fn&& fn) {
  lock_.LockForRequest();
  ApplyPendingOptions();
  current_session_ = session;
  auto result = fn();
  anchorage::CacheStats stats = resident_.Stats();
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
  return BetweenRequests(session, [&] { return resident_.EndRecord(session); });
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
  const ResidentOptions& o = resident_.options();
  if (!o.compaction_prepare || idle_ms < o.compaction_idle_s * 1000) {
    lock_.UnlockIdle();
    return;
  }
  const std::string session = resident_.session();
  const std::optional<std::vector<int32_t>> record = resident_.EndRecord(session);
  std::vector<int32_t> ids;
  // A conversation that already ends in these instructions is a compaction itself: nothing to write.
  if (record && static_cast<int64_t>(record->size()) >= o.compaction_min_tokens &&
      model_.tokenizer.Decode(*record).find(noted->request.instructions) == std::string::npos)
    if (auto continuation = ContinuationIds(*record, noted->request, model_.chat_template, model_.tokenizer); continuation.ok())
      ids = std::move(continuation).value();
  const std::vector<int32_t>* prepared = resident_.prepared_prompt();
  if (!ids.empty() && ids != prepare_failed_ && (prepared == nullptr || *prepared != ids)) {
    current_session_ = session;
    auto should_stop = [this] {
      std::lock_guard lock(mu_);
      return stop_ || draining_ || !queue_.empty() || lock_.ShouldYield();
    };
    Status written = resident_.WriteAhead(session, ids, noted->sampling, noted->context_tokens, should_stop);
    if (!written.ok() && written.code() != StatusCode::kCancelled) prepare_failed_ = ids;
    anchorage::CacheStats stats = resident_.Stats();
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
  return BetweenRequests("", [&] { return resident_.SpillForStop(); });
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
      if (!idle_cv_.wait_until(lock, deadline, [&] { return !running_job_ && queue_.empty(); })) return ResourceExhausted("the engine is busy");
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
  while (true) {
    std::shared_ptr<Job> job;
    double queue_ms = 0;
    {
      std::unique_lock lock(mu_);
      auto ready = [&] { return stop_ || !queue_.empty(); };
      if (!cv_.wait_for(lock, std::chrono::milliseconds(200), ready)) {
        lock.unlock();
        // Idle work looks for something to do every 0.2 s while no request runs or waits.
        if (options_.shadow != nullptr) ShadowIdle();
        PrepareIdle();
        continue;
      }
      if (stop_ && queue_.empty()) return;
      job = queue_.front().first;
      queue_ms = MsSince(queue_.front().second);
      queue_.pop_front();
      running_job_ = true;
    }
    lock_.LockForRequest();
    ApplyPendingOptions();
    RunJob(*job, queue_ms);
    lock_.UnlockRequest();
    {
      std::lock_guard lock(mu_);
      running_job_ = false;
      last_request_ = std::chrono::steady_clock::now();
      prepare_looked_ = false;
    }
    idle_cv_.notify_all();
  }
}

void Scheduler::RunJob(Job& job, double queue_ms) {
  RequestFigures stats;
  stats.queue_ms = queue_ms;
  stats.prompt_tokens = static_cast<int64_t>(job.prompt_ids().size());
  if (job.cancel_flag().load()) {
    job.Admit(Cancelled("cancelled before it started"));
    FinishJob(job, Cancelled("cancelled before it started"), {}, stats);
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point first_token;
  bool have_first = false;
  CacheRequest request{job.prompt_ids(), job.session(), job.sampling().max_tokens, job.context_tokens()};
  current_session_ = job.session();
  SamplingParams sampling = job.sampling();
  if (options_.reply_script && sampling.forced_ids.empty())
    if (auto scripted = options_.reply_script->ReplyFor(job.prompt_ids())) sampling.forced_ids = std::move(*scripted);
  ShadowReader* shadow = options_.shadow;
  auto result = resident_.Generate(
      request, sampling,
      [&](const GeneratedToken& token) {
        if (!have_first) {
          first_token = std::chrono::steady_clock::now();
          have_first = true;
        }
        job.PushToken(token);
        if (shadow != nullptr) {  // between two decode steps: the turn's output, then the reader's ration
          shadow->NoteOutput(job.session(), std::span(&token.sampled.id, 1));
          shadow->ReadRationed(job.session(), MsSince(first_token));
        }
        return !job.cancel_flag().load();
      },
      &job.cancel_flag(), [&](const ResumeInfo& info) {
        job.Admit(Status::Ok());
        if (shadow != nullptr) shadow->BeginTurn(job.session(), info.served_prompt);
      });
  const auto end = std::chrono::steady_clock::now();
  if (!result.ok()) {
    job.Admit(result.status());
    RecordJob(job, stats, 500, result.status().ToString(), "error");
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
  if (have_first) {
    stats.ttft_ms = std::chrono::duration<double, std::milli>(first_token - start).count() + queue_ms;
    stats.prefill_ms = std::chrono::duration<double, std::milli>(first_token - start).count();
    double decode_s = std::chrono::duration<double>(end - first_token).count();
    if (stats.completion_tokens > 1 && decode_s > 0) stats.decode_tokens_per_s = (stats.completion_tokens - 1) / decode_s;
    if (stats.reread_tokens > 0 && stats.prefill_ms > 0) {
      std::lock_guard lock(mu_);
      prefill_tokens_ += static_cast<double>(stats.reread_tokens);
      prefill_seconds_ += stats.prefill_ms / 1000.0;
    }
  }
  RecordJob(job, stats, 200, "", job.FinishReasonOf(result->generation));
  FinishJob(job, Status::Ok(), std::move(result->generation), stats);
}

void Scheduler::FinishJob(Job& job, Status status, GenerationResult result, const RequestFigures& figures) {
  // Published before the client is answered, so a stats read that follows its response never sees older tiers.
  anchorage::CacheStats stats = resident_.Stats();
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
  options_.journal->RecordRequest(std::move(row));
}

}  // namespace anchorage
