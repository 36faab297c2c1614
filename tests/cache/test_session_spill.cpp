// The session spill's store on the tiny model: an entry saved and read back by a reopened spill
// gives every row, the end anchor and the anchors bit for bit, and the next tokens' logits of a
// state that never left; raw, compressed and mixed entries restore the same state; a second save
// writes only the changed blocks and a restore reads only the blocks not in place; a flipped byte,
// a missing manifest, another fingerprint, the budget, the TTL, a crash at any write step and a
// SIGKILL mid-save each end with the right entry or none, never a wrong one.
#include <QtTest>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

#include "engine/cache/session_spill.h"
#include "tests/cache/cache_test_util.h"
#include "tests/cache/fault_env.h"

using namespace anchorage;
using anchorage::testing::FaultEnv;
using anchorage::testing::SameBits;
using anchorage::testing::Tokens;

class TestSessionSpill : public QObject {
  Q_OBJECT
  testing::TinyEngine engine_;
  Model* model_ = nullptr;
  Forward* forward_ = nullptr;
  int32_t vocab_ = 0;

  // A conversation of n tokens prefilled cold, with grid anchors at 1024 and 2048 and its end.
  struct Conversation {
    std::vector<int32_t> tokens;
    std::unique_ptr<SequenceState> state;
    SpillEntry entry;
  };
  Conversation Make(uint64_t seed, size_t n, const std::string& session = "s") {
    Conversation c{Tokens(seed, n, vocab_), std::make_unique<SequenceState>(model_->config), {}};
    c.entry.session = session;
    for (size_t done = 0; done < n;) {
      const size_t next = std::min(n, done < 2048 ? (done / 1024 + 1) * 1024 : n);
      if (!forward_->Prefill(*c.state, std::span(c.tokens).subspan(done, next - done)).ok()) qFatal("prefill");
      done = next;
      if (done % 1024 == 0 && done < n) c.entry.anchors.push_back(c.state->SaveAnchor());
    }
    c.entry.tokens = c.tokens;
    c.entry.taint_row = static_cast<int64_t>(n) - 100;
    c.entry.regions = {{static_cast<int64_t>(n) - 100, static_cast<int64_t>(n)}};
    c.entry.end = EndAnchor{c.state->SaveAnchor(), static_cast<int64_t>(n) - 100, c.entry.regions};
    return c;
  }
  SessionSpillOptions Options(const QTemporaryDir& dir, bool compress = true) const {
    SessionSpillOptions o;
    o.dir = dir.filePath("sessions").toStdString();
    o.compress = compress;
    return o;
  }
  std::unique_ptr<SessionSpill> Open(SessionSpillOptions o, const std::string& fp = "", DiskEnv& env = DiskEnv::Posix()) {
    auto s = SessionSpill::Open(env, model_->config, fp.empty() ? engine_.fingerprint : fp, std::move(o));
    if (!s.ok()) qFatal("%s", s.status().ToString().c_str());
    return std::move(s).value();
  }
  // Restores the entry into a new state and checks it against the conversation, bit for bit.
  void ExpectRestores(SessionSpill& spill, const Conversation& c, SpillRestoreReport* report = nullptr) {
    SequenceState state(model_->config);
    auto got = spill.Restore(SessionSpill::EntryId(c.entry.session, c.tokens), state, {}, report);
    QVERIFY2(got.ok(), got.status().ToString().c_str());
    QVERIFY(got->tokens == c.tokens);
    QCOMPARE(got->taint_row, c.entry.taint_row);
    QVERIFY(got->regions == c.entry.regions);
    QCOMPARE(got->anchors.size(), c.entry.anchors.size());
    for (size_t i = 0; i < got->anchors.size(); ++i) {
      QCOMPARE(got->anchors[i].length, c.entry.anchors[i].length);
      QVERIFY(SameBits(got->anchors[i].data, c.entry.anchors[i].data));
    }
    QVERIFY(got->end.has_value());
    QVERIFY(SameBits(got->end->anchor.data, c.entry.end->anchor.data));
    QCOMPARE(got->end->taint_row, c.entry.end->taint_row);
    QVERIFY(got->end->regions == c.entry.end->regions);
    QVERIFY(state.RestoreAnchor(got->end->anchor).ok());
    QVERIFY(state.BitEqual(*c.state));
    // The next turn from the restored state equals the one from the state that never left.
    const auto next = Tokens(99, 70, vocab_);
    SequenceState never_left = *c.state;
    auto a = forward_->Prefill(state, next), b = forward_->Prefill(never_left, next);
    QVERIFY(a.ok() && b.ok());
    QVERIFY(SameBits(*a, *b));
  }

