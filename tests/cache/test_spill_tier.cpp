// The session spill behind the resident prefix, on the tiny model with a 64-token grid: a
// conversation evicted by another session's request is written to the spill instead of the park,
// and its next turn resumes at the saved end anchor with the tokens of an engine it never left; a
// second eviction writes only the new blocks; a planned stop and a new engine read it back first;
// a damaged entry goes, and the turn is served from what is in place.
#include <QtTest>

#include <cstring>
#include <filesystem>

#include "engine/cache/resident_prefix.h"
#include "engine/cache/session_spill.h"
#include "engine/core/file_util.h"
#include "tests/cache/cache_test_util.h"

using namespace anchorage;
using anchorage::testing::Concat;
using anchorage::testing::Greedy;
using anchorage::testing::Tokens;

class TestSpillTier : public QObject {
  Q_OBJECT
  testing::TinyEngine engine_;
  Model* model_ = nullptr;
  Forward* forward_ = nullptr;
  int32_t vocab_ = 0;

  ResidentOptions Options() const {
    ResidentOptions o;
    o.store_enabled = false;
    o.park_budget_bytes = 1;  // the park holds nothing: an eviction goes to the spill
    o.spill.min_tokens = 256;
    o.spill.cost_check = false;  // the tiny model prefills faster than any drive reads
    return o;
  }
  std::unique_ptr<SessionSpill> OpenSpill(const QTemporaryDir& dir) {
    SessionSpillOptions o;
    o.dir = dir.filePath("sessions").toStdString();
    auto s = SessionSpill::Open(DiskEnv::Posix(), model_->config, engine_.fingerprint, o);
    if (!s.ok()) qFatal("%s", s.status().ToString().c_str());
    return std::move(s).value();
  }
  std::unique_ptr<ResidentPrefix> Engine(SessionSpill* spill, std::vector<CacheEvent>* events = nullptr) {
    auto rp = std::make_unique<ResidentPrefix>(*forward_, &model_->tokenizer, Options());
    if (events != nullptr) rp->set_event_sink([events](const CacheEvent& e) { events->push_back(e); });
    rp->set_session_spill(spill);
    return rp;
  }
  // A turn: the greedy tokens and where it resumed.
  std::pair<std::vector<int32_t>, ResumeInfo> Turn(ResidentPrefix& rp, const std::vector<int32_t>& prompt, const std::string& session) {
    auto out = rp.Generate(CacheRequest{prompt, session, 16, 0}, Greedy(16), nullptr);
    if (!out.ok()) qFatal("%s", out.status().ToString().c_str());
    return {out->generation.tokens, out->resume};
  }
  static bool Has(const std::vector<CacheEvent>& events, const std::string& kind, const std::string& text = "") {
    return std::any_of(events.begin(), events.end(), [&](const CacheEvent& e) {
      return e.tier == "spill" && e.kind == kind && e.reason.find(text) != std::string::npos;
    });
  }

 private slots:
  void initTestCase() {
    QVERIFY(engine_.Make(41, 64, 2));
    model_ = engine_.model.get();
    forward_ = engine_.forward.get();
    vocab_ = model_->tokenizer.vocab_size();
  }

  void evictedConversationResumesAtItsEnd() {
    QTemporaryDir dir;
    auto spill = OpenSpill(dir);
    std::vector<CacheEvent> events;
    auto rp = Engine(spill.get(), &events);
    auto reference = Engine(nullptr);  // the same conversation on an engine nobody else uses
    const auto a1 = Tokens(1, 1300, vocab_), b = Tokens(2, 1400, vocab_), user = Tokens(3, 40, vocab_);
    const auto [gen1, r1] = Turn(*rp, a1, "a");
    QVERIFY(Turn(*reference, a1, "a").first == gen1);
    QCOMPARE(Turn(*rp, b, "b").second.source, CacheSource::kCold);
    QVERIFY2(Has(events, "write", "eviction"), "the evicted conversation was written to the spill");
    QCOMPARE(spill->stats().entries, int64_t(1));
    const auto a2 = Concat(Concat(a1, gen1), user);
    const auto [gen2, r2] = Turn(*rp, a2, "a");
    QCOMPARE(r2.source, CacheSource::kSpill);
    QCOMPARE(r2.cached_tokens, static_cast<int64_t>(a1.size() + gen1.size() - 1));  // the end anchor: the last token is forwarded again
    const auto [ref2, ref_info] = Turn(*reference, a2, "a");
    QCOMPARE(ref_info.source, CacheSource::kEnd);
    QVERIFY2(gen2 == ref2, "the turn after the spill writes what it would have without it");
    // Evicted again: only the blocks the turn changed are written.
    events.clear();
    Turn(*rp, b, "b");
    const auto write = std::find_if(events.begin(), events.end(), [](const CacheEvent& e) { return e.tier == "spill" && e.kind == "write"; });
    QVERIFY(write != events.end());
    QVERIFY2(write->reason.find(", 1 kept") != std::string::npos, write->reason.c_str());
  }

