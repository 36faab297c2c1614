// SettingsScreen: every settings group in one place, built from the settings schema: one panel an
// area, an editor a field by its type (ranges, choices and descriptions from the schema), Apply
// sending the whole document as the next version, the server's refusals shown under the panel.
#pragma once

#include <QMap>
#include <QWidget>

#include "app/snapshots.h"

class SettingsModel;
class SettingsPanel;
class QGridLayout;

// GUI thread only. The panels appear with the first schema.
class SettingsScreen : public QWidget {
  Q_OBJECT

 public:
  explicit SettingsScreen(SettingsModel* settings, QWidget* parent = nullptr);

  QStringList areas() const { return m_panels.keys(); }
  SettingsPanel* panel(const QString& area) const { return m_panels.value(area); }

 signals:
  void settingsReplaceRequested(const QJsonObject& document);

 public slots:
  void onSettingsOutcome(const SettingsOutcome& outcome);

 private:
  void build();

  SettingsModel* m_settings;
  QGridLayout* m_grid;
  QMap<QString, SettingsPanel*> m_panels;
};
