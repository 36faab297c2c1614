// Generator: stop ids, stop strings, cancellation and streamed text on the generated tiny model.
#include <QTemporaryDir>
#include <QtTest>

#include <atomic>

#include "engine/model/model.h"
#include "engine/model/tiny_model.h"
#include "engine/runtime/generator.h"
#include "engine/text/unicode_text.h"

using namespace anchorage;

class TestGenerator : public QObject {
  Q_OBJECT
  QTemporaryDir dir_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Forward> forward_;
  std::vector<int32_t> prompt_;

  Result<GenerationResult> Run(const SamplingParams& p, const TokenCallback& cb = nullptr,
                               const std::atomic<bool>* cancel = nullptr) {
    SequenceState state(model_->config);
    Generator gen(*forward_, &model_->tokenizer);
    return gen.Generate(state, prompt_, p, cb, cancel);
  }

 private slots:
  void initTestCase() {
    QVERIFY(dir_.isValid());
    const std::string dir = dir_.path().toStdString();
    QVERIFY(GenerateTinyModel(TinyModelSize::kTiny, 3, dir).ok());
    auto m = LoadModel(dir);
    QVERIFY2(m.ok(), m.ok() ? "" : m.status().ToString().c_str());
    model_ = std::move(m).value();
    auto f = Forward::Create(model_->config, model_->weights, ForwardOptions{64, 2});
    QVERIFY(f.ok());
    forward_ = std::move(f).value();
    auto ids = model_->tokenizer.Encode("The harbour lights were low and the anchor held.");
    QVERIFY(ids.ok() && !ids->empty());
    prompt_ = *ids;
  }

  // Streamed pieces concatenate to the final text, which is the decoded tokens.
  void streamedTextIsTheDecodedText() {
    SamplingParams p;
    p.temperature = 0.8f;
    p.seed = 4;
    p.max_tokens = 24;
    std::string streamed;
    auto r = Run(p, [&](const GeneratedToken& t) { streamed += t.text; return true; });
    QVERIFY(r.ok());
    QVERIFY(r->finish == FinishReason::kLength);
    QCOMPARE(int64_t(r->tokens.size()), int64_t(24));
    QCOMPARE(streamed, r->text);
    QCOMPARE(r->text, model_->tokenizer.Decode(r->tokens));
    // Same seed, same tokens.
    auto again = Run(p);
    QVERIFY(again.ok());
    QCOMPARE(again->tokens, r->tokens);
  }

  // A character whose bytes come in two tokens is whole in the text, never U+FFFD: across seeds
  // some run samples such a token, and every run's text is the decoded tokens.
  void aCharacterSplitAcrossTokensIsWhole() {
    int split_runs = 0;
    for (uint64_t seed = 1; seed <= 40; ++seed) {
      SamplingParams p;
      p.temperature = 1.0f;
      p.seed = seed;
      p.max_tokens = 32;
      std::string streamed;
      auto r = Run(p, [&](const GeneratedToken& t) { streamed += t.text; return true; });
      QVERIFY(r.ok());
      bool split = false;
      for (int32_t id : r->tokens) {
        const std::string bytes(model_->tokenizer.TokenBytes(id));
        split |= !model_->tokenizer.IsAdded(id) && unicode::SanitizeUtf8(bytes) != bytes;
      }
      split_runs += split;
      QCOMPARE(r->text, model_->tokenizer.Decode(r->tokens));
      QCOMPARE(streamed, r->text);
    }
    QVERIFY2(split_runs > 0, "no run sampled a token holding part of a character");
  }

  void stopTokenIdEndsWithStop() {
    SamplingParams p;
    p.temperature = 0.0f;
    p.max_tokens = 10;
    auto free_run = Run(p);
    QVERIFY(free_run.ok());
    p.stop_token_ids = {free_run->tokens[3]};
    auto r = Run(p);
    QVERIFY(r.ok());
    QVERIFY(r->finish == FinishReason::kStop);
    // Ends at the first occurrence of that id.
    const auto first = std::find(free_run->tokens.begin(), free_run->tokens.end(), free_run->tokens[3]);
    QCOMPARE(int64_t(r->tokens.size()), int64_t(first - free_run->tokens.begin() + 1));
  }

  // A stop string inside the text cuts it there; nothing after it is streamed.
  void stopStringCutsText() {
    SamplingParams p;
    p.temperature = 0.0f;
    p.max_tokens = 30;
    auto free_run = Run(p);
    QVERIFY(free_run.ok());
    const std::string& text = free_run->text;
    QVERIFY(text.size() >= 8);
    const std::string stop = text.substr(text.size() / 2, 3);
    const size_t at = text.find(stop);
    p.stop_strings = {stop};
    std::string streamed;
    auto r = Run(p, [&](const GeneratedToken& t) { streamed += t.text; return true; });
    QVERIFY(r.ok());
    QVERIFY(r->finish == FinishReason::kStop);
    QCOMPARE(r->text, text.substr(0, at));
    QCOMPARE(streamed, r->text);
  }

  void callbackFalseCancels() {
    SamplingParams p;
    p.max_tokens = 50;
    int calls = 0;
    auto r = Run(p, [&](const GeneratedToken&) { return ++calls < 5; });
    QVERIFY(r.ok());
    QVERIFY(r->finish == FinishReason::kCancelled);
    QCOMPARE(int64_t(r->tokens.size()), int64_t(5));
  }

  void atomicFlagCancels() {
    SamplingParams p;
    p.max_tokens = 50;
    std::atomic<bool> cancel{false};
    int calls = 0;
    auto r = Run(p, [&](const GeneratedToken&) { if (++calls == 3) cancel = true; return true; }, &cancel);
    QVERIFY(r.ok());
    QVERIFY(r->finish == FinishReason::kCancelled);
    QCOMPARE(int64_t(r->tokens.size()), int64_t(3));
    QCOMPARE(QString(FinishReasonName(r->finish)), QString("cancelled"));
  }
};

QTEST_APPLESS_MAIN(TestGenerator)
#include "test_generator.moc"
