// The compaction written ahead (ResidentPrefix::WriteAhead) on the tiny model: its answer equals, bit for
// bit, the continuation a live request writes; a request that stops it at any point leaves the state
// the same bits and keeps nothing; the prepared answer serves only a request a live run would answer
// with the same tokens; clear drops it.
#include <QtTest>

#include "tests/kernel_path_env.h"

#include <cstring>

#include "engine/cache/resident_prefix.h"
#include "tests/cache/cache_test_util.h"

using namespace anchorage;
using anchorage::testing::Concat;
using anchorage::testing::Greedy;
using anchorage::testing::Tokens;

namespace {

constexpr int64_t kGrid = 64;

bool SameToken(const GeneratedToken& a, const GeneratedToken& b) {
  if (a.sampled.id != b.sampled.id || std::memcmp(&a.sampled.logprob, &b.sampled.logprob, sizeof(float)) != 0 || a.text != b.text ||
      a.sampled.top.size() != b.sampled.top.size())
    return false;
  for (size_t i = 0; i < a.sampled.top.size(); ++i)
    if (a.sampled.top[i].first != b.sampled.top[i].first ||
        std::memcmp(&a.sampled.top[i].second, &b.sampled.top[i].second, sizeof(float)) != 0)
      return false;
  return true;
}

}  // namespace

class TestWriteAhead : public QObject {
  Q_OBJECT

  anchorage::testing::TinyEngine engine_;
  int32_t vocab_ = 0;
  std::vector<int32_t> turn_;  // the conversation's prompt

  // A resident prefix holding session "s": one greedy turn, ending at its end anchor.
  std::unique_ptr<ResidentPrefix> Conversation() {
    auto rp = std::make_unique<ResidentPrefix>(*engine_.forward, &engine_.model->tokenizer, ResidentOptions{});
    if (!rp->Generate({turn_, "s", 24}, Greedy(24), nullptr).ok()) return nullptr;
    return rp;
  }
  // The continuation: the record up to the end anchor, then 100 new ids (over two grid pieces).
  std::vector<int32_t> ContinuationOf(const ResidentPrefix& rp) {
    auto record = rp.EndRecord("s");
    return record ? Concat(*record, Tokens(31, 100, vocab_)) : std::vector<int32_t>{};
  }
  struct Run {
    CacheSource source = CacheSource::kCold;
    std::vector<GeneratedToken> tokens;
    FinishReason finish = FinishReason::kCancelled;
  };
  Run Generate(ResidentPrefix& rp, const std::vector<int32_t>& ids, const SamplingParams& params) {
    Run run;
    auto r = rp.Generate({ids, "s", params.max_tokens}, params, [&](const GeneratedToken& t) {
      run.tokens.push_back(t);
      return true;
    });
    if (!r.ok()) return run;
    run.source = r->resume.source;
    run.finish = r->generation.finish;
    return run;
  }
  static bool SameTokens(const Run& a, const Run& b) {
    if (a.tokens.size() != b.tokens.size()) return false;
    for (size_t i = 0; i < a.tokens.size(); ++i)
      if (!SameToken(a.tokens[i], b.tokens[i])) return false;
    return true;
  }

 private slots:
  void initTestCase() {
    ANCHORAGE_SKIP_UNLESS_KERNEL_PATH_RUNS();
    QVERIFY(engine_.Make(11, kGrid, 2));
    vocab_ = engine_.model->tokenizer.vocab_size();
    turn_ = Tokens(30, 150, vocab_);
  }

  void equalsTheLiveContinuation() {
    auto rp = Conversation();
    auto live = Conversation();
    QVERIFY(rp && live);
    const auto ids = ContinuationOf(*rp);
    QVERIFY(!ids.empty());
    const SequenceState before = rp->state();
    QVERIFY(rp->WriteAhead("s", ids, Greedy(20), 0, [] { return false; }).ok());
    QVERIFY2(rp->state().BitEqual(before), "writing ahead changed the state in place");
    QVERIFY(rp->prepared_prompt() != nullptr && *rp->prepared_prompt() == ids);
    const Run reference = Generate(*live, ids, Greedy(20));
    QCOMPARE(reference.source, CacheSource::kEnd);
    QCOMPARE(reference.tokens.size(), size_t(20));
    const Run served = Generate(*rp, ids, Greedy(20));
    QCOMPARE(served.source, CacheSource::kPrepared);
    QVERIFY2(SameTokens(served, reference), "the prepared answer differs from the live continuation");
    QCOMPARE(served.finish, reference.finish);
    const CacheStats stats = rp->Stats();
    QCOMPARE(stats.prepared.entries, int64_t(1));
    QCOMPARE(stats.prepared.written, int64_t(1));
    QCOMPARE(stats.prepared.served, int64_t(1));
    QCOMPARE(stats.prepared.tokens, int64_t(20));
    QCOMPARE(stats.prepared.session, std::string("s"));
  }

