// Speculative decoding on the tiny model: a draft window's rows give Decode's logits bit for bit,
// and keeping 1, 2, 7, 8, 9 or 24 of its rows leaves the state bit-equal to that many decode steps;
// greedy generation with lookup drafts writes the same tokens and leaves the same state as plain
// greedy decoding, with drafts all accepted, none, or partly, and when a stop ends a window; sampled
// generation with drafts picks the same tokens as without, seed for seed; the lookup drafter
// proposes what followed the newest earlier match.
#include <QTemporaryDir>
#include <QtTest>

#include <cstring>

#include "engine/runtime/forward.h"
#include "engine/runtime/generator.h"
#include "engine/runtime/lookup_drafter.h"
#include "tests/engine/test_runtime_util.h"

using namespace anchorage;

namespace {

bool SameBits(const float* a, const float* b, int64_t n) { return std::memcmp(a, b, static_cast<size_t>(n) * sizeof(float)) == 0; }

SamplingParams Greedy(int64_t n) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = n;
  return p;
}

}  // namespace

class TestSpeculative : public QObject {
  Q_OBJECT
  QTemporaryDir dir_;
  std::unique_ptr<testing::LoadedWeights> model_;
  std::unique_ptr<Forward> forward_;
  int64_t vocab_ = 0;

  std::unique_ptr<SequenceState> Prefilled(const std::vector<int32_t>& prompt) {
    auto s = std::make_unique<SequenceState>(model_->config);
    if (!forward_->Prefill(*s, prompt).ok()) return nullptr;
    return s;
  }
  // Generates with and without drafts from the same prefilled prompt; both must agree in every bit.
  void CompareWithPlain(const std::vector<int32_t>& prompt, SamplingParams params, int max_draft, GenerationResult* drafted_out = nullptr) {
    Generator generator(*forward_, nullptr);
    auto plain_state = Prefilled(std::vector<int32_t>(prompt.begin(), prompt.end() - 1));
    auto draft_state = Prefilled(std::vector<int32_t>(prompt.begin(), prompt.end() - 1));
    const std::vector<int32_t> last(prompt.end() - 1, prompt.end());
    auto plain = generator.Generate(*plain_state, last, params, nullptr);
    SpeculativeOptions spec;
    spec.max_draft = max_draft;
    spec.history = std::span(prompt).first(prompt.size() - 1);
    auto drafted = generator.Generate(*draft_state, last, params, nullptr, nullptr, spec);
    QVERIFY(plain.ok() && drafted.ok());
    QCOMPARE(drafted->tokens, plain->tokens);
    QCOMPARE(static_cast<int>(drafted->finish), static_cast<int>(plain->finish));
    QVERIFY(draft_state->BitEqual(*plain_state));
    QCOMPARE(plain->drafted_tokens, int64_t{0});
    if (drafted_out != nullptr) *drafted_out = *drafted;
  }

 private slots:
  void initTestCase() {
    auto m = testing::MakeModel(TinyModelSize::kTiny, 17, dir_.path().toStdString());
    QVERIFY(m.ok());
    model_ = std::move(m).value();
    auto f = Forward::Create(model_->config, model_->weights, ForwardOptions{64, 2});
    QVERIFY(f.ok());
    forward_ = std::move(f).value();
    vocab_ = model_->config.vocab_size;
  }

  void windowRowsAreDecodeSteps_data() {
    QTest::addColumn<int>("kept");
    for (int k : {1, 2, 7, 8, 9, 24}) QTest::newRow(std::to_string(k).c_str()) << k;
  }
  void windowRowsAreDecodeSteps() {
    QFETCH(int, kept);
    const std::vector<int32_t> prompt = testing::RandomIds(150, vocab_, 3);
    const std::vector<int32_t> ids = testing::RandomIds(25, vocab_, 4);
    auto stepped = Prefilled(prompt);
    auto windowed = Prefilled(prompt);
    std::vector<std::vector<float>> step_logits;
    for (int i = 0; i < 25; ++i) {
      auto l = forward_->Decode(*stepped, ids[static_cast<size_t>(i)]);
      QVERIFY(l.ok());
      step_logits.push_back(*l);
    }
    auto window = forward_->DraftWindow(*windowed, ids);
    QVERIFY(window.ok());
    for (int i = 0; i < 25; ++i) QVERIFY2(SameBits(window->data() + i * vocab_, step_logits[static_cast<size_t>(i)].data(), vocab_), ("row " + std::to_string(i)).c_str());
    QVERIFY(forward_->KeepDraft(*windowed, kept).ok());
    auto reference = Prefilled(prompt);
    for (int i = 0; i < kept; ++i) QVERIFY(forward_->Decode(*reference, ids[static_cast<size_t>(i)]).ok());
    QVERIFY(windowed->BitEqual(*reference));
    QVERIFY(!forward_->KeepDraft(*windowed, 1).ok());  // the window is closed
    // The next step continues as decoding would.
    auto after_window = forward_->Decode(*windowed, 5);
    auto after_steps = forward_->Decode(*reference, 5);
    QVERIFY(SameBits(after_window->data(), after_steps->data(), vocab_));
  }

