// Fast precision through anchorage-server on the tiny model (64-token grid): every resume (the end anchor,
// another session's grid anchor, the spill after a restart) answers the tokens and logprobs of a cold fast
// server, those differ from exact's, and an exact server on the same folders reads none of fast's files
// (another fingerprint: swept and counted) and answers as a cold exact one. Runs on the CPU's bf16 units
// where it has them and on the emulated bf16 arithmetic everywhere.
#include <QtTest>

#include "tests/server/resume_walk.h"
#include "tests/server/server_fixture.h"

using anchorage::testing::ServerProcess;
using json = nlohmann::json;

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
    anchorage::testing::ResumeWalk walk;
    walk.flags = walk.restart_flags = {"--grid", "64", "--precision", "fast"};
    walk.other_flags = {"--grid", "64"};
    QTemporaryDir cold_fast_dir, cold_exact_dir;
    ServerProcess cold_fast, cold_exact;
    QVERIFY(cold_fast.Start(cold_fast_dir.path(), walk.flags + QStringList{"--caches", "off"}));
    const json health = json::parse(cold_fast.Get("/health")->body);
    if (health["precision"] != "fast")
      QSKIP(qPrintable("this CPU has no bf16 units: " + QString::fromStdString(health["kernel_path"].get<std::string>()) + " runs exact"));
    QVERIFY(cold_exact.Start(cold_exact_dir.path(), walk.other_flags + QStringList{"--caches", "off"}));
    walk.cold = &cold_fast;
    walk.other_cold = &cold_exact;
    anchorage::testing::WalkResumes(walk);
  }
};

QTEST_GUILESS_MAIN(TestPrecisionServer)
#include "test_precision_server.moc"
