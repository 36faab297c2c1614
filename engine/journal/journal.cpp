#include "engine/journal/journal.h"

#include <sqlite3.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <chrono>
#include <filesystem>
#include <utility>
#include <vector>

#include "engine/core/file_util.h"

namespace anchorage {

namespace {

constexpr int64_t kMsPerDay = 86400000;
constexpr int64_t kMaxQueryLimit = 1000;
constexpr int64_t kMaxQueryOffset = 100000;

// Schema migrations: entry i takes the database from user_version i to i + 1.
constexpr std::array<const char*, Journal::kSchemaVersion> kMigrations = {
    R"sql(
CREATE TABLE requests(
  id INTEGER PRIMARY KEY,
  time_ms INTEGER NOT NULL,
  session TEXT NOT NULL,
  model TEXT NOT NULL,
  route TEXT NOT NULL,
  status INTEGER NOT NULL,
  error TEXT NOT NULL,
  prompt_tokens INTEGER NOT NULL,
  cached_tokens INTEGER NOT NULL,
  reread_tokens INTEGER NOT NULL,
  hidden_tokens INTEGER NOT NULL,
  output_tokens INTEGER NOT NULL,
  cache_source TEXT NOT NULL,
  cache_tier TEXT NOT NULL,
  ttft_ms REAL NOT NULL,
  prefill_tokens_per_s REAL NOT NULL,
  decode_tokens_per_s REAL NOT NULL,
  finish_reason TEXT NOT NULL);
CREATE INDEX requests_time_ms ON requests(time_ms);
CREATE INDEX requests_session ON requests(session);
CREATE TABLE cache_events(
  id INTEGER PRIMARY KEY,
  time_ms INTEGER NOT NULL,
  kind TEXT NOT NULL
    CHECK (kind IN ('hit', 'write', 'eviction', 'shed', 'drop', 'failed_restore', 'clear')),
  tier TEXT NOT NULL,
  session TEXT NOT NULL,
  tokens INTEGER NOT NULL,
  bytes INTEGER NOT NULL,
  ms REAL NOT NULL,
  reason TEXT NOT NULL);
CREATE INDEX cache_events_time_ms ON cache_events(time_ms);
CREATE INDEX cache_events_kind ON cache_events(kind);
CREATE INDEX cache_events_session ON cache_events(session);
CREATE TABLE shadow_answers(
  id INTEGER PRIMARY KEY,
  time_ms INTEGER NOT NULL,
  session TEXT NOT NULL,
  question TEXT NOT NULL,
  answer TEXT NOT NULL,
  agreement REAL);
CREATE INDEX shadow_answers_time_ms ON shadow_answers(time_ms);
CREATE TABLE meta(key TEXT PRIMARY KEY, value INTEGER NOT NULL);
)sql",
    R"sql(
DROP TABLE shadow_answers;
CREATE TABLE shadow(
  id INTEGER PRIMARY KEY,
  time_ms INTEGER NOT NULL,
  session TEXT NOT NULL,
  question TEXT NOT NULL,
  insertion_tokens INTEGER NOT NULL,
  behind_tokens INTEGER NOT NULL,
  lag_ms REAL NOT NULL,
  shadow_choice TEXT,
  shadow_probability REAL,
  main_choice TEXT,
  main_probability REAL,
  shadow_probabilities TEXT,
  main_probabilities TEXT,
  agree INTEGER,
  note TEXT NOT NULL);
CREATE INDEX shadow_time_ms ON shadow(time_ms);
CREATE INDEX shadow_session ON shadow(session);
)sql",
    R"sql(
ALTER TABLE requests ADD COLUMN drafted_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE requests ADD COLUMN accepted_tokens INTEGER NOT NULL DEFAULT 0;
)sql",
    R"sql(
ALTER TABLE requests ADD COLUMN slot INTEGER NOT NULL DEFAULT 0;
ALTER TABLE requests ADD COLUMN queue_ms REAL NOT NULL DEFAULT 0;
)sql",
    R"sql(
ALTER TABLE requests ADD COLUMN queue_position INTEGER NOT NULL DEFAULT 0;
)sql",
    R"sql(
ALTER TABLE requests ADD COLUMN precision TEXT NOT NULL DEFAULT 'exact';
)sql",
    R"sql(