 private slots:
  void initTestCase() {
    QVERIFY(engine_.Make(31, 64, 2));
    model_ = engine_.model.get();
    forward_ = engine_.forward.get();
    vocab_ = model_->tokenizer.vocab_size();
  }

  // The two sums as defined: plain, and each word times its 1-based position, both mod 2^64.
  void wordSumsAreTheDefinedOnes() {
    std::vector<uint32_t> words(1001);
    for (size_t i = 0; i < words.size(); ++i) words[i] = static_cast<uint32_t>(0x9e3779b9u * (i + 7));
    uint64_t plain = 0, weighted = 0;
    for (size_t i = 0; i < words.size(); ++i) {
      plain += words[i];
      weighted += static_cast<uint64_t>(i + 1) * words[i];
    }
    QCOMPARE(WordSums(words.data(), static_cast<int64_t>(words.size() * 4)), std::make_pair(plain, weighted));
    std::swap(words[3], words[4]);  // the weighted sum sees an order the plain one does not
    QCOMPARE(WordSums(words.data(), static_cast<int64_t>(words.size() * 4)).first, plain);
    QVERIFY(WordSums(words.data(), static_cast<int64_t>(words.size() * 4)).second != weighted);
  }

  void savedEntryRestoresInANewSpill() {
    for (bool compress : {true, false}) {
      QTemporaryDir dir;
      const Conversation c = Make(1, 2600);
      {
        auto spill = Open(Options(dir, compress));
        auto saved = spill->Save(c.entry, *c.state);
        QVERIFY2(saved.ok(), saved.status().ToString().c_str());
        QCOMPARE(saved->blocks_written, int64_t(3));
        QCOMPARE(saved->anchors_written, int64_t(3));  // two grid anchors and the end
        if (compress) QVERIFY(saved->bytes_written < saved->raw_bytes + 3 * SequenceState::AnchorBytes(model_->config));
      }
      auto spill = Open(Options(dir, compress));
      QCOMPARE(spill->stats().entries, int64_t(1));
      ExpectRestores(*spill, c);
    }
  }

  // A session key is the client's bytes, UTF-8 or not; a restore can stop at a line below the end.
  void anySessionKeyAndAPartialRestore() {
    QTemporaryDir dir;
    const std::string key = std::string("conv-\xff\xfe\x01", 8);
    const Conversation c = Make(13, 2600, key);
    {
      auto spill = Open(Options(dir));
      QVERIFY(spill->Save(c.entry, *c.state).ok());
    }
    auto spill = Open(Options(dir));
    const std::string id = SessionSpill::EntryId(key, c.tokens);
    QCOMPARE(spill->Info(id)->session, key);
    SequenceState state(model_->config);
    SpillRestoreReport report;
    auto got = spill->Restore(id, state, {}, &report, 1024);
    QVERIFY2(got.ok(), got.status().ToString().c_str());
    QCOMPARE(report.blocks_read, int64_t(1));
    QCOMPARE(got->tokens.size(), size_t(1024));
    QCOMPARE(state.length(), int64_t(1024));
    QCOMPARE(got->anchors.size(), size_t(1));  // the anchor at 1024; the one at 2048 and the end lie above
    QVERIFY(!got->end.has_value());
    QVERIFY(state.RestoreAnchor(got->anchors[0]).ok());
    SequenceState head(model_->config);
    QVERIFY(forward_->Prefill(head, std::span(c.tokens).subspan(0, 1024)).ok());
    QVERIFY(state.BitEqual(head));
    ExpectRestores(*spill, c);
  }

