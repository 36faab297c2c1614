// K/V rows in bf16 and in fp8 through anchorage-server on the tiny model (64-token grid): every resume
// (the end anchor, another session's grid anchor, the spill after a restart) answers the tokens and
// logprobs of a cold server of the same dtype, a token's rows take the dtype's share of f32's bytes, and
// a server of another dtype reads none of those files (another fingerprint: swept and counted) and
// answers as a cold one of its own dtype.
#include <QtTest>

#include <map>

#include "tests/server/resume_walk.h"
#include "tests/server/server_fixture.h"

using anchorage::testing::CacheStats;
using anchorage::testing::LogprobTurn;
using anchorage::testing::NotesAboutRows;
using anchorage::testing::ServerProcess;
using json = nlohmann::json;

class TestKvDtypeServer : public QObject {
  Q_OBJECT

  QTemporaryDir cold_data_[3];
  std::map<std::string, ServerProcess> cold_;  // a server a dtype without caches: every answer a cold prefill's

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
    anchorage::testing::ResumeWalk walk;
    walk.flags = {"--grid", "64", "--kv-dtype", dtype};
    walk.restart_flags = dtype == "bf16" ? QStringList{"--grid", "64"} : walk.flags;  // bf16: the default
    walk.other_flags = {"--grid", "64", "--kv-dtype", other};
    walk.cold = &cold_[dtype.toStdString()];
    walk.other_cold = &cold_[other.toStdString()];
    walk.while_running = [&](ServerProcess& s) {
      QCOMPARE(json::parse(s.Get("/health")->body)["kv_dtype"].get<std::string>(), dtype.toStdString());
      // A token's rows take the dtype's share of f32 rows' bytes.
      const auto bytes_a_row = [&](ServerProcess& server) {
        const json resident = CacheStats(server)["resident"];
        return resident["row_bytes"].get<int64_t>() / std::max<int64_t>(1, resident["rows"].get<int64_t>());
      };
      ServerProcess f32;
      QTemporaryDir f32_data;
      QVERIFY(f32.Start(f32_data.path(), {"--grid", "64", "--kv-dtype", "f32"}));
      const json first = json::array({{{"role", "system"}, {"content", NotesAboutRows(1)}}, {{"role", "user"}, {"content", "Which row comes first?"}}});
      QVERIFY(f32.Chat(LogprobTurn(first, "size")).is_object());
      QVERIFY(bytes_a_row(s) > 0);
      QCOMPARE(bytes_a_row(s) * 128, bytes_a_row(f32) * bytes_in_128);
    };
    anchorage::testing::WalkResumes(walk);
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
