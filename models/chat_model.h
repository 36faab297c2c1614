// ChatModel: the messages of one console conversation, with each answer's reasoning and figures.
#pragma once

#include <QAbstractListModel>
#include <QJsonArray>

#include "app/snapshots.h"

// GUI thread only. An answer grows by applyDelta while it streams and ends with finishTurn.
class ChatModel : public QAbstractListModel {
  Q_OBJECT

 public:
  enum Role {
    RoleRole = Qt::UserRole + 1,  // "user" or "assistant"
    ContentRole,
    ReasoningRole,
    StatsRole,      // "source · cached/re-read tokens · TTFT · tok/s · output tokens, finish" of an answer
    StreamingRole,  // true while the answer streams
    ErrorRole,      // why the answer failed, or ""
  };

  struct Message {
    QString role;
    QString content;
    QString reasoning;
    bool streaming = false;
    bool hasStats = false;
    ChatTurnStats stats;
  };

  explicit ChatModel(const QString& conversation, QObject* parent = nullptr);

  int rowCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QHash<int, QByteArray> roleNames() const override;

  const QString& conversation() const { return m_conversation; }
  QString title() const;  // the first user message, shortened
  bool streaming() const;
  const Message& message(int i) const { return m_messages[i]; }

  // Adds the operator's message and an empty streaming answer; returns the messages to send.
  QJsonArray beginTurn(const QString& userText);
  void applyDelta(const ChatDelta& delta);
  void finishTurn(const ChatTurnStats& stats);

  // "resident · 412 cached / 17 re-read · TTFT 35 ms · 41.2 tok/s · 52 tokens, stop"; an answer cut by
  // max_tokens before its reasoning closed says so.
  static QString statsLine(const Message& message);

 private:
  QString m_conversation;
  QList<Message> m_messages;
};
