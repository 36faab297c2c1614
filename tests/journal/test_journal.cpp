// The journal: rows round-trip, filters and paging, retention, bounded queue, background errors, SIGKILL.
#include <QtTest>

#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "engine/journal/journal.h"

using namespace anchorage;

namespace {

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::unique_ptr<Journal> OpenOrFail(const JournalOptions& options) {
  Result<std::unique_ptr<Journal>> j = Journal::Open(options);
  if (!j.ok()) qFatal("Journal::Open: %s", j.status().ToString().c_str());
  return std::move(j).value();
}

std::vector<int64_t> Ids(const QueryPage& page) {
  std::vector<int64_t> ids;
  for (const auto& row : page.rows) ids.push_back(row["id"].get<int64_t>());
  return ids;
}

std::vector<int64_t> QueryIds(Journal& j, const JournalQuery& q) {
  Result<QueryPage> page = j.Query(q);
  if (!page.ok()) qFatal("Query: %s", page.status().ToString().c_str());
  return Ids(*page);
}

RequestRow Request(int64_t time_ms, std::string session, std::string model, std::string tier, std::string error = "") {
  RequestRow r;
  r.time_ms = time_ms;
  r.session = std::move(session);
  r.model = std::move(model);
  r.route = "/v1/chat/completions";
  r.cache_tier = std::move(tier);
  r.error = std::move(error);
  r.status = r.error.empty() ? 200 : 500;
  return r;
}

CacheEventRow Event(int64_t time_ms, CacheEventKind kind, std::string tier, std::string session,
                    std::string reason = "") {
  CacheEventRow e;
  e.time_ms = time_ms;
  e.kind = kind;
  e.tier = std::move(tier);
  e.session = std::move(session);
  e.reason = std::move(reason);
  return e;
}

int64_t SqlInt(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr);
  sqlite3_stmt* st = nullptr;
  int64_t v = -1;
  if (sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW) {
    v = sqlite3_column_int64(st, 0);
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  return v;
}

// A second connection that holds the database's write lock until Release().
class WriteLockHolder {
 public:
  explicit WriteLockHolder(const std::string& path) {
    sqlite3_open_v2(path.c_str(), &db_, SQLITE_OPEN_READWRITE, nullptr);
    rc_ = sqlite3_exec(db_, "BEGIN EXCLUSIVE", nullptr, nullptr, nullptr);
  }
  ~WriteLockHolder() {
    Release();
    sqlite3_close(db_);
  }
  bool locked() const { return rc_ == SQLITE_OK; }
  void Release() {
    if (rc_ == SQLITE_OK) sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr);
    rc_ = -1;
  }

 private:
  sqlite3* db_ = nullptr;
  int rc_ = -1;
};

// The crash child: commits batches of 25 requests and reports each committed total on fd; never returns.
[[noreturn]] void CrashChild(const std::string& dir, int fd) {
  JournalOptions o;
  o.data_dir = dir;
  o.max_batch_rows = 25;
  Result<std::unique_ptr<Journal>> j = Journal::Open(o);
  if (!j.ok()) _exit(3);
  int64_t committed = 0;
  for (int64_t batch = 0;; ++batch) {
    for (int i = 0; i < 25; ++i) {
      RequestRow r = Request(0, "crash", "m", "none", std::string(200, 'x'));
      r.figures.prompt_tokens = committed + i + 1;
      (*j)->RecordRequest(std::move(r));
    }
    (*j)->Flush();
    if (!(*j)->last_error().ok()) _exit(4);
    committed += 25;
    if (::write(fd, &committed, sizeof committed) != sizeof committed) _exit(5);
  }
}

constexpr const char* kCrashDirEnv = "ANCHORAGE_JOURNAL_CRASH_DIR";
constexpr const char* kCrashFdEnv = "ANCHORAGE_JOURNAL_CRASH_FD";

// Runs before main: a process started with kCrashDirEnv is the crash child and never returns.
const bool kIsCrashChild = [] {
  const char* dir = std::getenv(kCrashDirEnv);
  const char* fd = std::getenv(kCrashFdEnv);
  if (dir == nullptr || fd == nullptr) return false;
  CrashChild(dir, std::atoi(fd));
}();

}  // namespace

class TestJournal : public QObject {
  Q_OBJECT