  // Written raw, extended with the codec on: the entry mixes both and restores as one.
  void secondSaveWritesOnlyChangedBlocks() {
    QTemporaryDir dir;
    Conversation c = Make(2, 2600);
    auto spill = Open(Options(dir, false));
    QVERIFY(spill->Save(c.entry, *c.state).ok());
    const std::vector<int32_t> more = Tokens(3, 1000, vocab_);
    QVERIFY(forward_->Prefill(*c.state, more).ok());
    c.tokens.insert(c.tokens.end(), more.begin(), more.end());
    c.entry.tokens = c.tokens;
    c.entry.end = EndAnchor{c.state->SaveAnchor(), c.entry.taint_row, c.entry.regions};
    spill = Open(Options(dir, true));
    auto saved = spill->Save(c.entry, *c.state);
    QVERIFY(saved.ok());
    QCOMPARE(saved->blocks_kept, int64_t(2));     // rows 0..2048 did not change
    QCOMPARE(saved->blocks_written, int64_t(2));  // 2048..3072 grew, 3072..3600 is new
    QCOMPARE(saved->anchors_kept, int64_t(2));
    QCOMPARE(saved->anchors_written, int64_t(1));
    ExpectRestores(*spill, c);
    // With the first 2,100 rows in place, only the two blocks above 2,048 are read, and a device copy
    // of the state keeps its rows below 2,048.
    SequenceState state(model_->config);
    QVERIFY(forward_->Prefill(state, std::span(c.tokens).subspan(0, 2100)).ok());
    state.set_mirror(std::make_unique<testing::NullMirror>());
    state.set_mirror_sync(2100, NewestRecurrent::kHost);
    SpillRestoreReport report;
    auto got = spill->Restore(SessionSpill::EntryId("s", c.tokens), state, std::span(c.tokens).subspan(0, 2100), &report);
    QVERIFY(got.ok());
    QCOMPARE(report.blocks_in_place, int64_t(2));
    QCOMPARE(report.blocks_read, int64_t(2));
    QCOMPARE(state.mirror_rows(), int64_t(2048));
    QVERIFY(state.RestoreAnchor(got->end->anchor).ok());
    QVERIFY(state.BitEqual(*c.state));
  }

  void damagedEntriesGo() {
    QTemporaryDir dir;
    const Conversation c = Make(4, 1500);
    const std::string id = SessionSpill::EntryId("s", c.tokens);
    const std::string folder = Options(dir).dir;
    for (const std::string& victim : {id + ".b1", id + ".end", id + ".b0"}) {
      auto spill = Open(Options(dir));
      QVERIFY(spill->Save(c.entry, *c.state).ok());
      {
        std::string bytes = *ReadFile(folder + "/" + victim);
        bytes[bytes.size() / 3] ^= 0x01;
        QVERIFY(WriteFileAtomic(folder + "/" + victim, bytes).ok());
      }
      SequenceState state(model_->config);
      auto got = spill->Restore(id, state, {}, nullptr);
      QCOMPARE(got.status().code(), StatusCode::kCorrupt);
      QVERIFY(!spill->Info(id).has_value());
      QVERIFY(std::filesystem::is_empty(folder));
      QCOMPARE(spill->stats().failed_restores, int64_t(1));
    }
    // A truncated block, read back by a reopened spill.
    {
      auto spill = Open(Options(dir));
      QVERIFY(spill->Save(c.entry, *c.state).ok());
    }
    std::filesystem::resize_file(folder + "/" + id + ".b0", 1000);
    auto spill = Open(Options(dir));
    SequenceState state(model_->config);
    QCOMPARE(spill->Restore(id, state, {}, nullptr).status().code(), StatusCode::kCorrupt);
  }

