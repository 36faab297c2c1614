// anchorage-server: the headless OpenAI-compatible endpoint over the engine.
#include <sys/stat.h>

#include <pthread.h>

#include <csignal>
#include <cstdio>

#include "engine/server/service.h"

int main(int argc, char** argv) {
  using namespace anchorage;
  umask(077);  // the data folder (journal, settings, caches) is private to its user
  // SIGTERM and SIGINT are taken by sigwait below; blocked first, so every thread inherits the mask
  // and a signal during loading drains once serving starts.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  auto parsed = ParseServerCommandLine(argc, argv);
  if (!parsed.ok()) {
    std::fprintf(stderr, "anchorage-server: %s\n\n%s", parsed.status().message().c_str(), ServerUsage());
    return 2;
  }
  const ServerConfig& config = *parsed;
  if (config.help) {
    std::fputs(ServerUsage(), stdout);
    return 0;
  }
  for (const std::string& note : config.notes) std::fprintf(stderr, "anchorage-server: %s\n", note.c_str());
  if (!IsLoopbackHost(config.host))
    std::fprintf(stderr, "anchorage-server: warning: binding %s exposes the endpoint beyond this machine\n", config.host.c_str());
  if (Status bind = CheckBindAllowed(config.host, config.admin_token); !bind.ok()) {
    std::fprintf(stderr, "anchorage-server: %s\n", bind.message().c_str());
    return 2;
  }
  auto service = Service::Start(config, [](double, const std::string& what) { std::fprintf(stderr, "anchorage-server: %s\n", what.c_str()); });
  if (!service.ok()) {
    std::fprintf(stderr, "anchorage-server: %s\n", service.status().ToString().c_str());
    return 1;
  }
  Service& s = **service;
  for (const std::string& note : s.notes()) std::fprintf(stderr, "anchorage-server: %s\n", note.c_str());
  s.ServeInBackground();
  std::printf("anchorage-server: serving %s on %s (model %s, %s, grid %lld)\n", s.model_id().c_str(), s.url().c_str(),
              s.model().fingerprint.substr(0, 12).c_str(), s.device().c_str(), static_cast<long long>(config.grid_tokens));
  std::fflush(stdout);

  int signal = 0;
  sigwait(&stop_signals, &signal);
  std::fprintf(stderr, "anchorage-server: draining (signal %d): no new requests, waiting for the ones in flight\n", signal);
  s.Drain();
  std::fprintf(stderr, "anchorage-server: stopped\n");
  return 0;
}
