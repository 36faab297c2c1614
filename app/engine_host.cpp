#include "app/engine_host.h"

#include <QDateTime>
#include <QHash>
#include <QJsonDocument>
#include <QNetworkAccessManager>
#include <QNetworkProxy>
#include <QNetworkReply>
#include <QPointer>
#include <QTimer>

#include <memory>
#include <utility>

#include "engine/compute/cpu/matmul.h"
#include "engine/server/service.h"

namespace {

QByteArray dumpJson(const nlohmann::json& j) {
  return QByteArray::fromStdString(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

QJsonObject toQt(const nlohmann::json& j) { return QJsonDocument::fromJson(dumpJson(j)).object(); }

nlohmann::json fromQt(const QJsonObject& o) {
  return nlohmann::json::parse(QJsonDocument(o).toJson(QJsonDocument::Compact).toStdString(), nullptr, false);
}

// A number field of an object, or 0 when it is missing or not a number.
int64_t num(const nlohmann::json& j, const char* key) {
  if (!j.is_object()) return 0;
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<int64_t>() : 0;
}

// A string field of an object, or "" when it is missing or not a string.
std::string str(const nlohmann::json& j, const char* key) {
  if (!j.is_object()) return {};
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

qint64 nowMs() { return QDateTime::currentMSecsSinceEpoch(); }

CacheTierSnapshot tierOf(const char* name, qint64 entries, qint64 bytes, qint64 budgetBytes, qint64 hits, qint64 evictions) {
  CacheTierSnapshot t;
  t.tier = QString::fromLatin1(name);
  t.entries = entries;
  t.bytes = bytes;
  t.budgetBytes = budgetBytes;
  t.hits = hits;
  t.evictions = evictions;
  return t;
}

JournalRowSnapshot journalRowOf(const nlohmann::json& r) {
  JournalRowSnapshot row;
  row.id = num(r, "id");
  row.timeMs = num(r, "time_ms");
  row.type = QString::fromStdString(str(r, "type"));
  row.session = QString::fromStdString(str(r, "session"));
  if (row.type == "request") {
    row.kind = "request";
    row.tier = QString::fromStdString(str(r, "cache_source"));
    row.tokens = num(r, "prompt_tokens");
    row.status = static_cast<int>(num(r, "status"));
    const std::string error = str(r, "error");
    row.text = QString::fromStdString(error.empty() ? str(r, "route") + " " + str(r, "finish_reason") : error);
  } else if (row.type == "shadow") {
    row.kind = "shadow";
    row.tokens = num(r, "insertion_tokens");
    const auto answer = [&](const char* choice) { return r.contains(choice) && r[choice].is_string() ? r[choice].get<std::string>() : std::string("-"); };
    row.text = QString::fromStdString("shadow " + answer("shadow_choice") + ", main " + answer("main_choice") + (str(r, "note").empty() ? "" : "; " + str(r, "note")));
  } else {
    row.kind = QString::fromStdString(str(r, "kind"));
    row.tier = QString::fromStdString(str(r, "tier"));
    row.tokens = num(r, "tokens");
    row.text = QString::fromStdString(str(r, "reason"));
  }
  row.json = dumpJson(r);
  return row;
}

}  // namespace

// Lives on the host thread; every engine call of the console happens here.
class EngineWorker : public QObject {
 public:
  EngineWorker(EngineHost* host, anchorage::Service* service, int pollMs) : m_host(host), m_service(service) {
    m_nam.setProxy(QNetworkProxy::NoProxy);
    m_timer.setInterval(pollMs);
    QObject::connect(&m_timer, &QTimer::timeout, this, [this] { poll(); });
    m_timer.start();
    poll();
  }

  ~EngineWorker() override {
    const QHash<QString, Chat> chats = std::exchange(m_chats, {});
    for (const Chat& c : chats)
      if (c.reply) c.reply->abort();
  }

  void poll() {
    const qint64 now = nowMs();
    pollJournal(now);
    pollCache(now);
    pollShadow(now);
    pollBackends(now);
    pollSettings();
    pollStatus(now);
  }

  void clearTier(const QString& tier) {
    anchorage::Status s = m_service->scheduler().ClearCache(tier.toStdString());
    m_lastCacheJson.clear();
    poll();
    emit m_host->tierCleared(tier, s.ok(), QString::fromStdString(s.message()));
  }

  void replaceSettings(const QJsonObject& document) {
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
        QStringList lines{QString::fromStdString(r.error->message)};
        for (const auto& f : r.error->fields) lines << QString::fromStdString(f.field + ": " + f.message);
        out.message = lines.join('\n');
      }
    }
    pollSettings();
    emit m_host->settingsOutcome(out);
  }

  void sendChat(const QString& conversation, const QJsonArray& messages, int maxTokens, const QString& model) {
    if (m_chats.contains(conversation)) stopChat(conversation);
    QJsonObject body{{"messages", messages},
                     {"stream", true},
                     {"stream_options", QJsonObject{{"include_usage", true}}},
                     {"conversation_id", conversation}};
    if (maxTokens > 0) body["max_tokens"] = maxTokens;
    if (!model.isEmpty()) body["model"] = model;
    QNetworkRequest request(QUrl(QString::fromStdString(m_service->url()) + "/chat/completions"));
    request.setHeader(QNetworkRequest::ContentTypeHeader, "application/json");
    request.setRawHeader("Accept", "text/event-stream");
    if (const std::string token = m_service->client_token(); !token.empty()) request.setRawHeader("Authorization", QByteArray("Bearer ") + token.c_str());
    request.setAttribute(QNetworkRequest::Http2AllowedAttribute, false);
    Chat& chat = m_chats[conversation];
    chat = Chat{};
    chat.stats.conversation = conversation;
    chat.startMs = nowMs();
    chat.journalIdAtStart = m_lastJournalId;
    QNetworkReply* reply = m_nam.post(request, QJsonDocument(body).toJson(QJsonDocument::Compact));
    chat.reply = reply;
    QObject::connect(reply, &QNetworkReply::readyRead, this, [this, conversation, reply] { readChat(conversation, reply); });
    QObject::connect(reply, &QNetworkReply::finished, this, [this, conversation, reply] { finishChat(conversation, reply); });
    pollStatus(nowMs());
  }

  void stopChat(const QString& conversation) {
    auto it = m_chats.find(conversation);
    if (it == m_chats.end() || !it->reply) return;
    it->stats.stopped = true;
    it->reply->abort();  // finished() follows synchronously
  }

  void stopAll() {
    const QStringList ids = m_chats.keys();
    for (const QString& id : ids) stopChat(id);
    m_timer.stop();
  }

 private:
  struct Chat {
    QPointer<QNetworkReply> reply;
    QByteArray buffer;
    ChatTurnStats stats;
    qint64 startMs = 0;
    qint64 firstMs = -1;
    qint64 deltas = 0;
    qint64 journalIdAtStart = 0;
    QString resumeHint;
  };

  void readChat(const QString& conversation, QNetworkReply* reply) {
    auto it = m_chats.find(conversation);
    if (it == m_chats.end() || it->reply != reply) return;
    Chat& chat = *it;
    if (reply->isOpen()) chat.buffer += reply->readAll();
    const int status = reply->attribute(QNetworkRequest::HttpStatusCodeAttribute).toInt();
    if (status != 200) return;  // an error body: read whole at the end
    qsizetype sep;
    while ((sep = chat.buffer.indexOf("\n\n")) >= 0) {
      const QByteArray event = chat.buffer.left(sep);
      chat.buffer.remove(0, sep + 2);
      if (!event.startsWith("data: ")) continue;
      const QByteArray payload = event.mid(6);
      if (payload == "[DONE]") continue;
      const QJsonObject o = QJsonDocument::fromJson(payload).object();
      if (o.contains("error")) {
        chat.stats.ok = false;
        chat.stats.error = o["error"].toObject()["message"].toString();
      }
      const QJsonArray choices = o["choices"].toArray();
      if (!choices.isEmpty()) {
        const QJsonObject choice = choices[0].toObject();
        const QJsonObject delta = choice["delta"].toObject();
        ChatDelta d{conversation, delta["reasoning_content"].toString(), delta["content"].toString()};
        if (!d.reasoning.isEmpty() || !d.content.isEmpty()) {
          if (chat.firstMs < 0) chat.firstMs = nowMs();
          ++chat.deltas;
          emit m_host->chatDelta(d);
        }
        if (choice["finish_reason"].isString()) chat.stats.finishReason = choice["finish_reason"].toString();
      }
      if (o["usage"].isObject()) {
        const QJsonObject u = o["usage"].toObject();
        const QJsonObject a = u["anchorage"].toObject();
        anchorage::RequestFigures& f = chat.stats.figures;
        f.prompt_tokens = u["prompt_tokens"].toInteger();
        f.completion_tokens = u["completion_tokens"].toInteger();
        f.cache_source = a["cache_source"].toString().toStdString();
        f.cached_tokens = a["cached_tokens"].toInteger();
        f.reread_tokens = a["reread_tokens"].toInteger();
        f.served_prompt_tokens = a["served_prompt_tokens"].toInteger();
        f.prefill_ms = a["prefill_ms"].toDouble();
        f.ttft_ms = a["ttft_ms"].toDouble();
        f.decode_tokens_per_s = a["decode_tokens_per_s"].toDouble();
        f.queue_ms = a["queue_ms"].toDouble();
        f.drafted_tokens = a["drafted_tokens"].toInteger();
        f.accepted_tokens = a["accepted_tokens"].toInteger();
      }
    }
  }

  void finishChat(const QString& conversation, QNetworkReply* reply) {
    reply->deleteLater();
    auto it = m_chats.find(conversation);
    if (it == m_chats.end() || it->reply != reply) return;
    readChat(conversation, reply);
    ChatTurnStats stats = it->stats;
    const int status = reply->attribute(QNetworkRequest::HttpStatusCodeAttribute).toInt();
    if (!stats.stopped && (reply->error() != QNetworkReply::NoError || status != 200)) {
      stats.ok = false;
      const QString message = QJsonDocument::fromJson(it->buffer).object()["error"].toObject()["message"].toString();
      stats.error = message.isEmpty() ? reply->errorString() : QString("HTTP %1: %2").arg(status).arg(message);
    }
    m_chats.erase(it);
    emit m_host->chatFinished(stats);
    pollStatus(nowMs());
  }

  void pollStatus(qint64 now) {
    EngineStatusSnapshot s;
    s.ready = true;
    s.modelId = QString::fromStdString(m_service->model_id());
    s.kernelPath = QString::fromUtf8(anchorage::cpu::PathName(anchorage::cpu::ActivePath()));
    s.threads = m_service->scheduler().forward().threads();
    s.url = QString::fromStdString(m_service->url());
    anchorage::Scheduler& sched = m_service->scheduler();
    s.queueDepth = static_cast<int>(sched.queue_depth());
    s.busy = sched.busy();
    s.last = sched.last_stats();
    if (m_service->journal()) {
      const anchorage::Journal::Health h = m_service->journal()->health();
      s.journalErrors = h.errors;
      s.journalLastError = QString::fromStdString(h.last_error);
    }
    if (!m_chats.isEmpty()) {
      Chat& chat = *m_chats.begin();
      if (chat.firstMs < 0) {
        s.phase = "prefill";
        if (chat.resumeHint.isEmpty() && m_service->journal()) {
          anchorage::JournalQuery q;
          q.kind = "hit";
          q.limit = 1;
          auto page = m_service->journal()->Query(q);
          if (page.ok() && !page->rows.empty() && num(page->rows[0], "id") > chat.journalIdAtStart)
            chat.resumeHint = QString("%1 at %2 tokens")
                                  .arg(QString::fromStdString(str(page->rows[0], "tier")))
                                  .arg(num(page->rows[0], "tokens"));
        }
        s.resumeHint = chat.resumeHint.isEmpty() ? QString("no hit yet (cold)") : chat.resumeHint;
      } else {
        s.phase = "decode";
        const double secs = std::max<qint64>(1, now - chat.firstMs) / 1000.0;
        s.liveTokensPerS = chat.deltas / secs;
      }
    } else if (s.busy) {
      s.phase = "busy";
    }
    const QString key = QString("%1|%2|%3|%4|%5|%6|%7|%8").arg(s.queueDepth).arg(s.busy).arg(s.phase).arg(s.liveTokensPerS, 0, 'f', 0)
                            .arg(s.resumeHint).arg(s.last.completion_tokens).arg(s.last.ttft_ms).arg(s.journalErrors);
    if (key == m_lastStatusKey) return;
    m_lastStatusKey = key;
    emit m_host->statusChanged(s);
  }

  void pollCache(qint64 now) {
    const anchorage::CacheStats stats = m_service->scheduler().CacheStats();
    const QByteArray json = dumpJson(anchorage::ToJson(stats));
    if (json == m_lastCacheJson && now - m_lastCacheMs < 1000) return;  // once a second at least: the chart's clock
    m_lastCacheJson = json;
    m_lastCacheMs = now;
    CacheSnapshot c;
    c.timeMs = now;
    c.json = json;
    const auto& r = stats.resident;
    c.tiers.append(tierOf("resident", r.rows, r.row_bytes, 0, r.requests - r.cold, 0));
    c.tiers.append(tierOf("anchors", stats.anchors.entries, stats.anchors.bytes, stats.anchors.budget_bytes, stats.anchors.hits, stats.anchors.evictions));
    c.tiers.append(tierOf("end", stats.end.entries, stats.end.bytes, 0, stats.end.hits, 0));
    c.tiers.append(tierOf("stash", stats.stash.entries, stats.stash.bytes, stats.stash.budget_bytes, stats.stash.guests, 0));
    c.tiers.append(tierOf("pin", stats.pin.entries, stats.pin.bytes, stats.pin.budget_bytes, stats.pin.hits, 0));
    c.tiers.append(tierOf("park", stats.park.entries, stats.park.bytes, stats.park.budget_bytes, stats.park.hits, 0));
    c.tiers.append(tierOf("store", stats.store.entries, stats.store.bytes, stats.store.budget_bytes, stats.store.hits, stats.store.evictions));
    c.tiers.append(tierOf("response", stats.response.entries, stats.response.bytes, stats.response.enabled ? stats.response.max_bytes : 0,
                          stats.response.hits, stats.response.evictions));
    c.tiers.append(tierOf("prepared", stats.prepared.entries, stats.prepared.bytes, 0, stats.prepared.served, 0));
    c.engineBytes = stats.memory.engine_bytes;
    c.ceilingBytes = stats.memory.ceiling_bytes;
    c.peakBytes = stats.memory.peak_bytes;
    c.sheds = stats.memory.shed_total();
    c.refused = stats.memory.refused;
    emit m_host->cacheChanged(c);
  }

  void pollShadow(qint64 now) {
    anchorage::ShadowReader* shadow = m_service->scheduler().shadow();
    const QByteArray json = shadow != nullptr ? dumpJson(anchorage::ShadowStatusJson(shadow->Snapshot()))
                                              : dumpJson({{"loaded", false}, {"reason", "start with --shadow-model DIR (a small model of the same vocabulary)"}});
    if (json == m_lastShadowJson && now - m_lastShadowMs < 1000) return;
    m_lastShadowJson = json;
    m_lastShadowMs = now;
    emit m_host->shadowChanged(ShadowSnapshot{now, json});
  }

  void pollBackends(qint64 now) {
    anchorage::Backends& backends = m_service->backends();
    const QByteArray json = QByteArray::fromStdString(backends.HealthJson().dump());
    if (json == m_lastBackendsJson && now - m_lastBackendsMs < 1000) return;
    m_lastBackendsJson = json;
    m_lastBackendsMs = now;
    BackendsSnapshot b{now, json, {QString::fromStdString(m_service->model_id())}};
    for (const auto& entry : backends.ModelEntries()) b.models << QString::fromStdString(entry["id"].get<std::string>());
    emit m_host->backendsChanged(b);
  }

  void pollJournal(qint64 now) {
    anchorage::Journal* journal = m_service->journal();
    if (!journal || now - m_lastJournalMs < 500) return;
    m_lastJournalMs = now;
    anchorage::JournalQuery q;
    q.limit = 500;
    auto page = journal->Query(q);
    if (!page.ok()) return;
    const qint64 newest = page->rows.empty() ? 0 : num(page->rows[0], "id");
    if (newest == m_lastJournalId && page->total == m_lastJournalTotal && m_journalSent) return;
    m_journalSent = true;
    m_lastJournalId = newest;
    m_lastJournalTotal = page->total;
    JournalSnapshot snap;
    snap.total = page->total;
    for (const auto& r : page->rows) snap.rows.append(journalRowOf(r));
    emit m_host->journalChanged(snap);
  }

  void pollSettings() {
    anchorage::SettingsStore& store = m_service->settings();
    const QByteArray json = dumpJson(store.Document());
    if (json == m_lastSettingsJson) return;
    m_lastSettingsJson = json;
    SettingsSnapshot s;
    s.version = store.version();
    s.document = QJsonDocument::fromJson(json).object();
    s.schema = toQt(store.Schema());
    emit m_host->settingsChanged(s);
  }

  EngineHost* m_host;
  anchorage::Service* m_service;
  QTimer m_timer;
  QNetworkAccessManager m_nam;
  QHash<QString, Chat> m_chats;
  QByteArray m_lastCacheJson;
  QByteArray m_lastShadowJson;
  QByteArray m_lastBackendsJson;
  qint64 m_lastBackendsMs = 0;
  qint64 m_lastShadowMs = 0;
  qint64 m_lastCacheMs = 0;
  QByteArray m_lastSettingsJson;
  QString m_lastStatusKey;
  qint64 m_lastJournalMs = 0;
  qint64 m_lastJournalId = 0;
  qint64 m_lastJournalTotal = -1;
  bool m_journalSent = false;
};

EngineHost::EngineHost(const anchorage::ServerConfig& config, QObject* parent) : QThread(parent), m_config(config) {
  qRegisterMetaType<CacheSnapshot>();
  qRegisterMetaType<ShadowSnapshot>();
  qRegisterMetaType<BackendsSnapshot>();
  qRegisterMetaType<JournalSnapshot>();
  qRegisterMetaType<EngineStatusSnapshot>();
  qRegisterMetaType<SettingsSnapshot>();
  qRegisterMetaType<SettingsOutcome>();
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
  EngineWorker* worker = m_worker;
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
  post([tier](EngineWorker* w) { w->clearTier(tier); });
}

void EngineHost::replaceSettings(const QJsonObject& document) {
  post([document](EngineWorker* w) { w->replaceSettings(document); });
}

void EngineHost::sendChat(const QString& conversation, const QJsonArray& messages, int maxTokens, const QString& model) {
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
  post([=](EngineWorker* w) { w->sendChat(conversation, messages, maxTokens, model); });
}

void EngineHost::stopChat(const QString& conversation) {
  post([conversation](EngineWorker* w) { w->stopChat(conversation); });
}

void EngineHost::drain() {
  m_drainRequested = true;
  QMutexLocker lock(&m_mutex);
  if (!m_worker) return;  // run() sees the flag after the start
  EngineWorker* worker = m_worker;
  QMetaObject::invokeMethod(worker, [this, worker] {
    worker->stopAll();
    exit(0);
  }, Qt::QueuedConnection);
}

void EngineHost::run() {
  auto started = anchorage::Service::Start(m_config, [this](double fraction, const std::string& what) {
    emit progress(fraction, QString::fromStdString(what));
  });
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
    auto worker = std::make_unique<EngineWorker>(this, service.get(), m_pollMs);
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
