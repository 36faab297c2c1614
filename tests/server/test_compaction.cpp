// Compaction as a continuation, below the server: opencode's shape is recognised (system text,
// instructions, the history's first and last user lines) and other messages are not; the guard; and
// the continuation of a conversation resumes at its end anchor and writes what a cold run of the
// same ids writes (the greedy gate of end-anchor resumes: the same tokens unless a near tie).
#include <QTemporaryDir>
#include <QtTest>

#include "engine/cache/resident_prefix.h"
#include "engine/model/model.h"
#include "engine/model/tiny_model.h"
#include "engine/server/compaction.h"
#include "tests/cache/cache_test_util.h"

using namespace anchorage;
using anchorage::testing::Greedy;
using json = nlohmann::ordered_json;

namespace {

json Messages(const std::string& history_lines, const std::string& after = "Summarize the conversation above.") {
  return json::array({{{"role", "system"}, {"content", "You summarize sessions."}},
                      {{"role", "user"}, {"content", "Here is the conversation so far:\n<conversation>\n" + history_lines + "</conversation>\n" + after}}});
}

}  // namespace

class TestCompaction : public QObject {
  Q_OBJECT
  QTemporaryDir dir_;
  std::unique_ptr<Model> model_;

 private slots:
  void initTestCase() {
    QVERIFY(GenerateTinyModel(TinyModelSize::kTiny, 13, dir_.path().toStdString()).ok());
    auto m = LoadModel(dir_.path().toStdString());
    QVERIFY(m.ok());
    model_ = std::move(m).value();
  }

  void recognisesOpencodesShape() {
    auto r = RecognizeCompaction(Messages("[User]: fix the bug\n[Assistant]: fixed\n[Tool result]: ok\n[User]:   add a test  \n"));
    QVERIFY(r.has_value());
    QCOMPARE(r->client, std::string("opencode"));
    QCOMPARE(r->system_text, std::string("You summarize sessions."));
    QCOMPARE(r->instructions, std::string("Summarize the conversation above."));
    QCOMPARE(r->first_user_line, std::string("fix the bug"));
    QCOMPARE(r->last_user_line, std::string("add a test"));
    QVERIFY(!RecognizeCompaction(Messages("[Assistant]: no user line\n")));                       // nothing to guard with
    QVERIFY(!RecognizeCompaction(json::array({{{"role", "user"}, {"content", "Summarize."}}})));  // no history
    json two_users = Messages("[User]: a\n");
    two_users.push_back({{"role", "user"}, {"content", "more"}});
    QVERIFY(!RecognizeCompaction(two_users));
    QVERIFY(RecordIsThisConversation("... fix the bug ... add a test ...", *r));
    QVERIFY(!RecordIsThisConversation("... fix the bug ...", *r));
    QVERIFY(!RecordIsThisConversation("fix the bug, add a test. Summarize the conversation above.", *r));  // already continued
  }

  void theContinuationIsAColdRunsAnswer() {
    ForwardOptions o;
    o.grid_tokens = 64;
    o.threads = 2;
    auto forward = Forward::Create(model_->config, model_->weights, o);
    QVERIFY(forward.ok());
    ResidentPrefix rp(**forward, &model_->tokenizer, ResidentOptions{});
    auto prompt = model_->tokenizer.Encode("<|im_start|>user\nfix the bug in the parser<|im_end|>\n<|im_start|>assistant\n", true);
    QVERIFY(prompt.ok());
    QVERIFY(rp.Generate({*prompt, "s", 0}, Greedy(20), nullptr).ok());
    auto record = rp.EndRecord("s");
    QVERIFY(record.has_value());
    QVERIFY(!rp.EndRecord("other").has_value());
    auto request = RecognizeCompaction(Messages("[User]: fix the bug in the parser\n"));
    QVERIFY(request && RecordIsThisConversation(model_->tokenizer.Decode(*record), *request));
    auto ids = ContinuationIds(*record, *request, model_->chat_template, model_->tokenizer);
    QVERIFY(ids.ok());
    QVERIFY(std::equal(record->begin(), record->end(), ids->begin()));
    std::vector<SampledToken> warm_tokens, cold_tokens;
    auto warm = rp.Generate({*ids, "s", 0}, Greedy(16), [&](const GeneratedToken& t) { warm_tokens.push_back(t.sampled); return true; });
    QVERIFY(warm.ok());
    QCOMPARE(warm->resume.source, CacheSource::kEnd);
    QCOMPARE(warm->resume.cached_tokens, static_cast<int64_t>(record->size()));
    ResidentOptions off;
    off.enabled = false;
    ResidentPrefix cold(**forward, &model_->tokenizer, off);
    QVERIFY(cold.Generate({*ids, "", 0}, Greedy(16), [&](const GeneratedToken& t) { cold_tokens.push_back(t.sampled); return true; }).ok());
    std::string note;
    const std::string gate = anchorage::testing::GreedyGate(warm_tokens, cold_tokens, 1e-3f, &note);
    if (!note.empty()) qInfo() << note.c_str();
    QVERIFY2(gate.empty(), gate.c_str());
  }
};

QTEST_GUILESS_MAIN(TestCompaction)
#include "test_compaction.moc"
