// The shadow reader over the shadow model beside the tiny model: it refuses another vocabulary;
// turns read in idle windows equal a fresh grid prefill of the session's ids; past its byte cap the
// least recently used session goes to disk (or is dropped without one) and comes back exact; a
// planned stop writes every session for the next reader; ask() is a softmax over the letters that
// leaves the state untouched, and bad questions are refused; the agreement question is answered by
// both models at the turn's insertion point and journaled.
#include <QtTest>

#include <cmath>
#include <filesystem>

#include "engine/shadow/shadow_reader.h"
#include "tests/cache/cache_test_util.h"
#include "tests/shadow/shadow_test_util.h"

using namespace anchorage;
using anchorage::testing::Concat;
using anchorage::testing::Tokens;

class TestShadowReader : public QObject {
  Q_OBJECT
  testing::ShadowModels models_;
  std::unique_ptr<Forward> main_forward_;
  int32_t vocab_ = 0;
  int32_t im_end_ = 0;

  std::unique_ptr<ShadowReader> Reader(const std::string& disk_dir, ShadowOptions o = {}, Journal* journal = nullptr) {
    auto r = ShadowReader::Create(models_.LoadShadow(), *models_.main, ForwardOptions{1024, 2}, disk_dir, o, journal);
    if (!r.ok()) qFatal("%s", r.status().ToString().c_str());
    return std::move(r).value();
  }
  static void Drain(ShadowReader& r, const ShadowReader::MainFork& fork = nullptr) {
    while (r.HasIdleWork()) r.IdleWork([] { return false; }, fork);
  }
  bool EqualsFresh(ShadowReader& r, const std::string& session) {
    const ShadowSession* s = r.Find(session);
    if (s == nullptr) return false;
    auto fresh = testing::FreshPrefill(r.forward(), std::span(s->ids()).first(static_cast<size_t>(s->committed())));
    return fresh != nullptr && fresh->BitEqual(s->state());
  }
  // A chat-shaped prompt: ids with an <|im_end|> before the last few.
  std::vector<int32_t> Prompt(uint64_t seed, size_t n) {
    std::vector<int32_t> p = Tokens(seed, n, vocab_);
    p[n - 4] = im_end_;
    return p;
  }

 private slots:
  void initTestCase() {
    QVERIFY(models_.Make());
    auto f = Forward::Create(models_.main->config, models_.main->weights, ForwardOptions{1024, 2});
    QVERIFY(f.ok());
    main_forward_ = std::move(f).value();
    vocab_ = models_.main->tokenizer.vocab_size();
    im_end_ = *models_.main->tokenizer.TokenId("<|im_end|>");
  }

  void refusesAnotherVocabulary() {
    QTemporaryDir other;
    QVERIFY(GenerateTinyModel(TinyModelSize::kShadow, 5, other.path().toStdString(), TinyModelSize::kSmall).ok());
    auto m = LoadModel(other.path().toStdString());
    QVERIFY(m.ok());
    auto r = ShadowReader::Create(std::move(m).value(), *models_.main, ForwardOptions{1024, 2}, "", {});
    QVERIFY(!r.ok());
    QVERIFY2(r.status().message().find("vocabulary") != std::string::npos, r.status().message().c_str());
  }

  void idleReadsFollowTurnsExactly() {
    auto r = Reader("");
    const std::vector<int32_t> p1 = Prompt(1, 1700);
    r->BeginTurn("s", p1);
    const std::vector<int32_t> o1 = Tokens(2, 400, vocab_);
    r->NoteOutput("s", o1);
    Drain(*r);
    QCOMPARE(r->Find("s")->committed(), int64_t{2048});
    QVERIFY(EqualsFresh(*r, "s"));
    // The next prompt drops the answer's first 150 ids: back to the checkpoint at the first prompt's line.
    const std::vector<int32_t> p2 = Concat(Concat(p1, std::vector<int32_t>(o1.begin() + 150, o1.end())), Prompt(3, 900));
    r->BeginTurn("s", p2);
    QCOMPARE(r->Find("s")->committed(), int64_t{1536});
    r->NoteOutput("s", Tokens(4, 200, vocab_));
    Drain(*r);
    QVERIFY(EqualsFresh(*r, "s"));
    const ShadowStatus st = r->Snapshot();
    QCOMPARE(st.rollbacks, int64_t{1});
    QCOMPARE(st.reread_tokens, int64_t{512});
    QCOMPARE(st.sessions.size(), size_t{1});
    QCOMPARE(st.sessions[0].read, r->Find("s")->committed());
    QVERIFY(st.sessions[0].backlog < 512);
    QVERIFY(st.ms_per_1000_tokens > 0);
  }