  JournalOptions Options(const QTemporaryDir& dir) {
    JournalOptions o;
    o.data_dir = dir.path().toStdString() + "/journal";
    return o;
  }

 private slots:
  void everyRowKindRoundTrips() {
    QTemporaryDir dir;
    auto j = OpenOrFail(Options(dir));
    RequestRow r;
    r.time_ms = 1700000000123;
    r.session = "s-1";
    r.model = "qwen3.5-tiny";
    r.route = "/v1/chat/completions";
    r.status = 503;
    r.error = "prefill does not fit";
    r.figures.prompt_tokens = 1000;
    r.figures.cached_tokens = 900;
    r.figures.reread_tokens = 64;
    r.hidden_tokens = 12;
    r.figures.completion_tokens = 7;
    r.figures.cache_source = "anchor";
    r.cache_tier = "resident";
    r.figures.ttft_ms = 12.5;
    r.figures.prefill_ms = 32;  // 64 tokens: 2,000 a second
    r.figures.decode_tokens_per_s = 40.5;
    r.figures.drafted_tokens = 12;
    r.figures.accepted_tokens = 9;
    r.finish_reason = "length";
    r.slot = 2;
    r.figures.queue_ms = 31.5;
    r.figures.queue_position = 3;
    r.figures.image_tokens = 196;
    r.precision = "fast";
    j->RecordRequest(r);
    const std::vector<CacheEventKind> kinds = {CacheEventKind::kHit,  CacheEventKind::kWrite,
                                               CacheEventKind::kEviction, CacheEventKind::kShed,
                                               CacheEventKind::kDrop, CacheEventKind::kFailedRestore,
                                               CacheEventKind::kClear};
    for (size_t i = 0; i < kinds.size(); ++i) {
      CacheEventRow e = Event(1700000000200 + static_cast<int64_t>(i), kinds[i], "disk", "s-1", "why " + std::to_string(i));
      e.tokens = 1024 * static_cast<int64_t>(i + 1);
      e.bytes = 4096 * static_cast<int64_t>(i + 1);
      e.ms = 0.25 * static_cast<double>(i + 1);
      j->RecordCacheEvent(e);
    }
    j->Flush();
    QVERIFY(j->last_error().ok());

    JournalQuery q;
    Result<QueryPage> page = j->Query(q);
    QVERIFY2(page.ok(), page.status().ToString().c_str());
    QCOMPARE(page->total, int64_t{8});
    QCOMPARE(Ids(*page), (std::vector<int64_t>{8, 7, 6, 5, 4, 3, 2, 1}));
    QVERIFY(!page->next_cursor.has_value());

    const nlohmann::json& req = page->rows[7];
    QCOMPARE(req["type"].get<std::string>(), std::string("request"));
    QCOMPARE(req["time_ms"].get<int64_t>(), r.time_ms);
    QCOMPARE(req["session"].get<std::string>(), r.session);
    QCOMPARE(req["model"].get<std::string>(), r.model);
    QCOMPARE(req["route"].get<std::string>(), r.route);
    QCOMPARE(req["status"].get<int>(), 503);
    QCOMPARE(req["error"].get<std::string>(), r.error);
    QCOMPARE(req["prompt_tokens"].get<int64_t>(), int64_t{1000});
    QCOMPARE(req["cached_tokens"].get<int64_t>(), int64_t{900});
    QCOMPARE(req["reread_tokens"].get<int64_t>(), int64_t{64});
    QCOMPARE(req["hidden_tokens"].get<int64_t>(), int64_t{12});
    QCOMPARE(req["output_tokens"].get<int64_t>(), int64_t{7});
    QCOMPARE(req["cache_source"].get<std::string>(), std::string("anchor"));
    QCOMPARE(req["cache_tier"].get<std::string>(), std::string("resident"));
    QCOMPARE(req["ttft_ms"].get<double>(), 12.5);
    QCOMPARE(req["prefill_tokens_per_s"].get<double>(), 2000.0);
    QCOMPARE(req["decode_tokens_per_s"].get<double>(), 40.5);
    QCOMPARE(req["finish_reason"].get<std::string>(), std::string("length"));
    QCOMPARE(req["drafted_tokens"].get<int64_t>(), int64_t{12});
    QCOMPARE(req["accepted_tokens"].get<int64_t>(), int64_t{9});
    QCOMPARE(req["slot"].get<int>(), 2);
    QCOMPARE(req["queue_ms"].get<double>(), 31.5);
    QCOMPARE(req["queue_position"].get<int>(), 3);
    QCOMPARE(req["precision"].get<std::string>(), std::string("fast"));
    QCOMPARE(req["image_tokens"].get<int64_t>(), int64_t{196});
    QCOMPARE(req.size(), size_t{26});  // 25 columns, id included, plus "type"

    for (size_t i = 0; i < kinds.size(); ++i) {
      const nlohmann::json& e = page->rows[6 - i];
      QCOMPARE(e["id"].get<int64_t>(), static_cast<int64_t>(i + 2));
      QCOMPARE(e["type"].get<std::string>(), std::string("cache_event"));
      QCOMPARE(e["kind"].get<std::string>(), std::string(CacheEventKindName(kinds[i])));
      QCOMPARE(e["time_ms"].get<int64_t>(), 1700000000200 + static_cast<int64_t>(i));
      QCOMPARE(e["tier"].get<std::string>(), std::string("disk"));
      QCOMPARE(e["session"].get<std::string>(), std::string("s-1"));
      QCOMPARE(e["tokens"].get<int64_t>(), 1024 * static_cast<int64_t>(i + 1));
      QCOMPARE(e["bytes"].get<int64_t>(), 4096 * static_cast<int64_t>(i + 1));
      QCOMPARE(e["ms"].get<double>(), 0.25 * static_cast<double>(i + 1));
      QCOMPARE(e["reason"].get<std::string>(), "why " + std::to_string(i));
      QCOMPARE(ParseCacheEventKind(CacheEventKindName(kinds[i])), std::optional<CacheEventKind>(kinds[i]));
    }

    Result<JournalStats> stats = j->Stats();
    QVERIFY(stats.ok());
    QCOMPARE(stats->request_rows, int64_t{1});
    QCOMPARE(stats->cache_event_rows, int64_t{7});
    QCOMPARE(stats->committed_rows, int64_t{8});
    QCOMPARE(stats->dropped_rows, int64_t{0});
    QCOMPARE(stats->schema_version, Journal::kSchemaVersion);
    QVERIFY(stats->bytes_on_disk > 0);
    QCOMPARE(SqlInt(j->path(), "PRAGMA user_version"), int64_t{Journal::kSchemaVersion});
    QCOMPARE(SqlInt(j->path(), "SELECT count(*) FROM shadow"), int64_t{0});

    ShadowRow shadow;
    shadow.time_ms = 1700000000300;
    shadow.session = "s-1";
    shadow.question = "what?";
    shadow.insertion_tokens = 9000;
    shadow.behind_tokens = 300;
    shadow.lag_ms = 41.5;
    shadow.shadow_choice = "code";
    shadow.shadow_probability = 0.75;
    shadow.note = "the main model did not answer";
    j->RecordShadow(shadow);
    j->Flush();
    JournalQuery only_shadow;
    only_shadow.kind = "shadow";
    Result<QueryPage> shadow_page = j->Query(only_shadow);
    QVERIFY(shadow_page.ok());
    QCOMPARE(shadow_page->rows.size(), size_t{1});
    const nlohmann::json& row = shadow_page->rows[0];
    QCOMPARE(row["id"].get<int64_t>(), int64_t{9});  // ids are shared with the other tables
    QCOMPARE(row["type"].get<std::string>(), std::string("shadow"));
    QCOMPARE(row["insertion_tokens"].get<int64_t>(), int64_t{9000});
    QCOMPARE(row["shadow_choice"].get<std::string>(), std::string("code"));
    QCOMPARE(row["shadow_probability"].get<double>(), 0.75);
    QVERIFY(row["main_choice"].is_null());
    QVERIFY(row["agree"].is_null());
    QCOMPARE(j->Stats()->shadow_rows, int64_t{1});
  }

