#include "engine/settings/backend_spec.h"

#include <algorithm>
#include <cctype>
#include <sstream>

namespace anchorage {

namespace {

bool NameIsPlain(const std::string& name) {
  return !name.empty() && name.size() <= 128 && std::all_of(name.begin(), name.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '.' || c == '_' || c == '-' || c == ':' || c == '/';
  });
}

}  // namespace

Result<BackendSpec> ParseBackendSpec(const std::string& text) {
  const size_t eq = text.find('=');
  if (eq == std::string::npos) return InvalidArgument("backend '" + text + "': expected NAME=URL[,key=ENVVAR]");
  BackendSpec spec;
  spec.name = text.substr(0, eq);
  std::string rest = text.substr(eq + 1);
  if (!NameIsPlain(spec.name)) return InvalidArgument("backend '" + text + "': the name must be letters, digits and . _ - : / (at most 128)");
  if (const size_t comma = rest.find(','); comma != std::string::npos) {
    const std::string option = rest.substr(comma + 1);
    rest = rest.substr(0, comma);
    if (option.rfind("key=", 0) != 0 || option.size() == 4)
      return InvalidArgument("backend '" + spec.name + "': the only option is key=ENVVAR (the variable that holds its API key)");
    spec.key_env = option.substr(4);
  }
  if (rest.rfind("https://", 0) == 0)
    return InvalidArgument("backend '" + spec.name + "': https upstreams need TLS, which this build does not link; use http:// (a local TLS proxy can sit in between)");
  if (rest.rfind("http://", 0) != 0 || rest.size() <= 7) return InvalidArgument("backend '" + spec.name + "': the URL must start with http://");
  spec.url = rest;
  return spec;
}

Result<std::vector<BackendSpec>> ParseBackendList(const std::string& text) {
  std::vector<BackendSpec> specs;
  std::istringstream words(text);
  std::string word;
  while (words >> word) {
    ASSIGN_OR_RETURN(BackendSpec spec, ParseBackendSpec(word));
    for (const BackendSpec& b : specs)
      if (b.name == spec.name) return InvalidArgument("two backends are named '" + spec.name + "'");
    specs.push_back(std::move(spec));
  }
  return specs;
}

}  // namespace anchorage