ALTER TABLE requests ADD COLUMN image_tokens INTEGER NOT NULL DEFAULT 0;
)sql",
};

constexpr std::array<const char*, 3> kTables = {"requests", "cache_events", "shadow"};

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Status SqliteError(sqlite3* db, int rc, std::string_view call, std::string_view what, const std::string& path) {
  std::string message = std::string(call) + " (" + std::string(what) + ") on " + path + ": " +
                        (db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
  int primary = rc & 0xff;
  if (primary == SQLITE_CORRUPT || primary == SQLITE_NOTADB) return Corrupt(std::move(message));
  if (primary == SQLITE_FULL) return ResourceExhausted(std::move(message));
  return IoError(std::move(message));
}

Status Exec(sqlite3* db, const char* sql, const std::string& path) {
  char* err = nullptr;
  int rc = sqlite3_exec(db, sql, nullptr, nullptr, &err);
  if (rc == SQLITE_OK) return Status::Ok();
  std::string what(sql, std::min<size_t>(std::strlen(sql), 60));
  std::string message = "sqlite3_exec (" + what + ") on " + path + ": " + (err != nullptr ? err : sqlite3_errstr(rc));
  sqlite3_free(err);
  int primary = rc & 0xff;
  if (primary == SQLITE_CORRUPT || primary == SQLITE_NOTADB) return Corrupt(std::move(message));
  return IoError(std::move(message));
}

// A prepared statement finalized on scope exit.
class Statement {
 public:
  Statement() = default;
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  static Status Prepare(sqlite3* db, const std::string& sql, const std::string& path, Statement* out) {
    int rc = sqlite3_prepare_v2(db, sql.c_str(), -1, &out->stmt_, nullptr);
    if (rc != SQLITE_OK) return SqliteError(db, rc, "sqlite3_prepare_v2", sql.substr(0, 60), path);
    return Status::Ok();
  }
  sqlite3_stmt* get() const { return stmt_; }
  sqlite3_stmt* Release() { return std::exchange(stmt_, nullptr); }

 private:
  sqlite3_stmt* stmt_ = nullptr;
};

Result<int64_t> QueryInt(sqlite3* db, const std::string& sql, const std::string& path) {
  Statement st;
  RETURN_IF_ERROR(Statement::Prepare(db, sql, path, &st));
  int rc = sqlite3_step(st.get());
  if (rc != SQLITE_ROW) return SqliteError(db, rc, "sqlite3_step", sql.substr(0, 60), path);
  return static_cast<int64_t>(sqlite3_column_int64(st.get(), 0));
}

Status OpenConnection(const std::string& path, int flags, int busy_timeout_ms, sqlite3** out) {
  int rc = sqlite3_open_v2(path.c_str(), out, flags, nullptr);
  if (rc != SQLITE_OK) {
    Status s = SqliteError(*out, rc, "sqlite3_open_v2", "open", path);
    sqlite3_close(*out);
    *out = nullptr;
    return s;
  }
  sqlite3_extended_result_codes(*out, 1);
  sqlite3_busy_timeout(*out, busy_timeout_ms);
  return Status::Ok();
}

using Binding = std::variant<int64_t, std::string>;

Status Bind(sqlite3* db, sqlite3_stmt* st, const std::vector<Binding>& binds, const std::string& path) {
  for (size_t i = 0; i < binds.size(); ++i) {
    int index = static_cast<int>(i) + 1;
    int rc = std::holds_alternative<int64_t>(binds[i])
                 ? sqlite3_bind_int64(st, index, std::get<int64_t>(binds[i]))
                 : sqlite3_bind_text(st, index, std::get<std::string>(binds[i]).c_str(), -1, SQLITE_TRANSIENT);
    if (rc != SQLITE_OK) return SqliteError(db, rc, "sqlite3_bind", "query", path);
  }
  return Status::Ok();
}

nlohmann::json ColumnsToJson(sqlite3_stmt* st, const char* type) {
  nlohmann::json row = nlohmann::json::object();
  row["type"] = type;
  int n = sqlite3_column_count(st);
  for (int i = 0; i < n; ++i) {
    const char* name = sqlite3_column_name(st, i);
    switch (sqlite3_column_type(st, i)) {
      case SQLITE_INTEGER: row[name] = static_cast<int64_t>(sqlite3_column_int64(st, i)); break;
      case SQLITE_FLOAT: row[name] = sqlite3_column_double(st, i); break;
      case SQLITE_TEXT:
        row[name] = std::string(reinterpret_cast<const char*>(sqlite3_column_text(st, i)),
                                static_cast<size_t>(sqlite3_column_bytes(st, i)));
        break;
      default: row[name] = nullptr; break;
    }
  }
  return row;
}

// The WHERE clause of one table's part of a query.
struct TableFilter {
  const char* table;
  const char* type;
  std::string where;
  std::vector<Binding> binds;

  void Add(const std::string& clause) { where += (where.empty() ? " WHERE " : " AND ") + clause; }
};

}  // namespace

