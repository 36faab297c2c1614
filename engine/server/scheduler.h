// The scheduler: one engine thread runs the model; HTTP threads submit jobs to a bounded queue and
// read their tokens as they come. Jobs are cancelled between tokens.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/core/request_figures.h"
#include "engine/core/status.h"
#include "engine/server/reply_script.h"
#include "engine/model/model.h"
#include "engine/decide/decide.h"
#include "engine/runtime/forward.h"
#include "engine/cache/resident_prefix.h"
#include "engine/journal/journal.h"
#include "engine/runtime/generator.h"
#include "engine/runtime/sequence_state.h"
#include "engine/server/compaction.h"
#include "engine/server/draft_policy.h"
#include "engine/server/engine_lock.h"
#include "engine/shadow/shadow_reader.h"

namespace anchorage {


// One generation request. The engine thread appends tokens; one reader thread takes them.
class Job {
 public:
  Job(std::vector<int32_t> prompt_ids, SamplingParams sampling, std::string session = "", std::string route = "")
      : prompt_ids_(std::move(prompt_ids)), sampling_(std::move(sampling)), session_(std::move(session)), route_(std::move(route)) {}

  const std::vector<int32_t>& prompt_ids() const { return prompt_ids_; }
  const std::string& session() const { return session_; }
  const std::string& route() const { return route_; }
  const SamplingParams& sampling() const { return sampling_; }
  // A compaction served as a continuation: what usage reports as the prompt (the client's tokens).
  void set_continuation_of(int64_t client_prompt_tokens) { client_prompt_tokens_ = client_prompt_tokens; }
  int64_t client_prompt_tokens() const { return client_prompt_tokens_; }
  // The context limit (prompt as served plus output); 0: the model's.
  void set_context_tokens(int64_t tokens) { context_tokens_ = tokens; }
  // The images whose key ids the prompt holds.
  void set_images(ImageCatalog images) { images_ = std::move(images); }
  const ImageCatalog& images() const { return images_; }
  int64_t context_tokens() const { return context_tokens_; }
  // How the journal names the end of a generation (the API's finish reason); default the engine's.
  void set_finish_reason_namer(std::function<std::string(const GenerationResult&)> namer) { finish_reason_namer_ = std::move(namer); }
  std::string FinishReasonOf(const GenerationResult& result) const {
    return finish_reason_namer_ ? finish_reason_namer_(result) : FinishReasonName(result.finish);
  }

  // Its place among the requests waiting for a slot when it came (1: the next to get one); 0: a slot was free.
  void set_queue_position(int64_t position) { queue_position_ = position; }
  int64_t queue_position() const { return queue_position_; }

  // Asks the engine to stop before its next token (a client hung up).
  void Cancel() { cancel_.store(true); }
  const std::atomic<bool>& cancel_flag() const { return cancel_; }

  // Waits until the engine took the job and it fit the memory budget (ok), or it failed before
  // its prefill (the error: ResourceExhausted when it cannot fit).
  Status WaitAdmitted();
  // The same for at most timeout: nullopt while the job still waits.
  std::optional<Status> WaitAdmittedFor(std::chrono::milliseconds timeout);
  // Engine side: the job passed (or failed) admission.
  void Admit(Status status);

  // Waits for new tokens or the end; returns the tokens since the last call. *done is set at the end.
  std::vector<GeneratedToken> WaitTokens(bool* done);
  // After the end: the outcome (error, or the generation) and its figures.
  const Status& status() const { return status_; }
  const GenerationResult& result() const { return result_; }
  const RequestFigures& stats() const { return stats_; }

  // Engine side.
  void PushToken(const GeneratedToken& token);
  void Finish(Status status, GenerationResult result, RequestFigures stats);

 private:
  std::vector<int32_t> prompt_ids_;
  ImageCatalog images_;
  SamplingParams sampling_;
  std::string session_;
  std::string route_;
  int64_t context_tokens_ = 0;
  int64_t client_prompt_tokens_ = 0;  // set: a continuation
  int64_t queue_position_ = 0;
  std::function<std::string(const GenerationResult&)> finish_reason_namer_;
  std::atomic<bool> cancel_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<GeneratedToken> tokens_;
  bool done_ = false;
  bool admitted_ = false;
  Status admission_;
  Status status_;
  GenerationResult result_;
  RequestFigures stats_;
};

// What a slot is doing, as /health and the console show it.
struct SlotSnapshot {
  int index = 0;
  std::string session;     // the conversation its rows hold ("" when unknown)
  int64_t tokens = 0;      // rows in its state
  int64_t bytes = 0;       // what it holds for the memory budget (a running request: what it was admitted with)
  std::string state = "idle";  // "idle", "prefill", "decode"
  int64_t requests = 0;    // requests it ran
};

// /health's and /v1/cache/stats's "slots".
nlohmann::json SlotsJson(const std::vector<SlotSnapshot>& slots);

struct SchedulerOptions {
  size_t max_queue = 16;  // jobs waiting while every slot runs; more are refused (a free slot always takes one)
  int parallel = 1;       // slots: sequences that run at once, each with its own state and tiers (slot 0 the resident one)
  ResidentOptions resident;
  Journal* journal = nullptr;  // optional: every job and cache event becomes a row
  std::string model_id;
  std::string precision = "exact";  // what the journal's rows say products ran in
  std::optional<ReplyScript> reply_script;  // testing aid: a job whose prompt it matches decodes its reply
  DiskCache* disk = nullptr;  // the disk tier behind the RAM tiers (not owned); nullptr: none
  SessionSpill* spill = nullptr;  // the session spill (not owned); nullptr: none
  WriteGuard* write_guard = nullptr;  // the day's write budget of both (not owned); nullptr: none
  ShadowReader* shadow = nullptr;  // the shadow reader (not owned); nullptr: none
  SuffixStore* suffix_store = nullptr;  // the lookup drafter's store of earlier requests (not owned); nullptr: none
};

class Scheduler {
 public:
  Scheduler(Model& model, std::unique_ptr<ComputeBackend> forward, SchedulerOptions options);
  ~Scheduler();