  void openSweepsUnfinishedForeignAndExpired() {
    QTemporaryDir dir;
    const Conversation a = Make(5, 1200, "a"), b = Make(6, 1200, "b");
    int64_t now = 1'000'000'000'000;
    SessionSpillOptions o = Options(dir);
    o.now_ms = [&] { return now; };
    {
      auto spill = Open(o);
      QVERIFY(spill->Save(a.entry, *a.state).ok());
      QVERIFY(spill->Save(b.entry, *b.state).ok());
    }
    // a's manifest gone: an unfinished save.
    QVERIFY(std::filesystem::remove(o.dir + "/" + SessionSpill::EntryId("a", a.tokens) + ".manifest"));
    {
      auto spill = Open(o);
      QCOMPARE(spill->stats().entries, int64_t(1));
      QVERIFY(spill->Info(SessionSpill::EntryId("b", b.tokens)).has_value());
      for (const auto& e : std::filesystem::directory_iterator(o.dir))
        QVERIFY(!e.path().filename().string().starts_with(SessionSpill::EntryId("a", a.tokens)));
    }
    QCOMPARE(Open(o, "another-fingerprint")->stats().entries, int64_t(0));
    QVERIFY(std::filesystem::is_empty(o.dir));
    // Unused past the TTL.
    {
      auto spill = Open(o);
      QVERIFY(spill->Save(a.entry, *a.state).ok());
    }
    now = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count() +
          o.ttl_ms + 1000;  // the manifest's mtime is the wall clock's
    auto spill = Open(o);
    QCOMPARE(spill->stats().entries, int64_t(0));
    QCOMPARE(spill->stats().expired, int64_t(1));
  }

  void budgetEvictsLeastRecentlyUsed() {
    QTemporaryDir dir;
    const Conversation a = Make(7, 1100, "a"), b = Make(8, 1100, "b"), c = Make(9, 1100, "c");
    int64_t now = 1000;
    SessionSpillOptions o = Options(dir, false);
    o.now_ms = [&] { return now; };
    o.ttl_ms = int64_t(1) << 60;
    auto probe = Open(o);
    QVERIFY(probe->Save(a.entry, *a.state).ok());
    const int64_t one = probe->stats().bytes;
    probe.reset();
    o.budget_bytes = 2 * one + one / 2;
    auto spill = Open(o);
    QVERIFY(spill->Save(b.entry, *b.state).ok());
    now = 2000;
    SequenceState scratch(model_->config);
    QVERIFY(spill->Restore(SessionSpill::EntryId("a", a.tokens), scratch, {}, nullptr).ok());  // a used after b
    now = 3000;
    QVERIFY(spill->Save(c.entry, *c.state).ok());
    QCOMPARE(spill->stats().entries, int64_t(2));
    QCOMPARE(spill->stats().evictions, int64_t(1));
    QVERIFY(!spill->Info(SessionSpill::EntryId("b", b.tokens)).has_value());
    QVERIFY(spill->Info(SessionSpill::EntryId("a", a.tokens)).has_value());
  }

