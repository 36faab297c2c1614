// The suffix store: a request appends from where it parts from the last four, less 8 ids of
// overlap; drafts come from the newest stored match; the log survives a reopen; past its cap the
// oldest half goes at a document boundary; another tokenizer gets its own file; a damaged header,
// a foreign id or a cut-short last id are handled; generation with store drafts keeps the bits of
// plain decoding.
#include <QTemporaryDir>
#include <QtTest>

#include <filesystem>

#include "engine/core/file_util.h"
#include "engine/runtime/forward.h"
#include "engine/runtime/generator.h"
#include "engine/runtime/suffix_store.h"
#include "tests/engine/test_runtime_util.h"

using namespace anchorage;

namespace {

const std::string kSha = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

std::vector<int32_t> Range(int32_t from, int32_t n) {
  std::vector<int32_t> v;
  for (int32_t i = 0; i < n; ++i) v.push_back(from + i);
  return v;
}

std::vector<int32_t> Cat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

class TestSuffixStore : public QObject {
  Q_OBJECT

  std::unique_ptr<SuffixStore> Open(const QTemporaryDir& dir, int64_t max_bytes = 1 << 20, const std::string& sha = kSha, bool read_only = false) {
    SuffixStoreOptions o;
    o.dir = dir.filePath("suffix").toStdString();
    o.tokenizer_sha256 = sha;
    o.max_bytes = max_bytes;
    o.read_only = read_only;
    auto s = SuffixStore::Open(o, 1000);
    if (!s.ok()) qFatal("%s", s.status().ToString().c_str());
    return std::move(s).value();
  }

 private slots:
  void appendsWhereARequestParts() {
    QTemporaryDir dir;
    auto s = Open(dir);
    const std::vector<int32_t> a = Range(100, 50);
    QVERIFY(s->Append(a).ok());
    QCOMPARE(s->log(), Cat(a, {-1}));
    // The next turn repeats the first and adds 20 ids: only the last 8 of the first and the 20 go in.
    const std::vector<int32_t> b = Cat(a, Range(300, 20));
    QVERIFY(s->Append(b).ok());
    QCOMPARE(s->log(), Cat(Cat(Cat(a, {-1}), std::vector<int32_t>(b.begin() + 42, b.end())), {-1}));
    QVERIFY(s->Append(b).ok());  // the same request again adds its last 8 ids only
    QCOMPARE(static_cast<int64_t>(s->log().size()), int64_t{51 + 29 + 9});
    // Drafts: what followed the newest match, never past a document's end.
    QCOMPARE(s->Draft(std::vector<int32_t>{7, 310, 311}, 4), (std::vector<int32_t>{312, 313, 314, 315}));
    QCOMPARE(s->Draft(std::vector<int32_t>{318, 319}, 4), std::vector<int32_t>{});
    QVERIFY(s->Draft(std::vector<int32_t>{1, 2}, 4).empty());
    // A reopen reads the same log and drafts the same.
    auto again = Open(dir);
    QCOMPARE(again->log(), s->log());
    QVERIFY(again->note().empty());
    QCOMPARE(again->Draft(std::vector<int32_t>{7, 310, 311}, 4), (std::vector<int32_t>{312, 313, 314, 315}));
    // Read-only: drafts, appends nothing.
    auto ro = Open(dir, 1 << 20, kSha, true);
    QVERIFY(ro->Append(Range(500, 30)).ok());
    QCOMPARE(ro->log(), s->log());
  }

  void forgetsTheOldestHalf() {
    QTemporaryDir dir;
    auto s = Open(dir, 4000);  // 1,000 ids
    for (int32_t d = 0; d < 12; ++d) QVERIFY(s->Append(Range(d * 80, 100)).ok());
    QVERIFY(s->bytes() <= 4000);
    QCOMPARE(s->log().back(), -1);
    QVERIFY(s->log().front() % 80 == 0);  // a document's start
    QCOMPARE(s->log()[s->log().size() - 2], 11 * 80 + 99);
    QCOMPARE(Open(dir, 4000)->log(), s->log());
  }

