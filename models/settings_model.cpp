#include "models/settings_model.h"

#include <QJsonArray>

SettingsModel::SettingsModel(QObject* parent) : QAbstractTableModel(parent) {}

int SettingsModel::rowCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : m_keys.size(); }

int SettingsModel::columnCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : ColumnCount; }

static QString shown(const QJsonValue& v) {
  if (v.isBool()) return v.toBool() ? "true" : "false";
  if (v.isDouble()) return QString::number(v.toDouble(), 'g', 10);
  if (v.isString()) return v.toString();
  return {};
}

QVariant SettingsModel::data(const QModelIndex& index, int role) const {
  if (!checkIndex(index, CheckIndexOption::IndexIsValid)) return {};
  const QString& key = m_keys[index.row()];
  const QJsonObject f = field(key);
  const QJsonValue v = value(key);
  switch (role) {
    case KeyRole: return key;
    case ValueRole: return v.toVariant();
    case MinRole: return f["min"].toVariant();
    case MaxRole: return f["max"].toVariant();
    case TypeRole: return f["type"].toString();
    case OverrideRole: return m_snapshot.document["overrides"].toObject()[key].toObject().toVariantMap();
    case Qt::ToolTipRole: return f["description"].toString();
    case Qt::DisplayRole: break;
    default: return {};
  }
  switch (index.column()) {
    case FieldColumn: return key;
    case ValueColumn: return shown(v);
    case DefaultColumn: return shown(f["default"]);
    case RangeColumn: {
      if (f.contains("values")) {
        QStringList vs;
        for (const QJsonValue& e : f["values"].toArray()) vs << e.toString();
        return vs.join(", ");
      }
      if (f.contains("min") && f.contains("max")) return QString("%1..%2").arg(shown(f["min"]), shown(f["max"]));
      return QString();
    }
    case DescriptionColumn: return f["description"].toString();
  }
  return {};
}

QVariant SettingsModel::headerData(int section, Qt::Orientation orientation, int role) const {
  if (orientation != Qt::Horizontal || role != Qt::DisplayRole) return QAbstractTableModel::headerData(section, orientation, role);
  static const char* names[] = {"Field", "Value", "Default", "Range", "Meaning"};
  return section >= 0 && section < ColumnCount ? tr(names[section]) : QVariant();
}

QJsonValue SettingsModel::value(const QString& key) const {
  const QStringList parts = key.split('.');
  if (parts.size() != 2) return QJsonValue::Undefined;
  return m_snapshot.document[parts[0]].toObject()[parts[1]];
}

QJsonObject SettingsModel::field(const QString& key) const {
  const QStringList parts = key.split('.');
  if (parts.size() != 2) return {};
  return m_snapshot.schema["areas"].toObject()[parts[0]].toObject()[parts[1]].toObject();
}

QJsonObject SettingsModel::documentWith(const QVariantMap& values) const {
  QJsonObject doc = m_snapshot.document;
  doc.remove("overrides");
  for (auto it = values.begin(); it != values.end(); ++it) {
    const QStringList parts = it.key().split('.');
    if (parts.size() != 2) continue;
    QJsonObject area = doc[parts[0]].toObject();
    area[parts[1]] = QJsonValue::fromVariant(it.value());
    doc[parts[0]] = area;
  }
  doc["version"] = m_snapshot.version;
  return doc;
}

void SettingsModel::setSnapshot(const SettingsSnapshot& snapshot) {
  QStringList keys;
  const QJsonObject areas = snapshot.schema["areas"].toObject();
  for (const QString& area : {QString("memory"), QString("resident"), QString("state_store"), QString("disk_cache"), QString("shadow"), QString("journal")}) {
    const QJsonObject fields = areas[area].toObject();
    for (auto it = fields.begin(); it != fields.end(); ++it) keys << area + "." + it.key();
  }
  for (auto it = areas.begin(); it != areas.end(); ++it)
    for (const QString& f : it.value().toObject().keys())
      if (!keys.contains(it.key() + "." + f)) keys << it.key() + "." + f;
  if (keys != m_keys) {
    beginResetModel();
    m_snapshot = snapshot;
    m_keys = keys;
    endResetModel();
    return;
  }
  m_snapshot = snapshot;
  if (!m_keys.isEmpty()) emit dataChanged(index(0, 0), index(m_keys.size() - 1, ColumnCount - 1));
}
