// One shadow session on the shadow model at grid 512: after turns that grow, drop earlier output (a
// template leaving out reasoning) and edit history, the state equals a fresh grid prefill of the
// same ids bit for bit; a fork leaves it untouched; a disk round trip gives the same bits, and a
// damaged, foreign or cut-short file is refused.
#include <QtTest>

#include <cstring>
#include <filesystem>

#include "engine/cache/disk_env.h"
#include "engine/core/file_util.h"
#include "engine/shadow/shadow_file.h"
#include "engine/shadow/shadow_session.h"
#include "tests/cache/cache_test_util.h"
#include "tests/shadow/shadow_test_util.h"

using namespace anchorage;
using anchorage::testing::Concat;
using anchorage::testing::Tokens;

class TestShadowSession : public QObject {
  Q_OBJECT
  testing::ShadowModels models_;
  std::unique_ptr<Model> shadow_;
  std::unique_ptr<Forward> forward_;
  int32_t vocab_ = 0;
  static constexpr int64_t kGrid = 512;

  void ReadAll(ShadowSession& s) {
    while (true) {
      auto read = s.ReadChunk(*forward_);
      QVERIFY2(read.ok(), read.status().ToString().c_str());
      if (!*read) break;
    }
  }
  // The session's committed state against a fresh prefill of its ids up to the committed length.
  bool EqualsFresh(const ShadowSession& s) {
    auto fresh = testing::FreshPrefill(*forward_, std::span(s.ids()).first(static_cast<size_t>(s.committed())));
    return fresh != nullptr && fresh->BitEqual(s.state());
  }

 private slots:
  void initTestCase() {
    QVERIFY(models_.Make());
    shadow_ = models_.LoadShadow();
    QVERIFY(shadow_ != nullptr);
    QVERIFY(shadow_->config.hidden_size < models_.main->config.hidden_size);  // smaller than tiny
    QCOMPARE(shadow_->tokenizer.sha256(), models_.main->tokenizer.sha256());   // and the same tokenizer
    auto f = Forward::Create(shadow_->config, shadow_->weights, ForwardOptions{kGrid, 2});
    QVERIFY(f.ok());
    forward_ = std::move(f).value();
    vocab_ = shadow_->tokenizer.vocab_size();
  }

  void turnsStayOnTheGrid() {
    ShadowSession s(shadow_->config, kGrid);
    const std::vector<int32_t> p1 = Tokens(1, 1300, vocab_);
    ShadowFeed feed = s.Feed(p1, true);
    QCOMPARE(feed.common, int64_t{0});
    ReadAll(s);
    QCOMPARE(s.committed(), int64_t{1024});
    QCOMPARE(s.backlog(), int64_t{276});  // the pending tail waits
    QVERIFY(EqualsFresh(s));
    QCOMPARE(s.checkpoints().size(), size_t{1});
    QCOMPARE(s.checkpoints().back().length, int64_t{1024});  // the last line at or below the prompt's end

    const std::vector<int32_t> o1 = Tokens(2, 300, vocab_);
    s.Append(o1);
    ReadAll(s);
    QCOMPARE(s.committed(), int64_t{1536});
    QVERIFY(EqualsFresh(s));

    // The next prompt leaves out the first 200 ids of the answer (its reasoning): back to the checkpoint at 1024.
    const std::vector<int32_t> p2 = Concat(Concat(p1, std::vector<int32_t>(o1.begin() + 200, o1.end())), Tokens(3, 700, vocab_));
    feed = s.Feed(p2, true);
    QCOMPARE(feed.common, int64_t{1300});
    QCOMPARE(feed.rolled_back, int64_t{512});
    QCOMPARE(feed.resumed_at, int64_t{1024});
    ReadAll(s);
    QCOMPARE(s.committed(), int64_t{2048});
    QVERIFY(EqualsFresh(s));
    QCOMPARE(s.checkpoints().back().length, int64_t{2048});

    // A client edits history near the start, below every checkpoint: read again from nothing.
    std::vector<int32_t> p3 = p2;
    p3[100] = (p3[100] + 1) % vocab_;
    feed = s.Feed(p3, true);
    QCOMPARE(feed.resumed_at, int64_t{0});
    QVERIFY(s.checkpoints().empty());
    ReadAll(s);
    QVERIFY(EqualsFresh(s));

    // A prompt that only grows keeps everything read.
    const std::vector<int32_t> p4 = Concat(p3, Tokens(4, 600, vocab_));
    feed = s.Feed(p4, true);
    QCOMPARE(feed.rolled_back, int64_t{0});
    QCOMPARE(feed.resumed_at, int64_t{2048});
    ReadAll(s);
    QVERIFY(EqualsFresh(s));
  }

  void checkpointsAreCapped() {
    ShadowSession s(shadow_->config, kGrid);
    std::vector<int32_t> ids;
    for (int turn = 0; turn < 9; ++turn) {
      ids = Concat(ids, Tokens(10 + turn, 600, vocab_));
      s.Feed(ids, true);
      ReadAll(s);
    }
    QCOMPARE(static_cast<int>(s.checkpoints().size()), ShadowSession::kMaxCheckpoints);
    QVERIFY(EqualsFresh(s));
    // The newest checkpoint is the recurrent state of a fresh prefill at its length.
    const Anchor& newest = s.checkpoints().back();
    auto fresh = testing::FreshPrefill(*forward_, std::span(ids).first(static_cast<size_t>(newest.length)));
    QVERIFY(testing::SameBits(fresh->SaveAnchor().data, newest.data));
  }

