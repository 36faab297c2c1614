// The disk tier's files: crc32c; a chunk and an anchor written crash-safe, read back and restored
// resume bit for bit as a cold prefill; a flipped byte, a truncation, another fingerprint, kind or
// layout is refused; a fault at every step of a write (or ENOSPC, or SIGKILL) leaves either the old
// file or the new one, never a wrong one, and no .tmp after the start-up sweep.
#include <QtTest>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "engine/cache/disk_env.h"
#include "engine/cache/disk_files.h"
#include "engine/core/crc32c.h"
#include "engine/core/page_buffer.h"
#include "engine/model/model.h"
#include "engine/model/tiny_model.h"
#include "engine/runtime/forward.h"
#include "tests/cache/cache_test_util.h"
#include "tests/cache/fault_env.h"

using namespace anchorage;
using anchorage::testing::SameBits;
using anchorage::testing::Tokens;
using anchorage::testing::FaultEnv;

namespace {



Status Write(DiskEnv& env, const std::string& path, const EncodedCacheFile& file) {
  return WriteFileCrashSafe(env, path, file.pieces);
}

}  // namespace

class TestDiskFiles : public QObject {
  Q_OBJECT
  testing::TinyEngine engine_;
  Model* model_ = nullptr;
  Forward* forward_ = nullptr;
  std::string fp_;

 private slots:
  void initTestCase() {
    QVERIFY(engine_.Make(3, 64, 2));
    model_ = engine_.model.get();
    forward_ = engine_.forward.get();
    fp_ = engine_.fingerprint;
  }

  void crc32c() {
    QCOMPARE(Crc32c("123456789"), 0xe3069283u);  // the standard check value
    QCOMPARE(Crc32cPortable("123456789", 9), 0xe3069283u);
    std::mt19937 rng(7);
    std::string buf(10000, '\0');
    for (auto& c : buf) c = static_cast<char>(rng());
    for (size_t off : {0, 1, 3, 7})
      for (size_t n : {0, 1, 7, 8, 9, 63, 64, 1000, 9000}) {
        QCOMPARE(Crc32c(buf.data() + off, n), Crc32cPortable(buf.data() + off, n));
        QCOMPARE(Crc32c(buf.data() + off + n / 2, n - n / 2, Crc32c(buf.data() + off, n / 2)), Crc32c(buf.data() + off, n));
      }
  }

  void pageBufferIsZeroAlignedAndCopies() {
    for (size_t bytes : {size_t(100), size_t(4096), size_t(3) << 20}) {
      PageBuffer b(bytes);
      QCOMPARE(b.size(), bytes);
      const uintptr_t at = reinterpret_cast<uintptr_t>(b.data());
      QCOMPARE(at % (bytes >= (size_t(2) << 20) ? (size_t(2) << 20) : 4096), uintptr_t(0));
      const auto* p = static_cast<const unsigned char*>(b.data());
      QVERIFY(std::all_of(p, p + bytes, [](unsigned char c) { return c == 0; }));
      std::memset(b.data(), 0x5a, bytes);
      PageBuffer copy(b);
      QVERIFY(copy.data() != b.data());
      QCOMPARE(std::memcmp(copy.data(), b.data(), bytes), 0);
      PageBuffer moved(std::move(copy));
      QVERIFY(copy.data() == nullptr);
      QCOMPARE(static_cast<const unsigned char*>(moved.data())[bytes - 1], static_cast<unsigned char>(0x5a));
    }
  }

