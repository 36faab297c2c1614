// CacheTierModel: one row per resident cache tier (entries, bytes, budget, hits, evictions).
#pragma once

#include <QAbstractTableModel>

#include "app/snapshots.h"

// GUI thread only; changes only through setSnapshot.
class CacheTierModel : public QAbstractTableModel {
  Q_OBJECT

 public:
  enum Column { TierColumn, EntriesColumn, BytesColumn, BudgetColumn, HitsColumn, EvictionsColumn, ActionColumn, ColumnCount };  // ActionColumn: where a view puts the Clear button
  enum Role { TierRole = Qt::UserRole + 1, ValueRole };  // ValueRole: the raw number of the cell

  explicit CacheTierModel(QObject* parent = nullptr);

  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation orientation, int role = Qt::DisplayRole) const override;

  void setSnapshot(const CacheSnapshot& snapshot);
  const CacheSnapshot& snapshot() const { return m_snapshot; }
  // The row of a tier, or -1.
  int rowOf(const QString& tier) const;

 private:
  CacheSnapshot m_snapshot;
};
