// SettingsScreen against the real settings schema: a panel an area and an editor a field (of the
// field's type, with the schema's range), an edit applied as the next version, the server's 400
// message under the panel, and a 409 offered as reapply on the version that won.
#include <QCheckBox>
#include <QComboBox>
#include <QDoubleSpinBox>
#include <QFormLayout>
#include <QJsonDocument>
#include <QLabel>
#include <QLineEdit>
#include <QPushButton>
#include <QSignalSpy>
#include <QTemporaryDir>
#include <QtTest>

#include "engine/settings/settings.h"
#include "models/settings_model.h"
#include "widgets/settings_panel.h"
#include "widgets/disk_screen.h"
#include "widgets/settings_screen.h"
#include "widgets/shadow_screen.h"

namespace {

QJsonObject toQt(const nlohmann::json& j) { return QJsonDocument::fromJson(QByteArray::fromStdString(j.dump())).object(); }

SettingsSnapshot snapshotOf(const anchorage::SettingsStore& store) {
  SettingsSnapshot s;
  s.version = store.version();
  s.document = toQt(store.Document());
  s.schema = toQt(store.Schema());
  return s;
}

}  // namespace

class TestSettingsScreen : public QObject {
  Q_OBJECT
  QTemporaryDir dir_;

  anchorage::SettingsStore Store() {
    anchorage::SettingsOptions options;
    options.total_ram_bytes = 64ll << 30;
    auto store = anchorage::SettingsStore::Open(dir_.filePath("settings.json").toStdString(), options);
    if (!store.ok()) qFatal("%s", store.status().ToString().c_str());
    return std::move(store).value();
  }

 private slots:
  void everyFieldHasItsEditor() {
    anchorage::SettingsStore store = Store();
    SettingsModel model;
    SettingsScreen screen(&model);
    QVERIFY(screen.areas().isEmpty());  // until the first schema
    model.setSnapshot(snapshotOf(store));
    QStringList areas;
    for (const anchorage::SettingField& f : anchorage::SettingsSchemaFields(64ll << 30)) {
      if (!areas.contains(QString::fromStdString(f.area))) areas << QString::fromStdString(f.area);
      const QString name = QString::fromStdString(f.key()).replace('.', '_');
      SettingsPanel* panel = screen.panel(QString::fromStdString(f.area));
      QVERIFY2(panel != nullptr, f.area.c_str());
      QWidget* editor = panel->findChild<QWidget*>(name);
      QVERIFY2(editor != nullptr, f.key().c_str());
      switch (f.type) {
        case anchorage::SettingType::kInteger:
        case anchorage::SettingType::kNumber: {
          auto* spin = qobject_cast<QDoubleSpinBox*>(editor);
          QVERIFY2(spin != nullptr, f.key().c_str());
          QCOMPARE(spin->minimum(), f.min);
          QCOMPARE(spin->maximum(), f.max);
          QCOMPARE(spin->value(), store.Document()[f.area][f.name].get<double>());
          break;
        }
        case anchorage::SettingType::kEnum: {
          auto* box = qobject_cast<QComboBox*>(editor);
          QVERIFY2(box != nullptr && box->count() == static_cast<int>(f.values.size()), f.key().c_str());
          QCOMPARE(box->currentText().toStdString(), store.Document()[f.area][f.name].get<std::string>());
          break;
        }
        case anchorage::SettingType::kBoolean:
          QVERIFY2(qobject_cast<QCheckBox*>(editor) != nullptr, f.key().c_str());
          break;
        case anchorage::SettingType::kString:
          QVERIFY2(qobject_cast<QLineEdit*>(editor) != nullptr, f.key().c_str());
          break;
      }
      QVERIFY2(editor->toolTip().toStdString() == f.description + " (" + f.key() + ")", (f.key() + ": " + editor->toolTip().toStdString()).c_str());  // the description, then the key
    }
    QCOMPARE(screen.areas().size(), areas.size());
  }

