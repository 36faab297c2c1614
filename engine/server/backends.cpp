#include "engine/server/backends.h"

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <deque>

namespace anchorage {

namespace {

using Clock = std::chrono::steady_clock;

int64_t UnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

double MsBetween(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

void SetTimeouts(httplib::Client& client, const BackendOptions& o) {
  client.set_connection_timeout(o.connect_timeout_ms / 1000, (o.connect_timeout_ms % 1000) * 1000);
  client.set_read_timeout(o.timeout_ms / 1000, (o.timeout_ms % 1000) * 1000);
  client.set_write_timeout(o.timeout_ms / 1000, (o.timeout_ms % 1000) * 1000);
  client.set_keep_alive(false);
}

// What a failed exchange with an upstream came to, in words.
std::string ErrorText(httplib::Error error) {
  switch (error) {
    case httplib::Error::Connection: return "could not connect";
    case httplib::Error::ConnectionTimeout: return "the connection timed out";
    case httplib::Error::Read: return "reading its answer failed or timed out";
    case httplib::Error::Write: return "sending the request failed";
    case httplib::Error::Canceled: return "cancelled";
    default: return httplib::to_string(error);
  }
}

// An upstream's JSON, or discarded when it does not parse or nests deeper than a request may.
nlohmann::json ParseUpstream(const std::string& text) {
  if (JsonNestingDepth(text, kMaxJsonDepth) > kMaxJsonDepth) return nlohmann::json::value_t::discarded;
  return nlohmann::json::parse(text, nullptr, false);
}

// The upstream's own message from an error body (OpenAI's {"error": {"message"}}, or its text).
std::string UpstreamMessage(const std::string& body) {
  const auto j = ParseUpstream(body);
  if (j.is_object() && j.contains("error")) {
    const auto& e = j["error"];
    if (e.is_object() && e.contains("message") && e["message"].is_string()) return e["message"].get<std::string>();
    if (e.is_string()) return e.get<std::string>();
  }
  if (j.is_object() && j.contains("message") && j["message"].is_string()) return j["message"].get<std::string>();
  return body.substr(0, 300);
}

// Usage and finish reason from one answer object (a body or a stream's chunk).
void NoteAnswer(const nlohmann::json& j, ForwardOutcome* out) {
  if (!j.is_object()) return;
  if (j.contains("usage") && j["usage"].is_object()) {
    out->prompt_tokens = j["usage"].value("prompt_tokens", out->prompt_tokens);
    out->completion_tokens = j["usage"].value("completion_tokens", out->completion_tokens);
  }
  if (j.contains("choices") && j["choices"].is_array() && !j["choices"].empty() && j["choices"][0].is_object()) {
    const auto& f = j["choices"][0]["finish_reason"];
    if (f.is_string()) out->finish_reason = f.get<std::string>();
  }
}

// One upstream request on a thread of its own; the handler reads what arrives.
struct Call {
  std::unique_ptr<httplib::Client> client;
  std::thread thread;
  std::mutex mu;
  std::condition_variable cv;
  bool head = false, done = false, cancel = false;
  int status = 0;
  std::string content_type;
  std::deque<std::string> chunks;
  httplib::Error error = httplib::Error::Success;
  Clock::time_point started = Clock::now(), first_bytes;
  bool have_first = false;

  void Cancel() {
    {
      std::lock_guard lock(mu);
      cancel = true;
    }
    client->stop();
  }
  ~Call() {
    if (thread.joinable()) {
      Cancel();
      thread.join();
    }
  }
  std::string TakeAll() {
    std::string all;
    for (std::string& c : chunks) all += c;
    chunks.clear();
    return all;
  }
};

}  // namespace

std::shared_ptr<Backends::Entry> Backends::MakeEntry(BackendSpec spec) {
  auto e = std::make_shared<Entry>();
  std::string url = spec.url;
  while (!url.empty() && url.back() == '/') url.pop_back();
  if (url.size() >= 3 && url.compare(url.size() - 3, 3, "/v1") == 0) url.resize(url.size() - 3);
  const size_t path = url.find('/', 7);
  e->origin = path == std::string::npos ? url : url.substr(0, path);
  e->base_path = path == std::string::npos ? "" : url.substr(path);
  if (!spec.key_env.empty())
    if (const char* key = std::getenv(spec.key_env.c_str())) e->key = key;
  e->spec = std::move(spec);
  return e;
}

Backends::Backends(std::vector<BackendSpec> specs, BackendOptions options) : options_(options) {
  SetSpecs(std::move(specs));
  refresher_ = std::thread([this] { RefreshLoop(); });
}

void Backends::SetSpecs(std::vector<BackendSpec> specs) {
  {
    std::lock_guard lock(entries_mu_);
    std::vector<std::shared_ptr<Entry>> next;
    for (BackendSpec& spec : specs) {
      auto kept = std::find_if(entries_.begin(), entries_.end(), [&](const auto& e) { return e->spec == spec; });
      next.push_back(kept != entries_.end() ? *kept : MakeEntry(std::move(spec)));
    }
    entries_ = std::move(next);
  }
  {
    std::lock_guard lock(refresh_mu_);
    refresh_now_ = true;  // new ones are asked for their models now
  }
  refresh_cv_.notify_all();
}

bool Backends::empty() const {
  std::lock_guard lock(entries_mu_);
  return entries_.empty();
}

std::vector<std::shared_ptr<Backends::Entry>> Backends::Entries() const {
  std::lock_guard lock(entries_mu_);
  return entries_;
}

Backends::~Backends() {
  {
    std::lock_guard lock(refresh_mu_);
    stop_ = true;
  }
  refresh_cv_.notify_all();
  if (refresher_.joinable()) refresher_.join();
}

void Backends::RefreshLoop() {
  std::unique_lock lock(refresh_mu_);
  while (!stop_) {
    refresh_now_ = false;
    lock.unlock();
    for (const auto& e : Entries()) Refresh(*e);
    lock.lock();
    refresh_cv_.wait_for(lock, std::chrono::milliseconds(options_.refresh_ms), [&] { return stop_ || refresh_now_; });
    refresh_now_ = false;
  }
}

void Backends::Refresh(Entry& e) {
  httplib::Client client(e.origin);
  BackendOptions quick = options_;
  quick.timeout_ms = std::min<int64_t>(options_.timeout_ms, 10000);
  SetTimeouts(client, quick);
  httplib::Headers headers;
  if (!e.key.empty()) headers.emplace("Authorization", "Bearer " + e.key);
  auto r = client.Get((e.base_path + "/v1/models").c_str(), headers);
  if (!r) return NoteContact(e, false, "GET /v1/models: " + ErrorText(r.error()));
  if (r->status != 200) return NoteContact(e, false, "GET /v1/models answered " + std::to_string(r->status) + ": " + UpstreamMessage(r->body));
  const auto j = ParseUpstream(r->body);
  std::vector<std::string> models;
  if (j.is_object() && j.contains("data") && j["data"].is_array())
    for (const auto& m : j["data"])
      if (m.is_object() && m.contains("id") && m["id"].is_string()) models.push_back(m["id"].get<std::string>());
  {
    std::lock_guard lock(e.mu);
    e.models = std::move(models);
  }
  NoteContact(e, true, "");
}

void Backends::NoteContact(Entry& e, bool ok, const std::string& error) {
  std::lock_guard lock(e.mu);
  if (ok) {
    e.state = "up";
    e.down_since_ms = 0;
    return;
  }
  if (e.state != "down") e.down_since_ms = UnixMs();
  e.state = "down";
  e.last_error = error;
}

std::shared_ptr<Backends::Entry> Backends::Find(const std::string& name) const {
  for (const auto& e : Entries())
    if (e->spec.name == name) return e;
  return nullptr;
}

std::optional<BackendSpec> Backends::Route(const std::string& model) const {
  const auto entries = Entries();
  for (const auto& e : entries)
    if (e->spec.name == model) return e->spec;
  for (const auto& e : entries) {
    std::lock_guard lock(e->mu);
    if (std::find(e->models.begin(), e->models.end(), model) != e->models.end()) return e->spec;
  }
  return std::nullopt;
}

std::vector<std::string> Backends::NotUp() const {
  std::vector<std::string> out;
  for (const auto& e : Entries()) {
    std::lock_guard lock(e->mu);
    if (e->state == "up") continue;
    out.push_back("'" + e->spec.name + "' at " + e->spec.url + " (" + e->state + (e->last_error.empty() ? "" : ": " + e->last_error) + ")");
  }
  return out;
}

nlohmann::ordered_json Backends::ModelEntries() const {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& e : Entries()) {
    std::lock_guard lock(e->mu);
    std::vector<std::string> ids = e->models;
    if (std::find(ids.begin(), ids.end(), e->spec.name) == ids.end()) ids.insert(ids.begin(), e->spec.name);
    for (const std::string& id : ids) out.push_back({{"id", id}, {"object", "model"}, {"created", 0}, {"owned_by", "backend:" + e->spec.name}});
  }
  return out;
}

nlohmann::ordered_json Backends::HealthJson() const {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& e : Entries()) {
    std::lock_guard lock(e->mu);
    out.push_back({{"name", e->spec.name},
                   {"url", e->spec.url},
                   {"state", e->state},
                   {"down_since_ms", e->down_since_ms > 0 ? nlohmann::ordered_json(e->down_since_ms) : nlohmann::ordered_json(nullptr)},
                   {"last_error", e->last_error.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(e->last_error)},
                   {"models", e->models},
                   {"requests", e->requests},
                   {"errors", e->errors},
                   {"mean_ttft_ms", e->mean_ttft_ms()}});
  }
  return out;
}