  // Queues a job. ResourceExhausted when the queue is full, Cancelled while draining.
  Status Submit(std::shared_ptr<Job> job);

  // Stops taking jobs; queued and running jobs still finish.
  void BeginDrain();
  // Blocks until no job is queued or running.
  void WaitIdle();

  size_t queue_depth() const;
  // Every slot, slot 0 first.
  std::vector<SlotSnapshot> Slots() const;
  int busy_slots() const;
  // Forwards that decoded slots' rows, the slots' rows of those that decoded more than one slot (beside a
  // prefill piece or each other), and the draft windows' rows among those: how much of decoding ran batched.
  struct DecodeCounts {
    int64_t steps = 0, batched_rows = 0, batched_window_rows = 0;
  };
  DecodeCounts decode_counts() const;
  // Where job waits in the queue (1: next); 0 once the engine took it (or it is not queued).
  size_t QueuePosition(const Job* job) const;
  bool busy() const;
  bool draining() const;
  EngineLock& engine_lock() { return lock_; }
  ComputeBackend& forward() { return *forward_; }
  RequestFigures last_stats() const;

  // New resident options, applied before the next job.
  void SetResidentOptions(const ResidentOptions& options);
  // Slots wanted (engine.parallel, at least 1): the engine adds slots before its next step and removes
  // the last ones once they are idle, their conversations written to the spill first. Slot 0 stays.
  void SetParallel(int slots);

  // Every cache tier's counters as of the last job or command.
  anchorage::CacheStats CacheStats() const;
  // GET /v1/cache/stats's document: those counters and the slots.
  // with_titles: each spill entry's title too (conversation text: for admin callers and the console only).
  nlohmann::json CacheStatsJson(bool with_titles = false) const;
  // Empties a cache tier between requests (waits for the engine like a request does).
  Status ClearCache(const std::string& tier);
  // Where a prompt would resume, without running the model; ResourceExhausted when the engine stays
  // busy past wait_ms.
  Result<ResumeInfo> PeekCache(const CacheRequest& request, int wait_ms);
  // Brings a state held below the resident rows into place ahead of its request (waits like a request).
  Result<ResumeInfo> PrewarmCache(const CacheRequest& request);
  // A planned stop: writes the resident conversation to the session spill for the next start.
  Status SpillForStop();
  // The next start: reads back what a planned stop left; false when there was nothing.
  Result<bool> ResumeSpilled();
  // The shadow reader's answer to a typed question over a session: waits up to wait_ms for it to
  // catch up, then answers on what it has read. Unsupported without a shadow model.
  Result<ShadowAnswer> AskShadow(const std::string& session, const std::string& question, const std::vector<std::string>& choices, int wait_ms);
  ShadowReader* shadow() { return options_.shadow; }
  // A planned stop: writes every resident shadow session to disk.
  Status WriteShadowForStop();
  // The tokens up to the end anchor of session's conversation when the engine holds it resident
  // (waits for the engine like a request); nullopt otherwise.
  std::optional<std::vector<int32_t>> ConversationRecord(const std::string& session);
  // A decide request's branches between requests (waits like one): the layout it ran, after
  // on_branch saw every branch's logits. ResourceExhausted when its peak does not fit the memory limit.
  // Batches hold up to max_batch branches and a grid chunk of rows.
  Result<DecideLayout> Decide(std::span<const DecideBranch> branches, int64_t groups, bool reuse, int64_t max_batch,
                              const std::function<bool(size_t, std::span<const float>)>& on_branch);
  // A compaction request as the client sent it, with its sampling: the preparer writes the
  // continuation of the resident conversation ahead with the last one noted.
  void NoteCompaction(const CompactionRequest& request, const SamplingParams& sampling, int64_t context_tokens);
  // Prefill tokens per second measured over this process's requests (0 before the first).
  double measured_prefill_rate() const;

