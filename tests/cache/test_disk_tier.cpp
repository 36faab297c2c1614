// The disk tier's store on the tiny model with a 64-token grid: a state put, the tier reopened (in
// this process and in a child process) and restored continues bit for bit as a cold prefill;
// shared lines are written once; a corrupted chunk is refused, deleted with the longer lines, and
// the rest still serves; files of another fingerprint and cut-short writes are swept at open;
// eviction takes the least valuable first, and the TTL the unused.
#include <QtTest>

#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

#include "engine/cache/disk_files.h"
#include "engine/cache/disk_tier.h"
#include "engine/core/file_util.h"
#include "engine/model/model.h"
#include "engine/model/tiny_model.h"
#include "engine/runtime/forward.h"
#include "tests/cache/cache_test_util.h"

using namespace anchorage;
using anchorage::testing::Concat;
using anchorage::testing::Head;
using anchorage::testing::SameBits;
using anchorage::testing::Tokens;

namespace {

constexpr int64_t kGrid = 64;


}  // namespace

class TestDiskTier : public QObject {
  Q_OBJECT
  testing::TinyEngine engine_;
  Model* model_ = nullptr;
  Forward* forward_ = nullptr;
  std::string fp_;
  int32_t vocab_ = 0;

  std::unique_ptr<DiskTier> Open(const QTemporaryDir& dir, int64_t budget = int64_t(1) << 40, const std::string& fp = "") {
    auto t = DiskTier::Open(DiskEnv::Posix(), model_->config, fp.empty() ? fp_ : fp,
                            DiskTierOptions{dir.filePath("disk").toStdString(), kGrid, budget, 7, 0, nullptr});
    return t.ok() ? std::move(t).value() : nullptr;
  }

  // The state of a cold prefill of prompt[0, length).
  SequenceState Cold(const std::vector<int32_t>& prompt, int64_t length) {
    SequenceState s(model_->config);
    if (!forward_->Prefill(s, std::span(prompt.data(), size_t(length))).ok()) qFatal("prefill failed");
    return s;
  }

  // Restores at line, prefills the rest of prompt; the logits and state must equal a cold prefill's.
  void ExpectExactResume(DiskTier& tier, const std::vector<int32_t>& prompt, int64_t line) {
    SequenceState warm(model_->config);
    const Status s = tier.Restore(prompt, line, warm);
    QVERIFY2(s.ok(), s.ToString().c_str());
    QCOMPARE(warm.length(), line);
    auto warm_logits = forward_->Prefill(warm, std::span(prompt.data() + line, prompt.size() - size_t(line)));
    SequenceState cold(model_->config);
    auto cold_logits = forward_->Prefill(cold, prompt);
    QVERIFY(warm_logits.ok() && cold_logits.ok());
    QVERIFY(SameBits(*warm_logits, *cold_logits));
    QVERIFY(warm.BitEqual(cold));
  }

 private slots:
  void initTestCase() {
    QVERIFY(engine_.Make(13, kGrid, 2));
    model_ = engine_.model.get();
    forward_ = engine_.forward.get();
    fp_ = engine_.fingerprint;
    vocab_ = model_->tokenizer.vocab_size();
  }

  void putReopenRestore() {
    QTemporaryDir dir;
    const auto a = Tokens(1, 300, vocab_);
    {
      auto tier = Open(dir);
      QVERIFY(tier);
      QVERIFY(tier->Put(a, Cold(a, 192)).ok());
      QCOMPARE(tier->stats().chunks_written, int64_t(3));
      QCOMPARE(tier->stats().anchors_written, int64_t(1));
      QVERIFY(!tier->Put(a, Cold(a, 100)).ok());  // not on a line
    }
    auto tier = Open(dir);
    QVERIFY(tier);
    QCOMPARE(tier->stats().files, int64_t(4));
    QCOMPARE(tier->Find(a, 300), int64_t(192));
    QCOMPARE(tier->Find(a, 191), int64_t(0));
    ExpectExactResume(*tier, a, 192);
    // Another prompt sharing 130 tokens shares two chunks: a put at 256 writes two new ones.
    const auto b = Concat(Head(a, 130), Tokens(2, 170, vocab_));
    QCOMPARE(tier->Find(b, 300), int64_t(0));  // no anchor at 64 or 128
    QVERIFY(tier->Put(b, Cold(b, 256)).ok());
    QCOMPARE(tier->stats().chunks_written, int64_t(2));
    QCOMPARE(tier->Find(b, 300), int64_t(256));
    ExpectExactResume(*tier, b, 256);
  }

