// The state store, the memory budget and peek on the tiny model with a 64-token grid: prefix
// snapshots resume bit for bit as a cold prefill; session snapshots pass the greedy gate; shedding
// gives back caches cheapest first and refuses what cannot fit; peek predicts every resume; clear
// empties exactly the tier it names.
#include <QtTest>

#include "tests/kernel_path_env.h"

#include <cstring>

#include "engine/cache/resident_prefix.h"
#include "tests/cache/cache_test_util.h"
#include "engine/model/model.h"
#include "engine/model/tiny_model.h"

using namespace anchorage;
using anchorage::testing::Concat;
using anchorage::testing::Head;
using anchorage::testing::Greedy;
using anchorage::testing::Tokens;

namespace {

constexpr int64_t kGrid = 64;


}  // namespace

class TestStateStore : public QObject {
  Q_OBJECT

 private:
  QTemporaryDir dir_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Forward> forward_;
  int32_t vocab_ = 0;

  ResidentOptions StoreOnly() {
    ResidentOptions o;
    o.pin_budget_bytes = 0;
    o.park_budget_bytes = 0;
    return o;
  }

 private slots:
  void initTestCase() {
    ANCHORAGE_SKIP_UNLESS_KERNEL_PATH_RUNS();
    QVERIFY(GenerateTinyModel(TinyModelSize::kTiny, 5, dir_.path().toStdString()).ok());
    auto m = LoadModel(dir_.path().toStdString());
    QVERIFY(m.ok());
    model_ = std::move(m).value();
    vocab_ = model_->tokenizer.vocab_size();
    ForwardOptions o;
    o.grid_tokens = kGrid;
    o.threads = 2;
    auto f = Forward::Create(model_->config, model_->weights, o);
    QVERIFY(f.ok());
    forward_ = std::move(f).value();
  }

  void prefixSnapshotResumesBitExact() {
    ResidentPrefix rp(*forward_, &model_->tokenizer, StoreOnly());
    const auto a = Tokens(1, 300, vocab_);
    QVERIFY(rp.Prefill({a, "", 0}).ok());
    QCOMPARE(int(rp.Stats().store.entries), 1);  // the longest grid line: 256
    QVERIFY(rp.Prefill({Tokens(2, 200, vocab_), "", 0}).ok());  // replaces the rows (too long for a guest)
    ResumeInfo info;
    const auto again = Concat(Head(a, 280), Tokens(3, 40, vocab_));
    auto logits = rp.Prefill({again, "", 0}, &info);
    QVERIFY(logits.ok());
    QCOMPARE(info.source, CacheSource::kStore);
    QCOMPARE(info.cached_tokens, int64_t(256));
    SequenceState cold(model_->config);
    auto cold_logits = forward_->Prefill(cold, again);
    QVERIFY(cold_logits.ok());
    QVERIFY(std::memcmp(logits->data(), cold_logits->data(), logits->size() * 4) == 0);
    QVERIFY(rp.state().BitEqual(cold));
  }

  void sessionSnapshotPassesTheGreedyGate() {
    ResidentPrefix rp(*forward_, &model_->tokenizer, StoreOnly());
    ResidentOptions off;
    off.enabled = false;
    ResidentPrefix cold(*forward_, &model_->tokenizer, off);
    const auto prompt = Tokens(10, 120, vocab_);
    auto first = rp.Generate({prompt, "s", 12}, Greedy(12), nullptr);
    QVERIFY(first.ok());
    const auto follow = Concat(Concat(prompt, first->generation.tokens), Tokens(11, 20, vocab_));
    QVERIFY(rp.Prefill({Tokens(12, 200, vocab_), "t", 0}).ok());  // another conversation replaces the rows
    std::vector<SampledToken> warm_tokens, cold_tokens;
    auto warm = rp.Generate({follow, "s", 12}, Greedy(12), [&](const GeneratedToken& t) { warm_tokens.push_back(t.sampled); return true; });
    QVERIFY(warm.ok());
    QCOMPARE(warm->resume.source, CacheSource::kStore);
    QCOMPARE(warm->resume.cached_tokens, int64_t(120 + 11));
    auto reference = cold.Generate({follow, "s", 12}, Greedy(12), [&](const GeneratedToken& t) { cold_tokens.push_back(t.sampled); return true; });
    QVERIFY(reference.ok());
    std::string note;
    const std::string gate = anchorage::testing::GreedyGate(warm_tokens, cold_tokens, 1e-3f, &note);
    if (!note.empty()) qInfo() << note.c_str();
    QVERIFY2(gate.empty(), gate.c_str());
  }