const char* CacheEventKindName(CacheEventKind kind) {
  switch (kind) {
    case CacheEventKind::kHit: return "hit";
    case CacheEventKind::kWrite: return "write";
    case CacheEventKind::kEviction: return "eviction";
    case CacheEventKind::kShed: return "shed";
    case CacheEventKind::kDrop: return "drop";
    case CacheEventKind::kFailedRestore: return "failed_restore";
    case CacheEventKind::kClear: return "clear";
  }
  return "hit";
}

std::optional<CacheEventKind> ParseCacheEventKind(std::string_view name) {
  for (CacheEventKind k : {CacheEventKind::kHit, CacheEventKind::kWrite, CacheEventKind::kEviction,
                           CacheEventKind::kShed, CacheEventKind::kDrop, CacheEventKind::kFailedRestore,
                           CacheEventKind::kClear}) {
    if (name == CacheEventKindName(k)) return k;
  }
  return std::nullopt;
}

nlohmann::json JournalStats::ToJson() const {
  return {{"request_rows", request_rows},     {"cache_event_rows", cache_event_rows},
          {"shadow_rows", shadow_rows}, {"bytes_on_disk", bytes_on_disk},
          {"dropped_rows", dropped_rows},     {"failed_rows", failed_rows},
          {"committed_rows", committed_rows}, {"pruned_rows", pruned_rows},
          {"queued_rows", queued_rows},       {"schema_version", schema_version}};
}

Journal::Journal(const JournalOptions& options)
    : options_(options),
      path_(options.data_dir + "/journal.db"),
      retention_days_(options.retention_days),
      retention_rows_(options.retention_rows) {}

Result<std::unique_ptr<Journal>> Journal::Open(const JournalOptions& options) {
  if (options.data_dir.empty()) return InvalidArgument("journal: data_dir is empty");
  if (options.queue_capacity == 0 || options.max_batch_rows == 0) {
    return InvalidArgument("journal: queue_capacity and max_batch_rows must be positive");
  }
  if (!IsDirectory(options.data_dir)) RETURN_IF_ERROR(MakeDirectories(options.data_dir, 0700));
  std::unique_ptr<Journal> journal(new Journal(options));
  RETURN_IF_ERROR(journal->OpenConnections());
  {
    std::lock_guard<std::mutex> lock(journal->write_db_mu_);
    ASSIGN_OR_RETURN(int64_t pruned, journal->PruneLocked(NowMs()));
    journal->pruned_rows_ = pruned;
  }
  journal->writer_ = std::thread([j = journal.get()] { j->WriterLoop(); });
  return journal;
}