  void plannedStopReadsBackFirst() {
    QTemporaryDir dir;
    const auto a1 = Tokens(4, 1200, vocab_), user = Tokens(5, 30, vocab_);
    std::vector<int32_t> gen1, expected;
    std::vector<int32_t> rows;
    {
      auto spill = OpenSpill(dir);
      auto rp = Engine(spill.get());
      gen1 = Turn(*rp, a1, "a").first;
      rows = rp->rows();
      QVERIFY(rp->SpillResident("planned stop", true).ok());
      expected = Turn(*rp, Concat(Concat(a1, gen1), user), "a").first;  // the process that never stopped
    }
    auto spill = OpenSpill(dir);
    auto rp = Engine(spill.get());
    auto resumed = rp->ResumeSpilledResident();
    QVERIFY(resumed.ok() && *resumed);
    QVERIFY(rp->rows() == rows);
    const auto [gen2, info] = Turn(*rp, Concat(Concat(a1, gen1), user), "a");
    QCOMPARE(info.source, CacheSource::kEnd);
    QVERIFY(gen2 == expected);
    QVERIFY(!*rp->ResumeSpilledResident());  // read back once
  }

  // A planned stop writes the parked conversation too; after the restart its next turn comes
  // from the spill with the tokens of an engine that never stopped.
  void plannedStopWritesTheParkToo() {
    QTemporaryDir dir;
    const auto a1 = Tokens(11, 1300, vocab_), b = Tokens(12, 1400, vocab_), user = Tokens(13, 30, vocab_);
    ResidentOptions o = Options();
    o.park_budget_bytes = int64_t(1) << 30;  // the eviction parks a
    o.spill.min_tokens = 1 << 20;
    std::vector<int32_t> gen1, b_rows;
    {
      auto spill = OpenSpill(dir);
      ResidentPrefix rp(*forward_, &model_->tokenizer, o);
      rp.set_session_spill(spill.get());
      gen1 = Turn(rp, a1, "a").first;
      Turn(rp, b, "b");
      QCOMPARE(rp.Stats().park.entries, int64_t(1));
      QCOMPARE(spill->stats().entries, int64_t(0));
      b_rows = rp.rows();
      QVERIFY(rp.SpillForStop().ok());
      QCOMPARE(spill->stats().entries, int64_t(2));
    }
    auto reference = Engine(nullptr);
    QVERIFY(Turn(*reference, a1, "a").first == gen1);
    const auto a2 = Concat(Concat(a1, gen1), user);
    const auto expected = Turn(*reference, a2, "a").first;
    auto spill = OpenSpill(dir);
    auto rp = Engine(spill.get());
    QVERIFY(*rp->ResumeSpilledResident());  // b, the resident one
    QVERIFY(rp->rows() == b_rows);
    const auto [gen2, info] = Turn(*rp, a2, "a");
    QCOMPARE(info.source, CacheSource::kSpill);
    QVERIFY(gen2 == expected);
  }