  void forkLeavesTheStateUntouched() {
    ShadowSession s(shadow_->config, kGrid);
    s.Feed(Tokens(20, 1500, vocab_), true);
    ReadAll(s);
    auto before = testing::FreshPrefill(*forward_, std::span(s.ids()).first(static_cast<size_t>(s.committed())));
    const std::vector<int32_t> question = Tokens(21, 40, vocab_);
    auto a = s.ForkLogits(*forward_, s.known(), question);
    QVERIFY(a.ok());
    QVERIFY(before->BitEqual(s.state()));
    auto b = s.ForkLogits(*forward_, s.known(), question);
    QVERIFY(b.ok());
    QVERIFY(testing::SameBits(*a, *b));
    QVERIFY(before->BitEqual(s.state()));
    // The fork equals a prefill of everything the session holds and the question.
    auto whole = testing::FreshPrefill(*forward_, std::span<const int32_t>());
    auto logits = forward_->Prefill(*whole, Concat(s.ids(), question));
    QVERIFY(logits.ok());
    QVERIFY(testing::SameBits(*a, *logits));
  }

  void diskRoundTrip_data() {
    QTest::addColumn<int>("dtype");
    for (KvDtype dtype : {KvDtype::kF32, KvDtype::kBf16, KvDtype::kFp8}) QTest::newRow(KvDtypeName(dtype)) << int(dtype);
  }
  // Each K/V dtype's rows go to the file as the state holds them and come back with the same bits.
  void diskRoundTrip() {
    QFETCH(int, dtype);
    ModelConfig config = shadow_->config;
    config.kv_dtype = static_cast<KvDtype>(dtype);
    auto made = Forward::Create(config, shadow_->weights, ForwardOptions{kGrid, 2});
    QVERIFY(made.ok());
    std::unique_ptr<Forward> of_dtype = std::move(made).value();
    std::swap(forward_, of_dtype);  // ReadAll and EqualsFresh read forward_
    struct SwapBack {
      std::unique_ptr<Forward>& a;
      std::unique_ptr<Forward>& b;
      ~SwapBack() { std::swap(a, b); }
    } swap_back{forward_, of_dtype};
    QTemporaryDir dir;
    const std::string fp = "shadow-fingerprint/grid-512";
    ShadowSession s(config, kGrid);
    const std::vector<int32_t> p1 = Tokens(30, 1400, vocab_);
    s.Feed(p1, true);
    ReadAll(s);
    s.Feed(Concat(p1, Tokens(31, 900, vocab_)), true);  // a checkpoint line (2048) still to reach
    (void)s.ReadChunk(*forward_);
    const std::string path = dir.filePath("s.shadow").toStdString();
    Status saved = SaveShadowFile(DiskEnv::Posix(), path, fp, "session \xff key", s);
    QVERIFY2(saved.ok(), saved.ToString().c_str());
    auto loaded = LoadShadowFile(DiskEnv::Posix(), path, config, kGrid, fp, "session \xff key");
    QVERIFY2(loaded.ok(), loaded.status().ToString().c_str());
    ShadowSession& l = **loaded;
    QVERIFY(l.state().BitEqual(s.state()));
    QVERIFY(l.ids() == s.ids());
    QCOMPARE(l.checkpoints().size(), s.checkpoints().size());
    QVERIFY(testing::SameBits(l.checkpoints().back().data, s.checkpoints().back().data));
    QVERIFY(l.pending_checkpoints() == s.pending_checkpoints());
    ReadAll(s);
    ReadAll(l);
    QVERIFY(l.state().BitEqual(s.state()));
    QCOMPARE(l.checkpoints().back().length, int64_t{2048});
    QVERIFY(EqualsFresh(l));

    QVERIFY(!LoadShadowFile(DiskEnv::Posix(), path, config, kGrid, fp, "another session").ok());
    QVERIFY(!LoadShadowFile(DiskEnv::Posix(), path, config, kGrid, "another model/grid-512", "session \xff key").ok());
    auto bytes = ReadFile(path);
    QVERIFY(bytes.ok());
    std::string damaged = *bytes;
    const size_t ids_at = damaged.find(std::string(reinterpret_cast<const char*>(s.ids().data()), 64));
    QVERIFY(ids_at != std::string::npos);
    damaged[ids_at + 10] ^= 0x40;  // inside the ids section, which its crc covers
    QVERIFY(WriteFileAtomic(path, damaged).ok());
    auto corrupt = LoadShadowFile(DiskEnv::Posix(), path, config, kGrid, fp, "session \xff key");
    QVERIFY(!corrupt.ok());
    QCOMPARE(corrupt.status().code(), StatusCode::kCorrupt);
    QVERIFY(WriteFileAtomic(path, bytes->substr(0, bytes->size() / 2)).ok());
    QVERIFY(!LoadShadowFile(DiskEnv::Posix(), path, config, kGrid, fp, "session \xff key").ok());
  }
};

QTEST_GUILESS_MAIN(TestShadowSession)
#include "test_shadow_session.moc"