  // bf16 (fp8) K/V rows go to disk as they are held (half, or 33/128, of f32's bytes) and restore exactly;
  // a tier of f32 rows under the same fingerprint refuses them by their dtype rather than read them as its own.
  void narrowRowsRestoreExactlyAndAreRefusedByAnF32Tier_data() {
    QTest::addColumn<int>("dtype");
    QTest::addColumn<int64_t>("most_bytes_in_128");  // the file's bytes for 128 of the f32 tier's, at most
    QTest::newRow("bf16") << int(KvDtype::kBf16) << int64_t{96};
    QTest::newRow("fp8") << int(KvDtype::kFp8) << int64_t{80};  // the anchors and 4 KiB-aligned sections are most of the rest
  }
  void narrowRowsRestoreExactlyAndAreRefusedByAnF32Tier() {
    QFETCH(int, dtype);
    QFETCH(int64_t, most_bytes_in_128);
    ModelConfig config = model_->config;
    config.kv_dtype = static_cast<KvDtype>(dtype);
    auto made = Forward::Create(config, model_->weights, ForwardOptions{kGrid, 2});
    QVERIFY(made.ok());
    Forward& forward = **made;
    QTemporaryDir dir;
    const auto a = Tokens(5, 300, vocab_);
    const DiskTierOptions options{dir.filePath("disk").toStdString(), kGrid, int64_t(1) << 40, 7, 0, nullptr};
    auto narrow_tier = DiskTier::Open(DiskEnv::Posix(), config, fp_, options);
    QVERIFY(narrow_tier.ok());
    SequenceState head(config);
    QVERIFY(forward.Prefill(head, std::span(a.data(), size_t(192))).ok());
    QVERIFY((*narrow_tier)->Put(a, head).ok());
    {
      QTemporaryDir f32_dir;
      auto f32_tier = Open(f32_dir);
      QVERIFY(f32_tier && f32_tier->Put(a, Cold(a, 192)).ok());
      QVERIFY2((*narrow_tier)->stats().bytes_written * 128 < f32_tier->stats().bytes_written * most_bytes_in_128,
               qPrintable(QString("%1 bytes against f32's %2").arg((*narrow_tier)->stats().bytes_written).arg(f32_tier->stats().bytes_written)));
    }
    SequenceState warm(config);
    QVERIFY((*narrow_tier)->Restore(a, 192, warm).ok());
    auto warm_logits = forward.Prefill(warm, std::span(a.data() + 192, a.size() - 192));
    SequenceState cold(config);
    auto cold_logits = forward.Prefill(cold, a);
    QVERIFY(warm_logits.ok() && cold_logits.ok());
    QVERIFY(SameBits(*warm_logits, *cold_logits));
    QVERIFY(warm.BitEqual(cold));
    narrow_tier->reset();
    auto f32_tier = Open(dir);
    QVERIFY(f32_tier);
    SequenceState f32_state(model_->config);
    const Status refused = f32_tier->Restore(a, 192, f32_state);
    QVERIFY2(!refused.ok() && refused.message().find("not a chunk of this model") != std::string::npos, refused.ToString().c_str());
    QCOMPARE(f32_state.length(), int64_t(0));
    QCOMPARE(f32_tier->stats().failed_restores, int64_t(1));
  }

  // A restore that keeps a state's first rows tells its device copy that only the rows above changed
  // (a GPU then uploads those alone); the resume stays exact.
  void restoreKeepsTheDeviceCopysRowsBelowTheKeptOnes() {
    QTemporaryDir dir;
    auto tier = Open(dir);
    QVERIFY(tier);
    const auto a = Tokens(3, 300, vocab_);
    QVERIFY(tier->Put(a, Cold(a, 192)).ok());
    const auto b = Concat(Head(a, 130), Tokens(4, 100, vocab_));
    SequenceState s = Cold(b, 230);
    s.set_mirror(std::make_unique<testing::NullMirror>());
    s.set_mirror_sync(200, NewestRecurrent::kHost);
    const Status restored = tier->Restore(a, 192, s, 128);
    QVERIFY2(restored.ok(), restored.ToString().c_str());
    QCOMPARE(s.mirror_rows(), int64_t(128));
    (void)s.DropMirror();
    QVERIFY(s.BitEqual(Cold(a, 192)));
  }

