// DiskScreen: the disk tier: its folder, free space, budget, bytes and hit rate, the most-hit
// prefixes (token counts only), the last events, the day's writes against their budget; the
// session spill: its entries (token counts and sizes), bytes stored against raw, its last saves and
// restores; the settings of both (editable) and a clear button for each.
#pragma once

#include <QJsonObject>
#include <QWidget>

#include "app/snapshots.h"
#include "widgets/confirm.h"

class SettingsModel;
class SettingsPanel;
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
  QDoubleSpinBox* editor(const QString& key) const;
  QComboBox* modeEditor() const;
  QTableWidget* prefixTable() const { return m_prefixes; }
  QTableWidget* eventTable() const { return m_events; }
  QTableWidget* spillEntryTable() const { return m_spillEntries; }
  QTableWidget* spillEventTable() const { return m_spillEvents; }
  QString summaryText() const;
  QString spillSummaryText() const;
  // What an empty table says instead ("" while it has rows).
  QString prefixesEmptyText() const;
  QString spillEntriesEmptyText() const;

 signals:
  void clearTierRequested(const QString& tier);
  void settingsReplaceRequested(const QJsonObject& document);

 public slots:
  void setSnapshot(const CacheSnapshot& snapshot);
  void onSettingsOutcome(const SettingsOutcome& outcome);
  void onTierCleared(const QString& tier, bool ok, const QString& message);
  // Asks, then requests the disk tier emptied.
  void requestClear();
  // Asks, then requests the session spill emptied.
  void requestClearSpill();

 private:
  void setSpill(const QJsonObject& spill);

  // An empty table's line: why it is empty (the thresholds that fill it).
  void showEmpty(QLabel* line, const QTableWidget* table, const QString& why);

  SettingsModel* m_settings;
  qint64 m_diskAnchors = 0, m_diskChunks = 0, m_diskBytes = 0;  // what a clear deletes, as last shown
  qint64 m_spillCount = 0, m_spillBytes = 0;
  QLabel* m_prefixesEmpty;
  QLabel* m_spillEntriesEmpty;
  SettingsPanel* m_panel;
  QLabel* m_summary;
  QLabel* m_spillSummary;
  QPushButton* m_clearSpill;
  QTableWidget* m_spillEntries;
  QTableWidget* m_spillEvents;
  QPushButton* m_clear;
  QTableWidget* m_prefixes;
  QTableWidget* m_events;
  bool m_open = false;  // the engine runs a disk tier
  ConfirmFunction m_confirm = askConfirmation;
};