  // Aligned runs go straight from the drive where the file system allows it, the rest through the
  // page cache; either way every byte lands where it was asked, and a short file is Corrupt.
  void readRangesDirectAndBuffered() {
    QTemporaryDir dir;
    const std::string path = dir.path().toStdString() + "/ranges.bin";
    std::mt19937 rng(11);
    std::string bytes(size_t(64) << 10, '\0');
    for (auto& c : bytes) c = static_cast<char>(rng());
    const std::string_view piece(bytes);
    QVERIFY(WriteFileCrashSafe(DiskEnv::Posix(), path, piece).ok());
    PageBuffer dest(bytes.size());
    char* d = static_cast<char*>(dest.data());
    const std::vector<ReadRange> ranges = {
        {0, 4096, d + 8192},            // an aligned run of three, out of order in memory
        {4096, 8192, d + 16384},
        {12288, 4096, d},
        {16384 + 100, 300, d + 4096},   // unaligned in the file
        {20480, 4096, d + 24576 + 8},   // aligned in the file, not in memory
        {61440, 4096, d + 32768},       // the last page
    };
    QVERIFY2(DiskEnv::Posix().ReadRanges(path, ranges).ok(), "read");
    for (const ReadRange& r : ranges)
      QCOMPARE(std::string_view(r.dest, static_cast<size_t>(r.size)), piece.substr(static_cast<size_t>(r.offset), static_cast<size_t>(r.size)));
    const std::vector<ReadRange> past_end = {{61440, 8192, d}};
    QCOMPARE(DiskEnv::Posix().ReadRanges(path, past_end).code(), StatusCode::kCorrupt);
    const std::vector<ReadRange> unaligned_past_end = {{65000, 1000, d + 1}};
    QCOMPARE(DiskEnv::Posix().ReadRanges(path, unaligned_past_end).code(), StatusCode::kCorrupt);
    QCOMPARE(DiskEnv::Posix().ReadRanges(path + ".missing", ranges).code(), StatusCode::kIoError);
  }

  void prefixHashesChain() {
    const auto a = Tokens(1, 200, 500), b = Tokens(2, 200, 500);
    const auto ha = PrefixHashes(a, 64);
    QCOMPARE(ha.size(), size_t(3));
    std::vector<int32_t> c(a.begin(), a.begin() + 128);
    c.insert(c.end(), b.begin(), b.begin() + 72);
    const auto hc = PrefixHashes(c, 64);
    QCOMPARE(hc[0], ha[0]);
    QCOMPARE(hc[1], ha[1]);
    QVERIFY(hc[2] != ha[2]);
    QVERIFY(PrefixHashes(b, 64)[0] != ha[0]);
  }

  // A chunk and an anchor written, reopened and restored into a fresh state continue exactly as a cold prefill.
  void restoreIsBitExact() {
    QTemporaryDir dir;
    const auto ids = Tokens(5, 200, model_->tokenizer.vocab_size());
    SequenceState cold(model_->config);
    QVERIFY(forward_->Prefill(cold, std::span(ids.data(), 128)).ok());
    const auto hashes = PrefixHashes(ids, 64);
    std::vector<std::string> chunk_names;
    for (int64_t c = 0; c < 2; ++c) {
      auto rows = cold.CopyRows(c * 64, (c + 1) * 64);
      QVERIFY(rows.ok());
      ChunkFile chunk{std::vector<int32_t>(ids.begin() + c * 64, ids.begin() + (c + 1) * 64), std::move(rows).value()};
      auto encoded = EncodeChunk(model_->config, fp_, chunk);
      QVERIFY(encoded.ok());
      chunk_names.push_back(ChunkFileName(hashes[c]));
      QVERIFY(Write(DiskEnv::Posix(), dir.filePath(QString::fromStdString(chunk_names.back())).toStdString(), *encoded).ok());
    }
    AnchorFile anchor{cold.SaveAnchor(), chunk_names};
    auto encoded = EncodeAnchor(model_->config, fp_, anchor);
    QVERIFY(encoded.ok());
    const std::string anchor_path = dir.filePath(QString::fromStdString(AnchorFileName(hashes[1]))).toStdString();
    QVERIFY(Write(DiskEnv::Posix(), anchor_path, *encoded).ok());
    auto cold_next = forward_->Prefill(cold, std::span(ids.data() + 128, 72), LogitsRows::kAll);
    QVERIFY(cold_next.ok());

    SequenceState warm(model_->config);
    auto read_anchor = DecodeAnchor(model_->config, fp_, *ReadFile(anchor_path));
    QVERIFY2(read_anchor.ok(), read_anchor.status().ToString().c_str());
    QCOMPARE(read_anchor->chunks, chunk_names);
    for (const std::string& name : read_anchor->chunks) {
      auto chunk = DecodeChunk(model_->config, fp_, *ReadFile(dir.filePath(QString::fromStdString(name)).toStdString()));
      QVERIFY2(chunk.ok(), chunk.status().ToString().c_str());
      QVERIFY(std::equal(chunk->tokens.begin(), chunk->tokens.end(), ids.begin() + chunk->rows.begin));
      QVERIFY(warm.WriteRows(chunk->rows).ok());
    }
    QVERIFY(warm.RestoreAnchor(read_anchor->anchor).ok());
    auto warm_next = forward_->Prefill(warm, std::span(ids.data() + 128, 72), LogitsRows::kAll);
    QVERIFY(warm_next.ok());
    QVERIFY(SameBits(*cold_next, *warm_next));
    QVERIFY(cold.BitEqual(warm));
  }

