// EngineHost: the thread that owns the engine Service, polls it into snapshots and runs commands.
#pragma once

#include <QJsonArray>
#include <QJsonObject>
#include <QMutex>
#include <QThread>

#include <atomic>

#include "app/snapshots.h"
#include "engine/server/service_config.h"

class ConsoleWorker;

// A running anchorage-server the console operates instead of hosting an engine (--connect).
struct RemoteTarget {
  QString url;         // http://HOST:PORT, without /v1
  QString adminToken;  // sent as the bearer token when set (the operator routes need it)
  QString apiKey;      // sent when there is no admin token (the inference routes may need one)
};

// The server's base URL from what an operator typed (http[s]://HOST[:PORT][/v1][/]); empty, saying
// why in *error, when it is not one.
QString ServerBaseUrl(const QString& typed, QString* error);

// Thread: constructed, started and driven from the GUI thread; Service::Start, every engine call,
// the poll timer and the console's chat client run on the host thread. Slots may be called from
// any thread; they queue the command to the host thread. Signals are emitted on the host thread.
class EngineHost : public QThread {
  Q_OBJECT

 public:
  explicit EngineHost(const anchorage::ServerConfig& config, QObject* parent = nullptr);
  // Remote mode: the same snapshots and commands over the server's documented routes; drain() only
  // stops the console's polling and chats, the server keeps running.
  explicit EngineHost(const RemoteTarget& remote, QObject* parent = nullptr);
  ~EngineHost() override;  // drains and waits when still running

  const anchorage::ServerConfig& config() const { return m_config; }
  bool isRemote() const { return !m_remote.url.isEmpty(); }
  const RemoteTarget& remote() const { return m_remote; }
  // Poll period of the snapshots in milliseconds (default 250).
  void setPollIntervalMs(int ms) { m_pollMs = ms; }

 public slots:
  // Empties a cache tier ("anchors", "end", "stash", "pin", "park", "store", "disk", "ram", "all"); answers tierCleared.
  void clearTier(const QString& tier);
  // Over --connect: calls the server's routes with this admin token from now on.
  void setAdminToken(const QString& token);
  // The endpoint of the engine this console hosts: on at host:port (0: a free port) or off; answers
  // endpointChanged. Over --connect the server keeps its address (endpointChanged says so).
  void setEndpoint(bool on, const QString& host, int port);
  // Replaces the settings document (it names the version it edits); answers settingsOutcome.
  void replaceSettings(const QJsonObject& document);
  // Streams a chat completion through the service's own endpoint; answers chatDelta and chatFinished.
  // sampling: request fields merged into the body (max_tokens, temperature).
  void sendChat(const QString& conversation, const QJsonArray& messages, const QJsonObject& sampling, const QString& model = QString());
  // Aborts the conversation's streaming request, if any (chatFinished follows with stopped=true).
  void stopChat(const QString& conversation);
  // Like SIGTERM: no new requests, waits for those in flight, stops the endpoint, ends the thread.
  // While the model still loads, the load stops at its next step or layer.
  void drain();
  // Stops a load in progress at its next step or layer: loadCancelled follows and the thread ends.
  // Once the engine is bound (or in remote mode) it does nothing.
  void cancelLoad();

 signals:
  void progress(double fraction, const QString& what);
  void ready(const QString& url);
  void startFailed(const QString& error);
  void loadCancelled();
  // Remote mode: whether /health answers, and what the routes the screens read said when they failed
  // (one a line; empty when all is well).
  void connectionChanged(bool reachable, const QString& message);
  // Over --connect: which routes answer and whether the admin ones will (see AvailabilitySnapshot).
  void availabilityChanged(const AvailabilitySnapshot& availability);
  void statusChanged(const EngineStatusSnapshot& status);
  void cacheChanged(const CacheSnapshot& cache);
  void shadowChanged(const ShadowSnapshot& shadow);
  void backendsChanged(const BackendsSnapshot& backends);
  void journalChanged(const JournalSnapshot& journal);
  void settingsChanged(const SettingsSnapshot& settings);
  void settingsOutcome(const SettingsOutcome& outcome);
  void tierCleared(const QString& tier, bool ok, const QString& message);
  // Where the endpoint serves now (url empty: off), and why a change did not happen (empty: it did).
  void endpointChanged(bool serving, const QString& url, const QString& error);
  void chatDelta(const ChatDelta& delta);
  void chatFinished(const ChatTurnStats& stats);
  void drained();

 protected:
  void run() override;

 private:
  template <typename F>
  void post(F&& f);

  void registerTypes();

  anchorage::ServerConfig m_config;
  RemoteTarget m_remote;
  int m_pollMs = 250;
  QMutex m_mutex;                  // guards m_worker
  ConsoleWorker* m_worker = nullptr;  // lives on the host thread while the service runs
  std::atomic<bool> m_drainRequested{false};
  std::atomic<bool> m_cancelLoad{false};  // Service::Start's cancel flag
};
