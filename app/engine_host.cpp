#include "app/engine_host.h"

#include <QJsonDocument>

#include <memory>

#include "app/console_worker.h"
#include "app/remote_worker.h"
#include "engine/compute/cpu/matmul.h"
#include "engine/server/service.h"

namespace {

nlohmann::json fromQt(const QJsonObject& o) {
  return nlohmann::json::parse(QJsonDocument(o).toJson(QJsonDocument::Compact).toStdString(), nullptr, false);
}

}  // namespace

// The engine in this process: every engine call of the console happens here, on the host thread.
class LocalWorker : public ConsoleWorker {
 public:
  LocalWorker(EngineHost* host, anchorage::Service* service, int pollMs)
      : ConsoleWorker(host, pollMs), m_service(service), m_schema(service->settings().Schema()) {
    startPolling();
  }

  void clearTier(const QString& tier) override {
    anchorage::Status s = m_service->scheduler().ClearCache(tier.toStdString());
    poll();
    emit m_host->tierCleared(tier, s.ok(), QString::fromStdString(s.message()));
  }

  void replaceSettings(const QJsonObject& document) override {
    SettingsOutcome out;
    nlohmann::json doc = fromQt(document);
    if (doc.is_discarded()) {
      out.httpStatus = 400;
      out.message = "the document is not valid JSON";
    } else {
      anchorage::ReplaceOutcome r = m_service->settings().Replace(doc);
      out.ok = r.ok();
      out.version = r.version;
      if (!r.ok()) {
        out.httpStatus = r.error->http_status();
        out.message = SettingsRefusalText(r.error->ToJson());
      }
    }
    pollSettings();
    emit m_host->settingsOutcome(out);
  }

 protected:
  void poll() override {
    const qint64 now = nowMs();
    anchorage::Scheduler& sched = m_service->scheduler();
    if (anchorage::Journal* journal = m_service->journal(); journal && now - m_lastJournalMs >= 500) {
      m_lastJournalMs = now;
      anchorage::JournalQuery q;
      q.limit = 500;
      if (auto page = journal->Query(q); page.ok()) publishJournal(page->rows, page->total);
    }
    publishCache(sched.CacheStatsJson(true), now);
    anchorage::ShadowReader* shadow = sched.shadow();
    publishShadow(shadow != nullptr ? nlohmann::json(anchorage::ShadowStatusJson(shadow->Snapshot()))
                                    : nlohmann::json{{"loaded", false}, {"reason", "start with --shadow-model DIR (a small model of the same vocabulary)"}},
                  now);
    QStringList models{QString::fromStdString(m_service->model_id())};
    for (const auto& entry : m_service->backends().ModelEntries()) models << QString::fromStdString(entry["id"].get<std::string>());
    publishBackends(m_service->backends().HealthJson(), models, now);
    pollSettings();

    EngineStatusSnapshot s;
    s.ready = true;
    s.modelId = QString::fromStdString(m_service->model_id());
    const bool on_gpu = std::string(sched.forward().device_name()) == "cuda";
    s.kernelPath = on_gpu ? QStringLiteral("cuda") : QString::fromUtf8(anchorage::cpu::PathName(anchorage::cpu::ActivePath()));
    s.weights = QString::fromStdString(m_service->model().weights_format);
    s.kvDtype = QString::fromUtf8(anchorage::KvDtypeName(m_service->model().config.kv_dtype));
    s.precision = QString::fromStdString(m_service->precision());
    s.generatedModel = m_service->model().generated;
    for (const std::string& note : m_service->notes()) s.notes << QString::fromStdString(note);
    s.fingerprint = QString::fromStdString(m_service->model().fingerprint);
    s.threads = sched.forward().threads();
    s.url = endpointUrl();
    s.queueDepth = static_cast<int>(sched.queue_depth());
    s.slotCount = static_cast<int>(sched.Slots().size());
    s.busySlots = sched.busy_slots();
    s.busy = sched.busy();
    s.last = sched.last_stats();
    if (m_service->journal()) {
      const anchorage::Journal::Health h = m_service->journal()->health();
      s.journalErrors = h.errors;
      s.journalLastError = QString::fromStdString(h.last_error);
    }
    publishStatus(s, now);
  }

  void setEndpoint(bool on, const QString& host, int port) override {
    QString error;
    if (!on) {
      m_service->StopServing();
    } else if (anchorage::Status moved = m_service->ServeAt(host.trimmed().toStdString(), port); !moved.ok()) {
      error = QString::fromStdString(moved.message());
    }
    emit m_host->endpointChanged(m_service->serving(), endpointUrl(), error);
    poll();
  }

  QString endpointUrl() const override { return QString::fromStdString(m_service->url()); }
  QByteArray bearer() const override { return QByteArray::fromStdString(m_service->client_token()); }

 private:
  void pollSettings() { publishSettings(m_service->settings().Document(), m_schema); }

  anchorage::Service* m_service;
  const nlohmann::json m_schema;  // the fields the store has: fixed for its life
  qint64 m_lastJournalMs = 0;
};