  void damagedFilesAreRefused() {
    const auto ids = Tokens(9, 64, model_->tokenizer.vocab_size());
    SequenceState s(model_->config);
    QVERIFY(forward_->Prefill(s, ids).ok());
    ChunkFile chunk{ids, *s.CopyRows(0, 64)};
    auto encoded = EncodeChunk(model_->config, fp_, chunk);
    QVERIFY(encoded.ok());
    std::string bytes;
    for (std::string_view p : encoded->pieces) bytes += p;
    QCOMPARE(int64_t(bytes.size()), encoded->size);
    QVERIFY(DecodeChunk(model_->config, fp_, bytes).ok());
    // A flipped bit anywhere in the header or a section (the padding between sections is not read).
    std::vector<size_t> positions = {0, 5, 9, 14, 20, 100, 300};
    for (size_t at = kCacheSectionAlign; at < bytes.size(); at += 997) positions.push_back(at);
    auto decoded = DecodeCacheFile(bytes, "chunk", fp_);
    QVERIFY(decoded.ok());
    const auto covered = [&](size_t at) {
      if (at < 16) return true;
      for (const auto& sec : decoded->sections) {
        const size_t begin = static_cast<size_t>(sec.bytes.data() - decoded->data->data());
        if (at >= begin && at < begin + sec.bytes.size()) return true;
      }
      const size_t json = *reinterpret_cast<const uint32_t*>(bytes.data() + 12);
      return at < 16 + json + 4;
    };
    int checked = 0;
    for (size_t at : positions) {
      if (at >= bytes.size() || !covered(at)) continue;
      std::string bad = bytes;
      bad[at] = static_cast<char>(bad[at] ^ 0x10);
      auto r = DecodeChunk(model_->config, fp_, bad);
      QVERIFY2(!r.ok() && r.status().code() == StatusCode::kCorrupt, qPrintable(QString("flip at %1 accepted").arg(at)));
      ++checked;
    }
    QVERIFY(checked > 5);
    for (size_t len : {size_t(0), size_t(10), size_t(100), size_t(kCacheSectionAlign), bytes.size() / 2, bytes.size() - 1}) {
      auto r = DecodeChunk(model_->config, fp_, bytes.substr(0, len));
      QVERIFY2(!r.ok(), qPrintable(QString("truncated to %1 accepted").arg(len)));
    }
    auto other = DecodeChunk(model_->config, "another-fingerprint", bytes);
    QVERIFY(!other.ok());
    QVERIFY(other.status().message().find("fingerprint") != std::string::npos);
    QVERIFY(!DecodeAnchor(model_->config, fp_, bytes).ok());  // a chunk is not an anchor
    ModelConfig wider = model_->config;
    wider.head_dim *= 2;
    QVERIFY(!DecodeChunk(wider, fp_, bytes).ok());  // another model's layout
  }

