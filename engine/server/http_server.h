// The OpenAI-compatible HTTP endpoint over the scheduler: routes by family on our own transport.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/core/status.h"
#include "engine/model/model.h"
#include "engine/server/access_policy.h"
#include "engine/server/backends.h"
#include "engine/server/http_transport.h"
#include "engine/server/image_input.h"
#include "engine/server/metrics.h"
#include "engine/server/openai_api.h"
#include "engine/server/scheduler.h"
#include "engine/settings/settings.h"

namespace anchorage {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string model_id;          // what /v1/models lists and responses name
  std::vector<std::string> model_aliases;  // more names /v1/models lists
  bool strict_model_names = false;         // refuse names other than the id and the aliases (404)
  AccessOptions access;          // Host and Origin checks, API keys, the admin token
  int64_t context_tokens = 0;    // prompt plus output limit; 0 means the model's maximum
  HttpTransportOptions transport;  // limits, timeouts, pools and connection caps
  Backends* backends = nullptr;    // upstreams whose models are forwarded (not owned); nullptr: none
  std::vector<std::string> notes;  // what the start said besides its progress (warnings, overrides), for /health
  std::string precision = "exact";  // the precision products run in (Service::precision)
  ImageEncoder* images = nullptr;   // the vision tower behind its cache (not owned); nullptr: image parts are refused
  std::string images_off;           // why there is none, for the refusal
  int64_t max_images = 8;           // images a prompt keeps
  ImageInputOptions image_input;
};

class HttpServer {
 public:
  // journal and settings are optional (null: their routes answer 404).
  HttpServer(Model& model, Scheduler& scheduler, ServerOptions options, Journal* journal = nullptr, SettingsStore* settings = nullptr);
  ~HttpServer();

  // Binds the socket; the port is known after this (options.port 0 picks a free one).
  Status Bind();
  int port() const { return transport_.port(); }
  // Serves until Stop(); call after Bind() on the thread that will serve.
  void Serve();
  void Stop();

  Metrics& metrics() { return metrics_; }

 private:
  void Route(const std::string& method, const std::string& path, RouteClass route_class, RouteAccess access, HttpHandler handler);
  // Host, Origin, credentials and content type, before any route parses the body.
  bool Admit(const HttpRequest& req, HttpResponse& res) const;
  void RouteOperations();
  void RouteCache();
  void RouteShadow();
  void RouteDecide();
  void RouteJournalAndSettings();
  void RouteCompletions();

  void Completion(RequestKind kind, const HttpRequest& req, HttpResponse& res);
  // The backend serving the model a JSON body names, when one does; *parsed holds the body then.
  std::optional<BackendSpec> BackendOf(const std::string& body, nlohmann::ordered_json* parsed) const;
  // Where backends are configured, a model named in parsed that neither the embedded model nor a
  // backend that is up serves, while a backend is not up (it may serve it): 503 naming those backends.
  std::optional<ApiError> UnroutedModel(const nlohmann::ordered_json& parsed) const;
  // Forwards a completion (body as parsed) to a backend and journals it.
  void Forwarded(const BackendSpec& backend, const nlohmann::ordered_json& body, const HttpRequest& req, HttpResponse& res);
  // Parses a chat body for peek and prewarm: its prompt ids and session (body "session", else x-session-id).
  ParseOptions ParseOptionsOf() const;
  // {"ok", "errors", "failed_rows", "dropped_rows", "last_error"} of the journal's background writes; null without one.
  nlohmann::ordered_json JournalHealthJson() const;
  bool CacheRequestOf(const HttpRequest& req, CacheRequest* out, ApiError* error) const;
  // Renders and tokenizes a parsed request; false with *error set when it cannot.
  // images (optional): the request's images, encoded, their placeholders in ids expanded to their key ids.
  bool PromptIds(const CompletionRequest& r, std::vector<int32_t>* ids, bool* starts_in_reasoning, ApiError* error,
                 ImageCatalog* images = nullptr) const;

  Model& model_;
  Scheduler& scheduler_;
  ServerOptions options_;
  Journal* journal_;
  SettingsStore* settings_;
  Metrics metrics_;
  AccessPolicy policy_;
  std::map<std::string, RouteAccess> access_;  // "METHOD /path" -> what it needs
  HttpTransport transport_;
};

}  // namespace anchorage