  void aRequestStopsItAnywhereAndNothingChanges_data() {
    QTest::addColumn<int>("stop_at");  // the should_stop call that says stop
    QTest::newRow("before the prefill") << 1;
    QTest::newRow("between prefill pieces") << 2;
    QTest::newRow("after the first token") << 3;
    QTest::newRow("in the decode") << 10;
  }
  void aRequestStopsItAnywhereAndNothingChanges() {
    QFETCH(int, stop_at);
    auto rp = Conversation();
    auto live = Conversation();
    QVERIFY(rp && live);
    const auto ids = ContinuationOf(*rp);
    const SequenceState before = rp->state();
    int calls = 0;
    Status s = rp->WriteAhead("s", ids, Greedy(20), 0, [&] { return ++calls >= stop_at; });
    QCOMPARE(s.code(), StatusCode::kCancelled);
    QCOMPARE(calls, stop_at);
    QVERIFY2(rp->state().BitEqual(before), "a stopped write-ahead changed the state in place");
    QVERIFY(rp->prepared_prompt() == nullptr);
    QCOMPARE(rp->Stats().prepared.stopped, int64_t(1));
    // The request that stopped it resumes at the end anchor as if nothing had run.
    const Run after = Generate(*rp, ids, Greedy(20));
    QCOMPARE(after.source, CacheSource::kEnd);
    QVERIFY(SameTokens(after, Generate(*live, ids, Greedy(20))));
  }

  void servesOnlyWhatALiveRunWrites() {
    auto rp = Conversation();
    QVERIFY(rp);
    const auto ids = ContinuationOf(*rp);
    const Tokenizer& tokenizer = engine_.model->tokenizer;
    const int32_t im_end = *tokenizer.TokenId("<|im_end|>");
    SamplingParams stops = anchorage::testing::ForcedReply(tokenizer, Concat(Tokens(32, 6, vocab_), {im_end}));
    QVERIFY(rp->WriteAhead("s", ids, stops, 0, [] { return false; }).ok());
    // It stopped within the limit: a larger limit writes the same tokens.
    SamplingParams longer = stops;
    longer.max_tokens += 50;
    const Run served = Generate(*rp, ids, longer);
    QCOMPARE(served.source, CacheSource::kPrepared);
    QCOMPARE(served.finish, FinishReason::kStop);
    QCOMPARE(served.tokens.size(), size_t(7));
    QCOMPARE(served.tokens.back().sampled.id, im_end);
    // A shorter limit, another field, or other ids: a live run.
    SamplingParams shorter = stops;
    shorter.max_tokens = 3;
    QVERIFY(Generate(*rp, ids, shorter).source != CacheSource::kPrepared);
    SamplingParams sampled = longer;
    sampled.temperature = 0.7f;
    QVERIFY(Generate(*rp, ids, sampled).source != CacheSource::kPrepared);
    QVERIFY(Generate(*rp, Concat(ids, {5}), longer).source != CacheSource::kPrepared);
    QCOMPARE(Generate(*rp, ids, longer).source, CacheSource::kPrepared);  // still kept after live runs
    // An answer that ran to its limit serves that limit only.
    auto greedy_rp = Conversation();
    QVERIFY(greedy_rp && greedy_rp->WriteAhead("s", ids, Greedy(8), 0, [] { return false; }).ok());
    QVERIFY(Generate(*greedy_rp, ids, Greedy(9)).source != CacheSource::kPrepared);
    QCOMPARE(Generate(*greedy_rp, ids, Greedy(8)).source, CacheSource::kPrepared);
    QVERIFY(greedy_rp->Clear("prepared").ok());
    QVERIFY(greedy_rp->prepared_prompt() == nullptr);
    QVERIFY(Generate(*greedy_rp, ids, Greedy(8)).source != CacheSource::kPrepared);
  }

  void refusesWhatIsNotTheConversationInPlace() {
    auto rp = Conversation();
    QVERIFY(rp);
    const auto ids = ContinuationOf(*rp);
    auto never = [] { return false; };
    QCOMPARE(rp->WriteAhead("other", ids, Greedy(4), 0, never).code(), StatusCode::kNotFound);
    std::vector<int32_t> edited = ids;
    edited[3] = edited[3] == 5 ? 6 : 5;
    QCOMPARE(rp->WriteAhead("s", edited, Greedy(4), 0, never).code(), StatusCode::kInvalidArgument);
    QCOMPARE(rp->WriteAhead("s", *rp->EndRecord("s"), Greedy(4), 0, never).code(), StatusCode::kInvalidArgument);
    QCOMPARE(rp->WriteAhead("s", ids, Greedy(4), static_cast<int64_t>(ids.size()), never).code(), StatusCode::kOutOfRange);
    QVERIFY(rp->prepared_prompt() == nullptr);
  }
};

QTEST_MAIN(TestWriteAhead)
#include "test_write_ahead.moc"
