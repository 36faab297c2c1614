// SettingsModel: the fields of the settings document (one row a field) with their schema.
#pragma once

#include <QAbstractTableModel>
#include <QJsonObject>
#include <QJsonValue>
#include <QVariantMap>

#include "app/snapshots.h"

// GUI thread only; changes only through setSnapshot. Edits are made by building a new document
// (documentWith) that the screen sends through EngineHost; the model shows what the engine stores.
class SettingsModel : public QAbstractTableModel {
  Q_OBJECT

 public:
  enum Column { FieldColumn, ValueColumn, DefaultColumn, RangeColumn, DescriptionColumn, ColumnCount };
  enum Role { KeyRole = Qt::UserRole + 1, ValueRole, MinRole, MaxRole, TypeRole, OverrideRole };

  explicit SettingsModel(QObject* parent = nullptr);

  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation orientation, int role = Qt::DisplayRole) const override;

  void setSnapshot(const SettingsSnapshot& snapshot);
  qint64 version() const { return m_snapshot.version; }
  const QJsonObject& document() const { return m_snapshot.document; }
  // The stored value of "area.field", or undefined.
  QJsonValue value(const QString& key) const;
  // The schema entry of "area.field" ({type, min, max, default, description}), or empty.
  QJsonObject field(const QString& key) const;
  // The stored document with the given "area.field" values replaced; it names the current version.
  QJsonObject documentWith(const QVariantMap& values) const;

 private:
  SettingsSnapshot m_snapshot;
  QStringList m_keys;  // "area.field" in the schema's order
};
