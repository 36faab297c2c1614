// The disk tier behind the resident prefix, on the tiny model with a 64-token grid: what one
// request's writer puts on disk, a reopened tier and a new engine restore bit for bit as a cold
// prefill (logits, state, greedy tokens); the next request's fence drops what was not copied; a
// corrupted file, a failed write (ENOSPC) and a full disk are clean fallbacks with a journal event;
// nothing decode-wrote reaches the disk.
#include <QtTest>

#include <condition_variable>
#include <filesystem>
#include <mutex>

#include "engine/cache/disk_cache.h"
#include "engine/cache/disk_files.h"
#include "engine/cache/resident_prefix.h"
#include "engine/core/file_util.h"
#include "tests/cache/cache_test_util.h"
#include "tests/cache/fault_env.h"

using namespace anchorage;
using anchorage::testing::Concat;
using anchorage::testing::FaultEnv;
using anchorage::testing::Greedy;
using anchorage::testing::SameBits;
using anchorage::testing::Tokens;

namespace {

constexpr int64_t kGrid = 64;

// The real file system, whose first file creation after Hold() waits until Release().
class GateEnv : public FaultEnv {
 public:
  void Hold() {
    std::lock_guard lock(mu_);
    hold_ = true;
  }
  void WaitUntilHeld() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return waiting_; });
  }
  void Release() {
    {
      std::lock_guard lock(mu_);
      hold_ = false;
    }
    cv_.notify_all();
  }
  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    {
      std::unique_lock lock(mu_);
      if (hold_) {
        waiting_ = true;
        cv_.notify_all();
        cv_.wait(lock, [&] { return !hold_; });
      }
    }
    return Posix().NewWritableFile(path);
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool hold_ = false, waiting_ = false;
};

// Every event the engine and the writer report.
struct EventLog {
  std::mutex mu;
  std::vector<CacheEvent> events;
  CacheEventSink Sink() {
    return [this](const CacheEvent& e) {
      std::lock_guard lock(mu);
      events.push_back(e);
    };
  }
  // The first event of this kind on the disk tier whose reason holds `text`, or nullopt.
  std::optional<CacheEvent> Find(const std::string& kind, const std::string& text = "") {
    std::lock_guard lock(mu);
    for (const CacheEvent& e : events)
      if (e.tier == "disk" && e.kind == kind && e.reason.find(text) != std::string::npos) return e;
    return std::nullopt;
  }
};

std::vector<std::string> TemporaryFiles(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().string().ends_with(".tmp")) out.push_back(e.path().string());
  return out;
}

}  // namespace

class TestDiskCache : public QObject {
  Q_OBJECT
  testing::TinyEngine engine_;
  Model* model_ = nullptr;
  Forward* forward_ = nullptr;
  int32_t vocab_ = 0;

  static DiskCacheSettings Settings() {
    DiskCacheSettings s;
    s.mode = DiskMode::kReadWrite;
    s.admit_after = 1;
    s.min_tokens = 0;
    s.min_free_bytes = 0;
    s.budget_bytes = int64_t(1) << 40;
    s.cost_check = false;  // the tiny model prefills faster than any disk reads; the rule has its own case below
    return s;
  }
  ResidentOptions Options() const {
    ResidentOptions o;
    o.store_enabled = false;  // the disk alone behind the resident rows
    o.disk = Settings();
    return o;
  }
  std::unique_ptr<DiskCache> OpenDisk(const QTemporaryDir& dir, DiskEnv& env = DiskEnv::Posix()) {
    auto d = DiskCache::Open(env, model_->config, engine_.fingerprint, dir.filePath("disk").toStdString(), kGrid, Settings());
    if (!d.ok()) qFatal("%s", d.status().ToString().c_str());
    return std::move(d).value();
  }
  std::unique_ptr<ResidentPrefix> Engine(DiskCache* disk, EventLog* log = nullptr) {
    auto rp = std::make_unique<ResidentPrefix>(*forward_, &model_->tokenizer, Options());
    if (log != nullptr) rp->set_event_sink(log->Sink());
    rp->set_disk_cache(disk);
    return rp;
  }
  // A cold prefill's last logits and state.
  std::vector<float> Cold(const std::vector<int32_t>& prompt, SequenceState* state = nullptr) {
    SequenceState s(model_->config);
    auto logits = forward_->Prefill(s, prompt);
    if (!logits.ok()) qFatal("prefill failed");
    if (state != nullptr) *state = s;
    return *logits;
  }
  // Prefills prompt through rp; returns where it resumed.
  ResumeInfo Run(ResidentPrefix& rp, const std::vector<int32_t>& prompt, std::vector<float>* logits = nullptr) {
    ResumeInfo info;
    auto out = rp.Prefill(CacheRequest{prompt, "", 0, 0}, &info);
    if (!out.ok()) qFatal("%s", out.status().ToString().c_str());
    if (logits != nullptr) *logits = *out;
    return info;
  }

