#include "models/cache_tier_model.h"

#include "models/format.h"

CacheTierModel::CacheTierModel(QObject* parent) : QAbstractTableModel(parent) {}

int CacheTierModel::rowCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : m_snapshot.tiers.size(); }

int CacheTierModel::columnCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : ColumnCount; }

QVariant CacheTierModel::data(const QModelIndex& index, int role) const {
  if (!checkIndex(index, CheckIndexOption::IndexIsValid)) return {};
  const CacheTierSnapshot& t = m_snapshot.tiers[index.row()];
  if (role == TierRole) return t.tier;
  if (role == Qt::TextAlignmentRole) return index.column() == TierColumn ? QVariant() : QVariant(int(Qt::AlignRight | Qt::AlignVCenter));
  if (role == Qt::ToolTipRole && index.column() == EntriesColumn && t.tier == "resident") return tr("K/V rows held in the engine's buffer");
  if (role != Qt::DisplayRole && role != ValueRole) return {};
  const bool raw = role == ValueRole;
  switch (index.column()) {
    case TierColumn: return t.tier;
    case EntriesColumn: return t.entries;
    case BytesColumn: return raw ? QVariant(t.bytes) : QVariant(fmt::bytes(t.bytes));
    case BudgetColumn: return raw ? QVariant(t.budgetBytes) : QVariant(t.budgetBytes > 0 ? fmt::bytes(t.budgetBytes) : QString("-"));
    case HitsColumn: return t.hits;
    case EvictionsColumn: return t.evictions;
    case ActionColumn: return raw ? QVariant() : QVariant(QString());
  }
  return {};
}

QVariant CacheTierModel::headerData(int section, Qt::Orientation orientation, int role) const {
  if (orientation != Qt::Horizontal || role != Qt::DisplayRole) return QAbstractTableModel::headerData(section, orientation, role);
  switch (section) {
    case TierColumn: return tr("Tier");
    case EntriesColumn: return tr("Entries");
    case BytesColumn: return tr("Bytes");
    case BudgetColumn: return tr("Budget");
    case HitsColumn: return tr("Hits");
    case EvictionsColumn: return tr("Evictions");
    case ActionColumn: return QString();
  }
  return {};
}

int CacheTierModel::rowOf(const QString& tier) const {
  for (int i = 0; i < m_snapshot.tiers.size(); ++i)
    if (m_snapshot.tiers[i].tier == tier) return i;
  return -1;
}

void CacheTierModel::setSnapshot(const CacheSnapshot& snapshot) {
  bool sameRows = snapshot.tiers.size() == m_snapshot.tiers.size();
  for (int i = 0; sameRows && i < snapshot.tiers.size(); ++i) sameRows = snapshot.tiers[i].tier == m_snapshot.tiers[i].tier;
  if (!sameRows) {
    beginResetModel();
    m_snapshot = snapshot;
    endResetModel();
    return;
  }
  m_snapshot = snapshot;
  if (!m_snapshot.tiers.isEmpty()) emit dataChanged(index(0, 0), index(rowCount() - 1, ColumnCount - 1));
}
