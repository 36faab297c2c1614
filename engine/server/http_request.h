// HTTP/1.1 requests: the parsed form and an incremental parser with strict framing (no sockets).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace anchorage {

struct HttpLimits {
  size_t max_request_line_bytes = 8192;  // 414 beyond
  size_t max_header_bytes = 65536;       // 431 beyond (all header lines together)
  size_t max_header_count = 128;         // 431 beyond
  size_t max_body_bytes = 32u << 20;     // 413 beyond
};

struct HttpRequest {
  std::string method;
  std::string target;  // as sent
  std::string path;    // percent-decoded, without the query
  int minor_version = 1;
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-case, in arrival order
  std::vector<std::pair<std::string, std::string>> params;   // decoded query parameters
  std::string body;
  bool keep_alive = true;
  std::string remote_address;
  // Whether the client has hung up (set by the transport for the handler; polls the socket).
  std::function<bool()> client_gone;

  // The first header of that name (case-insensitive), or empty.
  std::string HeaderValue(std::string_view name) const;
  bool HasHeader(std::string_view name) const;
  bool HasParam(std::string_view name) const;
  std::string ParamValue(std::string_view name) const;
};

// A request the transport refuses before any route sees it.
struct HttpError {
  int status = 400;
  std::string message;
  std::string code;
};

// Feed bytes as they arrive; one parser per connection, Reset() between requests.
class HttpRequestParser {
 public:
  enum class State { kNeedMore, kComplete, kError };

  explicit HttpRequestParser(const HttpLimits& limits) : limits_(limits) {}

  // Consumes a prefix of data; *consumed says how much (bytes after a complete request are left).
  State Feed(std::string_view data, size_t* consumed);

  bool started() const { return started_; }
  bool head_done() const { return phase_ != Phase::kHead; }
  bool expects_continue() const { return expects_continue_; }
  size_t body_bytes() const { return request_.body.size(); }
  int64_t content_length() const { return content_length_; }  // -1 when chunked or absent
  bool chunked() const { return chunked_; }
  const HttpError& error() const { return error_; }
  HttpRequest TakeRequest();
  void Reset();

 private:
  enum class Phase { kHead, kBody, kChunkSize, kChunkData, kChunkEnd, kTrailers, kDone, kFailed };

  State Fail(int status, std::string message, std::string code);
  State ParseHead();
  State CheckFraming();

  const HttpLimits& limits_;
  Phase phase_ = Phase::kHead;
  bool started_ = false;
  std::string head_;  // bytes of the request line and headers
  std::string line_;  // a chunk-size or trailer line in progress
  size_t trailer_bytes_ = 0;
  uint64_t chunk_left_ = 0;
  int64_t content_length_ = -1;
  bool chunked_ = false;
  bool expects_continue_ = false;
  HttpRequest request_;
  HttpError error_;
};

// Percent-decoding; false on a malformed escape. plus_is_space for query strings.
bool PercentDecode(std::string_view in, bool plus_is_space, std::string* out);

// Printable, shortened text of client bytes for an error message.
std::string QuoteForMessage(std::string_view bytes, size_t max_bytes = 80);

const char* HttpReasonPhrase(int status);

}  // namespace anchorage