 private slots:
  void initTestCase() {
    QVERIFY(engine_.Make(21, kGrid, 2));
    model_ = engine_.model.get();
    forward_ = engine_.forward.get();
    vocab_ = model_->tokenizer.vocab_size();
  }

  void reopenedTierRestoresAsCold() {
    QTemporaryDir dir;
    const auto a = Tokens(1, 300, vocab_);
    {
      auto disk = OpenDisk(dir);
      auto rp = Engine(disk.get());
      QCOMPARE(Run(*rp, a).source, CacheSource::kCold);
      disk->WaitIdle();
      const DiskTierStats t = disk->tier().stats();
      QCOMPARE(t.anchors_written, int64_t(1));  // the longest line read cold admit_after times: 256
      QCOMPARE(t.chunks_written, int64_t(4));
    }
    SequenceState cold(model_->config);
    const std::vector<float> cold_logits = Cold(a, &cold);
    auto disk = OpenDisk(dir);
    QCOMPARE(disk->tier().stats().files, int64_t(5));
    auto rp = Engine(disk.get());
    std::vector<float> logits;
    const ResumeInfo info = Run(*rp, a, &logits);
    QCOMPARE(info.source, CacheSource::kDisk);
    QCOMPARE(info.cached_tokens, int64_t(256));
    QVERIFY(SameBits(logits, cold_logits));
    QVERIFY(rp->state().BitEqual(cold));
    QCOMPARE(disk->Stats().hits, int64_t(1));
  }

  void greedyTokensFromDiskEqualCold() {
    QTemporaryDir dir;
    const auto a = Tokens(2, 280, vocab_);
    auto cold_rp = Engine(nullptr);
    auto cold = cold_rp->Generate(CacheRequest{a, "", 24, 0}, Greedy(24), nullptr);
    QVERIFY(cold.ok());
    {
      auto disk = OpenDisk(dir);
      auto rp = Engine(disk.get());
      QVERIFY(rp->Generate(CacheRequest{a, "", 24, 0}, Greedy(24), nullptr).ok());
    }  // the engine's end waits for the writer
    auto disk = OpenDisk(dir);
    auto rp = Engine(disk.get());
    auto warm = rp->Generate(CacheRequest{a, "", 24, 0}, Greedy(24), nullptr);
    QVERIFY(warm.ok());
    QCOMPARE(warm->resume.source, CacheSource::kDisk);
    QCOMPARE(warm->resume.cached_tokens, int64_t(256));
    QCOMPARE(warm->generation.tokens, cold->generation.tokens);
  }

  // The next request fences the writer: what it had copied is written, the rest dropped and journaled.
  void nextRequestClosesTheWindow() {
    QTemporaryDir dir;
    GateEnv env;
    auto disk = OpenDisk(dir, env);
    EventLog log;
    auto rp = Engine(disk.get(), &log);
    const auto a = Tokens(3, 300, vocab_), b = Tokens(4, 300, vocab_);
    env.Hold();
    Run(*rp, a);
    env.WaitUntilHeld();  // the writer copied a's first chunk and waits to create its file
    Run(*rp, b);          // fences a's job before its prefill
    env.Release();
    disk->WaitIdle();
    const auto dropped = log.Find("drop", "window closed");
    QVERIFY(dropped.has_value());
    QVERIFY2(dropped->session.has_value(), "the writer's events name their session");
    QCOMPARE(disk->tier().Find(a, 300), int64_t(0));  // a's anchor was never written
    QVERIFY(disk->tier().HasFile(ChunkFileName(PrefixHashes(a, kGrid)[0])));  // what was copied was written
    QCOMPARE(disk->tier().Find(b, 300), int64_t(256));
    QVERIFY(TemporaryFiles(dir.filePath("disk").toStdString()).empty());
    QCOMPARE(disk->Stats().dropped_jobs, int64_t(1));
    // b, restored in a new engine, is a cold prefill's.
    auto rp2 = Engine(disk.get());
    rp.reset();
    std::vector<float> logits;
    QCOMPARE(Run(*rp2, b, &logits).source, CacheSource::kDisk);
    QVERIFY(SameBits(logits, Cold(b)));
  }