Status Journal::OpenConnections() {
  RETURN_IF_ERROR(OpenConnection(path_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                                 options_.busy_timeout_ms, &write_db_));
  {
    Statement st;
    RETURN_IF_ERROR(Statement::Prepare(write_db_, "PRAGMA journal_mode=WAL", path_, &st));
    int rc = sqlite3_step(st.get());
    if (rc != SQLITE_ROW) return SqliteError(write_db_, rc, "sqlite3_step", "PRAGMA journal_mode=WAL", path_);
    std::string mode = reinterpret_cast<const char*>(sqlite3_column_text(st.get(), 0));
    if (mode != "wal") return IoError("journal " + path_ + ": PRAGMA journal_mode=WAL answered " + mode);
  }
  RETURN_IF_ERROR(Exec(write_db_, "PRAGMA synchronous=NORMAL", path_));

  // Migrations run in one write transaction so two openers cannot both apply them.
  RETURN_IF_ERROR(Exec(write_db_, "BEGIN IMMEDIATE", path_));
  Status migrated = [&]() -> Status {
    ASSIGN_OR_RETURN(int64_t version, QueryInt(write_db_, "PRAGMA user_version", path_));
    if (version > kSchemaVersion) {
      return Unsupported("journal " + path_ + ": schema version " + std::to_string(version) +
                         " is newer than this build's " + std::to_string(kSchemaVersion));
    }
    for (int64_t v = version; v < kSchemaVersion; ++v) RETURN_IF_ERROR(Exec(write_db_, kMigrations[v], path_));
    if (version != kSchemaVersion) {
      std::string sql = "PRAGMA user_version=" + std::to_string(kSchemaVersion);
      RETURN_IF_ERROR(Exec(write_db_, sql.c_str(), path_));
    }
    return Status::Ok();
  }();
  if (!migrated.ok()) {
    (void)Exec(write_db_, "ROLLBACK", path_);
    return migrated;
  }
  RETURN_IF_ERROR(Exec(write_db_, "COMMIT", path_));

  ASSIGN_OR_RETURN(
      int64_t max_id,
      QueryInt(write_db_,
               "SELECT max(coalesce((SELECT max(id) FROM requests), 0), coalesce((SELECT max(id) FROM cache_events), 0),"
               " coalesce((SELECT max(id) FROM shadow), 0),"
               " coalesce((SELECT value FROM meta WHERE key = 'next_id') - 1, 0))",
               path_));
  next_id_ = max_id + 1;

  Statement insert_request, insert_event, insert_shadow;
  RETURN_IF_ERROR(Statement::Prepare(
      write_db_,
      "INSERT INTO requests(id, time_ms, session, model, route, status, error, prompt_tokens, cached_tokens,"
      " reread_tokens, hidden_tokens, output_tokens, cache_source, cache_tier, ttft_ms, prefill_tokens_per_s,"
      " decode_tokens_per_s, finish_reason, drafted_tokens, accepted_tokens, slot, queue_ms, queue_position, precision, image_tokens)"
      " VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
      path_, &insert_request));
  RETURN_IF_ERROR(Statement::Prepare(
      write_db_,
      "INSERT INTO cache_events(id, time_ms, kind, tier, session, tokens, bytes, ms, reason)"
      " VALUES(?,?,?,?,?,?,?,?,?)",
      path_, &insert_event));
  RETURN_IF_ERROR(Statement::Prepare(
      write_db_,
      "INSERT INTO shadow(id, time_ms, session, question, insertion_tokens, behind_tokens, lag_ms, shadow_choice,"
      " shadow_probability, main_choice, main_probability, shadow_probabilities, main_probabilities, agree, note)"
      " VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
      path_, &insert_shadow));
  insert_shadow_ = insert_shadow.Release();
  insert_request_ = insert_request.Release();
  insert_event_ = insert_event.Release();

  RETURN_IF_ERROR(OpenConnection(path_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_FULLMUTEX, options_.busy_timeout_ms,
                                 &read_db_));
  RETURN_IF_ERROR(Exec(read_db_, "PRAGMA query_only=1", path_));
  return Status::Ok();
}

Journal::~Journal() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_writer_.notify_all();
  if (writer_.joinable()) writer_.join();
  sqlite3_finalize(insert_request_);
  sqlite3_finalize(insert_event_);
  sqlite3_finalize(insert_shadow_);
  sqlite3_close(read_db_);
  sqlite3_close(write_db_);
}

void Journal::RecordRequest(RequestRow row) {
  if (row.time_ms == 0) row.time_ms = NowMs();
  Enqueue(std::move(row));
}

void Journal::RecordCacheEvent(CacheEventRow row) {
  if (row.time_ms == 0) row.time_ms = NowMs();
  Enqueue(std::move(row));
}

void Journal::RecordShadow(ShadowRow row) {
  if (row.time_ms == 0) row.time_ms = NowMs();
  Enqueue(std::move(row));
}

void Journal::Enqueue(std::variant<RequestRow, CacheEventRow, ShadowRow> row) {
  bool dropped = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (queue_.size() >= options_.queue_capacity) {
      queue_.pop_front();
      ++dropped_rows_;
      dropped = true;
    }
    queue_.push_back(Queued{next_seq_++, std::move(row)});
  }
  wake_writer_.notify_one();
  if (dropped) batch_done_.notify_all();
}