std::string Backends::MetricsText() const {
  std::string up = "# HELP anchorage_backend_up Whether the backend answered its last contact.\n# TYPE anchorage_backend_up gauge\n";
  std::string requests = "# HELP anchorage_backend_requests_total Requests forwarded to the backend.\n# TYPE anchorage_backend_requests_total counter\n";
  std::string errors = "# HELP anchorage_backend_errors_total Forwarded requests answered with an error.\n# TYPE anchorage_backend_errors_total counter\n";
  std::string ttft = "# HELP anchorage_backend_ttft_ms_mean Mean time to the upstream's first bytes.\n# TYPE anchorage_backend_ttft_ms_mean gauge\n";
  for (const auto& e : Entries()) {
    std::lock_guard lock(e->mu);
    const std::string label = "{backend=\"" + e->spec.name + "\"} ";
    up += "anchorage_backend_up" + label + (e->state == "up" ? "1" : "0") + "\n";
    requests += "anchorage_backend_requests_total" + label + std::to_string(e->requests) + "\n";
    errors += "anchorage_backend_errors_total" + label + std::to_string(e->errors) + "\n";
    ttft += "anchorage_backend_ttft_ms_mean" + label + std::to_string(e->mean_ttft_ms()) + "\n";
  }
  return up + requests + errors + ttft;
}