  void timeZeroMeansNow() {
    QTemporaryDir dir;
    auto j = OpenOrFail(Options(dir));
    int64_t before = NowMs();
    j->RecordRequest(Request(0, "s", "m", "none"));
    j->Flush();
    int64_t after = NowMs();
    Result<QueryPage> page = j->Query({});
    QVERIFY(page.ok());
    int64_t t = page->rows[0]["time_ms"].get<int64_t>();
    QVERIFY(t >= before && t <= after);
  }

  void filtersAndPagingReturnExactRows() {
    QTemporaryDir dir;
    auto j = OpenOrFail(Options(dir));
    // ids 1..10 in this order.
    j->RecordRequest(Request(1000, "alpha", "qwen-a", "resident"));                        // 1
    j->RecordCacheEvent(Event(1100, CacheEventKind::kHit, "disk", "alpha"));               // 2
    j->RecordRequest(Request(1200, "beta", "qwen-b", "disk", "Disk read failed"));         // 3
    j->RecordCacheEvent(Event(1300, CacheEventKind::kEviction, "resident", "beta", "budget"));  // 4
    j->RecordCacheEvent(Event(1400, CacheEventKind::kHit, "resident", "alpha"));           // 5
    j->RecordRequest(Request(1500, "gamma", "qwen-a", "none"));                            // 6
    j->RecordCacheEvent(Event(1600, CacheEventKind::kFailedRestore, "disk", "gamma", "crc mismatch"));  // 7
    j->RecordCacheEvent(Event(1700, CacheEventKind::kWrite, "disk", "beta"));              // 8
    j->RecordRequest(Request(1800, "alpha", "qwen-b", "disk"));                            // 9
    j->RecordCacheEvent(Event(1900, CacheEventKind::kShed, "state_store", "", "memory ceiling"));  // 10
    j->Flush();
    QVERIFY(j->last_error().ok());

    using V = std::vector<int64_t>;
    JournalQuery q;
    q.kind = "request";
    QCOMPARE(QueryIds(*j, q), (V{9, 6, 3, 1}));
    q.kind = "cache_event";
    QCOMPARE(QueryIds(*j, q), (V{10, 8, 7, 5, 4, 2}));
    q.kind = "hit";
    QCOMPARE(QueryIds(*j, q), (V{5, 2}));
    q.kind = "failed_restore";
    QCOMPARE(QueryIds(*j, q), (V{7}));
    q = {};
    q.tier = "disk";
    QCOMPARE(QueryIds(*j, q), (V{9, 8, 7, 3, 2}));
    q.kind = "request";
    QCOMPARE(QueryIds(*j, q), (V{9, 3}));
    q = {};
    q.session = "alpha";
    QCOMPARE(QueryIds(*j, q), (V{9, 5, 2, 1}));
    q = {};
    q.from_ms = 1200;
    q.to_ms = 1600;
    QCOMPARE(QueryIds(*j, q), (V{7, 6, 5, 4, 3}));
    q.session = "beta";
    QCOMPARE(QueryIds(*j, q), (V{4, 3}));
    q = {};
    q.text = "disk READ";  // error, case-insensitive
    QCOMPARE(QueryIds(*j, q), (V{3}));
    q.text = "crc";  // reason
    QCOMPARE(QueryIds(*j, q), (V{7}));
    q.text = "qwen-b";  // model
    QCOMPARE(QueryIds(*j, q), (V{9, 3}));
    q.text = "amm";  // session "gamma"
    QCOMPARE(QueryIds(*j, q), (V{7, 6}));
    q.text = "memory";
    q.kind = "shed";
    QCOMPARE(QueryIds(*j, q), (V{10}));
    q = {};
    q.text = "ALPHA";  // with a kind, a tier and a cursor: the parameters bind in order
    q.before_id = 9;
    QCOMPARE(QueryIds(*j, q), (V{5, 2, 1}));
    q.kind = "hit";
    q.tier = "disk";
    QCOMPARE(QueryIds(*j, q), (V{2}));

    // Cursor paging walks every row once, newest first.
    q = {};
    q.limit = 4;
    Result<QueryPage> p1 = j->Query(q);
    QVERIFY(p1.ok());
    QCOMPARE(Ids(*p1), (V{10, 9, 8, 7}));
    QCOMPARE(p1->total, int64_t{10});
    QCOMPARE(p1->next_cursor, std::optional<int64_t>(7));
    q.before_id = *p1->next_cursor;
    Result<QueryPage> p2 = j->Query(q);
    QCOMPARE(Ids(*p2), (V{6, 5, 4, 3}));
    QCOMPARE(p2->total, int64_t{10});
    QCOMPARE(p2->next_cursor, std::optional<int64_t>(3));
    q.before_id = *p2->next_cursor;
    Result<QueryPage> p3 = j->Query(q);
    QCOMPARE(Ids(*p3), (V{2, 1}));
    QVERIFY(!p3->next_cursor.has_value());

    // Offset paging, with a filter and a cursor together.
    q = {};
    q.kind = "cache_event";
    q.limit = 2;
    q.offset = 2;
    Result<QueryPage> p4 = j->Query(q);
    QCOMPARE(Ids(*p4), (V{7, 5}));
    QCOMPARE(p4->total, int64_t{6});
    QCOMPARE(p4->next_cursor, std::optional<int64_t>(5));
    q.offset = 1;
    q.before_id = 8;
    QCOMPARE(QueryIds(*j, q), (V{5, 4}));
    q.offset = 6;
    q.before_id.reset();
    Result<QueryPage> empty = j->Query(q);
    QVERIFY(empty->rows.empty());
    QVERIFY(!empty->next_cursor.has_value());

    q = {};
    q.kind = "evicted";
    Result<QueryPage> bad = j->Query(q);
    QVERIFY(!bad.ok());
    QCOMPARE(bad.status().code(), StatusCode::kInvalidArgument);
    QVERIFY(bad.status().message().find("evicted") != std::string::npos);
    q = {};
    q.limit = 0;
    QCOMPARE(j->Query(q).status().code(), StatusCode::kInvalidArgument);
    q.limit = 10;
    q.offset = -1;
    QCOMPARE(j->Query(q).status().code(), StatusCode::kInvalidArgument);
  }

