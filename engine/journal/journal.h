// The SQLite journal of requests and cache events: non-blocking writes, retention, queries.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/core/request_figures.h"
#include "engine/core/status.h"

struct sqlite3;
struct sqlite3_stmt;

namespace anchorage {

// One served request; time_ms 0 means "now" when recorded.
struct RequestRow {
  int64_t time_ms = 0;  // Unix epoch milliseconds
  std::string session;
  std::string model;
  std::string route;
  int status = 200;  // HTTP status answered
  std::string error;
  RequestFigures figures;
  int64_t hidden_tokens = 0;
  std::string cache_tier;
  std::string finish_reason;
  int slot = 0;  // the engine slot that ran it
  std::string precision = "exact";  // the precision its products ran in ("exact", "fast")
};

enum class CacheEventKind { kHit, kWrite, kEviction, kShed, kDrop, kFailedRestore, kClear };

// "hit", "write", "eviction", "shed", "drop", "failed_restore", "clear".
const char* CacheEventKindName(CacheEventKind kind);
std::optional<CacheEventKind> ParseCacheEventKind(std::string_view name);

// One cache event; time_ms 0 means "now" when recorded.
struct CacheEventRow {
  int64_t time_ms = 0;  // Unix epoch milliseconds
  CacheEventKind kind = CacheEventKind::kHit;
  std::string tier;
  std::string session;
  int64_t tokens = 0;
  int64_t bytes = 0;
  double ms = 0;
  std::string reason;
};

// One turn's shadow agreement: the shadow's and the main model's answers at the turn's insertion point.
struct ShadowRow {
  int64_t time_ms = 0;  // Unix epoch milliseconds
  std::string session;
  std::string question;
  int64_t insertion_tokens = 0;
  int64_t behind_tokens = 0;  // how far behind the reader was when the turn began
  double lag_ms = 0;          // from the turn's start to the shadow's answer
  std::optional<std::string> shadow_choice, main_choice;
  std::optional<double> shadow_probability, main_probability;  // of the chosen choice
  std::vector<double> shadow_probabilities, main_probabilities;  // every choice's, in order; empty when not answered
  std::optional<bool> agree;  // absent when either side did not answer
  std::string note;           // why a side did not answer
};

struct JournalOptions {
  std::string data_dir;            // created (0700) if missing; holds journal.db
  int64_t retention_days = 30;     // rows older than this are pruned; 0 keeps all ages
  int64_t retention_rows = 1000000;  // newest rows kept per table; 0 keeps any count
  size_t queue_capacity = 65536;   // queued rows before the oldest is dropped
  size_t max_batch_rows = 4096;    // rows per write transaction
  int64_t prune_interval_ms = 60000;  // how often the writer applies retention
  int busy_timeout_ms = 5000;      // SQLite busy timeout of both connections
};

// A filter over both tables; rows come newest first (id descending; ids are shared by both tables).
struct JournalQuery {
  std::string kind;     // "" all, "request", "cache_event", "shadow", or a cache event kind ("hit", ...)
  std::string tier;     // "" any; matches requests.cache_tier and cache_events.tier
  std::string session;  // "" any; exact match
  std::optional<int64_t> from_ms;  // inclusive
  std::optional<int64_t> to_ms;    // inclusive
  std::string text;     // "" any; case-insensitive substring of error/reason/session/model
  int64_t limit = 100;  // 1..1000
  int64_t offset = 0;   // 0..100000 rows skipped after the cursor
  std::optional<int64_t> before_id;  // cursor: only rows with id < before_id
};

struct QueryPage {
  nlohmann::json rows = nlohmann::json::array();  // objects with "id", "type" and the row's columns
  int64_t total = 0;                 // rows matching the filters, cursor and paging ignored
  std::optional<int64_t> next_cursor;  // before_id of the next page; absent on the last page
};

struct JournalStats {
  int64_t request_rows = 0;
  int64_t cache_event_rows = 0;
  int64_t shadow_rows = 0;
  int64_t bytes_on_disk = 0;   // journal.db plus its -wal and -shm files
  int64_t dropped_rows = 0;    // rows dropped because the queue was full
  int64_t failed_rows = 0;     // rows lost because their batch failed to commit
  int64_t committed_rows = 0;  // rows committed since open
  int64_t pruned_rows = 0;     // rows deleted by retention since open
  int64_t queued_rows = 0;     // rows waiting for the writer now
  int schema_version = 0;
  nlohmann::json ToJson() const;
};

// Thread-safe. Record* never blocks on the disk; one writer thread commits rows in batches.
class Journal {
 public:
  static constexpr int kSchemaVersion = 7;