  // A child process opens the tier the parent wrote and restores; its logits equal the parent's cold ones.
  void restoreInAnotherProcess() {
    QTemporaryDir dir;
    const auto a = Tokens(3, 200, vocab_);
    {
      auto tier = Open(dir);
      QVERIFY(tier && tier->Put(a, Cold(a, 128)).ok());
    }
    const std::string out = dir.filePath("child-logits").toStdString();
    const pid_t child = ::fork();
    QVERIFY(child >= 0);
    if (child == 0) {
      int code = 1;
      auto tier = Open(dir);
      SequenceState warm(model_->config);
      if (tier && tier->Restore(a, 128, warm).ok()) {
        auto logits = forward_->Prefill(warm, std::span(a.data() + 128, a.size() - 128));
        if (logits.ok()) {
          std::ofstream f(out, std::ios::binary);
          f.write(reinterpret_cast<const char*>(logits->data()), std::streamsize(logits->size() * 4));
          code = f.good() ? 0 : 1;
        }
      }
      ::_exit(code);
    }
    int status = 0;
    ::waitpid(child, &status, 0);
    QVERIFY(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    SequenceState cold(model_->config);
    auto cold_logits = forward_->Prefill(cold, a);
    QVERIFY(cold_logits.ok());
    auto bytes = ReadFile(out);
    QVERIFY(bytes.ok());
    QCOMPARE(bytes->size(), cold_logits->size() * 4);
    QVERIFY(std::memcmp(bytes->data(), cold_logits->data(), bytes->size()) == 0);
  }

  void corruptChunkIsRefusedAndDropped() {
    QTemporaryDir dir;
    const auto a = Tokens(4, 300, vocab_);
    const auto b = Concat(Head(a, 64), Tokens(5, 236, vocab_));  // shares chunk 0 only
    auto tier = Open(dir);
    QVERIFY(tier);
    QVERIFY(tier->Put(a, Cold(a, 192)).ok());
    QVERIFY(tier->Put(b, Cold(b, 128)).ok());
    // Flip a byte inside a's second chunk.
    const std::string victim = dir.filePath("disk").toStdString() + "/" + ChunkFileName(PrefixHashes(a, kGrid)[1]);
    std::string bytes = *ReadFile(victim);
    bytes[bytes.size() / 2] ^= 0x01;
    QVERIFY(WriteFileAtomic(victim, bytes).ok());
    SequenceState warm(model_->config);
    QVERIFY(forward_->Prefill(warm, std::span(a.data(), 10)).ok());
    const Status s = tier->Restore(a, 192, warm);
    QCOMPARE(s.code(), StatusCode::kCorrupt);
    QVERIFY2(s.message().find("checksum") != std::string::npos, s.message().c_str());
    QCOMPARE(warm.length(), int64_t(0));  // reset, never half-restored
    QCOMPARE(tier->stats().failed_restores, int64_t(1));
    QVERIFY(!FileExists(victim));
    QCOMPARE(tier->Find(a, 300), int64_t(0));  // its anchor at 192 went with the chunk
    QCOMPARE(tier->Find(b, 300), int64_t(128));  // the other prompt still serves
    ExpectExactResume(*tier, b, 128);
    // Files copied under another prompt's names (a stale or planted file) are refused too.
    const auto b_chunk0 = dir.filePath("disk").toStdString() + "/" + ChunkFileName(PrefixHashes(b, kGrid)[0]);
    const auto c = Concat(Tokens(6, 64, vocab_), Tokens(7, 100, vocab_));
    QVERIFY(WriteFileAtomic(dir.filePath("disk").toStdString() + "/" + ChunkFileName(PrefixHashes(c, kGrid)[0]), *ReadFile(b_chunk0)).ok());
    QVERIFY(WriteFileAtomic(dir.filePath("disk").toStdString() + "/" + AnchorFileName(PrefixHashes(c, kGrid)[0]),
                            *ReadFile(dir.filePath("disk").toStdString() + "/" + AnchorFileName(PrefixHashes(b, kGrid)[1]))).ok());
    auto reopened = Open(dir);
    QVERIFY(reopened);
    QCOMPARE(reopened->Find(c, 164), int64_t(64));
    const Status wrong = reopened->Restore(c, 64, warm);
    QVERIFY(!wrong.ok());
  }

  void truncatedChunkIsRefused() {
    QTemporaryDir dir;
    const auto a = Tokens(16, 200, vocab_);
    auto tier = Open(dir);
    QVERIFY(tier && tier->Put(a, Cold(a, 128)).ok());
    const std::string victim = dir.filePath("disk").toStdString() + "/" + ChunkFileName(PrefixHashes(a, kGrid)[1]);
    const std::string bytes = *ReadFile(victim);
    QVERIFY(WriteFileAtomic(victim, bytes.substr(0, bytes.size() / 2)).ok());
    SequenceState warm(model_->config);
    const Status s = tier->Restore(a, 128, warm);
    QCOMPARE(s.code(), StatusCode::kCorrupt);
    QVERIFY2(s.message().find("truncated") != std::string::npos, s.message().c_str());
    QCOMPARE(warm.length(), int64_t(0));
    QCOMPARE(tier->Find(a, 200), int64_t(0));
  }

  void openSweepsForeignAndTemporaryFiles() {
    QTemporaryDir dir;
    const auto a = Tokens(8, 200, vocab_);
    {
      auto tier = Open(dir);
      QVERIFY(tier && tier->Put(a, Cold(a, 128)).ok());
    }
    QVERIFY(WriteFileAtomic(dir.filePath("disk/abc.chunk.tmp").toStdString(), "cut short").ok());
    QVERIFY(WriteFileAtomic(dir.filePath("disk/junk.anchor").toStdString(), "not a cache file").ok());
    auto same = Open(dir);
    QVERIFY(same);
    QCOMPARE(same->stats().swept_temporaries, 1);
    QCOMPARE(same->stats().swept_foreign, int64_t(0));
    QCOMPARE(same->stats().swept_corrupt, int64_t(1));
    QCOMPARE(same->corrupt_at_open().size(), size_t(1));
    QVERIFY(same->corrupt_at_open()[0].starts_with("junk.anchor: "));
    QCOMPARE(same->Find(a, 200), int64_t(128));
    auto other = Open(dir, int64_t(1) << 40, "another-fingerprint");
    QVERIFY(other);
    QCOMPARE(other->stats().swept_foreign, int64_t(3));
    QCOMPARE(other->stats().files, int64_t(0));
    QCOMPARE(other->Find(a, 200), int64_t(0));
  }

  // After a restart the anchors still name their chunks: a budget eviction takes one whole prompt, never another's chunks.
  void evictionAfterReopenKeepsWholePrompts() {
    QTemporaryDir dir;
    const auto a = Tokens(14, 200, vocab_), b = Tokens(15, 200, vocab_);
    int64_t one_prompt = 0;
    {
      auto tier = Open(dir);
      QVERIFY(tier && tier->Put(a, Cold(a, 128)).ok());
      one_prompt = tier->stats().bytes;
      QVERIFY(tier->Put(b, Cold(b, 128)).ok());
    }
    auto tier = Open(dir);
    QVERIFY(tier);
    tier->set_budget_bytes(one_prompt + one_prompt / 2);
    QCOMPARE(tier->stats().bytes, one_prompt);
    QCOMPARE(tier->Find(a, 200) + tier->Find(b, 200), int64_t(128));  // one prompt whole, the other gone
  }

  // The least valuable goes first: (hits + 1) x tokens per byte, halved per day unused; the TTL drops the unused.
  void evictionByValueAgeAndTtl() {
    QTemporaryDir dir;
    int64_t now = int64_t(1700000000) * 1000;
    const int64_t day = int64_t(24) * 3600 * 1000;
    DiskTierOptions o{dir.filePath("disk").toStdString(), kGrid, int64_t(1) << 40, 7, 0, [&] { return now; }};
    auto opened = DiskTier::Open(DiskEnv::Posix(), model_->config, fp_, o);
    QVERIFY(opened.ok());
    DiskTier& tier = **opened;
    const auto a = Tokens(9, 200, vocab_), b = Tokens(10, 200, vocab_), c = Tokens(11, 200, vocab_);
    QVERIFY(tier.Put(a, Cold(a, 128)).ok());
    const int64_t one_prompt = tier.stats().bytes;
    QVERIFY(tier.Put(b, Cold(b, 128)).ok());
    SequenceState s(model_->config);
    QVERIFY(tier.Restore(a, 128, s).ok());  // a has a hit, b none
    tier.set_budget_bytes(one_prompt + one_prompt / 2);
    QCOMPARE(tier.stats().bytes, one_prompt);
    QCOMPARE(tier.stats().evicted_files, int64_t(3));  // b's anchor and the two chunks only it read
    QCOMPARE(tier.Find(a, 200), int64_t(128));
    QCOMPARE(tier.Find(b, 200), int64_t(0));
    // Two days later a's hit is worth a quarter: a fresh c outranks it.
    now += 2 * day;
    tier.set_budget_bytes(int64_t(1) << 40);
    QVERIFY(tier.Put(c, Cold(c, 128)).ok());
    tier.set_budget_bytes(one_prompt + one_prompt / 2);
    QCOMPARE(tier.Find(a, 200), int64_t(0));
    QCOMPARE(tier.Find(c, 200), int64_t(128));
    // Unused past the TTL: gone, whatever the budget; and the mtime carries the age across a reopen.
    tier.set_budget_bytes(int64_t(1) << 40);
    now += 6 * day;
    auto reopened = DiskTier::Open(DiskEnv::Posix(), model_->config, fp_, o);
    QVERIFY(reopened.ok());
    QCOMPARE((*reopened)->Find(c, 200), int64_t(128));
    now += 2 * day;
    (*reopened)->Evict();
    QCOMPARE((*reopened)->Find(c, 200), int64_t(0));
    QCOMPARE((*reopened)->stats().expired_files, int64_t(3));
    QCOMPARE((*reopened)->stats().files, int64_t(0));
    QVERIFY(tier.Clear().ok());
  }
};

QTEST_APPLESS_MAIN(TestDiskTier)
#include "test_disk_tier.moc"
