#include "models/chat_model.h"

#include <QJsonObject>
#include <QRandomGenerator>

ChatModel::ChatModel(const QString& conversation, QObject* parent) : QAbstractListModel(parent), m_conversation(conversation) {}

int ChatModel::rowCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : m_messages.size(); }

QVariant ChatModel::data(const QModelIndex& index, int role) const {
  if (!checkIndex(index, CheckIndexOption::IndexIsValid)) return {};
  const Message& m = m_messages[index.row()];
  switch (role) {
    case Qt::DisplayRole:
    case ContentRole: return m.content;
    case RoleRole: return m.role;
    case ReasoningRole: return m.reasoning;
    case StatsRole: return m.hasStats ? statsLine(m) : QString();
    case StreamingRole: return m.streaming;
    case ErrorRole: return m.hasStats && !m.stats.ok ? m.stats.error : QString();
  }
  return {};
}

QHash<int, QByteArray> ChatModel::roleNames() const {
  QHash<int, QByteArray> names = QAbstractListModel::roleNames();
  names[RoleRole] = "role";
  names[ContentRole] = "content";
  names[ReasoningRole] = "reasoning";
  names[StatsRole] = "stats";
  names[StreamingRole] = "streaming";
  names[ErrorRole] = "error";
  return names;
}

QString ChatModel::title() const {
  if (!m_title.isEmpty()) return m_title;
  for (const Message& m : m_messages)
    if (m.role == "user") return m.content.isEmpty() && !m.images.isEmpty() ? tr("An image") : m.content.simplified().left(40);
  return tr("New conversation");
}

void ChatModel::setTitle(const QString& title) { m_title = title.simplified(); }

QJsonObject ChatModel::sampling() const {
  QJsonObject out{{"max_tokens", m_options.maxTokens}, {"temperature", m_options.temperature}};
  if (m_options.temperature > 0) out["seed"] = static_cast<qint64>(QRandomGenerator::global()->bounded(1u << 31));  // a new sample each turn
  return out;
}

bool ChatModel::streaming() const { return !m_messages.isEmpty() && m_messages.last().streaming; }

QJsonArray ChatModel::beginTurn(const QString& userText, const QStringList& images) {
  beginInsertRows({}, m_messages.size(), m_messages.size() + 1);
  Message question;
  question.role = "user";
  question.content = userText;
  question.images = images;
  m_messages.append(question);
  Message answer;
  answer.role = "assistant";
  answer.streaming = true;
  m_messages.append(answer);
  endInsertRows();
  return messagesToSend();
}

QJsonArray ChatModel::regenerate() {
  if (m_messages.size() < 2 || m_messages.last().role != "assistant" || m_messages.last().streaming) return {};
  const int last = static_cast<int>(m_messages.size()) - 1;
  m_messages[last] = Message{"assistant", {}, {}, {}, true, false, {}};
  emit dataChanged(index(last), index(last));
  return messagesToSend();
}

QJsonArray ChatModel::messagesToSend() const {
  QJsonArray out;
  if (!m_options.systemPrompt.trimmed().isEmpty()) out.append(QJsonObject{{"role", "system"}, {"content", m_options.systemPrompt}});
  for (int i = 0; i + 1 < m_messages.size(); ++i) {
    const Message& m = m_messages[i];
    if (m.role == "assistant" && m.hasStats && !m.stats.ok && m.content.isEmpty()) continue;
    QJsonObject o{{"role", m.role}, {"content", m.content}};
    if (!m.images.isEmpty()) {  // OpenAI content parts: the text, then the images
      QJsonArray parts;
      if (!m.content.isEmpty()) parts.append(QJsonObject{{"type", "text"}, {"text", m.content}});
      for (const QString& url : m.images) parts.append(QJsonObject{{"type", "image_url"}, {"image_url", QJsonObject{{"url", url}}}});
      o["content"] = parts;
    }
    if (!m.reasoning.isEmpty()) o["reasoning_content"] = m.reasoning;
    out.append(o);
  }
  return out;
}

void ChatModel::applyDelta(const ChatDelta& delta) {
  if (!streaming() || delta.conversation != m_conversation) return;
  Message& m = m_messages.last();
  m.reasoning += delta.reasoning;
  m.content += delta.content;
  const QModelIndex i = index(m_messages.size() - 1);
  emit dataChanged(i, i, {ContentRole, ReasoningRole, Qt::DisplayRole});
}

void ChatModel::finishTurn(const ChatTurnStats& stats) {
  if (!streaming() || stats.conversation != m_conversation) return;
  Message& m = m_messages.last();
  m.streaming = false;
  m.hasStats = true;
  m.stats = stats;
  const QModelIndex i = index(m_messages.size() - 1);
  emit dataChanged(i, i, {StreamingRole, StatsRole, ErrorRole});
}

QString ChatModel::statsLine(const Message& m) {
  const ChatTurnStats& s = m.stats;
  if (!s.ok) return tr("failed: %1").arg(s.error);
  QString line = tr("%1 · %2 cached / %3 re-read tokens · TTFT %4 ms · %5 tok/s")
                     .arg(s.figures.cache_source.empty() ? QString("?") : QString::fromStdString(s.figures.cache_source))
                     .arg(s.figures.cached_tokens)
                     .arg(s.figures.reread_tokens)
                     .arg(s.figures.ttft_ms, 0, 'f', 1)
                     .arg(s.figures.decode_tokens_per_s, 0, 'f', 1);
  if (s.figures.completion_tokens > 0) line += tr(" · %1 tokens").arg(s.figures.completion_tokens);
  if (!s.finishReason.isEmpty()) line += (s.figures.completion_tokens > 0 ? ", " : " · ") + s.finishReason;
  if (s.finishReason == "length" && !m.reasoning.isEmpty() && m.content.isEmpty()) line += tr(": ended inside its reasoning (raise max tokens)");
  if (s.stopped) line += tr(" · stopped");
  return line;
}