  void corruptFileFallsBackAndIsWrittenAgain() {
    QTemporaryDir dir;
    const auto a = Tokens(5, 300, vocab_);
    {
      auto disk = OpenDisk(dir);
      Run(*Engine(disk.get()), a);
    }
    const std::string victim = dir.filePath("disk").toStdString() + "/" + ChunkFileName(PrefixHashes(a, kGrid)[2]);
    std::string bytes = *ReadFile(victim);
    bytes[bytes.size() - 100] ^= 0x10;
    QVERIFY(WriteFileAtomic(victim, bytes).ok());
    auto disk = OpenDisk(dir);
    EventLog log;
    auto rp = Engine(disk.get(), &log);
    std::vector<float> logits;
    const ResumeInfo info = Run(*rp, a, &logits);
    QCOMPARE(info.source, CacheSource::kCold);  // nothing in RAM: the request starts cold
    QVERIFY(SameBits(logits, Cold(a)));
    const auto failed = log.Find("failed_restore", "checksum");
    QVERIFY2(failed.has_value(), "a failed restore is journaled with its cause");
    QCOMPARE(disk->Stats().tier.failed_restores, int64_t(1));
    disk->WaitIdle();  // the bad file went with the longer lines; the cold prefill wrote them again, whole
    QCOMPARE(disk->tier().Find(a, 300), int64_t(256));
    QVERIFY(DecodeChunk(model_->config, engine_.fingerprint, *ReadFile(victim)).ok());
  }

  void failedWritesAreCleanFallbacks() {
    QTemporaryDir dir;
    FaultEnv env;
    auto disk = OpenDisk(dir, env);
    EventLog log;
    auto rp = Engine(disk.get(), &log);
    const auto a = Tokens(6, 300, vocab_);
    env.ops = 0;
    env.fail_at = 2;  // a write of the first chunk
    std::vector<float> logits;
    QCOMPARE(Run(*rp, a, &logits).source, CacheSource::kCold);
    QVERIFY(SameBits(logits, Cold(a)));
    disk->WaitIdle();
    QVERIFY2(log.Find("drop", "No space left").has_value(), "the failed write is journaled");
    QCOMPARE(disk->tier().stats().files, int64_t(0));
    QVERIFY(TemporaryFiles(dir.filePath("disk").toStdString()).empty());
    // A full file system: the tier writes nothing below its free-space floor.
    env.fail_at = -1;
    env.free_bytes = 1 << 20;
    DiskCacheSettings floor = Settings();
    floor.min_free_bytes = int64_t(1) << 30;
    ResidentOptions o = Options();
    o.disk = floor;
    rp->set_options(o);
    QVERIFY(rp->Clear("ram").ok());
    Run(*rp, a);
    disk->WaitIdle();
    QVERIFY(log.Find("drop", "kept free").has_value());
    QCOMPARE(disk->tier().stats().files, int64_t(0));
    // Room again: the same request writes its lines, and the engine served throughout.
    env.free_bytes = -1;
    rp->set_options(Options());
    QVERIFY(rp->Clear("ram").ok());
    Run(*rp, a);
    disk->WaitIdle();
    QCOMPARE(disk->tier().Find(a, 300), int64_t(256));
  }

