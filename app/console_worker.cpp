#include "app/console_worker.h"

#include <QDateTime>
#include <QJsonDocument>
#include <QNetworkProxy>
#include <QNetworkReply>

#include <algorithm>
#include <utility>

#include "app/engine_host.h"

namespace {

QByteArray dumpJson(const nlohmann::json& j) {
  return QByteArray::fromStdString(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

double real(const nlohmann::json& j, const char* key) {
  if (!j.is_object()) return 0;
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : 0.0;
}

// A string field of an object, or "" when it is missing or not a string.
std::string str(const nlohmann::json& j, const char* key) {
  if (!j.is_object()) return {};
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

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
  row.id = JsonInt(r, "id");
  row.timeMs = JsonInt(r, "time_ms");
  row.type = QString::fromStdString(str(r, "type"));
  row.session = QString::fromStdString(str(r, "session"));
  if (row.type == "request") {
    row.kind = "request";
    row.tier = QString::fromStdString(str(r, "cache_source"));
    row.tokens = JsonInt(r, "prompt_tokens");
    row.status = static_cast<int>(JsonInt(r, "status"));
    row.route = QString::fromStdString(str(r, "route"));
    row.finishReason = QString::fromStdString(str(r, "finish_reason"));
    row.outputTokens = JsonInt(r, "output_tokens");
    row.slot = static_cast<int>(JsonInt(r, "slot"));
    row.queueMs = real(r, "queue_ms");
    row.queuePosition = JsonInt(r, "queue_position");
    row.ttftMs = real(r, "ttft_ms");
    row.decodeTokensPerS = real(r, "decode_tokens_per_s");
    row.text = QString::fromStdString(str(r, "error"));
  } else if (row.type == "shadow") {
    row.kind = "shadow";
    row.tokens = JsonInt(r, "insertion_tokens");
    const auto answer = [&](const char* choice) { return r.contains(choice) && r[choice].is_string() ? r[choice].get<std::string>() : std::string("-"); };
    row.text = QString::fromStdString("shadow " + answer("shadow_choice") + ", main " + answer("main_choice") + (str(r, "note").empty() ? "" : "; " + str(r, "note")));
  } else {
    row.kind = QString::fromStdString(str(r, "kind"));
    row.tier = QString::fromStdString(str(r, "tier"));
    row.tokens = JsonInt(r, "tokens");
    row.text = QString::fromStdString(str(r, "reason"));
  }
  row.json = dumpJson(r);
  return row;
}

}  // namespace

int64_t JsonInt(const nlohmann::json& j, const char* key) {
  if (!j.is_object()) return 0;
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<int64_t>() : 0;
}

QString JsonText(const nlohmann::json& j, const char* key) { return QString::fromStdString(str(j, key)); }

const nlohmann::json& JsonField(const nlohmann::json& j, const char* key) {
  static const nlohmann::json kNull;
  if (!j.is_object()) return kNull;
  auto it = j.find(key);
  return it != j.end() ? *it : kNull;
}

QString SettingsRefusalText(const nlohmann::json& body) {
  const nlohmann::json& e = JsonField(body, "error");
  if (JsonText(e, "message").isEmpty()) return {};
  QStringList lines{JsonText(e, "message")};
  if (const nlohmann::json& fields = JsonField(e, "fields"); fields.is_array())
    for (const nlohmann::json& f : fields) lines << JsonText(f, "field") + ": " + JsonText(f, "message");
  return lines.join('\n');
}

bool ConsoleWorker::Published::update(const QByteArray& next, qint64 now, bool due) {
  if (next == json && !(due && now - ms >= 1000)) return false;
  json = next;
  ms = now;
  return true;
}

anchorage::RequestFigures FiguresOf(const nlohmann::json& usage, const nlohmann::json& a) {
  anchorage::RequestFigures f;
  f.prompt_tokens = JsonInt(usage, "prompt_tokens");
  f.completion_tokens = JsonInt(usage, "completion_tokens");
  if (const std::string source = str(a, "cache_source"); !source.empty()) f.cache_source = source;
  f.cached_tokens = JsonInt(a, "cached_tokens");
  f.reread_tokens = JsonInt(a, "reread_tokens");
  f.served_prompt_tokens = JsonInt(a, "served_prompt_tokens");
  f.prefill_ms = real(a, "prefill_ms");
  f.ttft_ms = real(a, "ttft_ms");
  f.decode_tokens_per_s = real(a, "decode_tokens_per_s");
  f.queue_ms = real(a, "queue_ms");
  f.drafted_tokens = JsonInt(a, "drafted_tokens");
  f.accepted_tokens = JsonInt(a, "accepted_tokens");
  return f;
}

ConsoleWorker::ConsoleWorker(EngineHost* host, int pollMs) : m_host(host) {
  m_nam.setProxy(QNetworkProxy::NoProxy);
  m_timer.setInterval(pollMs);
  QObject::connect(&m_timer, &QTimer::timeout, this, [this] { poll(); });
}

ConsoleWorker::~ConsoleWorker() {
  const QHash<QString, Chat> chats = std::exchange(m_chats, {});
  for (const Chat& c : chats)
    if (c.reply) c.reply->abort();
}

qint64 ConsoleWorker::nowMs() { return QDateTime::currentMSecsSinceEpoch(); }

void ConsoleWorker::startPolling() {
  m_timer.start();
  poll();
}

void ConsoleWorker::setEndpoint(bool, const QString&, int) {
  emit m_host->endpointChanged(true, endpointUrl(), tr("the server at %1 keeps its own address: change it where it runs").arg(endpointUrl()));
}

void ConsoleWorker::sendChat(const QString& conversation, const QJsonArray& messages, const QJsonObject& sampling, const QString& model) {
  if (m_chats.contains(conversation)) stopChat(conversation);
  if (endpointUrl().isEmpty()) {
    ChatTurnStats stats;
    stats.conversation = conversation;
    stats.ok = false;
    stats.error = tr("the endpoint is off, and the Chat tab talks through it: Server > Endpoint… turns it on");
    emit m_host->chatFinished(stats);
    return;
  }
  QJsonObject body = sampling;
  body["messages"] = messages;
  body["stream"] = true;
  body["stream_options"] = QJsonObject{{"include_usage", true}};
  body["conversation_id"] = conversation;
  if (!model.isEmpty()) body["model"] = model;
  QNetworkRequest request(QUrl(endpointUrl() + "/chat/completions"));
  request.setHeader(QNetworkRequest::ContentTypeHeader, "application/json");
  request.setRawHeader("Accept", "text/event-stream");
  if (const QByteArray token = bearer(); !token.isEmpty()) request.setRawHeader("Authorization", "Bearer " + token);
  request.setAttribute(QNetworkRequest::Http2AllowedAttribute, false);
  Chat& chat = m_chats[conversation];
  chat = Chat{};
  chat.stats.conversation = conversation;
  chat.journalIdAtStart = m_lastJournalId;
  QNetworkReply* reply = m_nam.post(request, QJsonDocument(body).toJson(QJsonDocument::Compact));
  chat.reply = reply;
  QObject::connect(reply, &QNetworkReply::readyRead, this, [this, conversation, reply] { readChat(conversation, reply); });
  QObject::connect(reply, &QNetworkReply::finished, this, [this, conversation, reply] { finishChat(conversation, reply); });
  publishStatus(m_engineStatus, nowMs());
}

void ConsoleWorker::stopChat(const QString& conversation) {
  auto it = m_chats.find(conversation);
  if (it == m_chats.end() || !it->reply) return;
  it->stats.stopped = true;
  it->reply->abort();  // finished() follows synchronously
}

void ConsoleWorker::stopAll() {
  const QStringList ids = m_chats.keys();
  for (const QString& id : ids) stopChat(id);
  m_timer.stop();
}

void ConsoleWorker::readChat(const QString& conversation, QNetworkReply* reply) {
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
      const nlohmann::json doc = nlohmann::json::parse(payload.toStdString(), nullptr, false);
      const nlohmann::json& usage = JsonField(doc, "usage");
      chat.stats.figures = FiguresOf(usage, JsonField(usage, "anchorage"));
    }
  }
}