  void concurrentRecordersLoseNothing() {
    QTemporaryDir dir;
    JournalOptions o = Options(dir);
    o.max_batch_rows = 64;
    auto j = OpenOrFail(o);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&j, t] {
        std::string session = std::to_string(t);
        session.insert(session.begin(), 't');
        for (int i = 0; i < 500; ++i) {
          if (i % 2 == 0) {
            j->RecordRequest(Request(1000 + i, session, "m", "none"));
          } else {
            j->RecordCacheEvent(Event(1000 + i, CacheEventKind::kWrite, "disk", session));
          }
        }
      });
    }
    for (std::thread& t : threads) t.join();
    j->Flush();
    QVERIFY(j->last_error().ok());
    Result<JournalStats> stats = j->Stats();
    QCOMPARE(stats->request_rows, int64_t{1000});
    QCOMPARE(stats->cache_event_rows, int64_t{1000});
    QCOMPARE(stats->committed_rows, int64_t{2000});
    JournalQuery q;
    q.session = "t2";
    QCOMPARE(j->Query(q)->total, int64_t{500});
    // Ids 1..2000, each used once across both tables.
    QCOMPARE(SqlInt(j->path(), "SELECT count(*) FROM (SELECT id FROM requests UNION SELECT id FROM cache_events)"),
             int64_t{2000});
    QCOMPARE(SqlInt(j->path(), "SELECT max(id) FROM (SELECT id FROM requests UNION SELECT id FROM cache_events)"),
             int64_t{2000});
  }

  void retentionByAge() {
    QTemporaryDir dir;
    JournalOptions o = Options(dir);
    o.retention_days = 0;
    o.retention_rows = 0;
    auto j = OpenOrFail(o);
    int64_t now = NowMs();
    const int64_t day = 86400000;
    j->RecordRequest(Request(now - 40 * day, "old", "m", "none"));              // 1
    j->RecordCacheEvent(Event(now - 31 * day, CacheEventKind::kHit, "disk", "old"));  // 2
    j->RecordRequest(Request(now - 29 * day, "kept", "m", "none"));             // 3
    j->RecordCacheEvent(Event(now - 1 * day, CacheEventKind::kWrite, "disk", "kept"));  // 4
    j->RecordRequest(Request(now, "kept", "m", "none"));                        // 5
    j->Flush();
    Result<int64_t> none = j->Prune();
    QVERIFY(none.ok());
    QCOMPARE(*none, int64_t{0});  // both limits off
    j->SetRetention(30, 0);
    Result<int64_t> pruned = j->Prune();
    QVERIFY2(pruned.ok(), pruned.status().ToString().c_str());
    QCOMPARE(*pruned, int64_t{2});
    QCOMPARE(QueryIds(*j, {}), (std::vector<int64_t>{5, 4, 3}));
    QCOMPARE(j->Stats()->pruned_rows, int64_t{2});
  }

  void retentionByRowsPerTable() {
    QTemporaryDir dir;
    JournalOptions o = Options(dir);
    o.retention_days = 0;
    o.retention_rows = 3;
    auto j = OpenOrFail(o);
    for (int i = 0; i < 6; ++i) j->RecordRequest(Request(1000 + i, "s", "m", "none"));                    // 1..6
    for (int i = 0; i < 2; ++i) j->RecordCacheEvent(Event(2000 + i, CacheEventKind::kHit, "disk", "s"));  // 7, 8
    j->Flush();
    Result<int64_t> pruned = j->Prune();
    QVERIFY(pruned.ok());
    QCOMPARE(*pruned, int64_t{3});
    QCOMPARE(QueryIds(*j, {}), (std::vector<int64_t>{8, 7, 6, 5, 4}));
  }

  void writerPrunesPeriodically() {
    QTemporaryDir dir;
    JournalOptions o = Options(dir);
    o.retention_days = 0;
    o.retention_rows = 2;
    o.prune_interval_ms = 20;
    auto j = OpenOrFail(o);
    for (int i = 0; i < 7; ++i) j->RecordRequest(Request(1000 + i, "s", "m", "none"));
    j->Flush();
    QTRY_COMPARE_WITH_TIMEOUT(j->Stats()->request_rows, int64_t{2}, 5000);
    QCOMPARE(QueryIds(*j, {}), (std::vector<int64_t>{7, 6}));
    QVERIFY(j->last_error().ok());
  }

  void retentionAppliesAtOpen() {
    QTemporaryDir dir;
    JournalOptions o = Options(dir);
    o.retention_days = 0;
    o.retention_rows = 0;
    {
      auto j = OpenOrFail(o);
      for (int i = 0; i < 5; ++i) j->RecordRequest(Request(1000 + i, "s", "m", "none"));
    }  // the destructor commits what was queued
    o.retention_rows = 2;
    auto j = OpenOrFail(o);
    QCOMPARE(QueryIds(*j, {}), (std::vector<int64_t>{5, 4}));
    // Ids continue after reopening and never reuse a pruned id.
    j->RecordRequest(Request(2000, "s", "m", "none"));
    j->Flush();
    QCOMPARE(QueryIds(*j, {})[0], int64_t{6});
  }

  void fullQueueDropsOldestAndCounts() {
    QTemporaryDir dir;
    JournalOptions o = Options(dir);
    o.queue_capacity = 4;
    o.busy_timeout_ms = 10000;
    auto j = OpenOrFail(o);
    WriteLockHolder lock(j->path());
    QVERIFY(lock.locked());
    RequestRow first = Request(1000, "s", "m", "none");
    first.route = "r0";
    j->RecordRequest(first);
    // The writer has taken r0 and waits for the lock; the next rows stay queued.
    QTRY_COMPARE_WITH_TIMEOUT(j->Stats()->queued_rows, int64_t{0}, 5000);
    for (int i = 1; i <= 10; ++i) {
      RequestRow r = Request(1000 + i, "s", "m", "none");
      r.route = std::to_string(i);
      r.route.insert(r.route.begin(), 'r');
      j->RecordRequest(r);
    }
    Result<JournalStats> during = j->Stats();
    QCOMPARE(during->queued_rows, int64_t{4});
    QCOMPARE(during->dropped_rows, int64_t{6});
    lock.Release();
    j->Flush();
    QVERIFY(j->last_error().ok());
    Result<QueryPage> page = j->Query({});
    std::vector<std::string> routes;
    for (const auto& row : page->rows) routes.push_back(row["route"].get<std::string>());
    QCOMPARE(routes, (std::vector<std::string>{"r10", "r9", "r8", "r7", "r0"}));
    QCOMPARE(j->Stats()->dropped_rows, int64_t{6});
    QCOMPARE(j->Stats()->committed_rows, int64_t{5});
  }

  void backgroundErrorSurfacesOnce() {
    QTemporaryDir dir;
    JournalOptions o = Options(dir);
    o.busy_timeout_ms = 50;
    auto j = OpenOrFail(o);
    {
      WriteLockHolder lock(j->path());
      QVERIFY(lock.locked());
      for (int i = 0; i < 3; ++i) j->RecordRequest(Request(1000 + i, "s", "m", "none"));
      j->Flush();  // returns although the batch failed
      Status error = j->last_error();
      QVERIFY(!error.ok());
      QCOMPARE(error.code(), StatusCode::kIoError);
      QVERIFY2(error.message().find("BEGIN IMMEDIATE") != std::string::npos, error.message().c_str());
      QVERIFY2(error.message().find("database is locked") != std::string::npos, error.message().c_str());
      QVERIFY2(error.message().find(j->path()) != std::string::npos, error.message().c_str());
      QVERIFY(j->last_error().ok());  // reported once
      QCOMPARE(j->Stats()->failed_rows, int64_t{3});
      // The health view keeps it for /health and the console's status bar.
      const Journal::Health health = j->health();
      // One error a failed batch: the writer may have taken the three rows in one, two or three batches.
      QVERIFY2(health.errors >= 1 && health.errors <= 3, qPrintable(QString::number(health.errors)));
      QCOMPARE(health.failed_rows, int64_t{3});
      QVERIFY2(health.last_error.find("database is locked") != std::string::npos, health.last_error.c_str());
    }
    j->RecordRequest(Request(2000, "after", "m", "none"));
    j->Flush();
    QVERIFY(j->last_error().ok());
    Result<QueryPage> page = j->Query({});
    QCOMPARE(page->total, int64_t{1});
    QCOMPARE(page->rows[0]["session"].get<std::string>(), std::string("after"));
    QCOMPARE(page->rows[0]["id"].get<int64_t>(), int64_t{1});
  }

  void migratesAVersionOneJournal() {
    QTemporaryDir dir;
    JournalOptions o = Options(dir);
    {
      auto j = OpenOrFail(o);
      RequestRow r;
      r.session = "old";
      r.figures.completion_tokens = 3;
      j->RecordRequest(r);
    }
    // Back to the first schema: no draft counts, the reserved shadow_answers table.
    std::string path = o.data_dir + "/journal.db";
    sqlite3* db = nullptr;
    sqlite3_open(path.c_str(), &db);
    const char* v1 =
        "ALTER TABLE requests DROP COLUMN drafted_tokens; ALTER TABLE requests DROP COLUMN accepted_tokens;"
        " ALTER TABLE requests DROP COLUMN slot; ALTER TABLE requests DROP COLUMN queue_ms;"
        " ALTER TABLE requests DROP COLUMN queue_position; ALTER TABLE requests DROP COLUMN precision;"
        " ALTER TABLE requests DROP COLUMN image_tokens; DROP TABLE shadow;"
        " CREATE TABLE shadow_answers(id INTEGER PRIMARY KEY, time_ms INTEGER NOT NULL, session TEXT NOT NULL, question TEXT NOT NULL,"
        " answer TEXT NOT NULL, agreement REAL); PRAGMA user_version=1;";
    QCOMPARE(sqlite3_exec(db, v1, nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(db);
    auto j = OpenOrFail(o);
    QCOMPARE(SqlInt(path, "PRAGMA user_version"), int64_t{Journal::kSchemaVersion});
    QCOMPARE(SqlInt(path, "SELECT drafted_tokens FROM requests WHERE session = 'old'"), int64_t{0});
    QCOMPARE(SqlInt(path, "SELECT slot FROM requests WHERE session = 'old'"), int64_t{0});
    QCOMPARE(SqlInt(path, "SELECT queue_position FROM requests WHERE session = 'old'"), int64_t{0});
    QCOMPARE(SqlInt(path, "SELECT count(*) FROM requests WHERE session = 'old' AND precision = 'exact'"), int64_t{1});
    QCOMPARE(SqlInt(path, "SELECT image_tokens FROM requests WHERE session = 'old'"), int64_t{0});
    QCOMPARE(SqlInt(path, "SELECT count(*) FROM sqlite_master WHERE name = 'shadow_answers'"), int64_t{0});
    ShadowRow row;
    row.session = "new";
    j->RecordShadow(row);
    j->Flush();
    QCOMPARE(SqlInt(path, "SELECT count(*) FROM shadow"), int64_t{1});
    QCOMPARE(SqlInt(path, "SELECT count(*) FROM requests"), int64_t{1});
  }

  void openRejectsANewerSchemaAndGarbage() {
    QTemporaryDir dir;
    JournalOptions o = Options(dir);
    { auto j = OpenOrFail(o); }
    std::string path = o.data_dir + "/journal.db";
    sqlite3* db = nullptr;
    sqlite3_open(path.c_str(), &db);
    sqlite3_exec(db, "PRAGMA user_version=99", nullptr, nullptr, nullptr);
    sqlite3_close(db);
    Result<std::unique_ptr<Journal>> newer = Journal::Open(o);
    QVERIFY(!newer.ok());
    QCOMPARE(newer.status().code(), StatusCode::kUnsupported);
    QVERIFY(newer.status().message().find("99") != std::string::npos);

    QTemporaryDir dir2;
    JournalOptions o2 = Options(dir2);
    QDir().mkpath(QString::fromStdString(o2.data_dir));
    QFile f(QString::fromStdString(o2.data_dir + "/journal.db"));
    QVERIFY(f.open(QIODevice::WriteOnly));
    f.write(QByteArray(8192, 'z'));
    f.close();
    Result<std::unique_ptr<Journal>> garbage = Journal::Open(o2);
    QVERIFY(!garbage.ok());
    QCOMPARE(garbage.status().code(), StatusCode::kCorrupt);
    QVERIFY2(garbage.status().message().find("sqlite3_") != std::string::npos, garbage.status().message().c_str());
  }

  void survivesSigkillMidWrite() {
    QTemporaryDir dir;
    std::string data_dir = dir.path().toStdString() + "/journal";
    int fds[2];
    QCOMPARE(::pipe(fds), 0);
    // The child is this binary run afresh (QtTest's watchdog thread makes a bare fork unsafe).
    std::vector<std::string> env_strings = {std::string(kCrashDirEnv) + "=" + data_dir,
                                            std::string(kCrashFdEnv) + "=" + std::to_string(fds[1])};
    for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
    std::vector<char*> envp;
    for (std::string& e : env_strings) envp.push_back(e.data());
    envp.push_back(nullptr);
    char self[] = "/proc/self/exe";
    char* argv[] = {self, nullptr};
    pid_t pid = ::fork();
    QVERIFY(pid >= 0);
    if (pid == 0) {
      ::close(fds[0]);
      ::execve(self, argv, envp.data());
      _exit(127);
    }
    ::close(fds[1]);
    int64_t reported = 0;
    int reports = 0;
    while (reports < 40) {
      int64_t v = 0;
      ssize_t n = ::read(fds[0], &v, sizeof v);
      if (n != sizeof v) break;
      reported = v;
      ++reports;
    }
    QCOMPARE(reports, 40);
    std::this_thread::sleep_for(std::chrono::microseconds(1500));  // into the next batch
    QCOMPARE(::kill(pid, SIGKILL), 0);
    int64_t v = 0;
    while (::read(fds[0], &v, sizeof v) == sizeof v) reported = v;
    ::close(fds[0]);
    int wstatus = 0;
    QCOMPARE(::waitpid(pid, &wstatus, 0), pid);
    QVERIFY(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL);

    JournalOptions o;
    o.data_dir = data_dir;
    o.retention_days = 0;
    o.retention_rows = 0;
    auto j = OpenOrFail(o);
    Result<std::string> check = j->IntegrityCheck();
    QVERIFY2(check.ok(), check.status().ToString().c_str());
    QCOMPARE(*check, std::string("ok"));
    Result<JournalStats> stats = j->Stats();
    qInfo("child reported %lld committed rows; %lld on disk", static_cast<long long>(reported),
          static_cast<long long>(stats->request_rows));
    QVERIFY(stats->request_rows >= reported);
    // Every reported row is there, with its id and its payload.
    QCOMPARE(SqlInt(j->path(), "SELECT count(*) FROM requests WHERE id <= " + std::to_string(reported) +
                                   " AND prompt_tokens = id"),
             reported);
    // Ids stay dense: no batch committed in part.
    QCOMPARE(SqlInt(j->path(), "SELECT max(id) FROM requests"), stats->request_rows);
    // The reopened journal keeps writing after the last surviving id.
    j->RecordRequest(Request(0, "after", "m", "none"));
    j->Flush();
    QVERIFY(j->last_error().ok());
    QCOMPARE(QueryIds(*j, {})[0], stats->request_rows + 1);
  }
};

QTEST_APPLESS_MAIN(TestJournal)
#include "test_journal.moc"
