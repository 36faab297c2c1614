// MemoryHistory: bytes held by each resident tier over the last minutes, one row a sample.
#pragma once

#include <QAbstractTableModel>
#include <QStringList>

#include "app/snapshots.h"

// GUI thread only. Column 0 is the sample's time (Unix epoch ms); column 1 + i is tier i's bytes.
class MemoryHistory : public QAbstractTableModel {
  Q_OBJECT

 public:
  explicit MemoryHistory(QObject* parent = nullptr);

  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation orientation, int role = Qt::DisplayRole) const override;

  // Samples older than the window (milliseconds before the newest) are dropped; default 5 minutes.
  void setWindowMs(qint64 ms) { m_windowMs = ms; }
  qint64 windowMs() const { return m_windowMs; }
  const QStringList& tiers() const { return m_tiers; }
  qint64 timeMs(int row) const { return m_samples[row].timeMs; }
  qint64 bytes(int row, int tier) const { return m_samples[row].bytes.value(tier); }
  qint64 maxBytes() const;

  void addSnapshot(const CacheSnapshot& snapshot);

 private:
  struct Sample {
    qint64 timeMs = 0;
    QList<qint64> bytes;  // by tier, in m_tiers' order
  };
  QStringList m_tiers;
  QList<Sample> m_samples;
  qint64 m_windowMs = 5 * 60 * 1000;
};