  // Rows in place that a decode wrote are not a cold prefill's: a restore reads the entry's own rows
  // there even when the tokens are the same.
  void decodeWrittenRowsInPlaceAreReadAgain() {
    QTemporaryDir dir;
    auto spill = OpenSpill(dir);
    const auto p = Tokens(19, 2033, vocab_);
    auto rp = Engine(spill.get());
    const auto gen = Turn(*rp, p, "r").first;  // rows 2033..2048 are written by the decode
    QCOMPARE(rp->rows().size(), size_t(2048));
    // The same tokens read cold, and more, as another conversation saved to the spill.
    const auto x = Concat(Concat(p, gen), Tokens(20, 400, vocab_));
    ResidentPrefix other(*forward_, &model_->tokenizer, Options());
    other.set_session_spill(spill.get());
    const auto gen_x = Turn(other, x, "x").first;
    QVERIFY(other.SpillResident("test").ok());
    const auto next = Concat(Concat(x, gen_x), Tokens(21, 30, vocab_));
    const auto [served, info] = Turn(*rp, next, "x");
    QCOMPARE(info.source, CacheSource::kSpill);
    QCOMPARE(rp->taint_row(), static_cast<int64_t>(x.size()));  // the entry's taint: its prompt's end
    const auto [expected, ref_info] = Turn(other, next, "x");  // the engine it never left
    QCOMPARE(ref_info.source, CacheSource::kEnd);
    QVERIFY(served == expected);
    SequenceState cold(model_->config);
    QVERIFY(forward_->Prefill(cold, std::span(x).subspan(0, 2048)).ok());
    const int64_t width = cold.kv_width();
    for (int64_t a = 0; a < cold.num_attention_layers(); ++a)
      QVERIFY2(std::memcmp(rp->state().k_rows(a) + 2033 * width, cold.k_rows(a) + 2033 * width, 15 * width * sizeof(float)) == 0,
               "the rows the decode wrote were replaced by the entry's");
  }

  // A client that leaves the reasoning out of its copy still resumes at the entry's end, through end
  // alignment on the entry's own tokens, as it would in RAM.
  void alignedCopyResumesAtTheEntryEnd() {
    QTemporaryDir dir;
    auto spill = OpenSpill(dir);
    ResidentOptions o = Options();
    o.spill.min_tokens = 0;
    ResidentPrefix rp(*forward_, &model_->tokenizer, o);
    rp.set_session_spill(spill.get());
    std::string question = "What is a grid line?";
    for (int i = 0; i < 40; ++i) question += " Think of row " + std::to_string(i) + ".";
    const std::string turn1 = "<|im_start|>user\n" + question + "<|im_end|>\n<|im_start|>assistant\n<think>\n";
    auto prompt = model_->tokenizer.Encode(turn1);
    auto reply = model_->tokenizer.Encode("Think about chunks.\n</think>\n\nA grid line is a chunk boundary.<|im_end|>");
    QVERIFY(prompt.ok() && reply.ok());
    const SamplingParams forced = testing::ForcedReply(model_->tokenizer, *reply);
    QVERIFY(rp.Generate({*prompt, "a", 64}, forced, nullptr).ok());
    const std::vector<int32_t> rows = rp.rows();
    QVERIFY(rows.size() > 128);
    Turn(rp, Tokens(14, rows.size() + 200, vocab_), "b");  // evicts a to the spill
    QCOMPARE(spill->stats().entries, int64_t(1));
    const std::string next = "<|im_end|>\n<|im_start|>user\nAnd a row?<|im_end|>\n<|im_start|>assistant\n<think>\n";
    auto copy = model_->tokenizer.Encode("<|im_start|>user\n" + question + "<|im_end|>\n<|im_start|>assistant\nA grid line is a chunk boundary." + next);
    QVERIFY(copy.ok());
    const ResumeInfo peek = rp.Peek({*copy, "a", 16});
    QCOMPARE(peek.source, CacheSource::kSpill);
    QVERIFY(peek.aligned);
    QCOMPARE(peek.cached_tokens, static_cast<int64_t>(rows.size()));
    QVERIFY(std::equal(rows.begin(), rows.end(), peek.served_prompt.begin()));
    auto served = rp.Generate({*copy, "a", 8}, Greedy(8), nullptr);
    QVERIFY(served.ok());
    QCOMPARE(served->resume.source, CacheSource::kSpill);
    QCOMPARE(served->resume.cached_tokens, static_cast<int64_t>(rows.size()));
    // The same as an engine whose rows never left, served from its end in RAM.
    ResidentPrefix never_left(*forward_, &model_->tokenizer, o);
    QVERIFY(never_left.Generate({*prompt, "a", 64}, forced, nullptr).ok());
    auto reference = never_left.Generate({*copy, "a", 8}, Greedy(8), nullptr);
    QVERIFY(reference.ok());
    QCOMPARE(reference->resume.source, CacheSource::kEnd);
    QVERIFY(reference->generation.tokens == served->generation.tokens);
  }