  void shedsCheapestFirstAndRefusesWhatCannotFit() {
    ResidentOptions o;  // every tier on
    ResidentPrefix rp(*forward_, &model_->tokenizer, o);
    std::vector<std::string> sheds;
    bool refused = false;
    rp.set_event_sink([&](const CacheEvent& e) {
      if (e.kind == "shed") sheds.push_back(e.tier);
      if (e.kind == "drop" && e.tier == "memory") refused = true;
    });
    // Fill the store, the anchors, the end anchor, the park (session b replaces a) and the pin (a compaction of b).
    const auto a = Tokens(20, 300, vocab_);
    QVERIFY(rp.Generate({a, "a", 4}, Greedy(4), nullptr).ok());
    const auto b = Tokens(21, 260, vocab_);
    QVERIFY(rp.Generate({b, "b", 4}, Greedy(4), nullptr).ok());
    QVERIFY(rp.Generate({Tokens(22, 200, vocab_), "b", 4}, Greedy(4), nullptr).ok());
    auto stats = rp.Stats();
    QVERIFY(int(stats.store.entries) > 0);
    QVERIFY(int(stats.anchors.entries) > 0);
    QVERIFY(int(stats.end.entries) == 1);
    QVERIFY(int(stats.park.entries) == 1);
    QVERIFY(int(stats.pin.entries) == 1);

    // A short guest under a peak that holds the engine's buffers and its prefill but none of the caches.
    const int64_t caches = rp.EngineBytes() - rp.state().allocated_bytes();
    const auto guest = Tokens(23, 40, vocab_);
    ResidentOptions tight = o;
    tight.memory_peak_bytes = rp.state().allocated_bytes() + rp.PrefillPeakBytes(40, 0, 4) + 1;
    rp.set_options(tight);
    auto served = rp.Generate({guest, "", 4}, Greedy(4), nullptr);
    QVERIFY2(served.ok(), served.status().ToString().c_str());
    QVERIFY(served->resume.guest);
    QVERIFY(caches > 0);
    // Cheapest first: every store entry, then anchors, the end anchor, the guest's stash, the park, the pin.
    std::vector<std::string> order;
    for (const auto& t : sheds)
      if (order.empty() || order.back() != t) order.push_back(t);
    std::string got;
    for (const auto& t : order) got += t + " ";
    QVERIFY2(order == (std::vector<std::string>{"store", "anchors", "end", "stash", "park", "pin"}), got.c_str());
    QCOMPARE(rp.rows().size(), size_t(0));  // the stash was given back, so the guest's rows replaced the resident ones
    QCOMPARE(int(rp.Stats().memory.sheds["pin"]), 1);

    // A prefill that cannot fit even with every cache given back is refused; nothing else breaks.
    tight.memory_peak_bytes = 1000;
    rp.set_options(tight);
    auto refused_result = rp.Generate({Tokens(24, 90, vocab_), "c", 4}, Greedy(4), nullptr);
    QVERIFY(!refused_result.ok());
    QVERIFY(refused_result.status().code() == StatusCode::kResourceExhausted);
    QVERIFY(refused);
    rp.set_options(o);
    auto after = rp.Generate({Tokens(24, 90, vocab_), "c", 4}, Greedy(4), nullptr);
    QVERIFY(after.ok());
  }

  void peekPredictsTheResume() {
    ResidentPrefix rp(*forward_, &model_->tokenizer, StoreOnly());
    const auto a = Tokens(30, 200, vocab_);
    struct Case {
      const char* name;
      std::vector<int32_t> prompt;
      CacheSource expected;
    };
    std::vector<int32_t> generated;
    auto run = [&](const char* name, const std::vector<int32_t>& prompt, CacheSource expected) {
      ResumeInfo predicted = rp.Peek({prompt, "", 6});
      auto actual = rp.Generate({prompt, "", 6}, Greedy(6), nullptr);
      QVERIFY2(actual.ok(), name);
      QVERIFY2(predicted.source == actual->resume.source, name);
      QVERIFY2(predicted.source == expected, name);
      QVERIFY2(predicted.cached_tokens == actual->resume.cached_tokens, name);
      QVERIFY2(predicted.reread_tokens == actual->resume.reread_tokens, name);
      generated = actual->generation.tokens;
    };
    run("fresh", a, CacheSource::kCold);
    run("end anchor", Concat(Concat(a, generated), Tokens(31, 10, vocab_)), CacheSource::kEnd);
    run("anchor", Concat(Head(a, 150), Tokens(32, 30, vocab_)), CacheSource::kResident);
    run("other", Tokens(33, 220, vocab_), CacheSource::kCold);
    run("store", Concat(Head(a, 190), Tokens(34, 30, vocab_)), CacheSource::kStore);
  }

  void clearEmptiesExactlyTheTierItNames() {
    ResidentPrefix rp(*forward_, &model_->tokenizer, ResidentOptions{});
    QVERIFY(rp.Generate({Tokens(40, 300, vocab_), "a", 4}, Greedy(4), nullptr).ok());
    QVERIFY(rp.Generate({Tokens(41, 260, vocab_), "b", 4}, Greedy(4), nullptr).ok());
    QVERIFY(rp.Generate({Tokens(42, 200, vocab_), "b", 4}, Greedy(4), nullptr).ok());
    const std::vector<std::string> tiers = {"store", "anchors", "end", "park", "pin"};
    for (const std::string& tier : tiers) {
      auto before = ToJson(rp.Stats());
      QVERIFY2(before[tier]["entries"].get<int>() > 0, tier.c_str());
      QVERIFY(rp.Clear(tier).ok());
      auto after = ToJson(rp.Stats());
      for (const std::string& other : tiers) {
        if (other == tier) QCOMPARE(after[other]["entries"].get<int>(), 0);
        else QCOMPARE(after[other]["entries"].get<int>(), before[other]["entries"].get<int>());
      }
    }
  }
};

QTEST_APPLESS_MAIN(TestStateStore)
#include "test_state_store.moc"