  // Rows past the first generation were written by decode steps: none of them reaches the disk.
  void decodeWrittenRowsAreNeverWritten() {
    QTemporaryDir dir;
    auto disk = OpenDisk(dir);
    auto rp = Engine(disk.get());
    const auto a = Tokens(7, 150, vocab_);
    auto first = rp->Generate(CacheRequest{a, "s", 40, 0}, Greedy(40), nullptr);
    QVERIFY(first.ok());
    disk->WaitIdle();
    QCOMPARE(disk->tier().Find(a, 150), int64_t(128));
    const auto next = Concat(Concat(a, first->generation.tokens), Tokens(8, 200, vocab_));
    auto second = rp->Generate(CacheRequest{next, "s", 4, 0}, Greedy(4), nullptr);
    QVERIFY(second.ok());
    QCOMPARE(second->resume.source, CacheSource::kEnd);
    disk->WaitIdle();
    QCOMPARE(disk->tier().Find(next, static_cast<int64_t>(next.size())), int64_t(128));
    QCOMPARE(disk->tier().stats().anchors_written, int64_t(1));
  }

  void modeOffAndReadOnly() {
    QTemporaryDir dir;
    auto disk = OpenDisk(dir);
    auto rp = Engine(disk.get());
    const auto a = Tokens(9, 300, vocab_);
    ResidentOptions o = Options();
    o.disk.mode = DiskMode::kRead;
    rp->set_options(o);
    Run(*rp, a);
    disk->WaitIdle();
    QCOMPARE(disk->tier().stats().files, int64_t(0));  // reads only
    rp->set_options(Options());
    QVERIFY(rp->Clear("ram").ok());
    Run(*rp, a);
    disk->WaitIdle();
    QCOMPARE(disk->tier().Find(a, 300), int64_t(256));
    o.disk.mode = DiskMode::kOff;
    rp->set_options(o);
    QVERIFY(rp->Clear("ram").ok());
    QCOMPARE(Run(*rp, a).source, CacheSource::kCold);
    // clear?tier=disk empties the files; "ram" leaves them.
    rp->set_options(Options());
    QVERIFY(rp->Clear("ram").ok());
    QCOMPARE(disk->tier().stats().anchors, int64_t(1));
    QVERIFY(rp->Clear("disk").ok());
    QCOMPARE(disk->tier().stats().files, int64_t(0));
    QCOMPARE(Run(*rp, a).source, CacheSource::kCold);
  }

  // Peek names the disk; prewarm brings its state into the engine's buffer, and the request resumes there.
  void peekAndPrewarmFromDisk() {
    QTemporaryDir dir;
    const auto a = Tokens(13, 300, vocab_);
    auto disk = OpenDisk(dir);
    Run(*Engine(disk.get()), a);
    auto rp = Engine(disk.get());
    const CacheRequest request{a, "", 0, 0};
    const ResumeInfo peek = rp->Peek(request);
    QCOMPARE(peek.source, CacheSource::kDisk);
    QCOMPARE(peek.cached_tokens, int64_t(256));
    auto warmed = rp->Prewarm(request);
    QVERIFY(warmed.ok());
    QCOMPARE(warmed->source, CacheSource::kResident);
    QCOMPARE(warmed->cached_tokens, int64_t(256));
    std::vector<float> logits;
    const ResumeInfo info = Run(*rp, a, &logits);
    QCOMPARE(info.source, CacheSource::kResident);
    QCOMPARE(info.cached_tokens, int64_t(256));
    QVERIFY(SameBits(logits, Cold(a)));
    QCOMPARE(disk->Stats().hits, int64_t(1));
  }

  void evictionsAreJournaled() {
    QTemporaryDir dir;
    auto disk = OpenDisk(dir);
    EventLog log;
    auto rp = Engine(disk.get(), &log);
    const auto a = Tokens(11, 300, vocab_), b = Tokens(12, 300, vocab_);
    Run(*rp, a);
    disk->WaitIdle();
    const int64_t one = disk->tier().stats().bytes;
    ResidentOptions o = Options();
    o.disk.budget_bytes = one + one / 2;
    rp->set_options(o);
    Run(*rp, b);
    disk->WaitIdle();
    const auto evicted = log.Find("eviction", "for the budget");
    QVERIFY2(evicted.has_value(), "an eviction is journaled");
    QVERIFY(evicted->bytes >= one / 2);
    QCOMPARE(disk->tier().Find(a, 300), int64_t(0));  // as valuable as b and older: it went, not b's chunks in flight
    QCOMPARE(disk->tier().Find(b, 300), int64_t(256));
  }