  // A fault at every operation of a write, and a crash after it: the old file or the new, never a
  // torn one; after the start-up sweep no .tmp is left.
  void faultAtEveryStepKeepsOldOrNew() {
    const auto ids = Tokens(11, 64, model_->tokenizer.vocab_size());
    SequenceState s(model_->config);
    QVERIFY(forward_->Prefill(s, ids).ok());
    const ChunkFile first{ids, *s.CopyRows(0, 64)};
    ChunkFile second = first;
    second.rows.data[0] += 1.0f;
    auto old_file = EncodeChunk(model_->config, fp_, first), new_file = EncodeChunk(model_->config, fp_, second);
    QVERIFY(old_file.ok() && new_file.ok());
    FaultEnv counter;
    {
      QTemporaryDir dir;
      QVERIFY(Write(counter, dir.filePath("x.chunk").toStdString(), *new_file).ok());
    }
    const int64_t total_ops = counter.ops;
    QVERIFY(total_ops >= 5);
    for (bool crash : {false, true})
      for (int64_t at = 0; at < total_ops; ++at) {
        QTemporaryDir dir;
        const std::string path = dir.filePath("x.chunk").toStdString();
        QVERIFY(Write(DiskEnv::Posix(), path, *old_file).ok());
        FaultEnv env;
        env.fail_at = at;
        env.crash = crash;
        const Status s = Write(env, path, *new_file);
        QVERIFY2(!s.ok(), qPrintable(QString("op %1").arg(at)));
        QVERIFY(s.message().find("No space left") != std::string::npos);
        auto swept = SweepTemporaries(DiskEnv::Posix(), dir.path().toStdString());
        QVERIFY(swept.ok());
        if (!crash) QCOMPARE(*swept, 0);  // a failing write cleans up after itself
        auto names = DiskEnv::Posix().ListFiles(dir.path().toStdString());
        QCOMPARE(*names, std::vector<std::string>{"x.chunk"});
        auto back = DecodeChunk(model_->config, fp_, *ReadFile(path));
        QVERIFY2(back.ok(), qPrintable(QString("op %1, crash %2: %3").arg(at).arg(crash).arg(QString::fromStdString(back.status().message()))));
        const bool is_old = SameBits(back->rows.data, first.rows.data), is_new = SameBits(back->rows.data, second.rows.data);
        QVERIFY(is_old || is_new);
        if (at < total_ops - 1) QVERIFY2(is_old, qPrintable(QString("op %1: the new file appeared before its rename").arg(at)));
      }
  }

  // A process killed with SIGKILL while it rewrites a file: after the sweep the file is whole.
  void sigkillMidWrite() {
    QTemporaryDir dir;
    const std::string path = dir.filePath("big.chunk").toStdString();
    std::vector<float> payload(size_t(8) << 20, 1.5f);  // 32 MiB
    const std::vector<SectionSpec> sections = {
        {"kv", SectionDType::kF32, {int64_t(payload.size())}, std::string_view(reinterpret_cast<const char*>(payload.data()), payload.size() * 4)}};
    auto file = EncodeCacheFile({"blob", fp_, 1, {}}, sections);
    QVERIFY(file.ok());
    QVERIFY(Write(DiskEnv::Posix(), path, *file).ok());
    const pid_t child = ::fork();
    QVERIFY(child >= 0);
    if (child == 0) {
      for (;;) (void)Write(DiskEnv::Posix(), path, *file);
    }
    ::usleep(150 * 1000);
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    QVERIFY(WIFSIGNALED(status));
    QVERIFY(SweepTemporaries(DiskEnv::Posix(), dir.path().toStdString()).ok());
    QCOMPARE(*DiskEnv::Posix().ListFiles(dir.path().toStdString()), std::vector<std::string>{"big.chunk"});
    auto back = DecodeCacheFile(*ReadFile(path), "blob", fp_);
    QVERIFY2(back.ok(), back.status().ToString().c_str());
    QCOMPARE(back->sections.at(0).bytes.size(), payload.size() * 4);
  }
};

QTEST_APPLESS_MAIN(TestDiskFiles)
#include "test_disk_files.moc"
