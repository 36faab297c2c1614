#include "models/memory_history.h"

MemoryHistory::MemoryHistory(QObject* parent) : QAbstractTableModel(parent) {}

int MemoryHistory::rowCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : m_samples.size(); }

int MemoryHistory::columnCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : 1 + m_tiers.size(); }

QVariant MemoryHistory::data(const QModelIndex& index, int role) const {
  if (!checkIndex(index, CheckIndexOption::IndexIsValid) || role != Qt::DisplayRole) return {};
  const Sample& s = m_samples[index.row()];
  return index.column() == 0 ? s.timeMs : s.bytes.value(index.column() - 1);
}

QVariant MemoryHistory::headerData(int section, Qt::Orientation orientation, int role) const {
  if (orientation != Qt::Horizontal || role != Qt::DisplayRole) return QAbstractTableModel::headerData(section, orientation, role);
  if (section == 0) return tr("Time");
  return m_tiers.value(section - 1);
}

qint64 MemoryHistory::maxBytes() const {
  qint64 m = 0;
  for (const Sample& s : m_samples)
    for (qint64 b : s.bytes) m = std::max(m, b);
  return m;
}

void MemoryHistory::addSnapshot(const CacheSnapshot& snapshot) {
  QStringList tiers;
  for (const CacheTierSnapshot& t : snapshot.tiers) tiers << t.tier;
  if (tiers != m_tiers) {
    beginResetModel();
    m_tiers = tiers;
    m_samples.clear();
    endResetModel();
  }
  Sample s{snapshot.timeMs, {}};
  for (const CacheTierSnapshot& t : snapshot.tiers) s.bytes << t.bytes;
  beginInsertRows({}, m_samples.size(), m_samples.size());
  m_samples.append(s);
  endInsertRows();
  int old = 0;
  while (old < m_samples.size() && m_samples[old].timeMs < snapshot.timeMs - m_windowMs) ++old;
  if (old > 0) {
    beginRemoveRows({}, 0, old - 1);
    m_samples.remove(0, old);
    endRemoveRows();
  }
}