  // Past the day's write budget the tier plans nothing and journals the skip; the writes it makes
  // otherwise count toward the day.
  void writeBudgetStopsPlanning() {
    QTemporaryDir dir;
    auto disk = OpenDisk(dir);
    auto guard = WriteGuard::Open(DiskEnv::Posix(), dir.filePath("writes.json").toStdString(), 0, [] { return std::string("2026-12-01"); });
    guard->Add(1);
    disk->set_write_guard(guard.get());
    ResidentOptions o = Options();
    o.disk.write_budget_bytes = 0;
    EventLog log;
    auto rp = std::make_unique<ResidentPrefix>(*forward_, &model_->tokenizer, o);
    rp->set_event_sink(log.Sink());
    rp->set_disk_cache(disk.get());
    const auto a = Tokens(14, 300, vocab_);
    Run(*rp, a);
    disk->WaitIdle();
    QCOMPARE(disk->tier().stats().anchors_written, int64_t(0));
    QVERIFY(log.Find("drop", "write budget").has_value());
    QCOMPARE(disk->Stats().skipped_by_write_budget, int64_t(1));
    QCOMPARE(guard->Stats().skips, int64_t(1));
    o.disk.write_budget_bytes = int64_t(1) << 40;
    rp->set_options(o);
    Run(*rp, Tokens(15, 300, vocab_));
    disk->WaitIdle();
    QCOMPARE(disk->tier().stats().anchors_written, int64_t(1));
    QCOMPARE(guard->Stats().today_bytes, 1 + disk->tier().stats().bytes_written);
  }

  // With the cost rule on, a line is read only when its read is cheaper than its prefill at the measured rates.
  void costRuleComparesMeasuredRates() {
    QTemporaryDir dir;
    auto disk = OpenDisk(dir);
    const auto a = Tokens(10, 300, vocab_);
    Run(*Engine(disk.get()), a);
    disk->WaitIdle();
    const double read_s = disk->RestoreSeconds(a, 256, 0);
    QVERIFY(read_s > 0);
    ResidentOptions o = Options();
    o.disk.cost_check = true;
    auto rp = std::make_unique<ResidentPrefix>(*forward_, &model_->tokenizer, o);
    rp->set_disk_cache(disk.get());
    const ResumeInfo peek = rp->Peek(CacheRequest{a, "", 0, 0});
    // Before this engine measured a prefill it assumes 740 tokens a second: 256 tokens cost 0.35 s.
    QCOMPARE(peek.source, read_s < 256.0 / 740 ? CacheSource::kDisk : CacheSource::kCold);
  }

  // A drive measured slower than the prefill: the line stays on disk, the request prefills, and the
  // decline is counted.
  void costRuleDeclinesASlowRead() {
    QTemporaryDir dir;
    FaultEnv slow;
    auto disk = OpenDisk(dir, slow);
    const auto a = Tokens(13, 300, vocab_);
    Run(*Engine(disk.get()), a);
    disk->WaitIdle();
    slow.read_delay_ms = 400;
    QCOMPARE(Run(*Engine(disk.get()), a).source, CacheSource::kDisk);  // unweighed: taken, and its rate measured
    QVERIFY(disk->RestoreSeconds(a, 256, 0) > 256.0 / 740);
    ResidentOptions o = Options();
    o.disk.cost_check = true;
    auto rp = std::make_unique<ResidentPrefix>(*forward_, &model_->tokenizer, o);
    rp->set_disk_cache(disk.get());
    std::vector<float> logits;
    QCOMPARE(Run(*rp, a, &logits).source, CacheSource::kCold);
    QVERIFY(SameBits(logits, Cold(a)));
    QCOMPARE(disk->Stats().declined_by_cost, int64_t(1));
    QCOMPARE(disk->Stats().hits, int64_t(1));
  }
};

QTEST_APPLESS_MAIN(TestDiskCache)
#include "test_disk_cache.moc"
