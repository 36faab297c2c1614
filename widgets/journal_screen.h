// JournalScreen: the journal's newest rows, live, filterable and sortable, with a detail pane.
#pragma once

#include <QWidget>

class JournalFilterModel;
class JournalModel;
class QComboBox;
class QLabel;
class QLineEdit;
class QPlainTextEdit;
class QTableView;

// GUI thread only; reads only JournalModel.
class JournalScreen : public QWidget {
  Q_OBJECT

 public:
  explicit JournalScreen(JournalModel* journal, QWidget* parent = nullptr);

  QTableView* table() const { return m_table; }
  JournalFilterModel* filter() const { return m_filter; }

 private:
  void updateCount();
  void showDetail();

  JournalModel* m_journal;
  JournalFilterModel* m_filter;
  QComboBox* m_kind;
  QLineEdit* m_tier;
  QLineEdit* m_session;
  QLineEdit* m_text;
  QLabel* m_count;
  QTableView* m_table;
  QPlainTextEdit* m_detail;
};
