// JournalScreen: the journal's newest rows, live, filterable and sortable, with a detail pane, and
// charts of the requests among them: TTFT and re-read tokens over time by cache source, and the
// share of requests per source.
#pragma once

#include <QWidget>

class JournalFilterModel;
class JournalModel;
class QChart;
class QComboBox;
class QLabel;
class QLineEdit;
class QCheckBox;
class QPlainTextEdit;
class QTableView;

// GUI thread only; reads only JournalModel.
class JournalScreen : public QWidget {
  Q_OBJECT

 public:
  explicit JournalScreen(JournalModel* journal, QWidget* parent = nullptr);

  QTableView* table() const { return m_table; }
  JournalFilterModel* filter() const { return m_filter; }
  QChart* ttftChart() const { return m_ttft; }
  QChart* rereadChart() const { return m_reread; }
  QChart* sourceChart() const { return m_sources; }

 private:
  void updateCount();
  void showDetail();
  void updateCharts();

  JournalModel* m_journal;
  JournalFilterModel* m_filter;
  QComboBox* m_kind;
  QLineEdit* m_tier;
  QLineEdit* m_session;
  QLineEdit* m_text;
  QLabel* m_count;
  QTableView* m_table;
  QPlainTextEdit* m_detail;
  QCheckBox* m_raw;  // the selected row's raw JSON instead of its summary
  QChart* m_ttft;
  QChart* m_reread;
  QChart* m_sources;
};