void ConsoleWorker::finishChat(const QString& conversation, QNetworkReply* reply) {
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
  publishStatus(m_engineStatus, nowMs());
}

void ConsoleWorker::publishStatus(EngineStatusSnapshot s, qint64 now) {
  m_engineStatus = s;
  if (!m_chats.isEmpty()) {
    const Chat& chat = *m_chats.begin();
    if (chat.firstMs < 0) {
      s.phase = "prefill";
      s.resumeHint = m_newestHit.id > chat.journalIdAtStart ? QString("%1 at %2 tokens").arg(m_newestHit.tier).arg(m_newestHit.tokens)
                                                            : QString("no hit yet (cold)");
    } else {
      s.phase = "decode";
      const double secs = std::max<qint64>(1, now - chat.firstMs) / 1000.0;
      s.liveTokensPerS = chat.deltas / secs;
    }
  } else if (s.busy) {
    s.phase = "busy";
  }
  const QString key = QString("%1/%2/%3|%4|%5|%6|%7|%8|%9|%10|%11").arg(s.queueDepth).arg(s.busySlots).arg(s.slotCount).arg(s.busy).arg(s.phase).arg(s.liveTokensPerS, 0, 'f', 0)
                          .arg(s.resumeHint).arg(s.last.completion_tokens).arg(s.last.ttft_ms).arg(s.journalErrors).arg(s.modelId);
  if (key == m_lastStatusKey) return;
  m_lastStatusKey = key;
  emit m_host->statusChanged(s);
}

