// ChatModel: the messages of one console conversation, with each answer's reasoning and figures.
#pragma once

#include <QAbstractListModel>
#include <QJsonArray>
#include <QStringList>

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
    QStringList images;  // a user message's images, as data: URLs
    QString reasoning;
    bool streaming = false;
    bool hasStats = false;
    ChatTurnStats stats;
  };

  // What the conversation's turns are sent with.
  struct Options {
    QString systemPrompt;     // sent first when set
    double temperature = 1.0;  // the endpoint's default; 0 is greedy
    int maxTokens = 256;
  };

  explicit ChatModel(const QString& conversation, QObject* parent = nullptr);

  int rowCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QHash<int, QByteArray> roleNames() const override;

  const QString& conversation() const { return m_conversation; }
  QString title() const;  // the name the operator gave it, else the first user message, shortened
  void setTitle(const QString& title);  // empty: back to the first message
  Options& options() { return m_options; }
  const Options& options() const { return m_options; }
  // The request fields of the options: {"max_tokens", "temperature"}, and a fresh "seed" when it
  // samples (the endpoint's default seed would give every turn and regeneration the same sample).
  QJsonObject sampling() const;
  bool streaming() const;
  const Message& message(int i) const { return m_messages[i]; }

  // Adds the operator's message (with its images, data: URLs) and an empty streaming answer; returns the messages to send.
  QJsonArray beginTurn(const QString& userText, const QStringList& images = {});
  // Drops the last answer and starts it again from the same messages; returns them (empty when
  // there is no finished answer to take back).
  QJsonArray regenerate();
  void applyDelta(const ChatDelta& delta);
  void finishTurn(const ChatTurnStats& stats);

  // "resident · 412 cached / 17 re-read · TTFT 35 ms · 41.2 tok/s · 52 tokens, stop"; an answer cut by
  // max_tokens before its reasoning closed says so.
  static QString statsLine(const Message& message);

 private:
  // The messages before the streaming answer, the system prompt first, failed empty answers left out.
  QJsonArray messagesToSend() const;

  QString m_conversation;
  QString m_title;
  Options m_options;
  QList<Message> m_messages;
};
