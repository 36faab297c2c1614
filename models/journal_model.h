// JournalModel: the journal's newest rows (requests and cache events), newest first.
#pragma once

#include <QAbstractTableModel>

#include "app/snapshots.h"

// The journal row (as the journal returns it) in words: a headline, then a "Label: value" line a field,
// the known fields first in a fixed order, the rest by name; empty fields are left out.
QString JournalRowSummary(const QJsonObject& row);

// GUI thread only; changes only through setSnapshot, which inserts new rows at the top.
class JournalModel : public QAbstractTableModel {
  Q_OBJECT

 public:
  // Route, slot, wait, output, TTFT, tok/s and finish are a request's; an event leaves them empty.
  enum Column {
    TimeColumn,
    KindColumn,
    RouteColumn,
    SlotColumn,
    WaitColumn,
    TierColumn,
    SessionColumn,
    TokensColumn,
    OutputColumn,
    TtftColumn,
    RateColumn,
    StatusColumn,
    FinishColumn,
    TextColumn,
    ColumnCount
  };
  enum Role {
    JsonRole = Qt::UserRole + 1,  // the row as the journal returns it, indented JSON text
    IdRole,
    KindRole,
    StatusRole,
    SortRole,     // the raw value of the cell (numbers for time, tokens, output, TTFT, tok/s, status)
    SummaryRole,  // the row in words, a field a line: labelled and in a fixed order, then the rest
  };

  explicit JournalModel(QObject* parent = nullptr);

  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation orientation, int role = Qt::DisplayRole) const override;

  void setSnapshot(const JournalSnapshot& snapshot);
  qint64 total() const { return m_total; }
  const JournalRowSnapshot& row(int i) const { return m_rows[i]; }

 private:
  QList<JournalRowSnapshot> m_rows;
  qint64 m_total = 0;
};