  // Opens or creates data_dir/journal.db, migrates its schema and starts the writer.
  static Result<std::unique_ptr<Journal>> Open(const JournalOptions& options);
  ~Journal();  // commits everything queued, then stops the writer
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;

  void RecordRequest(RequestRow row);
  void RecordCacheEvent(CacheEventRow row);
  void RecordShadow(ShadowRow row);

  // Returns once every row recorded before the call is committed, dropped or failed.
  void Flush();

  // The first background write error since the previous call, then ok until the next one.
  Status last_error();

  // Background failures so far, for /health and the console (does not consume last_error).
  struct Health {
    int64_t failed_rows = 0;   // rows a write failed for
    int64_t dropped_rows = 0;  // rows dropped because the queue was full
    int64_t errors = 0;        // failed writes and prunes
    std::string last_error;    // the newest failure's message, "" when none
  };
  Health health() const;

  // Applies retention now to committed rows; returns the rows deleted.
  Result<int64_t> Prune();
  // New retention for the periodic and explicit prunes; 0 disables that limit.
  void SetRetention(int64_t retention_days, int64_t retention_rows);

  Result<QueryPage> Query(const JournalQuery& query) const;
  Result<JournalStats> Stats() const;
  // PRAGMA integrity_check's answer: "ok" when the database is sound.
  Result<std::string> IntegrityCheck() const;

  const std::string& path() const { return path_; }

 private:
  struct Queued {
    uint64_t seq;
    std::variant<RequestRow, CacheEventRow, ShadowRow> row;
  };

  explicit Journal(const JournalOptions& options);
  Status OpenConnections();
  void WriterLoop();
  Status WriteBatch(std::deque<Queued>& batch);
  Result<int64_t> PruneLocked(int64_t now_ms);
  void Enqueue(std::variant<RequestRow, CacheEventRow, ShadowRow> row);
  void KeepError(Status status);

  JournalOptions options_;
  std::string path_;

  std::mutex write_db_mu_;  // guards write_db_ and its statements
  sqlite3* write_db_ = nullptr;
  sqlite3_stmt* insert_request_ = nullptr;
  sqlite3_stmt* insert_event_ = nullptr;
  sqlite3_stmt* insert_shadow_ = nullptr;
  int64_t next_id_ = 1;

  mutable std::mutex read_db_mu_;  // guards read_db_
  sqlite3* read_db_ = nullptr;

  mutable std::mutex mu_;  // guards everything below
  std::condition_variable wake_writer_;
  std::condition_variable batch_done_;
  std::deque<Queued> queue_;
  uint64_t next_seq_ = 1;
  bool in_flight_ = false;
  uint64_t in_flight_first_seq_ = 0;
  bool stop_ = false;
  Status error_;
  int64_t error_count_ = 0;
  std::string newest_error_;
  int64_t retention_days_ = 0;
  int64_t retention_rows_ = 0;
  int64_t dropped_rows_ = 0;
  int64_t failed_rows_ = 0;
  int64_t committed_rows_ = 0;
  int64_t pruned_rows_ = 0;

  std::thread writer_;
};

}  // namespace anchorage
