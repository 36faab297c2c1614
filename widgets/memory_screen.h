// MemoryScreen: the memory limits (editable), what each resident tier holds, bytes by tier over
// time, and the last sheds and 503 answers.
#pragma once

#include <QJsonObject>
#include <QMap>
#include <QWidget>

#include <functional>

#include "app/snapshots.h"
#include "widgets/confirm.h"

class CacheTierModel;
class JournalModel;
class MemoryHistory;
class SettingsModel;
class QChart;
class QChartView;
class QDoubleSpinBox;
class QLabel;
class QLineSeries;
class QPushButton;
class QTableView;
class QValueAxis;

// GUI thread only. Reads only models; commands leave as signals.
class MemoryScreen : public QWidget {
  Q_OBJECT

 public:
  MemoryScreen(CacheTierModel* tiers, MemoryHistory* history, SettingsModel* settings, JournalModel* journal, QWidget* parent = nullptr);

  void setConfirmFunction(ConfirmFunction confirm) { m_confirm = std::move(confirm); }
  QDoubleSpinBox* limitEditor(const QString& key) const { return m_editors.value(key); }
  QTableView* tierView() const { return m_tierView; }
  // Why the journal cannot be read (empty: it can): the sheds box says so instead of "none".
  void setJournalRefusal(const QString& why);

 signals:
  void clearTierRequested(const QString& tier);
  void settingsReplaceRequested(const QJsonObject& document);

 public slots:
  void onSettingsOutcome(const SettingsOutcome& outcome);
  void onTierCleared(const QString& tier, bool ok, const QString& message);
  // Applies the edited limits (validated here first, then by the engine).
  void applyLimits();
  // Asks, then requests the tier emptied ("ram" for the resident rows and every RAM tier).
  void requestClear(const QString& tier);

 private:
  void loadLimits();
  void rebuildClearButtons();
  void updateChart();
  void updateTotals();
  void setMessage(const QString& text, bool error);

  CacheTierModel* m_tiers;
  MemoryHistory* m_history;
  SettingsModel* m_settings;
  QMap<QString, QDoubleSpinBox*> m_editors;  // "memory.ceiling_gb" -> editor
  QLabel* m_versionLabel;
  QLabel* m_message;
  QLabel* m_totals;
  QLabel* m_slots;
  QPushButton* m_apply;
  QPushButton* m_revert;
  QTableView* m_tierView;
  QTableView* m_alertView;
  QLabel* m_alertEmpty;
  QString m_journalRefusal;
  std::function<void()> m_updateAlerts;
  QChart* m_chart;
  QChartView* m_chartView;
  QValueAxis* m_axisX;
  QValueAxis* m_axisY;
  QList<QLineSeries*> m_series;
  bool m_dirty = false;
  ConfirmFunction m_confirm = askConfirmation;
};
