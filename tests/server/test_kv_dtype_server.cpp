// K/V rows in bf16 and in fp8 through anchorage-server on the tiny model (64-token grid): every resume
// (the end anchor, another session's grid anchor, the spill after a restart) answers the tokens and
// logprobs of a cold server of the same dtype, a token's rows take the dtype's share of f32's bytes, and
// a server of another dtype reads none of those files (another fingerprint: swept and counted) and
// answers as a cold one of its own dtype.
#include <QtTest>

#include <map>

#include "tests/server/server_fixture.h"

using anchorage::testing::AnswerLogprobs;
using anchorage::testing::AnswerText;
using anchorage::testing::CachedTokens;
using anchorage::testing::ServerProcess;
using json = nlohmann::json;

namespace {

std::string Notes(int seed) {
  std::string text = "Keep these notes about rows and anchors in mind.";
  for (int i = 0; i < 150; ++i) text += " note" + std::to_string((i * 7919 + seed) % 1000) + " says row " + std::to_string(i);
  return text;
}

json Turn(const json& messages, const std::string& session) {
  return {{"messages", messages}, {"max_tokens", 10}, {"temperature", 0}, {"logprobs", true}, {"top_logprobs", 2}, {"session_id", session}};
}



}  // namespace

class TestKvDtypeServer : public QObject {
  Q_OBJECT

  QTemporaryDir cold_data_[3];
  std::map<std::string, ServerProcess> cold_;  // a server a dtype without caches: every answer a cold prefill's

  json Stats(ServerProcess& s) { return json::parse(s.Get("/v1/cache/stats")->body); }

 private slots:
  void initTestCase() {
    int i = 0;
    for (const char* dtype : {"f32", "bf16", "fp8"})
      QVERIFY(cold_[dtype].Start(cold_data_[i++].path(), {"--grid", "64", "--kv-dtype", QString(dtype), "--caches", "off"}));
  }

  void everyResumeAnswersAsColdAndTheOtherDtypeReadsNothing_data() {
    QTest::addColumn<QString>("dtype");
    QTest::addColumn<QString>("other");           // what the next start on the same folders keeps
    QTest::addColumn<int64_t>("bytes_in_128");  // a row's bytes for 128 of an f32 row's
    QTest::newRow("bf16, then f32") << "bf16" << "f32" << int64_t{64};
    QTest::newRow("fp8, then bf16") << "fp8" << "bf16" << int64_t{33};  // 64 codes and 2 scales for 256 bytes
  }
  void everyResumeAnswersAsColdAndTheOtherDtypeReadsNothing() {
    QFETCH(QString, dtype);
    QFETCH(QString, other);
    QFETCH(int64_t, bytes_in_128);
    QTemporaryDir data;
    QVERIFY(anchorage::testing::WriteSettingsWithoutDiskFloor(data.path()));
    ServerProcess& cold = cold_[dtype.toStdString()];
    ServerProcess& other_cold = cold_[other.toStdString()];
    const json first = json::array({{{"role", "system"}, {"content", Notes(1)}}, {{"role", "user"}, {"content", "Which row comes first?"}}});
    json second = first;
    json third;
    {
      ServerProcess s;
      QVERIFY(s.Start(data.path(), {"--grid", "64", "--kv-dtype", dtype}));
      const json health = json::parse(s.Get("/health")->body);
      QCOMPARE(health["kv_dtype"].get<std::string>(), dtype.toStdString());
      QVERIFY(health["state_fingerprint"] != json::parse(other_cold.Get("/health")->body)["state_fingerprint"]);
      const json r1 = s.Chat(Turn(first, "A"));
      QCOMPARE(AnswerLogprobs(r1), AnswerLogprobs(cold.Chat(Turn(first, "cold"))));
      QVERIFY2(AnswerLogprobs(r1) != AnswerLogprobs(other_cold.Chat(Turn(first, "cold"))), "the rows answered another dtype's logprobs");
      // A follow-up resumes at A's end anchor.
      second.push_back({{"role", "assistant"}, {"content", AnswerText(r1)}});
      second.push_back({{"role", "user"}, {"content", "And which comes last?"}});
      const json r2 = s.Chat(Turn(second, "A"));
      QVERIFY2(CachedTokens(r2) > r1["usage"]["prompt_tokens"].get<int64_t>() - 64, r2["usage"].dump().c_str());
      QCOMPARE(AnswerLogprobs(r2), AnswerLogprobs(cold.Chat(Turn(second, "cold"))));
      // Another session with the same notes resumes at a grid anchor of A's rows.
      const json other = json::array({{{"role", "system"}, {"content", Notes(1)}}, {{"role", "user"}, {"content", "Name a middle row."}}});
      const json rb = s.Chat(Turn(other, "B"));
      QVERIFY2(CachedTokens(rb) >= 512, rb["usage"].dump().c_str());
      QCOMPARE(AnswerLogprobs(rb), AnswerLogprobs(cold.Chat(Turn(other, "cold"))));
      // A token's rows take the dtype's share of f32 rows' bytes.
      const auto bytes_a_row = [&](ServerProcess& server) {
        const json resident = Stats(server)["resident"];
        return resident["row_bytes"].get<int64_t>() / std::max<int64_t>(1, resident["rows"].get<int64_t>());
      };
      ServerProcess f32;
      QTemporaryDir f32_data;
      QVERIFY(f32.Start(f32_data.path(), {"--grid", "64", "--kv-dtype", "f32"}));
      QVERIFY(f32.Chat(Turn(first, "size")).is_object());
      QVERIFY(bytes_a_row(s) > 0);
      QCOMPARE(bytes_a_row(s) * 128, bytes_a_row(f32) * bytes_in_128);
      // Back to A, then a planned stop: the drain spills A's rows.
      QVERIFY(s.Chat(Turn(second, "A")).is_object());
      third = second;
      third.push_back({{"role", "assistant"}, {"content", AnswerText(r2)}});
      third.push_back({{"role", "user"}, {"content", "Now count them."}});
      QVERIFY(s.Terminate());
    }
    {
      ServerProcess s;
      QVERIFY(s.Start(data.path(), dtype == "bf16" ? QStringList{"--grid", "64"} : QStringList{"--grid", "64", "--kv-dtype", dtype}));  // bf16: the default
      QCOMPARE(json::parse(s.Get("/health")->body)["kv_dtype"].get<std::string>(), dtype.toStdString());
      const json r3 = s.Chat(Turn(third, "A"));
      QVERIFY2(CachedTokens(r3) > 256, r3["usage"].dump().c_str());
      QCOMPARE(Stats(s)["spill"]["restores"].get<int64_t>(), int64_t(1));
      QCOMPARE(AnswerLogprobs(r3), AnswerLogprobs(cold.Chat(Turn(third, "cold"))));
      QVERIFY(s.Terminate());
    }
    // A server of the other dtype on the same folders: the files are another fingerprint's, never read.
    ServerProcess s;
    QVERIFY(s.Start(data.path(), {"--grid", "64", "--kv-dtype", other}));
    const json before = Stats(s);
    QVERIFY2(before["spill"]["swept"].get<int64_t>() > 0, before["spill"].dump().c_str());
    QCOMPARE(before["spill"]["entries"].get<int64_t>(), int64_t(0));
    const json r = s.Chat(Turn(third, "A"));
    QCOMPARE(CachedTokens(r), int64_t(0));
    QCOMPARE(AnswerLogprobs(r), AnswerLogprobs(other_cold.Chat(Turn(third, "cold"))));
    const json after = Stats(s);
    QCOMPARE(after["spill"]["restores"].get<int64_t>(), int64_t(0));
    QCOMPARE(after["disk"]["restores"].get<int64_t>(), int64_t(0));
  }