  // An entry that shares much with a prompt but does not serve it says why, and counts it: here
  // the rows in place serve all but a chunk of what the entry would.
  void refusedOffersSayWhy() {
    QTemporaryDir dir;
    auto spill = OpenSpill(dir);
    ResidentPrefix rp(*forward_, &model_->tokenizer, Options());
    rp.set_session_spill(spill.get());
    const auto a1 = Tokens(15, 1300, vocab_), b = Tokens(16, 1400, vocab_), user = Tokens(17, 30, vocab_);
    const auto gen1 = Turn(rp, a1, "a").first;
    Turn(rp, b, "b");
    QCOMPARE(spill->stats().entries, int64_t(1));
    // Another conversation that shares a's first 1,290 tokens becomes resident.
    Turn(rp, Concat(std::vector<int32_t>(a1.begin(), a1.begin() + 1290), Tokens(18, 200, vocab_)), "c");
    const auto [gen2, info] = Turn(rp, Concat(Concat(a1, gen1), user), "a");
    QCOMPARE(info.source, CacheSource::kResident);
    QCOMPARE(info.cached_tokens, int64_t(1280));
    QCOMPARE(rp.Stats().spill_refused.at("short"), int64_t(1));
    const auto events = spill->RecentEvents();
    QVERIFY(std::any_of(events.begin(), events.end(), [](const CacheEvent& e) {
      return e.kind == "refused" && e.reason.find("why=short") != std::string::npos && e.reason.find("ram=1280") != std::string::npos;
    }));
  }

  // Past 1.5 times the day's budget an eviction is not written (and journaled); a planned stop is.
  void writeBudgetSkipsEvictionsNotTheDrain() {
    QTemporaryDir dir;
    auto spill = OpenSpill(dir);
    auto guard = WriteGuard::Open(DiskEnv::Posix(), dir.filePath("writes.json").toStdString(), 10, [] { return std::string("2026-12-01"); });
    guard->Add(100);
    std::vector<CacheEvent> events;
    auto rp = Engine(spill.get(), &events);
    rp->set_write_guard(guard.get());
    Turn(*rp, Tokens(9, 1300, vocab_), "a");
    Turn(*rp, Tokens(10, 1400, vocab_), "b");
    QVERIFY(Has(events, "drop", "write budget"));
    QCOMPARE(spill->stats().entries, int64_t(0));
    QVERIFY(rp->SpillResident("planned stop", true).ok());
    QCOMPARE(spill->stats().entries, int64_t(1));
    QVERIFY(guard->Stats().today_bytes > 100);
  }

  void damagedEntryFallsBackToWhatIsInPlace() {
    QTemporaryDir dir;
    auto spill = OpenSpill(dir);
    std::vector<CacheEvent> events;
    auto rp = Engine(spill.get(), &events);
    const auto a1 = Tokens(6, 1300, vocab_), b = Tokens(7, 1400, vocab_), user = Tokens(8, 30, vocab_);
    const auto gen1 = Turn(*rp, a1, "a").first;
    Turn(*rp, b, "b");
    const std::string folder = dir.filePath("sessions").toStdString();
    for (const auto& e : std::filesystem::directory_iterator(folder)) {
      if (!e.path().string().ends_with(".b1")) continue;
      std::string bytes = *ReadFile(e.path().string());
      bytes[bytes.size() / 2] ^= 0x04;
      QVERIFY(WriteFileAtomic(e.path().string(), bytes).ok());
    }
    auto cold = Engine(nullptr);
    const auto a2 = Concat(Concat(a1, gen1), user);
    const auto [gen2, info] = Turn(*rp, a2, "a");
    QVERIFY(info.source != CacheSource::kSpill);
    QVERIFY(Has(events, "failed_restore"));
    QVERIFY(!spill->Info(SessionSpill::EntryId("a", a1)).has_value());  // a's entry went; b's, evicted by this turn, is there
    QVERIFY(spill->Info(SessionSpill::EntryId("b", b)).has_value());
    QVERIFY(gen2 == Turn(*cold, a2, "a").first);
  }
};

QTEST_APPLESS_MAIN(TestSpillTier)
#include "test_spill_tier.moc"
