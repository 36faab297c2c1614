#include "app/remote_worker.h"

#include <QJsonDocument>
#include <QNetworkReply>
#include <QUrlQuery>

namespace {

// What a failed answer says: the server's error message, else the network error, else the status.
QString whyFailed(int status, const nlohmann::json& body, const QString& error) {
  const QString message = JsonText(JsonField(body, "error"), "message");
  if (status != 0 && !message.isEmpty()) return QString("HTTP %1: %2").arg(status).arg(message);
  if (!error.isEmpty()) return error;
  if (status == 200) return QString("HTTP 200 with an answer that is not JSON");
  return QString("HTTP %1").arg(status);
}

}  // namespace

RemoteWorker::RemoteWorker(EngineHost* host, const RemoteTarget& target, int pollMs) : ConsoleWorker(host, pollMs), m_target(target) {
  startPolling();
}

RemoteWorker::~RemoteWorker() {
  for (QNetworkReply* reply : m_nam.findChildren<QNetworkReply*>()) {
    QObject::disconnect(reply, &QNetworkReply::finished, this, nullptr);
    reply->abort();
  }
}

QByteArray RemoteWorker::bearer() const { return (m_target.adminToken.isEmpty() ? m_target.apiKey : m_target.adminToken).toUtf8(); }

void RemoteWorker::send(const QByteArray& method, const QString& path, const QByteArray& body, Answer answer) {
  QNetworkRequest request(QUrl(m_target.url + path));
  if (method != "GET") request.setHeader(QNetworkRequest::ContentTypeHeader, "application/json");
  if (const QByteArray token = bearer(); !token.isEmpty()) request.setRawHeader("Authorization", "Bearer " + token);
  request.setAttribute(QNetworkRequest::Http2AllowedAttribute, false);
  request.setTransferTimeout(method == "GET" ? 10000 : 120000);
  QNetworkReply* reply = m_nam.sendCustomRequest(request, method, body);
  QObject::connect(reply, &QNetworkReply::finished, this, [reply, answer = std::move(answer)] {
    reply->deleteLater();
    const int status = reply->attribute(QNetworkRequest::HttpStatusCodeAttribute).toInt();
    const nlohmann::json doc = nlohmann::json::parse(reply->readAll().toStdString(), nullptr, false);
    answer(status, doc, reply->error() == QNetworkReply::NoError ? QString() : reply->errorString());
  });
}

void RemoteWorker::read(const QString& path, Answer answer) {
  if (m_inFlight.contains(path)) return;
  m_inFlight.insert(path);
  send("GET", path, {}, [this, path, answer = std::move(answer)](int status, const nlohmann::json& body, const QString& error) {
    m_inFlight.remove(path);
    answer(status, body, error);
  });
}

void RemoteWorker::poll() {
  read("/health", [this](int status, const nlohmann::json& body, const QString& error) { onHealth(status, body, error); });
  if (m_ready) pollRoutes();  // the rest once the server has answered
}

void RemoteWorker::pollRoutes() {
  const qint64 now = nowMs();
  auto reader = [this](const QString& path, std::function<void(const nlohmann::json&)> use) {
    read(path, [this, path, use = std::move(use)](int status, const nlohmann::json& body, const QString& error) {
      if (status != 200 || body.is_discarded()) return noteRouteError(path, status, body, error);
      noteRouteOk(path);
      use(body);
    });
  };
  reader("/v1/cache/stats", [this](const nlohmann::json& body) { publishCache(body, nowMs()); });
  reader("/v1/shadow/status", [this](const nlohmann::json& body) { publishShadow(body, nowMs()); });
  if (now - m_lastJournalMs >= 500) {
    m_lastJournalMs = now;
    reader("/v1/journal?limit=500", [this](const nlohmann::json& body) { publishJournal(JsonField(body, "rows"), JsonInt(body, "total")); });
  }
  if (now - m_lastModelsMs >= 2000) {
    m_lastModelsMs = now;
    reader("/v1/models", [this](const nlohmann::json& body) {
      QStringList models;
      if (const nlohmann::json& data = JsonField(body, "data"); data.is_array())
        for (const nlohmann::json& entry : data)
          if (const QString id = JsonText(entry, "id"); !id.isEmpty()) models << id;
      m_models = models;
    });
  }
  pollSettings();
}

void RemoteWorker::pollSettings() {
  if (m_schema.is_null()) {
    read("/v1/settings/schema", [this](int status, const nlohmann::json& body, const QString& error) {
      if (status != 200 || !body.is_object()) return noteRouteError("/v1/settings/schema", status, body, error);
      noteRouteOk("/v1/settings/schema");
      m_schema = body;
      pollSettings();
    });
    return;
  }
  read("/v1/settings", [this](int status, const nlohmann::json& body, const QString& error) {
    if (status != 200 || !body.is_object()) return noteRouteError("/v1/settings", status, body, error);
    noteRouteOk("/v1/settings");
    publishSettings(body, m_schema);
  });
}