  void evictedSessionsComeBackExact() {
    for (bool with_disk : {true, false}) {
      QTemporaryDir dir;
      ShadowOptions o;
      o.budget_bytes = 1;  // only the session in use stays resident
      auto r = Reader(with_disk ? dir.filePath("shadow").toStdString() : "", o);
      const std::vector<int32_t> a = Prompt(10, 1300), b = Prompt(11, 1100);
      r->BeginTurn("a", a);
      Drain(*r);
      r->BeginTurn("b", b);  // a goes
      QVERIFY(r->Find("a") == nullptr);
      ShadowStatus st = r->Snapshot();
      QCOMPARE(st.evictions, int64_t{1});
      QCOMPARE(st.disk_files, with_disk ? int64_t{1} : int64_t{0});
      QCOMPARE(st.sessions[1].on_disk, with_disk);
      Drain(*r);
      const std::vector<int32_t> a2 = Concat(a, Prompt(12, 700));
      r->BeginTurn("a", a2);
      QCOMPARE(r->Find("a")->committed(), with_disk ? int64_t{1024} : int64_t{0});  // from disk, or read again
      Drain(*r);
      QVERIFY(EqualsFresh(*r, "a"));
      QCOMPARE(r->Snapshot().disk_loads, with_disk ? int64_t{1} : int64_t{0});
    }
  }

  void plannedStopWritesEverySession() {
    QTemporaryDir dir;
    const std::string disk = dir.filePath("shadow").toStdString();
    std::vector<float> before_state;
    {
      auto r = Reader(disk);
      r->BeginTurn("x", Prompt(20, 1500));
      r->BeginTurn("y", Prompt(21, 600));
      Drain(*r);
      QVERIFY(r->WriteAll().ok());
    }
    auto r = Reader(disk);
    ShadowStatus st = r->Snapshot();
    QCOMPARE(st.disk_files, int64_t{2});
    r->BeginTurn("x", Concat(Prompt(20, 1500), Prompt(22, 100)));
    QCOMPARE(r->Find("x")->committed(), int64_t{1024});
    QVERIFY(EqualsFresh(*r, "x"));
    // A file of another model is swept at the start.
    QVERIFY(r->Clear().ok());
    QCOMPARE(r->Snapshot().sessions.size(), size_t{0});
    QVERIFY(std::filesystem::is_empty(disk));
  }

  void askIsALetterSoftmaxOnAFork() {
    ShadowOptions o;
    o.context_tokens = 2200;
    auto r = Reader("", o);
    r->BeginTurn("q", Prompt(30, 1800));
    Drain(*r);
    auto question = r->PrepareQuestion("Which colour?", {"red", "green", "blue"});
    QVERIFY(question.ok());
    QCOMPARE(question->letter_ids.size(), size_t{3});
    auto before = testing::FreshPrefill(r->forward(), std::span(r->Find("q")->ids()).first(1536));
    auto a = r->Ask("q", *question);
    QVERIFY2(a.ok(), a.status().ToString().c_str());
    QVERIFY(before->BitEqual(r->Find("q")->state()));
    QCOMPARE(a->probabilities.size(), size_t{3});
    double sum = 0;
    for (double p : a->probabilities) sum += p;
    QVERIFY(std::abs(sum - 1.0) < 1e-12);
    QCOMPARE(a->read_tokens, int64_t{1800});
    QCOMPARE(a->behind_tokens, int64_t{0});
    auto b = r->Ask("q", *question);
    QVERIFY(b.ok());
    QVERIFY(a->probabilities == b->probabilities);
    QCOMPARE(a->choice, b->choice);

    QCOMPARE(r->Ask("nobody", *question).status().code(), StatusCode::kNotFound);
    QCOMPARE(r->PrepareQuestion("Which?", {}).status().code(), StatusCode::kInvalidArgument);
    std::vector<std::string> many(27, "x");
    QCOMPARE(r->PrepareQuestion("Which?", many).status().code(), StatusCode::kInvalidArgument);
    QCOMPARE(r->PrepareQuestion("   ", {"a"}).status().code(), StatusCode::kInvalidArgument);
    std::string long_question;
    for (int i = 0; i < 300; ++i) long_question += "word" + std::to_string(i) + " ";
    auto too_long = r->PrepareQuestion(long_question, {"a", "b"});
    QVERIFY(too_long.ok());
    auto over = r->Ask("q", *too_long);
    QCOMPARE(over.status().code(), StatusCode::kInvalidArgument);
    QVERIFY2(over.status().message().find("context") != std::string::npos, over.status().message().c_str());
  }