  void lookupProposesWhatFollowed() {
    const std::vector<int32_t> ids = {1, 2, 3, 4, 9, 9, 1, 2, 3, 5, 6, 7, 1, 2, 3};
    QCOMPARE(LookupDraft(ids, 3), (std::vector<int32_t>{5, 6, 7}));  // the newest match of 1 2 3
    QCOMPARE(LookupDraft(ids, 10), (std::vector<int32_t>{5, 6, 7, 1, 2, 3}));
    QVERIFY(LookupDraft(std::vector<int32_t>{1, 2, 3, 4}, 4).empty());
    QVERIFY(LookupDraft(ids, 0).empty());
  }

  void greedyWithDraftsIsPlainGreedy() {
    GenerationResult r;
    // A prompt that repeats itself: the drafts find the copies.
    std::vector<int32_t> block = testing::RandomIds(40, vocab_, 7), prompt;
    for (int i = 0; i < 4; ++i) prompt.insert(prompt.end(), block.begin(), block.end());
    CompareWithPlain(prompt, Greedy(80), 6, &r);
    QVERIFY(r.drafted_tokens > 0);
    for (uint32_t seed : {11u, 12u, 13u}) CompareWithPlain(testing::RandomIds(200, vocab_, seed), Greedy(60), 4);
  }

  void forcedCopiesAreAcceptedWhole() {
    std::vector<int32_t> block = testing::RandomIds(30, vocab_, 21);
    std::vector<int32_t> prompt = block;
    prompt.insert(prompt.end(), block.begin(), block.begin() + 5);
    SamplingParams p = Greedy(24);
    p.forced_ids.assign(block.begin() + 5, block.begin() + 29);  // the reply repeats the prompt: every draft is right
    GenerationResult all;
    CompareWithPlain(prompt, p, 8, &all);
    QCOMPARE(all.tokens, p.forced_ids);
    QVERIFY(all.drafted_tokens >= 16);
    QCOMPARE(all.accepted_tokens, all.drafted_tokens);
    // Wrong drafts: the reply's first id continues the copy (a window opens), its second parts from it.
    SamplingParams wrong = p;
    wrong.max_tokens = 3;
    wrong.forced_ids = {block[5], static_cast<int32_t>((block[6] + 1) % vocab_), block[0]};
    GenerationResult none;
    CompareWithPlain(prompt, wrong, 8, &none);
    QVERIFY(none.drafted_tokens > 0);
    QCOMPARE(none.accepted_tokens, int64_t{0});
    // Partly right: the copy, then other ids from its middle on.
    SamplingParams partly = p;
    for (size_t i = 10; i < partly.forced_ids.size(); ++i) partly.forced_ids[i] = (partly.forced_ids[i] + 3) % static_cast<int32_t>(vocab_);
    GenerationResult some;
    CompareWithPlain(prompt, partly, 8, &some);
    QVERIFY(some.accepted_tokens > 0 && some.accepted_tokens < some.drafted_tokens);
    // A stop inside a window ends it where plain decoding would stop.
    SamplingParams stop = p;
    stop.stop_token_ids = {p.forced_ids[9]};
    GenerationResult stopped;
    CompareWithPlain(prompt, stop, 8, &stopped);
    QCOMPARE(stopped.finish, FinishReason::kStop);
  }

  void sampledWithDraftsIsPlainSampling() {
    std::vector<int32_t> block = testing::RandomIds(40, vocab_, 9), prompt;
    for (int i = 0; i < 3; ++i) prompt.insert(prompt.end(), block.begin(), block.end());
    int64_t drafted = 0, accepted = 0;
    for (uint64_t seed : {1u, 2u, 3u, 4u, 5u}) {
      for (float temperature : {0.3f, 1.0f}) {
        SamplingParams p = Greedy(60);
        p.temperature = temperature;
        p.seed = seed;
        p.top_p = 0.9f;
        GenerationResult r;
        CompareWithPlain(prompt, p, 6, &r);
        drafted += r.drafted_tokens;
        accepted += r.accepted_tokens;
      }
    }
    QVERIFY2(drafted > 0 && accepted > 0, (std::to_string(drafted) + " drafted, " + std::to_string(accepted) + " accepted").c_str());
  }
};

QTEST_GUILESS_MAIN(TestSpeculative)
#include "test_speculative.moc"
