// ShadowScreen: the shadow reader: its model, resident and disk bytes, read rate; every session's
// read position, backlog, bytes and checkpoints; the agreement rate over time (a chart) and the
// last answers of both models; the knobs (enabled, ration, budget, the question and its choices,
// the shortest turn asked) and a clear button.
#pragma once

#include <QJsonObject>
#include <QList>
#include <QPointF>
#include <QWidget>

#include "app/snapshots.h"
#include "widgets/confirm.h"

class SettingsModel;
class SettingsPanel;
class QChart;
class QChartView;
class QDoubleSpinBox;
class QGroupBox;
class QLabel;
class QLineSeries;
class QPushButton;
class QTableWidget;

// GUI thread only. Reads the shadow snapshot's status document and the settings model; commands leave as signals.
class ShadowScreen : public QWidget {
  Q_OBJECT

 public:
  explicit ShadowScreen(SettingsModel* settings, QWidget* parent = nullptr);

  void setConfirmFunction(ConfirmFunction confirm) { m_confirm = std::move(confirm); }
  QTableWidget* sessionTable() const { return m_sessions; }
  QTableWidget* answerTable() const { return m_answers; }
  QDoubleSpinBox* editor(const QString& key) const;
  QString summaryText() const;
  // The agreement rate's points: (minutes since the screen opened, rate).
  const QList<QPointF>& agreementPoints() const { return m_points; }

 signals:
  void clearTierRequested(const QString& tier);
  void settingsReplaceRequested(const QJsonObject& document);

 public slots:
  void setSnapshot(const ShadowSnapshot& snapshot);
  void onSettingsOutcome(const SettingsOutcome& outcome);
  void onTierCleared(const QString& tier, bool ok, const QString& message);
  // Asks, then requests every shadow session dropped.
  void requestClear();

 private:
  SettingsPanel* m_panel;
  QLabel* m_summary;
  QPushButton* m_clear;
  QTableWidget* m_sessions;
  QTableWidget* m_answers;
  QChart* m_chart;
  QChartView* m_chartView;
  QLineSeries* m_series;
  QList<QPointF> m_points;
  qint64 m_residentBytes = 0, m_diskBytes = 0;  // what a clear drops, as last shown
  QGroupBox* m_chartBox = nullptr;  // its title says what the empty chart waits for
  qint64 m_startMs = 0;
  qint64 m_lastCompared = -1;
  ConfirmFunction m_confirm = askConfirmation;
};