void Journal::Flush() {
  std::unique_lock<std::mutex> lock(mu_);
  uint64_t target = next_seq_ - 1;
  wake_writer_.notify_one();
  batch_done_.wait(lock, [&] {
    return (queue_.empty() || queue_.front().seq > target) && (!in_flight_ || in_flight_first_seq_ > target);
  });
}

Status Journal::last_error() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(error_, Status::Ok());
}

void Journal::KeepError(Status status) {
  ++error_count_;
  newest_error_ = status.ToString();
  if (error_.ok()) error_ = std::move(status);
}

Journal::Health Journal::health() const {
  std::lock_guard<std::mutex> lock(mu_);
  return Health{failed_rows_, dropped_rows_, error_count_, newest_error_};
}

void Journal::SetRetention(int64_t retention_days, int64_t retention_rows) {
  std::lock_guard<std::mutex> lock(mu_);
  retention_days_ = retention_days;
  retention_rows_ = retention_rows;
}

void Journal::WriterLoop() {
  using Clock = std::chrono::steady_clock;
  auto interval = std::chrono::milliseconds(std::max<int64_t>(options_.prune_interval_ms, 1));
  Clock::time_point next_prune = Clock::now() + interval;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    wake_writer_.wait_until(lock, next_prune, [&] { return stop_ || !queue_.empty(); });
    if (!queue_.empty()) {
      std::deque<Queued> batch;
      while (!queue_.empty() && batch.size() < options_.max_batch_rows) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      in_flight_ = true;
      in_flight_first_seq_ = batch.front().seq;
      lock.unlock();
      Status s;
      {
        std::lock_guard<std::mutex> db_lock(write_db_mu_);
        s = WriteBatch(batch);
      }
      lock.lock();
      in_flight_ = false;
      if (s.ok()) {
        committed_rows_ += static_cast<int64_t>(batch.size());
      } else {
        failed_rows_ += static_cast<int64_t>(batch.size());
        KeepError(std::move(s));
      }
      batch_done_.notify_all();
    } else if (stop_) {
      break;
    }
    if (Clock::now() >= next_prune) {
      lock.unlock();
      Result<int64_t> pruned = Prune();
      lock.lock();
      if (!pruned.ok()) KeepError(pruned.status());
      next_prune = Clock::now() + interval;
    }
  }
}