void Backends::Forward(const BackendSpec& spec, const std::string& path, const std::string& body, bool stream, const std::string& session,
                       const std::function<bool()>& client_gone, HttpResponse& res,
                       const std::function<void(HttpResponse&, const ApiError&)>& send_error,
                       std::function<void(const ForwardOutcome&)> on_done) {
  const std::shared_ptr<Entry> entry = Find(spec.name);
  auto outcome = std::make_shared<ForwardOutcome>();
  outcome->backend = spec.name;
  if (entry == nullptr) {  // removed from the settings since the request was routed
    outcome->status = 404;
    outcome->error = "backend " + spec.name + " is no longer configured";
    send_error(res, {404, outcome->error, "invalid_request_error", "model", "model_not_found"});
    if (on_done) on_done(*outcome);
    return;
  }
  auto finish = [entry, outcome, on_done](Clock::time_point started) {
    outcome->total_ms = MsBetween(started, Clock::now());
    {
      std::lock_guard lock(entry->mu);
      ++entry->requests;
      if (outcome->status != 200) ++entry->errors;
      if (outcome->ttft_ms > 0) {
        entry->ttft_ms_sum += outcome->ttft_ms;
        ++entry->ttft_count;
      }
    }
    if (on_done) on_done(*outcome);
  };
  auto fail = [&](const ApiError& e, Clock::time_point started) {
    outcome->status = e.status;
    outcome->error = e.message;
    send_error(res, e);
    finish(started);
  };

  // The client's name for the model, when the upstream lists others only: its first.
  std::string forwarded = body;
  {
    std::lock_guard lock(entry->mu);
    if (!entry->models.empty() && std::find(entry->models.begin(), entry->models.end(), spec.name) == entry->models.end()) {
      auto j = nlohmann::ordered_json::parse(body, nullptr, false);
      if (j.is_object() && j.value("model", std::string()) == spec.name) {
        j["model"] = entry->models.front();
        forwarded = j.dump();
      }
    }
  }

  auto call = std::make_shared<Call>();
  call->client = std::make_unique<httplib::Client>(entry->origin);
  SetTimeouts(*call->client, options_);
  httplib::Request req;
  req.method = "POST";
  req.path = entry->base_path + path;
  req.body = std::move(forwarded);
  req.headers.emplace("Content-Type", "application/json");
  req.headers.emplace("Accept", stream ? "text/event-stream" : "application/json");
  if (!entry->key.empty()) req.headers.emplace("Authorization", "Bearer " + entry->key);
  if (!session.empty()) req.headers.emplace("x-session-id", session);
  Call* c = call.get();
  req.response_handler = [c](const httplib::Response& r) {
    std::lock_guard lock(c->mu);
    c->status = r.status;
    c->content_type = r.get_header_value("Content-Type");
    c->head = true;
    c->cv.notify_all();
    return !c->cancel;
  };
  req.content_receiver = [c](const char* data, size_t n, uint64_t, uint64_t) {
    std::lock_guard lock(c->mu);
    if (!c->have_first) {
      c->first_bytes = Clock::now();
      c->have_first = true;
    }
    c->chunks.emplace_back(data, n);
    c->cv.notify_all();
    return !c->cancel;
  };
  call->thread = std::thread([c, req = std::move(req)] {
    auto result = c->client->send(req);
    std::lock_guard lock(c->mu);
    c->error = result.error();
    c->done = true;
    c->cv.notify_all();
  });
  const Clock::time_point started = call->started;
  const std::string who = "backend " + spec.name;

  // Waits until ready() or the end, polling the client; false when the client hung up.
  auto wait = [&](std::unique_lock<std::mutex>& lock, const std::function<bool()>& ready) {
    while (!ready() && !call->done) {
      call->cv.wait_for(lock, std::chrono::milliseconds(50));
      if (!ready() && !call->done && client_gone && client_gone()) return false;
    }
    return true;
  };
  auto hung_up = [&] {
    call->Cancel();
    outcome->status = 499;
    outcome->finish_reason = "cancelled";
    outcome->error = "the client hung up";
    finish(started);
  };

  std::unique_lock lock(call->mu);
  if (!wait(lock, [&] { return call->head; })) {
    lock.unlock();
    return hung_up();
  }
  if (!call->head) {  // no answer at all
    const httplib::Error error = call->error;
    lock.unlock();
    const int64_t limit_ms = error == httplib::Error::ConnectionTimeout ? options_.connect_timeout_ms : options_.timeout_ms;
    const bool timed_out = (error == httplib::Error::Read || error == httplib::Error::ConnectionTimeout) &&
                           MsBetween(started, Clock::now()) + 100 >= static_cast<double>(limit_ms);
    const std::string what = timed_out ? who + " did not answer within " + std::to_string(limit_ms) + " ms"
                                       : who + " is unreachable: " + ErrorText(error);
    NoteContact(*entry, false, what);
    return fail({timed_out ? 504 : 502, what, "server_error", "", timed_out ? "backend_timeout" : "backend_unreachable"}, started);
  }
  const int status = call->status;
  const std::string content_type = call->content_type;
  if (status != 200 || !stream) {
    if (!wait(lock, [] { return false; })) {
      lock.unlock();
      return hung_up();
    }
    const httplib::Error error = call->error;
    const std::string all = call->TakeAll();
    if (call->have_first) outcome->ttft_ms = MsBetween(started, call->first_bytes);
    lock.unlock();
    NoteContact(*entry, true, "");
    if (status != 200) {
      const std::string message = who + " answered " + std::to_string(status) + ": " + UpstreamMessage(all);
      // A client error is the client's: its status stays; the upstream's own failures are a bad gateway.
      if (status >= 400 && status < 500) return fail({status, message, "invalid_request_error", "", "backend_rejected"}, started);
      return fail({502, message, "server_error", "", "backend_error"}, started);
    }
    if (error != httplib::Error::Success) {
      const bool timed_out = error == httplib::Error::Read;
      return fail({timed_out ? 504 : 502, who + " broke off its answer: " + ErrorText(error), "server_error", "", timed_out ? "backend_timeout" : "backend_error"}, started);
    }
    NoteAnswer(ParseUpstream(all), outcome.get());
    outcome->status = 200;
    res.status = 200;
    res.SetContent(all, content_type.empty() ? "application/json" : content_type);
    return finish(started);
  }
  lock.unlock();
  NoteContact(*entry, true, "");
  outcome->status = 200;
  res.status = 200;
  res.content_type = content_type.empty() ? "text/event-stream" : content_type;
  res.SetHeader("Cache-Control", "no-cache");
  res.stream = [call, outcome, finish, started, who](HttpStream& sink) {
    std::string line;  // the stream's text since its last newline, for usage and the finish reason
    auto note_lines = [&](const std::string& piece) {
      line += piece;
      size_t at;
      while ((at = line.find('\n')) != std::string::npos) {
        const std::string one = line.substr(0, at);
        line.erase(0, at + 1);
        if (one.rfind("data:", 0) == 0 && one.find("[DONE]") == std::string::npos)
          NoteAnswer(ParseUpstream(one.substr(5)), outcome.get());
      }
    };
    std::unique_lock lock(call->mu);
    while (true) {
      if (!call->chunks.empty()) {
        if (outcome->ttft_ms == 0 && call->have_first) outcome->ttft_ms = MsBetween(started, call->first_bytes);
        const std::string piece = call->TakeAll();
        lock.unlock();
        note_lines(piece);
        if (!sink.Write(piece)) {
          call->Cancel();
          outcome->finish_reason = "cancelled";
          break;
        }
        lock.lock();
        continue;
      }
      if (call->done) {
        const httplib::Error error = call->error;
        lock.unlock();
        if (error != httplib::Error::Success && error != httplib::Error::Canceled) {
          outcome->error = who + " broke off its stream: " + ErrorText(error);
          const ApiError e{502, outcome->error, "server_error", "", "backend_error"};
          sink.Write("data: " + e.ToJson().dump() + "\n\n");
        }
        break;
      }
      call->cv.wait_for(lock, std::chrono::milliseconds(50));
      if (call->chunks.empty() && !call->done && sink.ClientGone()) {
        lock.unlock();
        call->Cancel();
        outcome->finish_reason = "cancelled";
        break;
      }
    }
    finish(started);
  };
}

}  // namespace anchorage
