// A backend's spec: an OpenAI-compatible upstream serving model NAME behind this endpoint, as the
// --backend flag and the settings' backends.upstreams list write it.
#pragma once

#include <string>
#include <vector>

#include "engine/core/status.h"

namespace anchorage {

struct BackendSpec {
  std::string name;       // the model id it serves here
  std::string url;        // "http://host:port" with an optional base path ("/v1" at its end is dropped)
  std::string key_env;    // the environment variable holding its API key; empty: none

  bool operator==(const BackendSpec&) const = default;
};

// "NAME=URL[,key=ENVVAR]"; InvalidArgument naming what is wrong.
Result<BackendSpec> ParseBackendSpec(const std::string& text);
// Specs separated by spaces (the settings' list); the first bad one's error.
Result<std::vector<BackendSpec>> ParseBackendList(const std::string& text);

}  // namespace anchorage