QString ServerBaseUrl(const QString& typed, QString* error) {
  QString text = typed.trimmed();
  while (text.endsWith('/')) text.chop(1);
  if (text.endsWith("/v1")) text.chop(3);
  const QUrl url(text, QUrl::StrictMode);
  if (!url.isValid() || (url.scheme() != "http" && url.scheme() != "https") || url.host().isEmpty()) {
    *error = QString("'%1' is not a server URL: give http://HOST:PORT (the address anchorage-server printed)").arg(typed);
    return {};
  }
  if (!url.path().isEmpty() || url.hasQuery() || url.hasFragment() || !url.userInfo().isEmpty()) {
    *error = QString("'%1' is not a server URL: give http://HOST:PORT with no path, query or user (the token goes in --admin-token)").arg(typed);
    return {};
  }
  return url.toString(QUrl::FullyEncoded);
}

EngineHost::EngineHost(const RemoteTarget& remote, QObject* parent) : QThread(parent), m_remote(remote) { registerTypes(); }

EngineHost::EngineHost(const anchorage::ServerConfig& config, QObject* parent) : QThread(parent), m_config(config) { registerTypes(); }

void EngineHost::registerTypes() {
  qRegisterMetaType<CacheSnapshot>();
  qRegisterMetaType<ShadowSnapshot>();
  qRegisterMetaType<BackendsSnapshot>();
  qRegisterMetaType<JournalSnapshot>();
  qRegisterMetaType<EngineStatusSnapshot>();
  qRegisterMetaType<SettingsSnapshot>();
  qRegisterMetaType<SettingsOutcome>();
  qRegisterMetaType<AvailabilitySnapshot>();
  qRegisterMetaType<ChatDelta>();
  qRegisterMetaType<ChatTurnStats>();
}

EngineHost::~EngineHost() {
  if (isRunning()) {
    drain();
    wait();
  }
}

template <typename F>
void EngineHost::post(F&& f) {
  QMutexLocker lock(&m_mutex);
  if (!m_worker) return;
  ConsoleWorker* worker = m_worker;
  QMetaObject::invokeMethod(worker, [worker, f = std::forward<F>(f)] { f(worker); }, Qt::QueuedConnection);
}

void EngineHost::clearTier(const QString& tier) {
  {
    QMutexLocker lock(&m_mutex);
    if (!m_worker) {
      emit tierCleared(tier, false, "the engine is not running");
      return;
    }
  }
  post([tier](ConsoleWorker* w) { w->clearTier(tier); });
}

void EngineHost::setAdminToken(const QString& token) {
  m_remote.adminToken = token;
  post([token](ConsoleWorker* w) { w->setAdminToken(token); });
}

void EngineHost::setEndpoint(bool on, const QString& host, int port) {
  post([on, host, port](ConsoleWorker* w) { w->setEndpoint(on, host, port); });
}

void EngineHost::replaceSettings(const QJsonObject& document) {
  post([document](ConsoleWorker* w) { w->replaceSettings(document); });
}

void EngineHost::sendChat(const QString& conversation, const QJsonArray& messages, const QJsonObject& sampling, const QString& model) {
  {
    QMutexLocker lock(&m_mutex);
    if (!m_worker) {
      ChatTurnStats s;
      s.conversation = conversation;
      s.ok = false;
      s.error = "the engine is not running";
      emit chatFinished(s);
      return;
    }
  }
  post([=](ConsoleWorker* w) { w->sendChat(conversation, messages, sampling, model); });
}

void EngineHost::stopChat(const QString& conversation) {
  post([conversation](ConsoleWorker* w) { w->stopChat(conversation); });
}

void EngineHost::cancelLoad() { m_cancelLoad = true; }

void EngineHost::drain() {
  m_drainRequested = true;
  m_cancelLoad = true;  // read by the load only; a started engine drains instead
  QMutexLocker lock(&m_mutex);
  if (!m_worker) return;  // run() sees the flag after the start
  ConsoleWorker* worker = m_worker;
  QMetaObject::invokeMethod(worker, [this, worker] {
    worker->stopAll();
    exit(0);
  }, Qt::QueuedConnection);
}

void EngineHost::run() {
  if (isRemote()) {
    {
      auto worker = std::make_unique<RemoteWorker>(this, m_remote, m_pollMs);
      {
        QMutexLocker lock(&m_mutex);
        m_worker = worker.get();
      }
      if (!m_drainRequested) exec();
      QMutexLocker lock(&m_mutex);
      m_worker = nullptr;
    }
    emit drained();
    return;
  }
  auto started = anchorage::Service::Start(m_config, [this](double fraction, const std::string& what) {
    emit progress(fraction, QString::fromStdString(what));
  }, &m_cancelLoad);
  if (!started.ok() && m_cancelLoad && started.status().code() == anchorage::StatusCode::kCancelled) {
    if (m_drainRequested) emit drained();
    else emit loadCancelled();
    return;
  }
  if (!started.ok()) {
    emit startFailed(QString::fromStdString(started.status().ToString()));
    return;
  }
  std::unique_ptr<anchorage::Service> service = std::move(*started);
  service->ServeInBackground();
  if (m_drainRequested) {
    service->Drain();
    emit drained();
    return;
  }
  {
    auto worker = std::make_unique<LocalWorker>(this, service.get(), m_pollMs);
    {
      QMutexLocker lock(&m_mutex);
      m_worker = worker.get();
    }
    emit ready(QString::fromStdString(service->url()));
    if (!m_drainRequested) exec();
    QMutexLocker lock(&m_mutex);
    m_worker = nullptr;
  }
  service->Drain();
  service.reset();
  emit drained();
}
