// The running service: model, engine scheduler, journal, settings and the HTTP endpoint, started
// from a ServerConfig. anchorage-server and the console's EngineHost both run one.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "engine/core/status.h"
#include "engine/journal/journal.h"
#include "engine/model/model.h"
#include "engine/server/http_server.h"
#include "engine/server/scheduler.h"
#include "engine/server/service_config.h"
#include "engine/settings/settings.h"

namespace anchorage {

// The resident prefix's options from the effective settings document.
ResidentOptions ResidentOptionsFromSettings(const nlohmann::json& effective);
// The backends: --backend's, then the settings' backends.upstreams (a name the flags use is theirs).
std::vector<BackendSpec> BackendSpecsOf(const ServerConfig& config, const nlohmann::json& effective);
// The shadow reader's, from its "shadow" area.
ShadowOptions ShadowOptionsFromSettings(const nlohmann::json& effective);

class Service {
 public:
  // Loads (or generates) the model, opens the journal and settings, starts the engine thread and
  // binds the socket. progress(fraction 0..1, what) reports the steps; errors name what failed. A
  // cancel flag set while it runs stops it at the next step or layer with kCancelled.
  static Result<std::unique_ptr<Service>> Start(const ServerConfig& config,
                                                const std::function<void(double, const std::string&)>& progress = nullptr,
                                                const std::atomic<bool>* cancel = nullptr);
  ~Service();

  // Serves HTTP on a thread of its own until Drain().
  void ServeInBackground();
  // Whether the endpoint listens, and where (host:port; empty while it does not).
  bool serving() const { return serving_.joinable(); }
  std::string address() const;
  // Moves the endpoint to host:port (port 0: a free one): the old listener stops (its responses in
  // flight finish first), the new one binds and serves with the same routes and credentials; its
  // request counters start anew. Where host:port cannot be bound the old address serves again and
  // the bind's error returns. The console's Server menu calls these; anchorage-server does not.
  Status ServeAt(const std::string& host, int port);
  // Stops listening (responses in flight finish first); the engine and its caches go on.
  void StopServing();
  // No new requests; waits for the ones in flight and queued, then stops the endpoint.
  void Drain();

  Model& model() { return *model_; }
  Scheduler& scheduler() { return *scheduler_; }
  HttpServer& http() { return *http_; }
  Journal* journal() { return journal_.get(); }
  Backends& backends() { return *backends_; }  // empty without --backend or backends.upstreams
  SettingsStore& settings() { return *settings_; }
  const std::string& model_id() const { return model_id_; }
  std::string url() const;
  // What the console sends as its Bearer credential on its own endpoint (empty: none needed).
  std::string client_token() const;
  const std::vector<std::string>& notes() const { return notes_; }
  // What runs the model: "cpu, kernel path ..., N threads" or "cuda, <the GPU>".
  const std::string& device() const { return device_; }
  // The precision products run in: "fast" only where it was asked and the kernel path has bf16 units.
  const std::string& precision() const { return precision_; }

 private:
  Service() = default;

  ServerConfig config_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<SettingsStore> settings_;
  std::unique_ptr<Journal> journal_;
  std::unique_ptr<WriteGuard> write_guard_;  // before the tier and the spill that count into it
  std::unique_ptr<DiskCache> disk_;  // before the scheduler: it outlives the engine that writes to it
  std::unique_ptr<SessionSpill> spill_;  // the same
  std::unique_ptr<ShadowReader> shadow_;  // the same
  std::unique_ptr<SuffixStore> suffix_store_;  // the same
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<Backends> backends_;  // before the endpoint that forwards to them
  std::unique_ptr<ImageEncoder> images_;  // the same
  std::unique_ptr<HttpServer> http_;
  ServerOptions http_options_;  // what ServeAt makes a new endpoint of
  std::thread serving_;
  std::string model_id_;
  std::vector<std::string> notes_;
  std::string device_;
  std::string precision_ = "exact";
  bool drained_ = false;
  bool endpoint_off_ = false;  // StopServing closed the endpoint
};

}  // namespace anchorage
