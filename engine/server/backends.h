// Backends: OpenAI-compatible upstreams (vLLM, SGLang, llama-server, another anchorage-server) whose
// models this endpoint serves beside its own. Completions for a backend's model are forwarded
// (streams chunk by chunk as they arrive); their models are listed from each upstream's /v1/models,
// refreshed in the background; each one's health, counters and last error are kept for /health,
// /metrics and the console. An upstream's API key is read from an environment variable at start
// and never written anywhere.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/core/status.h"
#include "engine/server/http_transport.h"
#include "engine/server/openai_api.h"
#include "engine/settings/backend_spec.h"

namespace anchorage {

struct BackendOptions {
  int64_t connect_timeout_ms = 5000;
  int64_t timeout_ms = 600000;      // the longest wait for the upstream's next bytes
  int64_t refresh_ms = 30000;       // how often each /v1/models is asked
};

// What a forwarded request came to, for the journal and the metrics.
struct ForwardOutcome {
  std::string backend;
  int status = 0;                   // what the client was answered
  std::string error;
  double ttft_ms = 0;               // until the upstream's first body bytes
  double total_ms = 0;
  int64_t prompt_tokens = 0, completion_tokens = 0;  // from the upstream's usage, when it sent one
  std::string finish_reason;        // the first choice's, or "cancelled" when the client hung up
};

class Backends {
 public:
  Backends(std::vector<BackendSpec> specs, BackendOptions options);
  // The backends from now on (the settings changed): a spec kept as it was keeps its health and
  // counters; requests in flight to a removed one finish.
  void SetSpecs(std::vector<BackendSpec> specs);
  ~Backends();
  Backends(const Backends&) = delete;
  Backends& operator=(const Backends&) = delete;

  bool empty() const;
  // The backend that serves model: its name, or a model its /v1/models listed.
  std::optional<BackendSpec> Route(const std::string& model) const;
  // The backends not known to be up (down, or not reached yet): their model lists may be missing
  // names they serve. Each as "NAME at URL (state: last error)".
  std::vector<std::string> NotUp() const;
  // Every backend's models as /v1/models entries (the name when none was listed yet).
  nlohmann::ordered_json ModelEntries() const;
  // [{name, url, state: up|down|unknown, down_since_ms, last_error, models, requests, errors}]
  nlohmann::ordered_json HealthJson() const;
  // anchorage_backend_* lines for /metrics.
  std::string MetricsText() const;

  // Forwards body to spec's path (/v1/chat/completions, /v1/completions) and writes the answer into
  // res: the upstream's body, or its stream as it arrives (then res.stream is set and runs later on
  // this thread). Upstream failures become send_error's OpenAI-shaped errors: 502 with the upstream's
  // message, 504 on a timeout. client_gone is polled while waiting; a hang-up cancels the upstream
  // request. session (x-session-id, when the client sent one) goes along. on_done runs once when the
  // request is over.
  void Forward(const BackendSpec& spec, const std::string& path, const std::string& body, bool stream, const std::string& session,
               const std::function<bool()>& client_gone, HttpResponse& res,
               const std::function<void(HttpResponse&, const ApiError&)>& send_error,
               std::function<void(const ForwardOutcome&)> on_done);

 private:
  struct Entry {
    BackendSpec spec;
    std::string origin, base_path;  // "http://host:port" and the path before /v1
    std::string key;                // read from key_env at start
    mutable std::mutex mu;
    std::vector<std::string> models;
    std::string state = "unknown";
    int64_t down_since_ms = 0;
    std::string last_error;
    int64_t requests = 0, errors = 0;
    double ttft_ms_sum = 0;
    int64_t ttft_count = 0;
    double mean_ttft_ms() const { return ttft_count > 0 ? ttft_ms_sum / static_cast<double>(ttft_count) : 0.0; }
  };
  void RefreshLoop();
  void Refresh(Entry& e);
  static void NoteContact(Entry& e, bool ok, const std::string& error);
  static std::shared_ptr<Entry> MakeEntry(BackendSpec spec);
  std::shared_ptr<Entry> Find(const std::string& name) const;
  std::vector<std::shared_ptr<Entry>> Entries() const;

  mutable std::mutex entries_mu_;
  std::vector<std::shared_ptr<Entry>> entries_;  // guarded by entries_mu_
  BackendOptions options_;
  std::mutex refresh_mu_;
  std::condition_variable refresh_cv_;
  bool stop_ = false;         // guarded by refresh_mu_
  bool refresh_now_ = false;  // the same: the specs changed
  std::thread refresher_;
};

}  // namespace anchorage
