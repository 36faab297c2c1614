#include "models/journal_model.h"

#include <QJsonDocument>
#include <QJsonArray>
#include <QJsonObject>
#include <QSet>

#include "models/format.h"

namespace {

QString ValueText(const QJsonValue& v) {
  if (v.isDouble()) {
    const double d = v.toDouble();
    return d == static_cast<double>(static_cast<qint64>(d)) ? QString::number(static_cast<qint64>(d)) : QString::number(d, 'f', d < 100 ? 2 : 0);
  }
  if (v.isBool()) return v.toBool() ? "yes" : "no";
  if (v.isString()) return v.toString();
  return QString::fromUtf8((v.isObject() ? QJsonDocument(v.toObject()) : QJsonDocument(v.toArray())).toJson(QJsonDocument::Compact));
}

// A request's wait: milliseconds, and its place in the queue when it came ("12.5 (#2)").
QString WaitText(double ms, qint64 position) {
  const QString wait = QString::number(ms, 'f', ms < 100 ? 1 : 0);
  return position > 0 ? QString("%1 (#%2)").arg(wait).arg(position) : wait;
}

}  // namespace

QString JournalRowSummary(const QJsonObject& row) {
  static const std::pair<const char*, const char*> kLabels[] = {
      {"time_ms", "Time"},           {"session", "Session"},         {"model", "Model"},
      {"route", "Route"},            {"slot", "Slot"},               {"queue_ms", "Waited (ms)"}, {"queue_position", "Queue position"},
      {"status", "Status"},          {"finish_reason", "Finish"},
      {"error", "Error"},            {"prompt_tokens", "Prompt tokens"}, {"cached_tokens", "Cached tokens"},
      {"reread_tokens", "Re-read tokens"}, {"cache_source", "Cache source"}, {"cache_tier", "Cache tier"},
      {"output_tokens", "Output tokens"}, {"hidden_tokens", "Reasoning tokens"}, {"ttft_ms", "TTFT (ms)"},
      {"prefill_tokens_per_s", "Prefill tok/s"}, {"decode_tokens_per_s", "Decode tok/s"}, {"drafted_tokens", "Drafted tokens"},
      {"accepted_tokens", "Accepted drafts"}, {"image_tokens", "Image tokens"}, {"kind", "Kind"}, {"tier", "Tier"},
      {"tokens", "Tokens"},          {"bytes", "Bytes"},             {"reason", "Reason"},
  };
  const QString type = row["type"].toString();
  QStringList lines;
  if (type == "request")
    lines << QObject::tr("Request %1: %2%3").arg(row["route"].toString(), ValueText(row["status"]),
                                                  row["finish_reason"].toString().isEmpty() ? QString() : ", " + row["finish_reason"].toString());
  else if (type == "cache_event")
    lines << QObject::tr("Cache event: %1 in %2").arg(row["kind"].toString(), row["tier"].toString());
  else
    lines << QObject::tr("%1 row").arg(type.isEmpty() ? QString("journal") : type);
  QSet<QString> shown = {"id", "type"};
  QList<std::pair<QString, QString>> fields;  // label, value
  const auto add = [&](const QString& key, const QString& label) {
    shown.insert(key);
    const QJsonValue v = row[key];
    if (v.isUndefined() || v.isNull() || (v.isString() && v.toString().isEmpty())) return;
    fields.append({label, key == "time_ms" ? fmt::dateAndTime(static_cast<qint64>(v.toDouble()), true) : ValueText(v)});
  };
  for (const auto& [key, label] : kLabels) add(key, QObject::tr(label));
  QStringList rest = row.keys();
  rest.sort();
  for (const QString& key : rest)
    if (!shown.contains(key)) add(key, key);
  qsizetype width = 0;
  for (const auto& f : fields) width = std::max(width, f.first.size());
  for (const auto& [label, value] : fields) lines << (label + ":").leftJustified(width + 2) + value;
  return lines.join('\n');
}

JournalModel::JournalModel(QObject* parent) : QAbstractTableModel(parent) {}

int JournalModel::rowCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : m_rows.size(); }