  void anUnknownDtypeIsRefusedAtStart() {
    QTemporaryDir dir;
    QProcess p;
    p.start(QString(ANCHORAGE_BINARY_DIR) + "/app/anchorage-server", {"--data-dir", dir.path(), "--port", "0", "--kv-dtype", "f16"});
    QVERIFY(p.waitForFinished(30000));
    QCOMPARE(p.exitCode(), 2);
    const QString err = QString::fromUtf8(p.readAllStandardError());
    QVERIFY2(err.contains("--kv-dtype: kv-dtype must be auto, f32, bf16 or fp8, got 'f16'"), qPrintable(err));
  }

  // The settings document's engine.kv_dtype picks the dtype at start; --kv-dtype overrides it for the run.
  void theSettingsPickTheDtypeAndTheFlagOverridesIt() {
    QTemporaryDir dir;
    nlohmann::json doc = anchorage::DefaultSettingsDocument(anchorage::MachineTotalRamBytes());
    doc["disk_cache"]["min_free_gb"] = 0;
    doc["engine"]["kv_dtype"] = "f32";
    QVERIFY(anchorage::WriteFileAtomic((dir.path() + "/settings.json").toStdString(), doc.dump()).ok());
    const auto dtype_of = [](ServerProcess& s) { return json::parse(s.Get("/health")->body)["kv_dtype"].get<std::string>(); };
    {
      ServerProcess s;
      QVERIFY(s.Start(dir.path(), {"--grid", "64"}));
      QCOMPARE(dtype_of(s), std::string("f32"));
      QCOMPARE(json::parse(s.Get("/v1/settings")->body)["engine"]["kv_dtype"].get<std::string>(), std::string("f32"));
    }
    ServerProcess s;
    QVERIFY(s.Start(dir.path(), {"--grid", "64", "--kv-dtype", "bf16"}));
    QCOMPARE(dtype_of(s), std::string("bf16"));
  }
};

QTEST_APPLESS_MAIN(TestKvDtypeServer)
#include "test_kv_dtype_server.moc"
