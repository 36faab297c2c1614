// anchorage-server: the headless OpenAI-compatible endpoint over the engine.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include <nlohmann/json.hpp>

#include "app/server_options.h"
#include "engine/core/file_util.h"
#include "engine/model/model.h"
#include "engine/model/tiny_model.h"
#include "engine/runtime/forward.h"
#include "engine/server/http_server.h"
#include "engine/server/scheduler.h"

namespace {

volatile std::sig_atomic_t g_signal = 0;
void OnSignal(int sig) { g_signal = sig; }

}  // namespace

int main(int argc, char** argv) {
  using namespace anchorage;
  auto parsed = ParseServerCommandLine(argc, argv);
  if (!parsed.ok()) {
    std::fprintf(stderr, "anchorage-server: %s\n\n%s", parsed.status().message().c_str(), ServerUsage());
    return 2;
  }
  ServerConfig config = std::move(parsed).value();
  if (config.help) {
    std::fputs(ServerUsage(), stdout);
    return 0;
  }
  for (const std::string& note : config.notes) std::fprintf(stderr, "anchorage-server: %s\n", note.c_str());
  if (!IsLoopbackHost(config.host)) {
    std::fprintf(stderr, "anchorage-server: warning: binding %s exposes the endpoint beyond this machine\n", config.host.c_str());
    if (config.admin_token.empty()) {
      std::fprintf(stderr, "anchorage-server: binding a non-loopback address needs --admin-token\n");
      return 2;
    }
  }

  std::string model_dir = config.model_dir;
  if (model_dir.empty()) {
    model_dir = (std::filesystem::path(config.data_dir) / "models" / "tiny-seed0").string();
    if (!std::filesystem::exists(std::filesystem::path(model_dir) / "model.safetensors")) {
      std::fprintf(stderr, "anchorage-server: no --model given; generating the tiny model in %s\n", model_dir.c_str());
      Status s = GenerateTinyModel(TinyModelSize::kTiny, 0, model_dir);
      if (!s.ok()) {
        std::fprintf(stderr, "anchorage-server: %s\n", s.ToString().c_str());
        return 1;
      }
    }
  }
  std::fprintf(stderr, "anchorage-server: loading %s\n", model_dir.c_str());
  auto model = LoadModel(model_dir);
  if (!model.ok()) {
    std::fprintf(stderr, "anchorage-server: %s\n", model.status().ToString().c_str());
    return 1;
  }
  ForwardOptions forward_options;
  forward_options.grid_tokens = config.grid_tokens;
  forward_options.threads = config.threads;
  auto forward = Forward::Create((*model)->config, (*model)->weights, forward_options);
  if (!forward.ok()) {
    std::fprintf(stderr, "anchorage-server: %s\n", forward.status().ToString().c_str());
    return 1;
  }
  SchedulerOptions scheduler_options;
  scheduler_options.max_queue = config.max_queue;
  ResidentOptions& resident = scheduler_options.resident;
  auto gib = [](double gb) { return static_cast<int64_t>(gb * double(1ll << 30)); };
  resident.enabled = config.caches;
  resident.end_anchor = config.end_anchor;
  resident.anchor_budget_bytes = gib(config.resident_gb);
  resident.guest_max_tokens = config.resident_guest_max;
  resident.stash_budget_bytes = gib(config.resident_stash_gb);
  resident.pin_budget_bytes = gib(config.resident_pin_gb);
  resident.park_budget_bytes = gib(config.resident_park_gb);
  Scheduler scheduler(**model, std::move(forward).value(), scheduler_options);

  ServerOptions options;
  options.host = config.host;
  options.port = config.port;
  options.model_id = config.served_model_name.empty() ? std::filesystem::path(model_dir).filename().string() : config.served_model_name;
  options.admin_token = config.admin_token;
  options.context_tokens = config.context_tokens;
  if (!config.test_replies_file.empty()) {
    auto text = ReadFile(config.test_replies_file);
    nlohmann::json replies = text.ok() ? nlohmann::json::parse(*text, nullptr, false) : nlohmann::json();
    if (!replies.is_array()) {
      std::fprintf(stderr, "anchorage-server: --test-replies %s must hold a JSON array\n", config.test_replies_file.c_str());
      return 2;
    }
    options.test_replies = replies;
  }
  HttpServer server(**model, scheduler, options);
  Status bound = server.Bind();
  if (!bound.ok()) {
    std::fprintf(stderr, "anchorage-server: %s\n", bound.ToString().c_str());
    return 1;
  }
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  std::thread serving([&] { server.Serve(); });
  std::printf("anchorage-server: serving %s on http://%s:%d/v1 (model %s, %d threads, grid %lld)\n", options.model_id.c_str(),
              config.host.c_str(), server.port(), (*model)->fingerprint.substr(0, 12).c_str(), scheduler.forward().threads(),
              static_cast<long long>(config.grid_tokens));
  std::fflush(stdout);

  while (g_signal == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::fprintf(stderr, "anchorage-server: draining (signal %d): no new requests, waiting for the ones in flight\n", static_cast<int>(g_signal));
  scheduler.BeginDrain();
  scheduler.WaitIdle();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let the last response reach its client
  server.Stop();
  serving.join();
  std::fprintf(stderr, "anchorage-server: stopped\n");
  return 0;
}
