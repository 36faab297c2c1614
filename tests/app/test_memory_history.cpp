// MemoryHistory: one row a snapshot, a column a tier, samples older than the window dropped.
#include <QAbstractItemModelTester>
#include <QtTest>

#include "models/memory_history.h"

namespace {

CacheSnapshot at(qint64 timeMs, qint64 resident, qint64 anchors) {
  CacheSnapshot s;
  s.timeMs = timeMs;
  s.tiers = {{"resident", 1, resident, 0, 0, 0}, {"anchors", 1, anchors, 0, 0, 0}};
  return s;
}

}  // namespace

class TestMemoryHistory : public QObject {
  Q_OBJECT

 private slots:
  void samplesAndWindow() {
    MemoryHistory model;
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
    model.setWindowMs(10000);
    model.addSnapshot(at(1000, 100, 0));
    QCOMPARE(model.columnCount(), 3);
    QCOMPARE(model.tiers(), QStringList({"resident", "anchors"}));
    QCOMPARE(model.headerData(2, Qt::Horizontal).toString(), QString("anchors"));
    model.addSnapshot(at(2000, 200, 50));
    model.addSnapshot(at(3000, 300, 70));
    QCOMPARE(model.rowCount(), 3);
    QCOMPARE(model.index(1, 0).data().toLongLong(), 2000);
    QCOMPARE(model.index(1, 2).data().toLongLong(), 50);
    QCOMPARE(model.bytes(2, 0), 300);
    QCOMPARE(model.maxBytes(), 300);
    model.addSnapshot(at(12500, 10, 10));  // 1000 and 2000 are older than 12500 - 10000
    QCOMPARE(model.rowCount(), 2);
    QCOMPARE(model.timeMs(0), 3000);
    QCOMPARE(model.maxBytes(), 300);
    CacheSnapshot other = at(13000, 1, 1);
    other.tiers.append({"store", 1, 5, 0, 0, 0});
    model.addSnapshot(other);  // a new tier starts the history over
    QCOMPARE(model.columnCount(), 4);
    QCOMPARE(model.rowCount(), 1);
    QCOMPARE(model.index(0, 3).data().toLongLong(), 5);
  }
};

QTEST_MAIN(TestMemoryHistory)
#include "test_memory_history.moc"