Status Journal::WriteBatch(std::deque<Queued>& batch) {
  int64_t first_id = next_id_;
  RETURN_IF_ERROR(Exec(write_db_, "BEGIN IMMEDIATE", path_));
  Status s = [&]() -> Status {
    for (Queued& q : batch) {
      sqlite3_stmt* st = nullptr;
      if (const RequestRow* r = std::get_if<RequestRow>(&q.row)) {
        st = insert_request_;
        sqlite3_bind_int64(st, 1, next_id_);
        sqlite3_bind_int64(st, 2, r->time_ms);
        sqlite3_bind_text(st, 3, r->session.c_str(), -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(st, 4, r->model.c_str(), -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(st, 5, r->route.c_str(), -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(st, 6, r->status);
        sqlite3_bind_text(st, 7, r->error.c_str(), -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(st, 8, r->figures.prompt_tokens);
        sqlite3_bind_int64(st, 9, r->figures.cached_tokens);
        sqlite3_bind_int64(st, 10, r->figures.reread_tokens);
        sqlite3_bind_int64(st, 11, r->hidden_tokens);
        sqlite3_bind_int64(st, 12, r->figures.completion_tokens);
        sqlite3_bind_text(st, 13, r->figures.cache_source.c_str(), -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(st, 14, r->cache_tier.c_str(), -1, SQLITE_TRANSIENT);
        sqlite3_bind_double(st, 15, r->figures.ttft_ms);
        sqlite3_bind_double(st, 16, r->figures.prefill_tokens_per_s());
        sqlite3_bind_double(st, 17, r->figures.decode_tokens_per_s);
        sqlite3_bind_text(st, 18, r->finish_reason.c_str(), -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(st, 19, r->figures.drafted_tokens);
        sqlite3_bind_int64(st, 20, r->figures.accepted_tokens);
        sqlite3_bind_int64(st, 21, r->slot);
        sqlite3_bind_double(st, 22, r->figures.queue_ms);
        sqlite3_bind_int64(st, 23, r->figures.queue_position);
        sqlite3_bind_text(st, 24, r->precision.c_str(), -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(st, 25, r->figures.image_tokens);
      } else if (const ShadowRow* r = std::get_if<ShadowRow>(&q.row)) {
        st = insert_shadow_;
        auto text_or_null = [&](int i, const std::optional<std::string>& v) {
          if (v) sqlite3_bind_text(st, i, v->c_str(), -1, SQLITE_TRANSIENT);
          else sqlite3_bind_null(st, i);
        };
        auto real_or_null = [&](int i, const std::optional<double>& v) {
          if (v) sqlite3_bind_double(st, i, *v);
          else sqlite3_bind_null(st, i);
        };
        sqlite3_bind_int64(st, 1, next_id_);
        sqlite3_bind_int64(st, 2, r->time_ms);
        sqlite3_bind_text(st, 3, r->session.c_str(), -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(st, 4, r->question.c_str(), -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(st, 5, r->insertion_tokens);
        sqlite3_bind_int64(st, 6, r->behind_tokens);
        sqlite3_bind_double(st, 7, r->lag_ms);
        text_or_null(8, r->shadow_choice);
        real_or_null(9, r->shadow_probability);
        text_or_null(10, r->main_choice);
        real_or_null(11, r->main_probability);
        auto list_or_null = [&](int i, const std::vector<double>& v) {
          if (v.empty()) return sqlite3_bind_null(st, i);
          return sqlite3_bind_text(st, i, nlohmann::json(v).dump().c_str(), -1, SQLITE_TRANSIENT);
        };
        list_or_null(12, r->shadow_probabilities);
        list_or_null(13, r->main_probabilities);
        if (r->agree) sqlite3_bind_int64(st, 14, *r->agree ? 1 : 0);
        else sqlite3_bind_null(st, 14);
        sqlite3_bind_text(st, 15, r->note.c_str(), -1, SQLITE_TRANSIENT);
      } else {
        const CacheEventRow& e = std::get<CacheEventRow>(q.row);
        st = insert_event_;
        sqlite3_bind_int64(st, 1, next_id_);
        sqlite3_bind_int64(st, 2, e.time_ms);
        sqlite3_bind_text(st, 3, CacheEventKindName(e.kind), -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 4, e.tier.c_str(), -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(st, 5, e.session.c_str(), -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(st, 6, e.tokens);
        sqlite3_bind_int64(st, 7, e.bytes);
        sqlite3_bind_double(st, 8, e.ms);
        sqlite3_bind_text(st, 9, e.reason.c_str(), -1, SQLITE_TRANSIENT);
      }
      int rc = sqlite3_step(st);
      sqlite3_reset(st);
      sqlite3_clear_bindings(st);
      if (rc != SQLITE_DONE) {
        return SqliteError(write_db_, rc, "sqlite3_step",
                           st == insert_request_ ? "INSERT INTO requests" : st == insert_shadow_ ? "INSERT INTO shadow" : "INSERT INTO cache_events", path_);
      }
      ++next_id_;
    }
    std::string meta = "INSERT OR REPLACE INTO meta(key, value) VALUES('next_id', " + std::to_string(next_id_) + ")";
    RETURN_IF_ERROR(Exec(write_db_, meta.c_str(), path_));
    return Exec(write_db_, "COMMIT", path_);
  }();
  if (!s.ok()) {
    if (!sqlite3_get_autocommit(write_db_)) (void)Exec(write_db_, "ROLLBACK", path_);
    next_id_ = first_id;
  }
  return s;
}

Result<int64_t> Journal::Prune() {
  std::lock_guard<std::mutex> lock(write_db_mu_);
  ASSIGN_OR_RETURN(int64_t pruned, PruneLocked(NowMs()));
  std::lock_guard<std::mutex> stats_lock(mu_);
  pruned_rows_ += pruned;
  return pruned;
}

Result<int64_t> Journal::PruneLocked(int64_t now_ms) {
  int64_t days, rows;
  {
    std::lock_guard<std::mutex> lock(mu_);
    days = retention_days_;
    rows = retention_rows_;
  }
  if (days <= 0 && rows <= 0) return int64_t{0};
  RETURN_IF_ERROR(Exec(write_db_, "BEGIN IMMEDIATE", path_));
  int64_t deleted = 0;
  Status s = [&]() -> Status {
    for (const char* table : kTables) {
      if (days > 0) {
        std::string sql = std::string("DELETE FROM ") + table + " WHERE time_ms < " + std::to_string(now_ms - days * kMsPerDay);
        RETURN_IF_ERROR(Exec(write_db_, sql.c_str(), path_));
        deleted += sqlite3_changes(write_db_);
      }
      if (rows > 0) {
        std::string sql = std::string("DELETE FROM ") + table + " WHERE id <= (SELECT id FROM " + table +
                          " ORDER BY id DESC LIMIT 1 OFFSET " + std::to_string(rows) + ")";
        RETURN_IF_ERROR(Exec(write_db_, sql.c_str(), path_));
        deleted += sqlite3_changes(write_db_);
      }
    }
    return Exec(write_db_, "COMMIT", path_);
  }();
  if (!s.ok()) {
    if (!sqlite3_get_autocommit(write_db_)) (void)Exec(write_db_, "ROLLBACK", path_);
    return s;
  }
  return deleted;
}

Result<QueryPage> Journal::Query(const JournalQuery& query) const {
  if (query.limit < 1 || query.limit > kMaxQueryLimit) {
    return InvalidArgument("journal query: limit " + std::to_string(query.limit) + " is outside 1.." +
                           std::to_string(kMaxQueryLimit));
  }
  if (query.offset < 0 || query.offset > kMaxQueryOffset) {
    return InvalidArgument("journal query: offset " + std::to_string(query.offset) + " is outside 0.." +
                           std::to_string(kMaxQueryOffset) + "; page further with before_id");
  }

  TableFilter requests{"requests", "request", "", {}};
  TableFilter events{"cache_events", "cache_event", "", {}};
  TableFilter shadow{"shadow", "shadow", "", {}};
  bool want_requests = query.kind.empty() || query.kind == "request";
  bool want_events = query.kind.empty() || query.kind == "cache_event";
  // Shadow rows belong to no cache tier: a tier filter leaves them out.
  bool want_shadow = (query.kind.empty() && query.tier.empty()) || query.kind == "shadow";
  if (!want_requests && !want_events && !want_shadow) {
    if (!ParseCacheEventKind(query.kind)) {
      return InvalidArgument("journal query: unknown kind '" + query.kind +
                             "' (request, cache_event, shadow, hit, write, eviction, shed, drop, failed_restore, clear)");
    }
    want_events = true;
    events.Add("kind = ?");
    events.binds.push_back(query.kind);
  }
  if (!query.tier.empty()) {
    requests.Add("cache_tier = ?");
    requests.binds.push_back(query.tier);
    events.Add("tier = ?");
    events.binds.push_back(query.tier);
  }
  for (TableFilter* f : {&requests, &events, &shadow}) {
    if (!query.session.empty()) {
      f->Add("session = ?");
      f->binds.push_back(query.session);
    }
    if (query.from_ms) {
      f->Add("time_ms >= ?");
      f->binds.push_back(*query.from_ms);
    }
    if (query.to_ms) {
      f->Add("time_ms <= ?");
      f->binds.push_back(*query.to_ms);
    }
  }
  if (!query.text.empty()) {
    // A named parameter takes one index however often it appears.
    requests.Add("(instr(lower(error), lower(:text)) > 0 OR instr(lower(session), lower(:text)) > 0 OR"
                 " instr(lower(model), lower(:text)) > 0)");
    requests.binds.push_back(query.text);
    events.Add("(instr(lower(reason), lower(:text)) > 0 OR instr(lower(session), lower(:text)) > 0)");
    events.binds.push_back(query.text);
    shadow.Add("(instr(lower(note), lower(:text)) > 0 OR instr(lower(session), lower(:text)) > 0)");
    shadow.binds.push_back(query.text);
  }

  std::lock_guard<std::mutex> lock(read_db_mu_);
  RETURN_IF_ERROR(Exec(read_db_, "BEGIN", path_));
  Result<QueryPage> page = [&]() -> Result<QueryPage> {
    QueryPage out;
    std::vector<std::pair<int64_t, nlohmann::json>> merged;
    int64_t fetch = query.offset + query.limit + 1;
    for (TableFilter* f : {&requests, &events, &shadow}) {
      if ((f == &requests && !want_requests) || (f == &events && !want_events) || (f == &shadow && !want_shadow)) continue;
      std::string where = f->where;
      std::vector<Binding> binds = f->binds;
      Statement count;
      RETURN_IF_ERROR(Statement::Prepare(read_db_, std::string("SELECT count(*) FROM ") + f->table + where, path_, &count));
      RETURN_IF_ERROR(Bind(read_db_, count.get(), binds, path_));
      int rc = sqlite3_step(count.get());
      if (rc != SQLITE_ROW) return SqliteError(read_db_, rc, "sqlite3_step", "count", path_);
      out.total += sqlite3_column_int64(count.get(), 0);

      std::string page_where = where;
      std::vector<Binding> page_binds = binds;
      if (query.before_id) {
        page_where += (page_where.empty() ? " WHERE " : " AND ") + std::string("id < ?");
        page_binds.push_back(*query.before_id);
      }
      Statement rows;
      RETURN_IF_ERROR(Statement::Prepare(read_db_,
                                         std::string("SELECT * FROM ") + f->table + page_where +
                                             " ORDER BY id DESC LIMIT " + std::to_string(fetch),
                                         path_, &rows));
      RETURN_IF_ERROR(Bind(read_db_, rows.get(), page_binds, path_));
      while ((rc = sqlite3_step(rows.get())) == SQLITE_ROW) {
        merged.emplace_back(sqlite3_column_int64(rows.get(), 0), ColumnsToJson(rows.get(), f->type));
      }
      if (rc != SQLITE_DONE) return SqliteError(read_db_, rc, "sqlite3_step", "rows", path_);
    }
    std::sort(merged.begin(), merged.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    size_t begin = std::min(merged.size(), static_cast<size_t>(query.offset));
    size_t end = std::min(merged.size(), static_cast<size_t>(query.offset + query.limit));
    for (size_t i = begin; i < end; ++i) out.rows.push_back(std::move(merged[i].second));
    if (merged.size() > end && end > begin) out.next_cursor = merged[end - 1].first;
    return out;
  }();
  (void)Exec(read_db_, "COMMIT", path_);
  return page;
}

Result<JournalStats> Journal::Stats() const {
  JournalStats stats;
  {
    std::lock_guard<std::mutex> lock(read_db_mu_);
    RETURN_IF_ERROR(Exec(read_db_, "BEGIN", path_));
    Status s = [&]() -> Status {
      ASSIGN_OR_RETURN(stats.request_rows, QueryInt(read_db_, "SELECT count(*) FROM requests", path_));
      ASSIGN_OR_RETURN(stats.cache_event_rows, QueryInt(read_db_, "SELECT count(*) FROM cache_events", path_));
      ASSIGN_OR_RETURN(stats.shadow_rows, QueryInt(read_db_, "SELECT count(*) FROM shadow", path_));
      ASSIGN_OR_RETURN(int64_t version, QueryInt(read_db_, "PRAGMA user_version", path_));
      stats.schema_version = static_cast<int>(version);
      return Status::Ok();
    }();
    (void)Exec(read_db_, "COMMIT", path_);
    RETURN_IF_ERROR(s);
  }
  for (const char* suffix : {"", "-wal", "-shm"}) {
    std::error_code ec;
    auto size = std::filesystem::file_size(path_ + suffix, ec);
    if (!ec) stats.bytes_on_disk += static_cast<int64_t>(size);
  }
  std::lock_guard<std::mutex> lock(mu_);
  stats.dropped_rows = dropped_rows_;
  stats.failed_rows = failed_rows_;
  stats.committed_rows = committed_rows_;
  stats.pruned_rows = pruned_rows_;
  stats.queued_rows = static_cast<int64_t>(queue_.size());
  return stats;
}

Result<std::string> Journal::IntegrityCheck() const {
  std::lock_guard<std::mutex> lock(read_db_mu_);
  Statement st;
  RETURN_IF_ERROR(Statement::Prepare(read_db_, "PRAGMA integrity_check", path_, &st));
  std::string answer;
  int rc;
  while ((rc = sqlite3_step(st.get())) == SQLITE_ROW) {
    if (!answer.empty()) answer += "\n";
    answer += reinterpret_cast<const char*>(sqlite3_column_text(st.get(), 0));
  }
  if (rc != SQLITE_DONE) return SqliteError(read_db_, rc, "sqlite3_step", "PRAGMA integrity_check", path_);
  return answer;
}

}  // namespace anchorage
