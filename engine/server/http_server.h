// The OpenAI-compatible HTTP endpoint over the scheduler (cpp-httplib; one thread per connection).
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/core/status.h"
#include "engine/model/model.h"
#include "engine/server/metrics.h"
#include "engine/server/openai_api.h"
#include "engine/server/scheduler.h"
#include "engine/settings/settings.h"

namespace httplib {
class Server;
struct Request;
}  // namespace httplib

namespace anchorage {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string model_id;          // what /v1/models lists and requests may name
  std::string admin_token;       // required on state-changing routes when set
  int64_t context_tokens = 0;    // prompt plus output limit; 0 means the model's maximum
  size_t max_body_bytes = 32u << 20;
  int http_threads = 64;
  // Testing aid: [{"match": TEXT, "reply": TEXT}]; a chat whose last message contains TEXT decodes
  // exactly that reply (forced tokens through the real forward) and then <|im_end|>.
  nlohmann::json test_replies = nlohmann::json::array();
};

class HttpServer {
 public:
  // journal and settings are optional (null: their routes answer 404).
  HttpServer(Model& model, Scheduler& scheduler, ServerOptions options, Journal* journal = nullptr, SettingsStore* settings = nullptr);
  ~HttpServer();

  // Binds the socket; the port is known after this (options.port 0 picks a free one).
  Status Bind();
  int port() const { return port_; }
  // Serves until Stop(); call after Bind() on the thread that will serve.
  void Serve();
  void Stop();

  Metrics& metrics() { return metrics_; }

 private:
  void Routes();

  bool Authorized(const httplib::Request& req) const;
  // Renders and tokenizes a parsed request; false with *error set when it cannot.
  bool PromptIds(const CompletionRequest& r, std::vector<int32_t>* ids, bool* starts_in_reasoning, ApiError* error) const;

  Model& model_;
  Scheduler& scheduler_;
  ServerOptions options_;
  Journal* journal_;
  SettingsStore* settings_;
  Metrics metrics_;
  std::unique_ptr<httplib::Server> server_;
  int port_ = 0;
};

}  // namespace anchorage