 private:
  struct Slot {
    ResidentPrefix* cache = nullptr;
    std::shared_ptr<Job> job;            // running, or null
    std::unique_ptr<ResidentTurn> turn;
    RequestFigures stats;
    std::chrono::steady_clock::time_point start, first_token, last_used;
    bool have_first = false;
    uint64_t order = 0;                  // when it took its job: the earliest prefills first
    uint64_t options_version = 0;        // the resident options it runs with
    int64_t requests = 0;
  };
  void EngineLoop();
  // The slot that takes job: the idle one holding its session or most of its prompt, else an empty
  // one, else the least recently used; nullptr when every slot runs.
  Slot* PickSlot(const Job& job);
  // Begins job on slot; false when it must wait for memory another slot holds (it goes back to the queue).
  bool StartJob(Slot& slot, std::shared_ptr<Job> job, double queue_ms);
  // One engine step: a prefill piece of the earliest prefilling slot, then one token of every
  // decoding slot, their plain decodes in one forward.
  void StepSlots();
  void EndJob(Slot& slot);
  // The slot takes no job now; the caller answers the job (after this, so its client sees the slot free).
  void FreeSlot(Slot& slot);
  int active_slots() const;
  // Bytes every slot but `slot` holds, and the shadow reader's, for slot's memory budget.
  int64_t OutsideBytes(size_t slot) const;
  void PublishSlots();
  // Slot 0's tiers, the shared ones and the memory of all; the prepared answer of whichever slot wrote it.
  anchorage::CacheStats CombinedStats() const;
  // The shadow reader's idle window, when the engine lock is free for idle work.
  void ShadowIdle();
  // Writes the resident conversation's compaction ahead when the engine has been idle long enough.
  void PrepareIdle();
  // Takes options set by SetResidentOptions; each slot installs them before its next job (every idle
  // slot at once where all are). The caller holds the engine lock.
  void ApplyPendingOptions();
  void InstallOptions(Slot& slot);
  // Adds a slot with its own resident prefix (slot 0: the scheduler's) wired to the shared tiers.
  void AddSlot();
  // Every slot reads the other slots' state stores as well as its own.
  void SharePeerStores();
  // Slots toward the wanted count: added at once, the last removed while idle. The engine lock is held.
  void ResizeSlots();
  // Runs fn on the calling thread holding the engine lock like a request, then refreshes the stats.
  template <typename Fn>
  auto BetweenRequests(const std::string& session, Fn&& fn);
  void RecordJob(const Job& job, const RequestFigures& stats, int status, const std::string& error, const std::string& finish);
  void FinishJob(Job& job, Status status, GenerationResult result, const RequestFigures& figures);

  Model& model_;
  std::unique_ptr<ComputeBackend> forward_;
  SchedulerOptions options_;
  ResidentPrefix resident_;  // slot 0's
  std::vector<std::unique_ptr<ResidentPrefix>> side_caches_;
  std::vector<Slot> slots_;   // engine thread
  RowCostModel row_costs_;    // engine thread: what the decode and window forwards cost by rows
  RowCostModel row_costs_seen_;  // its copy for the stats (mu_)
  DecodeCounts decode_counts_;   // mu_
  uint64_t started_jobs_ = 0;
  bool waiting_for_memory_ = false;  // the queue's head waits for a running slot to end
  ResidentOptions applied_options_;  // engine thread: the newest options, version options_version_
  uint64_t options_version_ = 0;
  EngineLock lock_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable idle_cv_;
  std::deque<std::pair<std::shared_ptr<Job>, std::chrono::steady_clock::time_point>> queue_;
  int running_slots_ = 0;
  std::vector<SlotSnapshot> slot_snapshots_;
  bool draining_ = false;
  bool stop_ = false;
  RequestFigures last_stats_;
  anchorage::CacheStats cache_stats_;
  std::optional<ResidentOptions> pending_options_;
  std::optional<int> pending_parallel_;  // guarded by mu_
  int wanted_slots_ = 1;                 // engine thread
  CacheEventSink journal_sink_;          // every slot's cache events, to the journal
  std::string current_session_;  // engine thread: the session cache events belong to
  double prefill_tokens_ = 0, prefill_seconds_ = 0;  // guarded by mu_
  struct NotedCompaction {
    CompactionRequest request;
    SamplingParams sampling;
    int64_t context_tokens = 0;
  };
  std::optional<NotedCompaction> noted_compaction_;  // guarded by mu_
  std::chrono::steady_clock::time_point last_request_ = std::chrono::steady_clock::now();  // guarded by mu_
  bool prepare_looked_ = false;  // guarded by mu_: the preparer looked since the last request, note or settings change
  std::vector<int32_t> prepare_failed_;  // engine side: the continuation whose write-ahead failed (not tried again)
  std::thread thread_;
};

}  // namespace anchorage
