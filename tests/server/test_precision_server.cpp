// Fast precision through anchorage-server on the tiny model (64-token grid): every resume (the end anchor,
// another session's grid anchor, the spill after a restart) answers the tokens and logprobs of a cold fast
// server, those differ from exact's, and an exact server on the same folders reads none of fast's files
// (another fingerprint: swept and counted) and answers as a cold exact one. Runs on the CPU's bf16 units
// where it has them and on the emulated bf16 arithmetic everywhere.
#include <QtTest>

#include "tests/server/server_fixture.h"

using anchorage::testing::AnswerLogprobs;
using anchorage::testing::AnswerText;
using anchorage::testing::CachedTokens;
using anchorage::testing::ServerProcess;
using json = nlohmann::json;

namespace {

std::string Notes() {
  std::string text = "Keep these notes about rows and anchors in mind.";
  for (int i = 0; i < 150; ++i) text += " note" + std::to_string((i * 7919 + 3) % 1000) + " says row " + std::to_string(i);
  return text;
}

json Turn(const json& messages, const std::string& session) {
  return {{"messages", messages}, {"max_tokens", 10}, {"temperature", 0}, {"logprobs", true}, {"top_logprobs", 2}, {"session_id", session}};
}

json Stats(ServerProcess& s) { return json::parse(s.Get("/v1/cache/stats")->body); }

}  // namespace

class TestPrecisionServer : public QObject {
  Q_OBJECT

 private slots:
  void cleanup() { qunsetenv("ANCHORAGE_KERNEL"); }

  void everyFastResumeAnswersAsColdAndExactReadsNothing_data() {
    QTest::addColumn<QString>("kernel");  // ANCHORAGE_KERNEL for every server of the row; empty: the CPU's choice
    QTest::newRow("the CPU's bf16 units") << QString();
    QTest::newRow("emulated-bf16") << QString("emulated-bf16");
  }
  void everyFastResumeAnswersAsColdAndExactReadsNothing() {
    QFETCH(QString, kernel);
    if (!kernel.isEmpty()) qputenv("ANCHORAGE_KERNEL", kernel.toUtf8());
    const QStringList fast_flags = {"--grid", "64", "--precision", "fast"};
    QTemporaryDir cold_fast_dir, cold_exact_dir, data;
    ServerProcess cold_fast, cold_exact;
    QVERIFY(cold_fast.Start(cold_fast_dir.path(), fast_flags + QStringList{"--caches", "off"}));
    const json fast_health = json::parse(cold_fast.Get("/health")->body);
    if (fast_health["precision"] != "fast")
      QSKIP(qPrintable("this CPU has no bf16 units: " + QString::fromStdString(fast_health["kernel_path"].get<std::string>()) + " runs exact"));
    QVERIFY(cold_exact.Start(cold_exact_dir.path(), {"--grid", "64", "--caches", "off"}));
    QVERIFY(fast_health["state_fingerprint"] != json::parse(cold_exact.Get("/health")->body)["state_fingerprint"]);

    QVERIFY(anchorage::testing::WriteSettingsWithoutDiskFloor(data.path()));
    const json first = json::array({{{"role", "system"}, {"content", Notes()}}, {{"role", "user"}, {"content", "Which row comes first?"}}});
    json second = first, third;
    {
      ServerProcess s;
      QVERIFY(s.Start(data.path(), fast_flags));
      const json r1 = s.Chat(Turn(first, "A"));
      QCOMPARE(AnswerLogprobs(r1), AnswerLogprobs(cold_fast.Chat(Turn(first, "cold"))));
      QVERIFY2(AnswerLogprobs(r1) != AnswerLogprobs(cold_exact.Chat(Turn(first, "cold"))), "fast answered exact's logprobs");
      // A follow-up resumes at A's end anchor.
      second.push_back({{"role", "assistant"}, {"content", AnswerText(r1)}});
      second.push_back({{"role", "user"}, {"content", "And which comes last?"}});
      const json r2 = s.Chat(Turn(second, "A"));
      QVERIFY2(CachedTokens(r2) > r1["usage"]["prompt_tokens"].get<int64_t>() - 64, r2["usage"].dump().c_str());
      QCOMPARE(AnswerLogprobs(r2), AnswerLogprobs(cold_fast.Chat(Turn(second, "cold"))));
      // Another session with the same notes resumes at a grid anchor of A's rows.
      const json other = json::array({{{"role", "system"}, {"content", Notes()}}, {{"role", "user"}, {"content", "Name a middle row."}}});
      const json rb = s.Chat(Turn(other, "B"));
      QVERIFY2(CachedTokens(rb) >= 512, rb["usage"].dump().c_str());
      QCOMPARE(AnswerLogprobs(rb), AnswerLogprobs(cold_fast.Chat(Turn(other, "cold"))));
      // Back to A, then a planned stop: the drain spills A's rows.
      QVERIFY(s.Chat(Turn(second, "A")).is_object());
      third = second;
      third.push_back({{"role", "assistant"}, {"content", AnswerText(r2)}});
      third.push_back({{"role", "user"}, {"content", "Now count them."}});
      QVERIFY(s.Terminate());
    }
    {
      ServerProcess s;
      QVERIFY(s.Start(data.path(), fast_flags));
      const json r3 = s.Chat(Turn(third, "A"));
      QVERIFY2(CachedTokens(r3) > 256, r3["usage"].dump().c_str());
      QCOMPARE(Stats(s)["spill"]["restores"].get<int64_t>(), int64_t(1));
      QCOMPARE(AnswerLogprobs(r3), AnswerLogprobs(cold_fast.Chat(Turn(third, "cold"))));
      QVERIFY(s.Terminate());
    }
    // An exact server on the same folders: fast's files are another fingerprint's, never read.
    ServerProcess s;
    QVERIFY(s.Start(data.path(), {"--grid", "64"}));
    const json before = Stats(s);
    QVERIFY2(before["spill"]["swept"].get<int64_t>() > 0, before["spill"].dump().c_str());
    QCOMPARE(before["spill"]["entries"].get<int64_t>(), int64_t(0));
    const json r = s.Chat(Turn(third, "A"));
    QCOMPARE(CachedTokens(r), int64_t(0));
    QCOMPARE(AnswerLogprobs(r), AnswerLogprobs(cold_exact.Chat(Turn(third, "cold"))));
    const json after = Stats(s);
    QCOMPARE(after["spill"]["restores"].get<int64_t>(), int64_t(0));
    QCOMPARE(after["disk"]["restores"].get<int64_t>(), int64_t(0));
  }
};

QTEST_GUILESS_MAIN(TestPrecisionServer)
#include "test_precision_server.moc"