  void agreementIsAskedOfBothModels() {
    QTemporaryDir dir;
    JournalOptions jo;
    jo.data_dir = dir.path().toStdString();
    auto journal = Journal::Open(jo);
    QVERIFY(journal.ok());
    ShadowOptions o;
    o.min_tokens = 1000;
    o.question = "What does the user ask for?";
    o.choices = {"code", "chat", "other"};
    auto r = Reader("", o, journal->get());
    const std::vector<int32_t> p = Prompt(40, 1200);
    std::vector<int32_t> asked_context;
    auto main_fork = [&](std::span<const int32_t> context, std::span<const int32_t> question) -> Result<std::vector<float>> {
      asked_context.assign(context.begin(), context.end());
      SequenceState state(main_forward_->config());
      return main_forward_->Prefill(state, Concat(asked_context, std::vector<int32_t>(question.begin(), question.end())));
    };
    r->BeginTurn("t", p);
    r->BeginTurn("short", Prompt(41, 300));  // under min_tokens: not asked
    // A question the operator breaks while the turn's answer is pending: the turn keeps its own.
    ShadowOptions broken = o;
    broken.choices.assign(27, "x");
    r->SetOptions(broken);
    r->BeginTurn("later", Prompt(42, 1100));
    QVERIFY(r->Snapshot().last_error.find("26") != std::string::npos);
    Drain(*r, main_fork);
    QCOMPARE(asked_context.size(), size_t{1197});  // up to and with the prompt's last <|im_end|>
    ShadowStatus st = r->Snapshot();
    QCOMPARE(st.last_agreements.size(), size_t{1});
    const ShadowAgreement& row = st.last_agreements[0];
    QVERIFY(row.shadow && row.main && row.agree);
    QCOMPARE(*row.agree, row.shadow->choice == row.main->choice);
    QCOMPARE(row.insertion, int64_t{1197});
    QCOMPARE(row.choices, o.choices);
    QCOMPARE(row.behind_tokens, int64_t{1197});
    QCOMPARE(st.compared, int64_t{1});
    // The shadow's answer is its own ask at the insertion point.
    (*journal)->Flush();
    JournalQuery q;
    q.kind = "shadow";
    auto page = (*journal)->Query(q);
    QVERIFY(page.ok());
    QCOMPARE(page->rows.size(), size_t{1});
    QCOMPARE(page->rows[0]["session"].get<std::string>(), std::string("t"));
    QCOMPARE(page->rows[0]["agree"].get<int64_t>(), *row.agree ? int64_t{1} : int64_t{0});
    QVERIFY(page->rows[0]["main_probability"].get<double>() > 0);
    const nlohmann::json probabilities = nlohmann::json::parse(page->rows[0]["shadow_probabilities"].get<std::string>());
    QCOMPARE(probabilities.size(), size_t{3});
    QCOMPARE(probabilities[static_cast<size_t>(row.shadow->choice)].get<double>(), row.shadow->probabilities[static_cast<size_t>(row.shadow->choice)]);
  }
};

QTEST_GUILESS_MAIN(TestShadowReader)
#include "test_shadow_reader.moc"
