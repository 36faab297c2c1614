// BackendsScreen: the upstreams this endpoint forwards to (--backend): each one's URL, state, since
// when it is down, its models, requests, errors, mean time to first bytes and last error.
#pragma once

#include <QWidget>

#include "app/snapshots.h"

class QLabel;
class QTableWidget;

// GUI thread only. Reads the backends snapshot.
class BackendsScreen : public QWidget {
  Q_OBJECT

 public:
  explicit BackendsScreen(QWidget* parent = nullptr);

  QTableWidget* table() const { return m_table; }
  QString summaryText() const;

 public slots:
  void setSnapshot(const BackendsSnapshot& snapshot);

 private:
  QLabel* m_summary;
  QTableWidget* m_table;
};