void ConsoleWorker::publishCache(const nlohmann::json& stats, qint64 now) {
  const QByteArray json = dumpJson(stats);
  if (!m_cache.update(json, now, true)) return;
  CacheSnapshot c;
  c.timeMs = now;
  c.json = json;
  const nlohmann::json& r = JsonField(stats, "resident");
  c.tiers.append(tierOf("resident", JsonInt(r, "rows"), JsonInt(r, "row_bytes"), 0, JsonInt(r, "requests") - JsonInt(r, "cold"), 0));
  auto budgeted = [&](const char* name, const char* hits, bool evictions) {
    const nlohmann::json& t = JsonField(stats, name);
    c.tiers.append(tierOf(name, JsonInt(t, "entries"), JsonInt(t, "bytes"), JsonInt(t, "budget_bytes"), JsonInt(t, hits), evictions ? JsonInt(t, "evictions") : 0));
  };
  budgeted("anchors", "hits", true);
  budgeted("end", "hits", false);
  budgeted("stash", "guests", false);
  budgeted("pin", "hits", false);
  budgeted("park", "hits", false);
  budgeted("store", "hits", true);
  const nlohmann::json& response = JsonField(stats, "response");
  c.tiers.append(tierOf("response", JsonInt(response, "entries"), JsonInt(response, "bytes"),
                        JsonField(response, "enabled") == true ? JsonInt(response, "max_bytes") : 0, JsonInt(response, "hits"), JsonInt(response, "evictions")));
  const nlohmann::json& prepared = JsonField(stats, "prepared");
  c.tiers.append(tierOf("prepared", JsonInt(prepared, "entries"), JsonInt(prepared, "bytes"), 0, JsonInt(prepared, "served"), 0));
  const nlohmann::json& memory = JsonField(stats, "memory");
  c.engineBytes = JsonInt(memory, "engine_bytes");
  c.ceilingBytes = JsonInt(memory, "ceiling_bytes");
  c.peakBytes = JsonInt(memory, "peak_bytes");
  if (const nlohmann::json& sheds = JsonField(memory, "sheds"); sheds.is_object())
    for (const auto& [tier, count] : sheds.items())
      if (count.is_number()) c.sheds += count.get<int64_t>();
  c.refused = JsonInt(memory, "refused");
  if (const nlohmann::json& rows = JsonField(stats, "slots"); rows.is_array())
    for (const nlohmann::json& slot : rows) {
      SlotRowSnapshot row;
      row.slot = static_cast<int>(JsonInt(slot, "slot"));
      row.session = JsonText(slot, "session");
      row.tokens = JsonInt(slot, "tokens");
      row.bytes = JsonInt(slot, "bytes");
      row.state = JsonText(slot, "state");
      row.requests = JsonInt(slot, "requests");
      c.slotRows.append(row);
    }
  c.deviceBytes = JsonInt(memory, "device_bytes");
  emit m_host->cacheChanged(c);
}

void ConsoleWorker::publishShadow(const nlohmann::json& status, qint64 now) {
  const QByteArray json = dumpJson(status);
  if (m_shadow.update(json, now, true)) emit m_host->shadowChanged(ShadowSnapshot{now, json});
}

void ConsoleWorker::publishBackends(const nlohmann::json& health, const QStringList& models, qint64 now) {
  const QByteArray json = QByteArray::fromStdString(health.dump());
  if (m_backends.update(json, now, true)) emit m_host->backendsChanged(BackendsSnapshot{now, json, models});
}

void ConsoleWorker::publishJournal(const nlohmann::json& rows, qint64 total) {
  if (!rows.is_array()) return;
  const qint64 newest = rows.empty() ? 0 : JsonInt(rows[0], "id");
  for (const nlohmann::json& r : rows) {
    if (str(r, "kind") != "hit") continue;
    if (JsonInt(r, "id") > m_newestHit.id) m_newestHit = Hit{JsonInt(r, "id"), QString::fromStdString(str(r, "tier")), JsonInt(r, "tokens")};
    break;  // newest first
  }
  if (newest == m_lastJournalId && total == m_lastJournalTotal) return;
  m_lastJournalId = newest;
  m_lastJournalTotal = total;
  JournalSnapshot snap;
  snap.total = total;
  for (const nlohmann::json& r : rows) snap.rows.append(journalRowOf(r));
  emit m_host->journalChanged(snap);
}

void ConsoleWorker::publishSettings(const nlohmann::json& document, const nlohmann::json& schema) {
  const QByteArray json = dumpJson(document);
  if (!m_settings.update(json, nowMs(), false)) return;
  SettingsSnapshot s;
  s.version = JsonInt(document, "version");
  s.document = QJsonDocument::fromJson(json).object();
  s.schema = QJsonDocument::fromJson(dumpJson(schema)).object();
  emit m_host->settingsChanged(s);
}
