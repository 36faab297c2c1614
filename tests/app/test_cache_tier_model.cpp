// CacheTierModel: one row a tier, raw and formatted values, in-place updates after a snapshot.
#include <QAbstractItemModelTester>
#include <QSignalSpy>
#include <QtTest>

#include "models/cache_event_words.h"
#include "models/cache_tier_model.h"

namespace {

CacheSnapshot snapshot(qint64 anchorBytes) {
  CacheSnapshot s;
  s.timeMs = 1000;
  s.tiers = {{"resident", 273, 139776, 0, 1, 0}, {"anchors", 4, anchorBytes, 2684354560, 3, 2}, {"end", 1, 16896, 0, 1, 0}};
  return s;
}

}  // namespace

class TestCacheTierModel : public QObject {
  Q_OBJECT

 private slots:
  void rowsColumnsAndRoles() {
    CacheTierModel model;
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
    QCOMPARE(model.rowCount(), 0);
    model.setSnapshot(snapshot(4096));
    QCOMPARE(model.rowCount(), 3);
    QCOMPARE(model.columnCount(), int(CacheTierModel::ColumnCount));
    QCOMPARE(model.rowOf("anchors"), 1);
    QCOMPARE(model.rowOf("disk"), -1);
    const QModelIndex bytes = model.index(1, CacheTierModel::BytesColumn);
    QCOMPARE(bytes.data().toString(), QString("4.00 KiB"));
    QCOMPARE(bytes.data(CacheTierModel::ValueRole).toLongLong(), 4096);
    QCOMPARE(model.index(1, CacheTierModel::BudgetColumn).data().toString(), QString("2.50 GiB"));
    QCOMPARE(model.index(0, CacheTierModel::BudgetColumn).data().toString(), QString("-"));
    QCOMPARE(model.index(1, CacheTierModel::EvictionsColumn).data().toLongLong(), 2);
    QCOMPARE(model.index(2, 0).data(CacheTierModel::TierRole).toString(), QString("end"));
    QCOMPARE(model.headerData(CacheTierModel::HitsColumn, Qt::Horizontal).toString(), QString("Hits"));
  }

  void sameTiersUpdateInPlace() {
    CacheTierModel model;
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
    model.setSnapshot(snapshot(4096));
    QSignalSpy resets(&model, &QAbstractItemModel::modelReset);
    QSignalSpy changes(&model, &QAbstractItemModel::dataChanged);
    model.setSnapshot(snapshot(8192));
    QCOMPARE(resets.count(), 0);  // Clear buttons placed with setIndexWidget survive
    QCOMPARE(changes.count(), 1);
    QCOMPARE(model.index(1, CacheTierModel::BytesColumn).data(CacheTierModel::ValueRole).toLongLong(), 8192);
    CacheSnapshot more = snapshot(8192);
    more.tiers.append({"store", 2, 100, 0, 0, 0});
    model.setSnapshot(more);
    QCOMPARE(resets.count(), 1);
    QCOMPARE(model.rowCount(), 4);
  }

  // Cache events in words: what happened, and a spill refusal's cause as a sentence (its note stays in the tooltip).
  void cacheEventsInWords() {
    QCOMPARE(DescribeCacheEvent("write", "prefix snapshot").what, QString("written"));
    QCOMPARE(DescribeCacheEvent("write", "prefix snapshot").why, QString("prefix snapshot"));
    QCOMPARE(DescribeCacheEvent("failed_restore", "x").what, QString("not restored"));
    const CacheEventWords refused = DescribeCacheEvent("refused", "no entry served: tokens=70000 shares=65536 offer=0 ram=4096 why=end_no_align");
    QCOMPARE(refused.what, QString("not restored"));
    QVERIFY2(refused.why.startsWith("the copy did not reach the saved end"), qPrintable(refused.why));
    QCOMPARE(DescribeCacheEvent("refused", "why=unheard_of").why, QString("why=unheard_of"));  // unknown causes stay as they came
    QCOMPARE(DescribeCacheEvent("new_kind", "r").what, QString("new_kind"));
  }
};

QTEST_MAIN(TestCacheTierModel)
#include "test_cache_tier_model.moc"
