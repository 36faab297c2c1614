// RemoteWorker: the console over a running anchorage-server (`anchorage --connect URL`): the same
// snapshots and commands as an engine in this process, every one through a documented route.
#pragma once

#include <QSet>

#include <functional>

#include "app/console_worker.h"
#include "app/engine_host.h"

class RemoteWorker : public ConsoleWorker {
 public:
  RemoteWorker(EngineHost* host, const RemoteTarget& target, int pollMs);
  ~RemoteWorker() override;  // aborts its requests: their answers use this class's members

  void clearTier(const QString& tier) override;
  void replaceSettings(const QJsonObject& document) override;
  void setAdminToken(const QString& token) override;

 protected:
  void poll() override;
  QString endpointUrl() const override { return m_target.url + "/v1"; }
  QByteArray bearer() const override;

 private:
  // An answer: the HTTP status (0 when none came), its JSON body (discarded when not JSON) and the
  // network error, if any.
  using Answer = std::function<void(int status, const nlohmann::json& body, const QString& error)>;
  void send(const QByteArray& method, const QString& path, const QByteArray& body, Answer answer);
  // A GET of a route the screens poll; not sent again while one for the path is in flight.
  void read(const QString& path, Answer answer);
  void pollRoutes();  // every route but /health
  void onHealth(int status, const nlohmann::json& body, const QString& error);
  // A route the screens read answered with an error: on the banner until it answers again.
  void noteRouteError(const QString& path, int status, const nlohmann::json& body, const QString& error);
  // Puts a line on the banner under key, or takes it off when note is empty.
  void setNote(const QString& key, const QString& note);
  // A read of path answered: its age starts again.
  void noteRouteOk(const QString& path);
  void publishAvailability();
  void pollSettings();

  RemoteTarget m_target;
  QSet<QString> m_inFlight;
  QHash<QString, QString> m_notes;  // the banner's lines by route (path without the query)
  QHash<QString, qint64> m_lastOkMs;
  QString m_adminRefusal;
  nlohmann::json m_schema;
  nlohmann::json m_backendsHealth = nlohmann::json::array();
  QStringList m_models;
  bool m_ready = false;
  bool m_reachable = false;
  qint64 m_lastJournalMs = 0;
  qint64 m_lastModelsMs = 0;
};
