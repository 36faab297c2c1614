// Sampler knobs on synthetic logits, and the generator's stop rules and cancellation.
#include <QtTest>

#include <atomic>
#include <cmath>
#include <map>
#include <set>

#include "engine/runtime/sampler.h"

using namespace anchorage;

namespace {

std::vector<float> Logits() {
  // Token 3 best, then 7, 1, 5; the rest low.
  std::vector<float> l(16, -4.0f);
  l[3] = 2.0f;
  l[7] = 1.5f;
  l[1] = 1.0f;
  l[5] = 0.5f;
  return l;
}

std::vector<int32_t> Draw(const SamplingParams& p, int count, const std::vector<float>& logits,
                          int64_t vocab_limit = 16) {
  Sampler s(p, vocab_limit);
  std::vector<int32_t> out;
  for (int i = 0; i < count; ++i) out.push_back(s.Sample(logits, {}).id);
  return out;
}

}  // namespace

class TestSampler : public QObject {
  Q_OBJECT
 private slots:
  void greedyPicksArgmax() {
    SamplingParams p;
    p.temperature = 0.0f;
    for (int32_t id : Draw(p, 20, Logits())) QCOMPARE(id, 3);
  }
  void topKOneEqualsGreedy() {
    SamplingParams p;
    p.temperature = 5.0f;
    p.top_k = 1;
    p.seed = 9;
    for (int32_t id : Draw(p, 50, Logits())) QCOMPARE(id, 3);
  }
  void topKLimitsTheSupport() {
    SamplingParams p;
    p.temperature = 10.0f;
    p.top_k = 2;
    std::set<int32_t> seen;
    for (int32_t id : Draw(p, 300, Logits())) seen.insert(id);
    QCOMPARE(seen, (std::set<int32_t>{3, 7}));
  }
  void seedReproducesAndDiffers() {
    SamplingParams p;
    p.temperature = 3.0f;
    p.seed = 1;
    const auto a = Draw(p, 100, Logits()), b = Draw(p, 100, Logits());
    QCOMPARE(a, b);
    p.seed = 2;
    QVERIFY(Draw(p, 100, Logits()) != a);
  }
  void temperatureFlattens() {
    SamplingParams p;
    p.seed = 5;
    p.temperature = 0.05f;
    int best_cold = 0, best_hot = 0;
    for (int32_t id : Draw(p, 400, Logits())) best_cold += id == 3;
    p.temperature = 20.0f;
    for (int32_t id : Draw(p, 400, Logits())) best_hot += id == 3;
    QCOMPARE(best_cold, 400);
    QVERIFY(best_hot < 200);
  }
  void topPKeepsTheNucleus() {
    // p(3) ~ 0.39, p(7) ~ 0.24 at temperature 1 among 4 real candidates; top_p 0.5 keeps {3, 7}.
    SamplingParams p;
    p.top_p = 0.5f;
    std::set<int32_t> seen;
    for (int32_t id : Draw(p, 400, Logits())) seen.insert(id);
    QCOMPARE(seen, (std::set<int32_t>{3, 7}));
  }
  void minPDropsUnlikely() {
    // p(x)/p(3): 7 -> 0.61, 1 -> 0.37, 5 -> 0.22; min_p 0.3 keeps {3, 7, 1}.
    SamplingParams p;
    p.min_p = 0.3f;
    std::set<int32_t> seen;
    for (int32_t id : Draw(p, 600, Logits())) seen.insert(id);
    QCOMPARE(seen, (std::set<int32_t>{1, 3, 7}));
  }
  void penaltiesLowerRepeatedTokens() {
    const auto base = Logits();
    const std::vector<int32_t> history = {3, 3, 7};
    SamplingParams p;
    p.presence_penalty = 0.5f;
    auto l = base;
    Sampler::ApplyPenalties(p, history, l);
    QCOMPARE(l[3], 1.5f);
    QCOMPARE(l[7], 1.0f);
    QCOMPARE(l[1], 1.0f);
    p = {};
    p.frequency_penalty = 0.25f;
    l = base;
    Sampler::ApplyPenalties(p, history, l);
    QCOMPARE(l[3], 1.5f);   // two occurrences
    QCOMPARE(l[7], 1.25f);  // one
    p = {};
    p.repetition_penalty = 2.0f;
    l = base;
    l[5] = -1.0f;
    Sampler::ApplyPenalties(p, std::vector<int32_t>{3, 5}, l);
    QCOMPARE(l[3], 1.0f);
    QCOMPARE(l[5], -2.0f);
    // A large presence penalty turns greedy away from the repeated best token.
    SamplingParams g;
    g.temperature = 0.0f;
    g.presence_penalty = 1.0f;
    Sampler s(g, 16);
    QCOMPARE(s.Sample(base, history).id, 1);
  }
  void vocabLimitMasksPadding() {
    auto l = Logits();
    l[15] = 100.0f;  // a padding row beyond the tokenizer
    SamplingParams p;
    p.temperature = 0.0f;
    QCOMPARE(Draw(p, 1, l, 15)[0], 3);
    QCOMPARE(Draw(p, 1, l, 16)[0], 15);
  }
  // Forced ids are picked first, one per generated token, then sampling resumes.
  void forcedIdsComeFirst() {
    SamplingParams p;
    p.temperature = 0.0f;
    p.forced_ids = {9, 2};
    Sampler s(p, 16);
    const auto l = Logits();
    std::vector<int32_t> history;
    for (int i = 0; i < 3; ++i) history.push_back(s.Sample(l, history).id);
    QCOMPARE(history, (std::vector<int32_t>{9, 2, 3}));
  }
  void logprobsAreNormalised() {
    SamplingParams p;
    p.temperature = 0.0f;
    p.logprobs = 3;
    Sampler s(p, 16);
    const auto l = Logits();
    const SampledToken t = s.Sample(l, {});
    QCOMPARE(t.id, 3);
    QCOMPARE(int(t.top.size()), 3);
    QCOMPARE(t.top[0].first, 3);
    QCOMPARE(t.top[1].first, 7);
    QCOMPARE(t.top[2].first, 1);
    double z = 0.0;
    for (float v : l) z += std::exp(double(v));
    QVERIFY(std::abs(t.logprob - (2.0 - std::log(z))) < 1e-5);
    QVERIFY(std::abs(t.top[1].second - (1.5 - std::log(z))) < 1e-5);
  }
};

QTEST_APPLESS_MAIN(TestSampler)
#include "test_sampler.moc"
