// ConsoleWorker: the console's side of one engine, on EngineHost's thread. It turns the documents the
// routes answer into snapshots, runs the screens' commands and streams the Chat tab over the endpoint.
#pragma once

#include <QHash>
#include <QJsonArray>
#include <QJsonObject>
#include <QNetworkAccessManager>
#include <QObject>
#include <QPointer>
#include <QTimer>

#include <nlohmann/json.hpp>

#include "app/snapshots.h"

class EngineHost;
class QNetworkReply;

// A field of a JSON object: 0, "" or null when it is missing or of another type.
int64_t JsonInt(const nlohmann::json& j, const char* key);
QString JsonText(const nlohmann::json& j, const char* key);
const nlohmann::json& JsonField(const nlohmann::json& j, const char* key);

// A refused settings document's message and its fields, one a line, from the error body
// ({"error": {"message", "fields": [{"field", "message"}]}}); empty when it has no message.
QString SettingsRefusalText(const nlohmann::json& body);

// The figures of one request from usage.anchorage (or /health's last_request) plus the usage counts.
anchorage::RequestFigures FiguresOf(const nlohmann::json& usage, const nlohmann::json& anchorage);

// Host thread only. Subclasses own where the documents come from: a Service in this process, or a
// running anchorage-server over HTTP.
class ConsoleWorker : public QObject {
 public:
  ConsoleWorker(EngineHost* host, int pollMs);
  ~ConsoleWorker() override;  // aborts the chats still streaming

  // Empties a tier; answers EngineHost::tierCleared.
  virtual void clearTier(const QString& tier) = 0;
  // Replaces the settings document; answers EngineHost::settingsOutcome.
  virtual void replaceSettings(const QJsonObject& document) = 0;
  // Over --connect: the token the routes are called with from now on (a hosted engine needs none).
  virtual void setAdminToken(const QString& token) {}
  // Moves, stops or starts the endpoint (a hosted engine's); answers EngineHost::endpointChanged.
  virtual void setEndpoint(bool on, const QString& host, int port);
  void sendChat(const QString& conversation, const QJsonArray& messages, const QJsonObject& sampling, const QString& model);
  void stopChat(const QString& conversation);
  void stopAll();  // aborts every chat and stops polling

 protected:
  void startPolling();  // polls now, then every pollMs
  virtual void poll() = 0;
  virtual QString endpointUrl() const = 0;  // http://HOST:PORT/v1
  virtual QByteArray bearer() const = 0;    // the chat requests' Authorization token, empty for none

  // Each publishes its snapshot when the document changed; the cache and the shadow at least once a
  // second too (the charts' clock).
  void publishCache(const nlohmann::json& stats, qint64 now);            // GET /v1/cache/stats
  void publishShadow(const nlohmann::json& status, qint64 now);          // GET /v1/shadow/status
  void publishBackends(const nlohmann::json& health, const QStringList& models, qint64 now);  // /health's "backends"
  void publishJournal(const nlohmann::json& rows, qint64 total);        // GET /v1/journal's rows and total
  void publishSettings(const nlohmann::json& document, const nlohmann::json& schema);
  // The engine's part of the status; the console's chat adds its phase, live rate and resume hint.
  void publishStatus(EngineStatusSnapshot status, qint64 now);
  static qint64 nowMs();

  EngineHost* m_host;
  QNetworkAccessManager m_nam;

 private:
  struct Chat {
    QPointer<QNetworkReply> reply;
    QByteArray buffer;
    ChatTurnStats stats;
    qint64 firstMs = -1;
    qint64 deltas = 0;
    qint64 journalIdAtStart = 0;
  };
  struct Published {  // the last document a snapshot was made of
    QByteArray json;
    qint64 ms = 0;
    // True (and remembered) when json differs, or when due is set and a second has passed.
    bool update(const QByteArray& next, qint64 now, bool due);
  };
  struct Hit {  // the newest journal row of kind "hit"
    qint64 id = 0;
    QString tier;
    qint64 tokens = 0;
  };

  void readChat(const QString& conversation, QNetworkReply* reply);
  void finishChat(const QString& conversation, QNetworkReply* reply);

  QTimer m_timer;
  QHash<QString, Chat> m_chats;
  EngineStatusSnapshot m_engineStatus;
  QString m_lastStatusKey;
  Published m_cache;
  Published m_shadow;
  Published m_backends;
  Published m_settings;
  qint64 m_lastJournalId = 0;
  qint64 m_lastJournalTotal = -1;
  Hit m_newestHit;
};