int JournalModel::columnCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : ColumnCount; }

QVariant JournalModel::data(const QModelIndex& index, int role) const {
  if (!checkIndex(index, CheckIndexOption::IndexIsValid)) return {};
  const JournalRowSnapshot& r = m_rows[index.row()];
  switch (role) {
    case JsonRole: return QString::fromUtf8(QJsonDocument::fromJson(r.json).toJson(QJsonDocument::Indented));
    case SummaryRole: return JournalRowSummary(QJsonDocument::fromJson(r.json).object());
    case IdRole: return r.id;
    case KindRole: return r.kind;
    case StatusRole: return r.status;
    case Qt::ToolTipRole:
      if (index.column() == TextColumn) return r.text;
      if (index.column() == TimeColumn) return fmt::dateAndTime(r.timeMs, true);
      return {};
    case Qt::DisplayRole:
    case SortRole: break;
    default: return {};
  }
  const bool raw = role == SortRole, request = r.type == "request";
  // A request's figure: the number to sort by, shown with a decimal under 100 (blank for events and requests that have none).
  const auto figure = [&](double value) -> QVariant {
    if (raw) return request ? value : -1.0;
    return request && value > 0 ? QVariant(QString::number(value, 'f', value < 100 ? 1 : 0)) : QVariant(QString());
  };
  switch (index.column()) {
    case TimeColumn: return raw ? QVariant(r.timeMs) : QVariant(fmt::dateAndTime(r.timeMs));
    case KindColumn: return r.kind;
    case RouteColumn: return r.route;
    case SlotColumn: return raw ? QVariant(request ? r.slot : -1) : QVariant(request ? QString::number(r.slot) : QString());
    case WaitColumn: return raw ? QVariant(request ? r.queueMs : -1.0) : QVariant(request ? WaitText(r.queueMs, r.queuePosition) : QString());
    case TierColumn: return r.tier;
    case SessionColumn: return r.session;
    case TokensColumn: return r.tokens;
    case OutputColumn: return raw ? QVariant(request ? r.outputTokens : qint64{-1}) : QVariant(request ? QString::number(r.outputTokens) : QString());
    case TtftColumn: return figure(r.ttftMs);
    case RateColumn: return figure(r.decodeTokensPerS);
    case StatusColumn: return raw ? QVariant(r.status) : QVariant(r.status ? QString::number(r.status) : QString());
    case FinishColumn: return r.finishReason;
    case TextColumn: return r.text;
  }
  return {};
}

QVariant JournalModel::headerData(int section, Qt::Orientation orientation, int role) const {
  if (orientation != Qt::Horizontal || role != Qt::DisplayRole) return QAbstractTableModel::headerData(section, orientation, role);
  static const char* names[] = {"Time", "Kind", "Route", "Slot", "Waited (ms)", "Tier", "Session", "Tokens", "Output", "TTFT (ms)", "tok/s", "Status", "Finish", "Text"};
  static_assert(sizeof(names) / sizeof(names[0]) == ColumnCount, "a header a column");
  return section >= 0 && section < ColumnCount ? tr(names[section]) : QVariant();
}

void JournalModel::setSnapshot(const JournalSnapshot& snapshot) {
  m_total = snapshot.total;
  const QList<JournalRowSnapshot>& next = snapshot.rows;
  if (m_rows.isEmpty() || next.isEmpty()) {
    beginResetModel();
    m_rows = next;
    endResetModel();
    return;
  }
  const qint64 top = m_rows.first().id;
  int fresh = 0;
  while (fresh < next.size() && next[fresh].id > top) ++fresh;
  if (fresh == next.size() || next[fresh].id != top) {  // no overlap with what is shown: start over
    beginResetModel();
    m_rows = next;
    endResetModel();
    return;
  }
  if (fresh > 0) {
    beginInsertRows({}, 0, fresh - 1);
    m_rows = next.mid(0, fresh) + m_rows;
    endInsertRows();
  }
  if (m_rows.size() > next.size()) {
    beginRemoveRows({}, next.size(), m_rows.size() - 1);
    m_rows.resize(next.size());
    endRemoveRows();
  }
}
