// The shadow reader inside the scheduler on the tiny model: a request that arrives while the idle
// window reads waits at most the chunk in flight (ordering of chunk counts, not time); a ration of 0
// reads nothing inside a turn and a ration reads whole chunks there; a turn feeds
// the shadow its served prompt and output, and the idle window then reads them exactly; the
// agreement's main side is a fork of the engine's state that leaves the engine's next turn the same.
#include <QtTest>

#include <thread>

#include "engine/server/scheduler.h"
#include "tests/cache/cache_test_util.h"
#include "tests/shadow/shadow_test_util.h"

using namespace anchorage;
using anchorage::testing::Concat;
using anchorage::testing::Tokens;

class TestShadowScheduler : public QObject {
  Q_OBJECT
  testing::ShadowModels models_;
  int32_t vocab_ = 0;

  std::unique_ptr<ShadowReader> Reader(ShadowOptions o = {}) {
    auto r = ShadowReader::Create(models_.LoadShadow(), *models_.main, ForwardOptions{512, 2}, "", o);
    if (!r.ok()) qFatal("%s", r.status().ToString().c_str());
    return std::move(r).value();
  }
  // max_draft 0 turns drafts off (the ration test needs a decode whose length in time follows its tokens).
  std::unique_ptr<Scheduler> Engine(ShadowReader* shadow, int max_draft = 8) {
    auto f = Forward::Create(models_.main->config, models_.main->weights, ForwardOptions{256, 2});
    if (!f.ok()) qFatal("%s", f.status().ToString().c_str());
    SchedulerOptions o;
    o.shadow = shadow;
    o.resident.max_draft = max_draft;
    return std::make_unique<Scheduler>(*models_.main, std::move(f).value(), o);
  }
  static std::vector<int32_t> Run(Scheduler& s, const std::vector<int32_t>& prompt, const std::string& session, int64_t n) {
    SamplingParams p = testing::Greedy(n);
    auto job = std::make_shared<Job>(prompt, p, session);
    if (!s.Submit(job).ok()) return {};
    bool done = false;
    while (!done) job->WaitTokens(&done);
    return job->result().tokens;
  }
  static bool WaitFor(const std::function<bool()>& condition, int ms = 20000) {
    for (int waited = 0; waited < ms; waited += 1) {
      if (condition()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return condition();
  }

 private slots:
  void initTestCase() {
    QVERIFY(models_.Make());
    vocab_ = models_.main->tokenizer.vocab_size();
  }

  void requestWaitsAtMostOneChunk() {
    auto shadow = Reader();
    auto engine = Engine(shadow.get());
    // A long backlog fed directly (holding the engine lock as a turn does), so only the idle window reads it.
    const std::vector<int32_t> backlog = Tokens(1, 512 * 400, vocab_);
    engine->engine_lock().LockForRequest();
    shadow->BeginTurn("background", backlog);
    engine->engine_lock().UnlockRequest();
    QVERIFY(WaitFor([&] { return shadow->chunks_read() >= 2; }));
    auto job = std::make_shared<Job>(Tokens(2, 100, vocab_), testing::Greedy(2), "foreground");
    QVERIFY(engine->Submit(job).ok());
    const int64_t after_submit = shadow->chunks_read();
    bool done = false;
    while (!done) job->WaitTokens(&done);
    QVERIFY(job->status().ok());
    // The turn began with at most the chunk in flight at the submit read after it, and long before the backlog was read.
    QVERIFY2(shadow->chunks_at_last_turn() <= after_submit + 1,
             (std::to_string(shadow->chunks_at_last_turn()) + " chunks at the turn, " + std::to_string(after_submit) + " at the submit").c_str());
    QVERIFY(shadow->chunks_at_last_turn() < 400);
  }

  void rationReadsInsideTheTurnOnly() {
    for (double ration : {0.0, 0.5}) {
      ShadowOptions o;
      o.ration = ration;
      o.idle_read_ms = 0;  // no idle window: only the ration reads
      o.slice_ms = 20;
      auto shadow = Reader(o);
      auto engine = Engine(shadow.get(), 0);
      const std::vector<int32_t> out = Run(*engine, Tokens(6, 2000, vocab_), "r", 1500);
      QCOMPARE(out.size(), size_t{1500});
      engine->engine_lock().LockForRequest();
      const ShadowSession* s = shadow->Find("r");
      QVERIFY(s != nullptr);
      QCOMPARE(s->known(), int64_t{3500});
      if (ration == 0) {
        QCOMPARE(s->committed(), int64_t{0});
      } else {  // whole chunks, the prompt first
        QVERIFY2(s->committed() > 0, "the ration read nothing during a 1,500-token decode");
        QCOMPARE(s->committed() % 512, int64_t{0});
        QCOMPARE(shadow->Snapshot().ration_tokens, s->committed());
        auto fresh = testing::FreshPrefill(shadow->forward(), std::span(s->ids()).first(static_cast<size_t>(s->committed())));
        QVERIFY(fresh->BitEqual(s->state()));
      }
      engine->engine_lock().UnlockRequest();
    }
  }

  void turnsFeedTheShadowExactly() {
    auto shadow = Reader();
    auto engine = Engine(shadow.get());
    const std::vector<int32_t> prompt = Tokens(3, 1200, vocab_);
    const std::vector<int32_t> out = Run(*engine, prompt, "conv", 40);
    QCOMPARE(out.size(), size_t{40});
    QVERIFY(WaitFor([&] {
      const ShadowStatus st = shadow->Snapshot();
      return !st.sessions.empty() && st.sessions[0].backlog < 512 && st.sessions[0].known == 1240;
    }));
    engine->engine_lock().LockForRequest();
    const ShadowSession* s = shadow->Find("conv");
    QVERIFY(s != nullptr);
    QVERIFY(s->ids() == Concat(prompt, out));
    auto fresh = testing::FreshPrefill(shadow->forward(), std::span(s->ids()).first(static_cast<size_t>(s->committed())));
    QVERIFY(fresh->BitEqual(s->state()));
    engine->engine_lock().UnlockRequest();
  }

  void mainForkLeavesTheNextTurnTheSame() {
    ShadowOptions o;
    o.min_tokens = 500;
    const int32_t im_end = *models_.main->tokenizer.TokenId("<|im_end|>");
    std::vector<int32_t> prompt = Tokens(4, 900, vocab_);
    prompt[890] = im_end;
    const std::vector<int32_t> follow = Tokens(5, 60, vocab_);
    // Without a shadow: the reference second turn.
    auto plain = Engine(nullptr);
    const std::vector<int32_t> first = Run(*plain, prompt, "c", 8);
    const std::vector<int32_t> second = Run(*plain, Concat(Concat(prompt, first), follow), "c", 8);

    auto shadow = Reader(o);
    auto engine = Engine(shadow.get());
    QVERIFY(Run(*engine, prompt, "c", 8) == first);
    QVERIFY(WaitFor([&] { return !shadow->Snapshot().last_agreements.empty(); }));
    const ShadowAgreement row = shadow->Snapshot().last_agreements[0];
    QVERIFY2(row.main.has_value(), row.main_note.c_str());
    QVERIFY(row.shadow.has_value());
    QCOMPARE(row.insertion, int64_t{891});
    QVERIFY(Run(*engine, Concat(Concat(prompt, first), follow), "c", 8) == second);
    QCOMPARE(engine->CacheStats().memory.shadow_bytes, shadow->resident_bytes());
  }
};

QTEST_GUILESS_MAIN(TestShadowScheduler)
#include "test_shadow_scheduler.moc"
