#include "models/journal_filter_model.h"

#include "models/journal_model.h"

JournalFilterModel::JournalFilterModel(QObject* parent) : QSortFilterProxyModel(parent) {
  setSortRole(JournalModel::SortRole);
  setDynamicSortFilter(true);
}

void JournalFilterModel::setKind(const QString& kind) {
  m_kind = kind;
  invalidateFilter();
}

void JournalFilterModel::setTier(const QString& tier) {
  m_tier = tier;
  invalidateFilter();
}

void JournalFilterModel::setSession(const QString& session) {
  m_session = session;
  invalidateFilter();
}

void JournalFilterModel::setText(const QString& text) {
  m_text = text;
  invalidateFilter();
}

void JournalFilterModel::setAlertsOnly(bool on) {
  m_alertsOnly = on;
  invalidateFilter();
}

bool JournalFilterModel::filterAcceptsRow(int sourceRow, const QModelIndex& sourceParent) const {
  const QAbstractItemModel* m = sourceModel();
  auto cell = [&](int column) { return m->index(sourceRow, column, sourceParent).data().toString(); };
  const QString kind = cell(JournalModel::KindColumn);
  const int status = m->index(sourceRow, 0, sourceParent).data(JournalModel::StatusRole).toInt();
  if (m_alertsOnly && kind != "shed" && status != 503) return false;
  if (!m_kind.isEmpty()) {
    if (m_kind == "cache_event" ? kind == "request" || kind == "shadow" : kind != m_kind) return false;
  }
  if (!m_tier.isEmpty() && !cell(JournalModel::TierColumn).contains(m_tier, Qt::CaseInsensitive)) return false;
  if (!m_session.isEmpty() && !cell(JournalModel::SessionColumn).contains(m_session, Qt::CaseInsensitive)) return false;
  if (!m_text.isEmpty()) {
    bool any = false;
    for (int c = 0; c < JournalModel::ColumnCount && !any; ++c) any = cell(c).contains(m_text, Qt::CaseInsensitive);
    if (!any) return false;
  }
  return true;
}
