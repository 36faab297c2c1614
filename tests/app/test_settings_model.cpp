// SettingsModel: one row a schema field, values of the stored document, edits as a new document.
#include <QAbstractItemModelTester>
#include <QSignalSpy>
#include <QtTest>

#include "models/settings_model.h"

namespace {

SettingsSnapshot snapshot(qint64 version, double ceiling) {
  SettingsSnapshot s;
  s.version = version;
  s.document = QJsonObject{{"version", version},
                           {"memory", QJsonObject{{"ceiling_gb", ceiling}, {"prefill_peak_gb", 16.0}}},
                           {"journal", QJsonObject{{"retention_days", 30}}},
                           {"overrides", QJsonObject{{"memory.ceiling_gb", QJsonObject{{"value", 4.0}, {"source", "--flag"}}}}}};
  s.schema = QJsonObject{
      {"version", version},
      {"areas", QJsonObject{{"memory", QJsonObject{{"ceiling_gb", QJsonObject{{"type", "number"}, {"min", 0.5}, {"max", 16384}, {"default", 8.0}, {"description", "GiB between requests"}}},
                                                   {"prefill_peak_gb", QJsonObject{{"type", "number"}, {"min", 0.5}, {"max", 16384}, {"default", 11.0}, {"description", "GiB in prefill"}}}}},
                            {"journal", QJsonObject{{"retention_days", QJsonObject{{"type", "integer"}, {"min", 1}, {"max", 3650}, {"default", 30}, {"description", "days"}}}}}}}};
  return s;
}

}  // namespace

class TestSettingsModel : public QObject {
  Q_OBJECT

 private slots:
  void fieldsValuesAndEdits() {
    SettingsModel model;
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
    model.setSnapshot(snapshot(3, 8.0));
    QCOMPARE(model.rowCount(), 3);
    QCOMPARE(model.columnCount(), int(SettingsModel::ColumnCount));
    QCOMPARE(model.index(0, SettingsModel::FieldColumn).data().toString(), QString("memory.ceiling_gb"));  // memory first
    QCOMPARE(model.index(0, SettingsModel::ValueColumn).data().toString(), QString("8"));
    QCOMPARE(model.index(0, SettingsModel::RangeColumn).data().toString(), QString("0.5..16384"));
    QCOMPARE(model.index(0, 0).data(SettingsModel::MinRole).toDouble(), 0.5);
    QCOMPARE(model.index(0, 0).data(SettingsModel::OverrideRole).toMap()["source"].toString(), QString("--flag"));
    QCOMPARE(model.index(2, 0).data(SettingsModel::KeyRole).toString(), QString("journal.retention_days"));
    QCOMPARE(model.value("memory.prefill_peak_gb").toDouble(), 16.0);
    QCOMPARE(model.field("journal.retention_days")["max"].toInt(), 3650);

    const QJsonObject edited = model.documentWith({{"memory.ceiling_gb", 9.5}});
    QCOMPARE(edited["version"].toInteger(), 3);  // names the version it edits
    QVERIFY(!edited.contains("overrides"));
    QCOMPARE(edited["memory"].toObject()["ceiling_gb"].toDouble(), 9.5);
    QCOMPARE(edited["memory"].toObject()["prefill_peak_gb"].toDouble(), 16.0);
    QCOMPARE(model.value("memory.ceiling_gb").toDouble(), 8.0);  // the model shows what is stored

    QSignalSpy resets(&model, &QAbstractItemModel::modelReset);
    QSignalSpy changes(&model, &QAbstractItemModel::dataChanged);
    model.setSnapshot(snapshot(4, 9.5));
    QCOMPARE(resets.count(), 0);
    QCOMPARE(changes.count(), 1);
    QCOMPARE(model.version(), 4);
    QCOMPARE(model.index(0, SettingsModel::ValueColumn).data().toString(), QString("9.5"));
  }
};

QTEST_MAIN(TestSettingsModel)
#include "test_settings_model.moc"
