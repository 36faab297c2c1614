// DiskScreen: the disk tier: its folder, free space, budget, bytes and hit rate, the most-hit
// prefixes (token counts only), the last events, its settings (editable) and a clear button.
#pragma once

#include <QJsonObject>
#include <QMap>
#include <QWidget>

#include "app/snapshots.h"
#include "widgets/confirm.h"

class SettingsModel;
class QComboBox;
class QDoubleSpinBox;
class QLabel;
class QPushButton;
class QTableWidget;

// GUI thread only. Reads the cache snapshot's "disk" object and the settings model; commands leave as signals.
class DiskScreen : public QWidget {
  Q_OBJECT

 public:
  explicit DiskScreen(SettingsModel* settings, QWidget* parent = nullptr);

  void setConfirmFunction(ConfirmFunction confirm) { m_confirm = std::move(confirm); }
  QDoubleSpinBox* editor(const QString& key) const { return m_editors.value(key); }
  QComboBox* modeEditor() const { return m_mode; }
  QTableWidget* prefixTable() const { return m_prefixes; }
  QTableWidget* eventTable() const { return m_events; }
  QString summaryText() const;

 signals:
  void clearTierRequested(const QString& tier);
  void settingsReplaceRequested(const QJsonObject& document);

 public slots:
  void setSnapshot(const CacheSnapshot& snapshot);
  void onSettingsOutcome(const SettingsOutcome& outcome);
  void onTierCleared(const QString& tier, bool ok, const QString& message);
  void applySettings();
  // Asks, then requests the disk tier emptied.
  void requestClear();

 private:
  void loadSettings();
  void markDirty();
  void setMessage(const QString& text, bool error);

  SettingsModel* m_settings;
  QMap<QString, QDoubleSpinBox*> m_editors;  // "disk_cache.budget_gb" -> editor
  QComboBox* m_mode;
  QLabel* m_summary;
  QLabel* m_message;
  QPushButton* m_apply;
  QPushButton* m_revert;
  QPushButton* m_clear;
  QTableWidget* m_prefixes;
  QTableWidget* m_events;
  bool m_dirty = false;
  bool m_open = false;  // the engine runs a disk tier
  ConfirmFunction m_confirm = askConfirmation;
};