void RemoteWorker::onHealth(int status, const nlohmann::json& body, const QString& error) {
  if (status != 200 || !body.is_object()) {
    m_reachable = false;
    noteRouteError("/health", status, body, error);
    return;
  }
  if (!m_ready) {
    m_ready = true;
    emit m_host->ready(endpointUrl());
    pollRoutes();
  }
  const bool reached = !m_reachable;
  m_reachable = true;
  m_lastOkMs["/health"] = nowMs();
  const nlohmann::json& admin = JsonField(JsonField(body, "access"), "admin");
  const QString refusal = !admin.is_boolean() || admin.get<bool>() ? QString()
                          : m_target.adminToken.isEmpty() ? QString("The server needs its admin token for this: start the console with --admin-token TOKEN.")
                                                          : QString("The server refuses this console's admin token.");
  const bool changed = reached || refusal != m_adminRefusal;
  m_adminRefusal = refusal;
  setNote("/health", JsonText(body, "status") == "draining" ? QString("The server is draining: it takes no new requests.") : QString());
  if (changed) publishAvailability();
  const qint64 now = nowMs();
  EngineStatusSnapshot s;
  s.ready = true;
  s.modelId = JsonText(body, "model");
  s.kernelPath = JsonText(body, "device") == "cuda" ? QStringLiteral("cuda") : JsonText(body, "kernel_path");
  s.weights = JsonText(body, "weights");
  s.kvDtype = JsonText(body, "kv_dtype");
  s.precision = JsonText(body, "precision");
  const nlohmann::json& generated = JsonField(body, "generated_model");
  s.generatedModel = generated.is_boolean() && generated.get<bool>();
  s.fingerprint = JsonText(body, "fingerprint");
  if (const nlohmann::json& notes = JsonField(body, "notes"); notes.is_array())
    for (const nlohmann::json& note : notes)
      if (note.is_string()) s.notes << QString::fromStdString(note.get<std::string>());
  s.threads = static_cast<int>(JsonInt(body, "threads"));
  s.url = endpointUrl();
  s.queueDepth = static_cast<int>(JsonInt(body, "queue"));
  if (const nlohmann::json& rows = JsonField(body, "slots"); rows.is_array() && !rows.empty()) s.slotCount = static_cast<int>(rows.size());
  s.busySlots = static_cast<int>(JsonInt(body, "busy_slots"));
  s.busy = JsonText(body, "state") == "busy";
  s.last = FiguresOf(JsonField(body, "last_request"), JsonField(body, "last_request"));
  const nlohmann::json& journal = JsonField(body, "journal");
  s.journalErrors = JsonInt(journal, "errors");
  s.journalLastError = JsonText(journal, "last_error");
  publishStatus(s, now);
  publishBackends(JsonField(body, "backends").is_array() ? JsonField(body, "backends") : nlohmann::json::array(),
                  m_models.isEmpty() ? QStringList{s.modelId} : m_models, now);
}

void RemoteWorker::noteRouteError(const QString& path, int status, const nlohmann::json& body, const QString& error) {
  setNote(path, path == "/health" && status == 0 ? QString("Cannot reach %1 (%2); trying again.").arg(m_target.url, error)
                                                 : QString("%1: %2").arg(path.section('?', 0, 0), whyFailed(status, body, error)));
}

void RemoteWorker::noteRouteOk(const QString& path) {
  m_lastOkMs[path.section('?', 0, 0)] = nowMs();
  setNote(path, {});
}

void RemoteWorker::setNote(const QString& path, const QString& note) {
  const QString key = path.section('?', 0, 0);
  if (m_notes.value(key) == note) return;
  if (note.isEmpty()) m_notes.remove(key);
  else m_notes[key] = note;
  QStringList lines = m_notes.values();
  lines.sort();
  emit m_host->connectionChanged(m_reachable, lines.join('\n'));
  publishAvailability();
}

void RemoteWorker::publishAvailability() {
  AvailabilitySnapshot a;
  a.reachable = m_reachable;
  a.failing = m_notes;
  a.failing.remove("/health");
  if (!m_reachable && m_notes.contains("/health")) a.failing["/health"] = m_notes["/health"];  // a draining note is no failure
  a.lastOkMs = m_lastOkMs;
  a.adminRefusal = m_adminRefusal;
  emit m_host->availabilityChanged(a);
}

void RemoteWorker::setAdminToken(const QString& token) {
  m_target.adminToken = token;
  m_schema = nlohmann::json();  // every route is read again with it
  poll();
}

void RemoteWorker::clearTier(const QString& tier) {
  QUrlQuery query;
  query.addQueryItem("tier", tier);
  send("POST", "/v1/cache/clear?" + query.toString(QUrl::FullyEncoded), {}, [this, tier](int status, const nlohmann::json& body, const QString& error) {
    const bool ok = status == 200;
    poll();
    emit m_host->tierCleared(tier, ok, ok ? QString() : whyFailed(status, body, error));
  });
}

void RemoteWorker::replaceSettings(const QJsonObject& document) {
  send("PUT", "/v1/settings", QJsonDocument(document).toJson(QJsonDocument::Compact), [this](int status, const nlohmann::json& body, const QString& error) {
    SettingsOutcome out;
    out.ok = status == 200 && body.is_object();
    out.httpStatus = status;
    if (out.ok) {
      out.version = JsonInt(body, "version");
      publishSettings(body, m_schema);
      emit m_host->settingsOutcome(out);
      return;
    }
    out.message = SettingsRefusalText(body);
    if (out.message.isEmpty()) out.message = whyFailed(status, body, error);
    // The screens offer a reload on 409: the current document first, then the outcome.
    send("GET", "/v1/settings", {}, [this, out](int s, const nlohmann::json& current, const QString&) {
      if (s == 200 && current.is_object()) publishSettings(current, m_schema);
      emit m_host->settingsOutcome(out);
    });
  });
}
