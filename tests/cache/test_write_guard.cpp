// The day's write budget: the level by today's bytes (ok, over past the budget, hard past 1.5
// times), what the tier and the spill may write at each level, the counts kept across a reopen and
// for 14 days, a new day starting at zero, and a damaged counts file starting the counts again.
#include <QtTest>

#include "engine/cache/write_guard.h"
#include "engine/core/file_util.h"

using namespace anchorage;

class TestWriteGuard : public QObject {
  Q_OBJECT

 private slots:
  void levelsAndWhatEachAllows() {
    QTemporaryDir dir;
    std::string day = "2026-12-01";
    auto g = WriteGuard::Open(DiskEnv::Posix(), dir.filePath("writes.json").toStdString(), 1000, [&] { return day; });
    QCOMPARE(g->level(), WriteLevel::kOk);
    QVERIFY(g->TierMayWrite());
    QVERIFY(g->SpillMayWrite(false, 100));
    g->Add(1000);
    QCOMPARE(g->level(), WriteLevel::kOk);  // at the budget, not past it
    g->Add(1);
    QCOMPARE(g->level(), WriteLevel::kOver);
    QVERIFY(!g->TierMayWrite());
    QVERIFY(!g->SpillMayWrite(false, WriteGuard::kEvictionTokensWhenOver - 1));
    QVERIFY(g->SpillMayWrite(false, WriteGuard::kEvictionTokensWhenOver));
    QVERIFY(g->SpillMayWrite(true, 10));
    g->Add(500);
    QCOMPARE(g->level(), WriteLevel::kHard);
    QVERIFY(!g->SpillMayWrite(false, 1 << 20));
    QVERIFY(g->SpillMayWrite(true, 10));  // a planned stop's drain always writes
    g->NoteSkip();
    day = "2026-12-02";
    QCOMPARE(g->level(), WriteLevel::kOk);  // a new day
    QCOMPARE(g->Stats().today_bytes, int64_t(0));
    QCOMPARE(g->Stats().days.at("2026-12-01"), int64_t(1501));
  }

  void countsSurviveAReopenForFourteenDays() {
    QTemporaryDir dir;
    const std::string path = dir.filePath("writes.json").toStdString();
    int d = 1;
    auto day = [&] { return "2026-11-" + std::string(d < 10 ? "0" : "") + std::to_string(d); };
    {
      auto g = WriteGuard::Open(DiskEnv::Posix(), path, 1 << 30, day);
      for (d = 1; d <= 20; ++d) g->Add(d * 10);
      d = 20;
      g->NoteSkip();
    }
    auto g = WriteGuard::Open(DiskEnv::Posix(), path, 1 << 30, day);
    const WriteGuardStats s = g->Stats();
    QCOMPARE(s.days.size(), size_t(WriteGuard::kDaysKept));
    QCOMPARE(s.days.begin()->first, std::string("2026-11-07"));
    QCOMPARE(s.today_bytes, int64_t(200));
    QCOMPARE(s.skips, int64_t(1));
    QVERIFY(WriteFileAtomic(path, "{not json").ok());
    auto fresh = WriteGuard::Open(DiskEnv::Posix(), path, 1 << 30, day);
    QCOMPARE(fresh->Stats().today_bytes, int64_t(0));
    fresh->Add(5);
    QCOMPARE(WriteGuard::Open(DiskEnv::Posix(), path, 1 << 30, day)->Stats().today_bytes, int64_t(5));
  }
};

QTEST_APPLESS_MAIN(TestWriteGuard)
#include "test_write_guard.moc"
