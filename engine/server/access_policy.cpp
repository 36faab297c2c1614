#include "engine/server/access_policy.h"

#include <algorithm>
#include <cctype>

#include "engine/server/service_config.h"

namespace anchorage {

namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool IsLoopbackName(const std::string& host) {
  return IsLoopbackHost(host) || host == "localhost." || (host.size() > 10 && host.compare(host.size() - 10, 10, ".localhost") == 0);
}

ApiError Forbidden(std::string message, std::string code) { return {403, std::move(message), "permission_error", "", std::move(code)}; }

}  // namespace

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  const size_t n = std::max(a.size(), b.size());
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned>(x ^ y);
  }
  return diff == 0;
}

std::string HostOfHeader(std::string_view value) {
  std::string_view host = value;
  if (!host.empty() && host.front() == '[') {
    const size_t close = host.find(']');
    host = close == std::string_view::npos ? host.substr(1) : host.substr(1, close - 1);
  } else if (const size_t colon = host.rfind(':'); colon != std::string_view::npos && host.find(':') == colon) {
    host = host.substr(0, colon);
  }
  return Lower(host);
}

AccessPolicy::AccessPolicy(AccessOptions options) : options_(std::move(options)), loopback_bind_(IsLoopbackHost(options_.bind_host)) {
  for (std::string& h : options_.allowed_hosts) h = Lower(h);
}

std::optional<ApiError> AccessPolicy::CheckHost(const HttpRequest& req) const {
  if (!req.HasHeader("host")) return std::nullopt;  // HTTP/1.0 without Host; the parser refuses it in 1.1
  const std::string host = HostOfHeader(req.HeaderValue("host"));
  if (IsLoopbackName(host)) return std::nullopt;
  const std::string bind = Lower(options_.bind_host);
  if (host == bind && bind != "0.0.0.0" && bind != "::") return std::nullopt;
  for (const std::string& allowed : options_.allowed_hosts) {
    if (allowed == "*" || allowed == host) return std::nullopt;
    if (allowed.size() > 1 && allowed[0] == '.' && host.size() > allowed.size() && host.compare(host.size() - allowed.size(), allowed.size(), allowed) == 0)
      return std::nullopt;
  }
  return Forbidden("the Host header '" + QuoteForMessage(req.HeaderValue("host")) +
                       "' is not this server's name; add it with --allowed-hosts (requests through other names are refused against DNS rebinding)",
                   "host_not_allowed");
}

bool AccessPolicy::OriginAllowed(std::string_view origin) const {
  const std::string o = Lower(origin);
  return std::any_of(options_.cors_origins.begin(), options_.cors_origins.end(), [&](const std::string& allowed) {
    return allowed == "*" || Lower(allowed) == o;
  });
}

std::optional<ApiError> AccessPolicy::CheckOrigin(const HttpRequest& req) const {
  if (!req.HasHeader("origin")) return std::nullopt;
  const std::string origin = req.HeaderValue("origin");
  if (OriginAllowed(origin)) return std::nullopt;
  return Forbidden("requests from web pages are refused: the origin '" + QuoteForMessage(origin) + "' is not in --cors-origins", "origin_not_allowed");
}

std::string AccessPolicy::BearerOf(const HttpRequest& req) const {
  const std::string auth = req.HeaderValue("authorization");
  if (auth.size() < 7 || Lower(auth.substr(0, 7)) != "bearer ") return {};
  std::string token = auth.substr(7);
  while (!token.empty() && token.front() == ' ') token.erase(0, 1);
  return token;
}

std::optional<ApiError> AccessPolicy::Authorize(RouteAccess access, const HttpRequest& req) const {
  if (access == RouteAccess::kPublic) return std::nullopt;
  const std::string bearer = BearerOf(req);
  const bool has_admin = !options_.admin_token.empty();
  const bool admin_ok = has_admin && !bearer.empty() && ConstantTimeEquals(bearer, options_.admin_token);
  bool key_ok = false;
  for (const std::string& key : options_.api_keys) key_ok |= !bearer.empty() && ConstantTimeEquals(bearer, key);
  const bool present = req.HasHeader("authorization");
  if (access == RouteAccess::kAdmin && has_admin) {
    if (admin_ok) return std::nullopt;
    return ApiError{401, present ? "the admin token given is not this server's; this route needs it (Authorization: Bearer TOKEN)"
                                 : "this route needs the admin token (Authorization: Bearer TOKEN)",
                    "authentication_error", "", "admin_token_required"};
  }
  if (options_.api_keys.empty() && loopback_bind_) return std::nullopt;
  if (key_ok || admin_ok) return std::nullopt;
  return ApiError{401, present ? "the API key given is not valid for this server (Authorization: Bearer KEY)"
                               : "this server needs an API key: send Authorization: Bearer KEY",
                  "authentication_error", "", present ? "invalid_api_key" : "missing_api_key"};
}

std::optional<ApiError> AccessPolicy::CheckContentType(const HttpRequest& req) {
  if (req.body.empty()) return std::nullopt;
  const std::string type = req.HeaderValue("content-type");
  std::string media = Lower(type.substr(0, type.find(';')));
  while (!media.empty() && media.back() == ' ') media.pop_back();
  if (media == "application/json") return std::nullopt;
  std::string got = "none";
  if (!type.empty()) got = std::string("'").append(QuoteForMessage(type)).append("'");
  ApiError e{415, "the request body must be JSON sent with Content-Type: application/json (got ", "invalid_request_error", "", "unsupported_media_type"};
  e.message += got;
  e.message += ")";
  return e;
}

std::vector<std::pair<std::string, std::string>> AccessPolicy::CorsHeaders(const HttpRequest& req, bool preflight) const {
  std::vector<std::pair<std::string, std::string>> h;
  if (!req.HasHeader("origin") || !OriginAllowed(req.HeaderValue("origin"))) return h;
  h.emplace_back("Access-Control-Allow-Origin", req.HeaderValue("origin"));
  h.emplace_back("Vary", "Origin");
  if (preflight) {
    h.emplace_back("Access-Control-Allow-Methods", "GET, POST, PUT, OPTIONS");
    h.emplace_back("Access-Control-Allow-Headers", "Authorization, Content-Type, X-Session-Id");
    h.emplace_back("Access-Control-Max-Age", "600");
  }
  return h;
}

}  // namespace anchorage