  // The Settings screen speaks as the screens it configures: their labels and units for the same
  // keys, areas titled and grouped by screen; a field edited and not applied is marked until
  // applied or reverted.
  void oneVocabularyAndChangedFieldsMarked() {
    anchorage::SettingsStore store = Store();
    SettingsModel model;
    SettingsScreen screen(&model);
    DiskScreen disk(&model);
    ShadowScreen shadow(&model);
    model.setSnapshot(snapshotOf(store));
    auto labelOf = [](QWidget* editor) {
      auto* form = qobject_cast<QFormLayout*>(editor->parentWidget()->findChild<QFormLayout*>());
      auto* label = form != nullptr ? qobject_cast<QLabel*>(form->labelForField(editor)) : nullptr;
      return label != nullptr ? label->text() : QString();
    };
    int compared = 0;
    for (QWidget* screenOf : {static_cast<QWidget*>(&disk), static_cast<QWidget*>(&shadow)})
      for (auto* spin : screenOf->findChildren<QDoubleSpinBox*>()) {
        const QString name = spin->objectName(), area = name.section('_', 0, 0);
        SettingsPanel* panel = nullptr;
        for (const QString& a : screen.areas())
          if (name.startsWith(a + "_")) panel = screen.panel(a);
        QVERIFY2(panel != nullptr, qPrintable(name));
        auto* same = panel->findChild<QDoubleSpinBox*>(name);
        QVERIFY2(same != nullptr, qPrintable(name));
        QCOMPARE(labelOf(same), labelOf(spin));
        QCOMPARE(same->suffix(), spin->suffix());
        ++compared;
      }
    QVERIFY(compared >= 10);
    QCOMPARE(screen.panel("memory")->title(), QString("Memory: limits"));
    QCOMPARE(screen.panel("spill")->title(), QString("Disk cache: session spill"));
    QCOMPARE(labelOf(screen.panel("memory")->findChild<QDoubleSpinBox*>("memory_ceiling_gb")), QString("Ceiling between requests"));
    QCOMPARE(screen.panel("memory")->findChild<QDoubleSpinBox*>("memory_ceiling_gb")->suffix(), QString(" GiB"));
    // Changed and not applied: marked; reverted: not.
    SettingsPanel* journal = screen.panel("journal");
    auto* days = journal->findChild<QDoubleSpinBox*>("journal_retention_days");
    QCOMPARE(labelOf(days), QString("Keep rows"));
    days->setValue(days->value() + 1);
    QCOMPARE(labelOf(days), QString("Keep rows •"));
    QVERIFY(labelOf(journal->findChild<QDoubleSpinBox*>("journal_retention_rows")).endsWith("table"));  // the untouched one is not marked
    for (QPushButton* b : journal->findChildren<QPushButton*>())
      if (b->text() == "Revert") b->click();
    QCOMPARE(labelOf(days), QString("Keep rows"));
  }

  void applyRefusalAndReapply() {
    anchorage::SettingsStore store = Store();
    SettingsModel model;
    SettingsScreen screen(&model);
    model.setSnapshot(snapshotOf(store));
    QSignalSpy sent(&screen, &SettingsScreen::settingsReplaceRequested);
    SettingsPanel* journal = screen.panel("journal");
    auto* days = journal->findChild<QDoubleSpinBox*>("journal_retention_days");
    days->setValue(12);
    journal->findChild<QPushButton*>("apply_journal")->click();
    QCOMPARE(sent.count(), 1);
    QJsonObject doc = sent.last()[0].toJsonObject();
    QCOMPARE(doc["version"].toInteger(), store.version());
    QCOMPARE(doc["journal"].toObject()["retention_days"].toInteger(), 12);
    // The store is the server here: what it says of the document is what the panel shows.
    const auto stored = store.Replace(nlohmann::json::parse(QJsonDocument(doc).toJson().toStdString()));
    QVERIFY(stored.ok());
    model.setSnapshot(snapshotOf(store));
    SettingsOutcome applied;
    applied.ok = true;
    applied.version = stored.version;
    screen.onSettingsOutcome(applied);
    QVERIFY(journal->findChild<QLabel*>("message_journal")->text().startsWith("Applied: settings version 2"));
    // A bad value: the server's 400 message under the panel, the edit kept.
    SettingsPanel* backends = screen.panel("backends");
    auto* upstreams = backends->findChild<QLineEdit*>("backends_upstreams");
    upstreams->setText("big=ftp://nowhere");
    emit upstreams->textEdited(upstreams->text());
    backends->findChild<QPushButton*>("apply_backends")->click();
    const auto refused = store.Replace(nlohmann::json::parse(QJsonDocument(sent.last()[0].toJsonObject()).toJson().toStdString()));
    QVERIFY(!refused.ok());
    SettingsOutcome bad;
    bad.ok = false;
    bad.httpStatus = refused.error->http_status();
    bad.message = QString::fromStdString(refused.error->message + "\n" + refused.error->fields.at(0).field + ": " + refused.error->fields.at(0).message);
    screen.onSettingsOutcome(bad);
    const QString shown = backends->findChild<QLabel*>("message_backends")->text();
    QVERIFY2(shown.contains("HTTP 400") && shown.contains("backends.upstreams") && shown.contains("URL must start with http://"), qPrintable(shown));
    QCOMPARE(upstreams->text(), QString("big=ftp://nowhere"));
    // A 409: someone else stored a version meanwhile; reapply names the version that won.
    upstreams->setText("big=http://10.0.0.5:8000");
    emit upstreams->textEdited(upstreams->text());
    const qint64 stale = model.version();
    nlohmann::json other = store.Document();
    other["journal"]["retention_days"] = 40;
    QVERIFY(store.Replace(other).ok());
    model.setSnapshot(snapshotOf(store));  // the host polls the new version before it reports the refusal
    SettingsOutcome conflict;
    conflict.ok = false;
    conflict.httpStatus = 409;
    screen.onSettingsOutcome(conflict);
    QPushButton* reapply = backends->reapplyButton();
    QVERIFY(!reapply->isHidden());
    QCOMPARE(upstreams->text(), QString("big=http://10.0.0.5:8000"));
    reapply->click();
    doc = sent.last()[0].toJsonObject();
    QCOMPARE(doc["version"].toInteger(), stale + 1);
    QCOMPARE(doc["backends"].toObject()["upstreams"].toString(), QString("big=http://10.0.0.5:8000"));
    QCOMPARE(doc["journal"].toObject()["retention_days"].toInteger(), 40);  // the other change stays
    QVERIFY(store.Replace(nlohmann::json::parse(QJsonDocument(doc).toJson().toStdString())).ok());
  }
};

QTEST_MAIN(TestSettingsScreen)
#include "test_settings_screen.moc"
