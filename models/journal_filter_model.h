// JournalFilterModel: filters and sorts JournalModel rows by kind, tier, session and text.
#pragma once

#include <QSortFilterProxyModel>

// GUI thread only. Empty filters match everything; alertsOnly keeps sheds and 503 answers.
class JournalFilterModel : public QSortFilterProxyModel {
  Q_OBJECT

 public:
  explicit JournalFilterModel(QObject* parent = nullptr);

  void setKind(const QString& kind);        // "" any, "request", "cache_event", "shadow" or an event kind
  void setTier(const QString& tier);        // substring, case-insensitive
  void setSession(const QString& session);  // substring, case-insensitive
  void setText(const QString& text);        // substring of any column, case-insensitive
  void setAlertsOnly(bool on);

 protected:
  bool filterAcceptsRow(int sourceRow, const QModelIndex& sourceParent) const override;

 private:
  QString m_kind, m_tier, m_session, m_text;
  bool m_alertsOnly = false;
};