  void damageIsHandled() {
    QTemporaryDir dir;
    std::string path;
    {
      auto s = Open(dir);
      QVERIFY(s->Append(Range(10, 40)).ok());
      path = s->path();
    }
    // Another tokenizer gets another file.
    auto other = Open(dir, 1 << 20, "fedcba9876543210" + kSha.substr(16));
    QVERIFY(other->log().empty());
    QVERIFY(other->path() != path);
    // A cut-short last id is dropped.
    auto bytes = ReadFile(path);
    QVERIFY(WriteFileAtomic(path, bytes->substr(0, bytes->size() - 2)).ok());
    auto cut = Open(dir);
    QCOMPARE(static_cast<int64_t>(cut->log().size()), int64_t{40});
    QVERIFY(!cut->note().empty());
    // A foreign id (outside the vocabulary) or a damaged header: an empty log, and it says why.
    std::string foreign = *bytes;
    const int32_t big = 5000;
    std::memcpy(foreign.data() + foreign.size() - 8, &big, 4);
    QVERIFY(WriteFileAtomic(path, foreign).ok());
    auto f = Open(dir);
    QVERIFY(f->log().empty());
    QVERIFY(f->note().find("vocabulary") != std::string::npos);
    QVERIFY(WriteFileAtomic(path, "garbage").ok());
    auto g = Open(dir);
    QVERIFY(g->log().empty());
    QVERIFY(!g->note().empty());
    QVERIFY(g->Append(Range(1, 10)).ok());
    QCOMPARE(Open(dir)->log().size(), size_t{11});
  }

  void storeDraftsKeepThePlainBits() {
    QTemporaryDir dir, model_dir;
    auto m = testing::MakeModel(TinyModelSize::kTiny, 17, model_dir.path().toStdString());
    QVERIFY(m.ok());
    auto f = Forward::Create((*m)->config, (*m)->weights, ForwardOptions{64, 2});
    QVERIFY(f.ok());
    const int64_t vocab = (*m)->config.vocab_size;
    SuffixStoreOptions o;
    o.dir = dir.filePath("suffix").toStdString();
    o.tokenizer_sha256 = kSha;
    auto store = SuffixStore::Open(o, vocab);
    QVERIFY(store.ok());
    const std::vector<int32_t> file = testing::RandomIds(60, vocab, 31);
    QVERIFY((*store)->Append(Cat(testing::RandomIds(30, vocab, 30), file)).ok());  // an earlier request read the file
    // This request's prompt does not hold the file; its reply repeats it.
    std::vector<int32_t> prompt = testing::RandomIds(50, vocab, 32);
    prompt.insert(prompt.end(), file.begin(), file.begin() + 3);
    SamplingParams p;
    p.temperature = 0;
    p.max_tokens = 50;
    p.forced_ids.assign(file.begin() + 3, file.begin() + 53);
    Generator generator(**f, nullptr);
    SequenceState plain((*m)->config), drafted((*m)->config);
    QVERIFY((*f)->Prefill(plain, std::span(prompt).first(prompt.size() - 1)).ok());
    QVERIFY((*f)->Prefill(drafted, std::span(prompt).first(prompt.size() - 1)).ok());
    auto a = generator.Generate(plain, std::span(prompt).last(1), p, nullptr);
    SpeculativeOptions spec;
    spec.max_draft = 8;
    spec.history = std::span(prompt).first(prompt.size() - 1);
    spec.store = store->get();
    auto b = generator.Generate(drafted, std::span(prompt).last(1), p, nullptr, nullptr, spec);
    QVERIFY(a.ok() && b.ok());
    QCOMPARE(b->tokens, a->tokens);
    QVERIFY(drafted.BitEqual(plain));
    QVERIFY2(b->accepted_tokens >= 40, std::to_string(b->accepted_tokens).c_str());
  }
};

QTEST_GUILESS_MAIN(TestSuffixStore)
#include "test_suffix_store.moc"
