#include "widgets/settings_editors.h"

#include <QDoubleSpinBox>
#include <QLabel>
#include <QSignalBlocker>
#include <QWidget>

#include "models/settings_model.h"

void loadEditors(const QMap<QString, QDoubleSpinBox*>& editors, const SettingsModel& settings) {
  for (auto it = editors.begin(); it != editors.end(); ++it) {
    const QJsonObject f = settings.field(it.key());
    QSignalBlocker block(it.value());
    if (f.contains("min")) it.value()->setRange(f["min"].toDouble(), f["max"].toDouble());
    it.value()->setValue(settings.value(it.key()).toDouble());
    it.value()->setToolTip(QString("%1 (%2)").arg(f["description"].toString(), it.key()));  // the document's key too
    it.value()->setEnabled(settings.version() > 0);
  }
}

void addEditorValues(const QMap<QString, QDoubleSpinBox*>& editors, const SettingsModel& settings, QVariantMap* values) {
  for (auto it = editors.begin(); it != editors.end(); ++it) {
    if (settings.field(it.key())["type"].toString() == "integer") (*values)[it.key()] = static_cast<qint64>(it.value()->value());
    else (*values)[it.key()] = it.value()->value();
  }
}

void showMessage(QLabel* label, const QString& text, bool error) {
  label->setText(text);
  label->setStyleSheet(error ? "color: #b00020;" : QString());
}

void keepFullHeight(QWidget* editor) { editor->setMinimumHeight(editor->sizeHint().height()); }
