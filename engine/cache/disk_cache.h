// The disk tier as the resident prefix uses it: the store (disk_tier.h), its admission
// (disk_admission.h), and a writer thread, so writes never hold a request. The engine thread stages
// an anchor's state as the prefill passes its line and submits the job after the prefill; the
// writer copies the rows out of the engine's state and writes while the request decodes; the next
// request's Fence closes the window, and what was not copied by then is dropped and journaled.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "engine/cache/cache_tier.h"
#include "engine/cache/disk_admission.h"
#include "engine/cache/disk_tier.h"
#include "engine/cache/write_guard.h"

namespace anchorage {

enum class DiskMode { kOff, kRead, kReadWrite };
const char* DiskModeName(DiskMode mode);  // "off", "read", "readwrite"
std::optional<DiskMode> ParseDiskMode(std::string_view name);

// The settings document's disk_cache area, applied from the next request.
struct DiskCacheSettings {
  DiskMode mode = DiskMode::kReadWrite;
  int64_t budget_bytes = 16ll << 30;
  int64_t ttl_days = 7;
  int admit_after = 2;
  int64_t min_free_bytes = 20ll << 30;
  int64_t min_tokens = 4096;
  bool cost_check = true;  // take a disk anchor only when its read costs less than the prefill it saves
  int64_t write_budget_bytes = 200ll << 30;  // the day's writes of the tier and the spill (write_guard.h)
};

// What one request asks the writer to keep: anchors at lines of tokens, ascending.
struct DiskWriteJob {
  std::vector<int32_t> tokens;  // the prompt up to its longest anchor
  std::vector<Anchor> anchors;
  std::string session;
};

struct DiskCacheStats {
  std::string mode, dir;
  int64_t budget_bytes = 0, min_free_bytes = 0, ttl_days = 0, free_bytes = -1, staged_bytes = 0;
  DiskTierStats tier;
  int64_t hits = 0, misses = 0, declined_by_cost = 0, jobs = 0, dropped_jobs = 0, skipped_by_write_budget = 0;
  std::vector<DiskPrefix> top;
  std::vector<CacheEvent> recent;  // newest last
  double hit_rate() const { return hits + misses > 0 ? static_cast<double>(hits) / static_cast<double>(hits + misses) : 0.0; }
};

// As a tier (the last the resident prefix asks): it offers the longest line on disk with the read's
// cost, reads the chunks above the rows in place and the anchor straight into the state, and holds
// no memory but what the writer stages.
class DiskCache : public CacheTier {
 public:
  // Opens the store in dir and the counts beside it; the writer thread starts.
  static Result<std::unique_ptr<DiskCache>> Open(DiskEnv& env, const ModelConfig& config, std::string fingerprint, std::string dir,
                                                 int64_t line_tokens, DiskCacheSettings settings);
  // Fences, writes what was copied, saves the counts and joins the writer.
  ~DiskCache() override;

  const char* name() const override { return "disk"; }
  TierOffer Find(std::span<const int32_t> prompt, const ResidentRows& resident, int64_t limit) const override;
  Status Restore(std::span<const int32_t> prompt, const TierOffer& offer, ResidentRows& resident) override;
  int64_t bytes() const override { return staged_bytes(); }
  ShedUnit ShedOne() override { return {}; }  // staged anchors go at the next fence; the files hold no memory

  void set_settings(const DiskCacheSettings& settings);
  // The day's write budget it shares with the spill (not owned; it outlives this); nullptr: none.
  void set_write_guard(WriteGuard* guard);
  DiskCacheSettings settings() const;
  bool reads() const;
  bool writes() const;
  int64_t line_tokens() const { return line_tokens_; }
  // Receives every event, on the engine thread or (with its session set) on the writer's.
  void set_event_sink(CacheEventSink sink);
  void Record(CacheEvent event);

  // The engine thread's calls.
  int64_t FindLine(std::span<const int32_t> prompt, int64_t max_length) const;
  // What reading line (rows below keep_rows in place) costs at the rate this process measured.
  double RestoreSeconds(std::span<const int32_t> prompt, int64_t line, int64_t keep_rows) const;
  Status RestoreLine(std::span<const int32_t> prompt, int64_t line, SequenceState& state, int64_t keep_rows);
  // The rows in place a restore of line keeps: the prompt's, below the taint, on a line.
  int64_t KeepRows(std::span<const int32_t> prompt, const ResidentRows& resident, int64_t line) const;
  void NoteMiss() { ++misses_; }
  void NoteDeclinedByCost() { ++declined_by_cost_; }
  // Counts the request's cold lines and returns the lines to anchor that the tier lacks, ascending.
  std::vector<int64_t> PlanWrites(AdmissionRequest request);
  // Whether this is the first request seen of session (empty: never); remembers it.
  bool FirstOfSession(const std::string& session);
  // Queues the job; the writer reads its rows out of state until the next Fence.
  void Submit(DiskWriteJob job, const SequenceState& state);
  // Closes the window of state's jobs (nullptr: every state's): no row is read out of it after this returns.
  void Fence(const SequenceState* state = nullptr);
  // Blocks until no job is queued or running (tests, benchmarks, shutdown).
  void WaitIdle();
  // Fences, deletes every file and the counts.
  Status Clear();
  // Reserve takes this while it moves the state's rows; the writer copies under it.
  std::shared_mutex& growth_lock() { return growth_lock_; }
  // Host bytes the writer holds: staged anchors and the chunk it copies.
  int64_t staged_bytes() const;
  DiskCacheStats Stats() const;
  DiskTier& tier() { return *tier_; }

 private:
  struct Pending {
    DiskWriteJob job;
    const SequenceState* state = nullptr;
    uint64_t epoch = 0;
  };
  DiskCache(DiskEnv& env, std::unique_ptr<DiskTier> tier, DiskAdmission admission, int64_t line_tokens, DiskCacheSettings settings);
  void WriterLoop();
  void Write(Pending& pending);
  void SaveCounts();
  // Journals the files the tier evicted or expired since the last report, as one event.
  void ReportEvictions(const std::optional<std::string>& session);

  DiskEnv& env_;
  std::unique_ptr<DiskTier> tier_;
  std::atomic<WriteGuard*> guard_ = nullptr;
  const int64_t line_tokens_;
  std::shared_mutex growth_lock_;

  mutable std::mutex mu_;  // guards everything below
  std::condition_variable cv_, idle_cv_;
  DiskCacheSettings settings_;
  DiskAdmission admission_;
  bool counts_dirty_ = false;
  CacheEventSink sink_;
  std::deque<CacheEvent> recent_;
  std::deque<CacheEvent> unsent_;  // recorded before any sink was set
  std::deque<Pending> queue_;
  bool writing_ = false;
  bool stop_ = false;
  // A job reads rows only while its state's epoch is the one it was submitted in: the sum of the
  // epoch every Fence bumps and the state's own, which its fences bump.
  uint64_t EpochOf(const SequenceState* state) const;
  uint64_t epoch_ = 0;
  std::unordered_map<const SequenceState*, uint64_t> state_epochs_;
  int64_t staged_bytes_ = 0;
  std::deque<std::string> sessions_order_;
  std::unordered_set<std::string> sessions_;
  int64_t hits_ = 0, jobs_ = 0, dropped_jobs_ = 0, skipped_by_write_budget_ = 0;
  int64_t reported_evicted_ = 0, reported_expired_ = 0, reported_evicted_bytes_ = 0;
  std::atomic<int64_t> misses_ = 0, declined_by_cost_ = 0;
  std::thread writer_;
};

}  // namespace anchorage
