// Who may reach which route: the Host check (DNS rebinding), the Origin check and CORS (web
// pages), API keys and the admin token. Pure functions of a request; no I/O.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/server/http_request.h"
#include "engine/server/openai_api.h"

namespace anchorage {

// What a route needs. kClient: an API key (or the admin token) when keys are set or the bind is
// not loopback. kAdmin: the admin token when one is set, else as kClient.
enum class RouteAccess { kPublic, kClient, kAdmin };

struct AccessOptions {
  std::string bind_host = "127.0.0.1";
  std::vector<std::string> allowed_hosts;  // Host names or addresses besides loopback; "*" allows any, ".example.com" a suffix
  std::vector<std::string> cors_origins;   // origins web pages may call from ("https://app.example.com"); "*" allows any
  std::vector<std::string> api_keys;
  std::string admin_token;
};

// Compares without an early exit, so the time taken does not depend on where a guess goes wrong.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

// The host part of a Host header ("[::1]:8000" -> "::1", "Example.com:80" -> "example.com").
std::string HostOfHeader(std::string_view host_header);

class AccessPolicy {
 public:
  explicit AccessPolicy(AccessOptions options);

  bool loopback_bind() const { return loopback_bind_; }
  const AccessOptions& options() const { return options_; }

  // 403 for a Host that is not loopback, the bind address or an allowed name.
  std::optional<ApiError> CheckHost(const HttpRequest& req) const;
  // 403 for an Origin header that is not an allowed origin; requests without Origin pass.
  std::optional<ApiError> CheckOrigin(const HttpRequest& req) const;
  // 401 when the route needs a key or the admin token that the request does not carry.
  std::optional<ApiError> Authorize(RouteAccess access, const HttpRequest& req) const;
  // 415 for a body that is not declared application/json.
  static std::optional<ApiError> CheckContentType(const HttpRequest& req);

  // Response headers for an allowed cross-origin request (empty without an Origin).
  std::vector<std::pair<std::string, std::string>> CorsHeaders(const HttpRequest& req, bool preflight) const;

 private:
  bool OriginAllowed(std::string_view origin) const;
  std::string BearerOf(const HttpRequest& req) const;

  AccessOptions options_;
  bool loopback_bind_;
};

}  // namespace anchorage