  // A process killed with SIGKILL while it saves, again and again, leaves an entry that restores
  // as one of the two versions it wrote, or no entry: never a mix.
  void sigkillMidSave() {
    const Conversation first = Make(20, 2100);
    Conversation second = Make(20, 2100);
    const std::vector<int32_t> more = Tokens(21, 1100, vocab_);
    QVERIFY(forward_->Prefill(*second.state, more).ok());
    second.tokens.insert(second.tokens.end(), more.begin(), more.end());
    second.entry.tokens = second.tokens;
    second.entry.end = EndAnchor{second.state->SaveAnchor(), second.entry.taint_row, second.entry.regions};
    for (int delay_ms : {5, 40, 150}) {
      QTemporaryDir dir;
      QVERIFY(Open(Options(dir))->Save(first.entry, *first.state).ok());
      const pid_t child = ::fork();
      QVERIFY(child >= 0);
      if (child == 0) {
        auto spill = SessionSpill::Open(DiskEnv::Posix(), model_->config, engine_.fingerprint, Options(dir));
        for (int i = 0;; ++i) (void)(*spill)->Save(i % 2 == 0 ? second.entry : first.entry, i % 2 == 0 ? *second.state : *first.state);
      }
      ::usleep(delay_ms * 1000);
      ::kill(child, SIGKILL);
      int status = 0;
      ::waitpid(child, &status, 0);
      QVERIFY(WIFSIGNALED(status));
      auto spill = Open(Options(dir));
      for (const auto& e : std::filesystem::directory_iterator(Options(dir).dir)) QVERIFY(!e.path().string().ends_with(".tmp"));
      const auto info = spill->Info(SessionSpill::EntryId("s", first.tokens));
      if (!info) continue;
      QVERIFY(info->tokens == static_cast<int64_t>(first.tokens.size()) || info->tokens == static_cast<int64_t>(second.tokens.size()));
      ExpectRestores(*spill, info->tokens == static_cast<int64_t>(first.tokens.size()) ? first : second);
    }
  }

  // The tier's free-space floor: a save that would go under it is refused and writes nothing.
  void fullDiskRefusesTheSave() {
    QTemporaryDir dir;
    const Conversation c = Make(12, 1100);
    FaultEnv env;
    env.free_bytes = 64ll << 20;
    SessionSpillOptions o = Options(dir);
    o.min_free_bytes = 64ll << 20;  // any write would go under it
    auto spill = Open(o, "", env);
    auto saved = spill->Save(c.entry, *c.state);
    QCOMPARE(saved.status().code(), StatusCode::kResourceExhausted);
    QVERIFY2(saved.status().message().find("free on the disk") != std::string::npos, saved.status().message().c_str());
    QCOMPARE(spill->stats().entries, int64_t(0));
    QVERIFY(std::filesystem::is_empty(o.dir));
    env.free_bytes = 1ll << 40;
    QVERIFY(spill->Save(c.entry, *c.state).ok());
  }

  // A crash at any write step of a second save leaves the first entry whole or no entry.
  void crashAtEveryStepServesNothingWrong() {
    const Conversation first = Make(10, 1500);
    Conversation second = Make(10, 1500);
    const std::vector<int32_t> more = Tokens(11, 600, vocab_);
    QVERIFY(forward_->Prefill(*second.state, more).ok());
    second.tokens.insert(second.tokens.end(), more.begin(), more.end());
    second.entry.tokens = second.tokens;
    second.entry.end = EndAnchor{second.state->SaveAnchor(), second.entry.taint_row, second.entry.regions};
    bool completed = false;
    for (int64_t step = 0; !completed && step < 100; ++step) {
      QTemporaryDir dir;
      QVERIFY(Open(Options(dir))->Save(first.entry, *first.state).ok());
      FaultEnv env;
      env.fail_at = step;
      env.crash = true;
      {
        auto spill = Open(Options(dir), "", env);
        env.ops = 0;
        completed = spill->Save(second.entry, *second.state).ok();
      }
      auto spill = Open(Options(dir));
      const std::string id = SessionSpill::EntryId("s", first.tokens);
      const auto info = spill->Info(id);
      if (completed) {
        QVERIFY(info.has_value());
        ExpectRestores(*spill, second);
      } else if (info.has_value()) {
        QVERIFY(info->tokens == static_cast<int64_t>(first.tokens.size()) || info->tokens == static_cast<int64_t>(second.tokens.size()));
        ExpectRestores(*spill, info->tokens == static_cast<int64_t>(first.tokens.size()) ? first : second);
      }
      for (const auto& e : std::filesystem::directory_iterator(Options(dir).dir)) QVERIFY(!e.path().string().ends_with(".tmp"));
    }
    QVERIFY2(completed, "the save completes once no step fails");
  }
};

QTEST_APPLESS_MAIN(TestSessionSpill)
#include "test_session_spill.moc"
