#include "engine/server/http_request.h"

#include <algorithm>
#include <cctype>

#include "engine/core/text_split.h"

namespace anchorage {

namespace {

bool IsTokenChar(unsigned char c) {
  if (std::isalnum(c)) return true;
  switch (c) {
    case '!': case '#': case '$': case '%': case '&': case '\'': case '*': case '+':
    case '-': case '.': case '^': case '_': case '`': case '|': case '~':
      return true;
    default:
      return false;
  }
}

bool IsToken(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return IsTokenChar(static_cast<unsigned char>(c)); });
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Finds the blank line that ends a head (CRLF CRLF or LF LF); returns the offset past it or npos.
size_t EndOfHead(const std::string& head, size_t from) {
  for (size_t i = from; i < head.size(); ++i) {
    if (head[i] != '\n') continue;
    if (i + 1 < head.size() && head[i + 1] == '\n') return i + 2;
    if (i + 2 < head.size() && head[i + 1] == '\r' && head[i + 2] == '\n') return i + 3;
  }
  return std::string::npos;
}

}  // namespace

std::string HttpRequest::HeaderValue(std::string_view name) const {
  const std::string key = Lower(name);
  for (const auto& [k, v] : headers)
    if (k == key) return v;
  return {};
}

bool HttpRequest::HasHeader(std::string_view name) const {
  const std::string key = Lower(name);
  return std::any_of(headers.begin(), headers.end(), [&](const auto& h) { return h.first == key; });
}

bool HttpRequest::HasParam(std::string_view name) const {
  return std::any_of(params.begin(), params.end(), [&](const auto& p) { return p.first == name; });
}

std::string HttpRequest::ParamValue(std::string_view name) const {
  for (const auto& [k, v] : params)
    if (k == name) return v;
  return {};
}

bool PercentDecode(std::string_view in, bool plus_is_space, std::string* out) {
  out->clear();
  for (size_t i = 0; i < in.size(); ++i) {
    char c = in[i];
    if (c == '%') {
      if (i + 2 >= in.size()) return false;
      const int hi = HexValue(in[i + 1]), lo = HexValue(in[i + 2]);
      if (hi < 0 || lo < 0) return false;
      out->push_back(static_cast<char>(hi * 16 + lo));
      i += 2;
    } else if (c == '+' && plus_is_space) {
      out->push_back(' ');
    } else {
      out->push_back(c);
    }
  }
  return true;
}

std::string QuoteForMessage(std::string_view bytes, size_t max_bytes) {
  std::string out;
  for (size_t i = 0; i < bytes.size() && i < max_bytes; ++i) {
    unsigned char c = static_cast<unsigned char>(bytes[i]);
    out.push_back(c >= 0x20 && c < 0x7f ? static_cast<char>(c) : '?');
  }
  if (bytes.size() > max_bytes) out += "...";
  return out;
}

const char* HttpReasonPhrase(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 417: return "Expectation Failed";
    case 422: return "Unprocessable Content";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
  }
}

HttpRequestParser::State HttpRequestParser::Fail(int status, std::string message, std::string code) {
  phase_ = Phase::kFailed;
  error_ = {status, std::move(message), std::move(code)};
  return State::kError;
}

void HttpRequestParser::Reset() {
  phase_ = Phase::kHead;
  started_ = false;
  head_.clear();
  line_.clear();
  trailer_bytes_ = 0;
  chunk_left_ = 0;
  content_length_ = -1;
  chunked_ = false;
  expects_continue_ = false;
  request_ = HttpRequest();
  error_ = HttpError();
}

HttpRequest HttpRequestParser::TakeRequest() { return std::move(request_); }

HttpRequestParser::State HttpRequestParser::Feed(std::string_view data, size_t* consumed) {
  size_t pos = 0;
  auto done = [&](State s) {
    *consumed = pos;
    return s;
  };
  if (phase_ == Phase::kFailed) return done(State::kError);
  if (phase_ == Phase::kDone) return done(State::kComplete);

  while (pos < data.size() || phase_ == Phase::kDone) {
    switch (phase_) {
      case Phase::kHead: {
        // Blank lines before a request line are skipped, as RFC 9112 asks of a robust server.
        if (head_.empty()) {
          while (pos < data.size() && (data[pos] == '\r' || data[pos] == '\n')) ++pos;
          if (pos == data.size()) return done(State::kNeedMore);
        }
        started_ = true;
        const size_t scan_from = head_.size() < 3 ? 0 : head_.size() - 3;
        const size_t head_cap = limits_.max_request_line_bytes + limits_.max_header_bytes + 4;
        const size_t take = std::min(data.size() - pos, head_cap - head_.size());
        head_.append(data.substr(pos, take));
        const size_t end = EndOfHead(head_, scan_from);
        if (end == std::string::npos) {
          pos += take;
          const size_t first_line = head_.find('\n');
          if (first_line == std::string::npos && head_.size() > limits_.max_request_line_bytes)
            return done(Fail(414, "the request line is longer than " + std::to_string(limits_.max_request_line_bytes) + " bytes", "uri_too_long"));
          if (head_.size() >= head_cap) {
            if (first_line != std::string::npos && first_line > limits_.max_request_line_bytes)
              return done(Fail(414, "the request line is longer than " + std::to_string(limits_.max_request_line_bytes) + " bytes", "uri_too_long"));
            return done(Fail(431, "the request headers exceed " + std::to_string(limits_.max_header_bytes) + " bytes", "headers_too_large"));
          }
          return done(State::kNeedMore);
        }
        // Give back what lies past the head: it is the body or the next request.
        const size_t extra = head_.size() - end;
        pos += take - extra;
        head_.resize(end);
        if (State s = ParseHead(); s == State::kError) return done(s);
        if (State s = CheckFraming(); s == State::kError) return done(s);
        break;
      }
      case Phase::kBody: {
        const size_t want = static_cast<size_t>(content_length_) - request_.body.size();
        const size_t n = std::min(want, data.size() - pos);
        request_.body.append(data.substr(pos, n));
        pos += n;
        if (request_.body.size() == static_cast<size_t>(content_length_)) phase_ = Phase::kDone;
        break;
      }
      case Phase::kChunkSize:
      case Phase::kTrailers: {
        const size_t nl = data.find('\n', pos);
        const size_t n = (nl == std::string_view::npos ? data.size() : nl + 1) - pos;
        line_.append(data.substr(pos, n));
        pos += n;
        const size_t line_limit = phase_ == Phase::kChunkSize ? 1024 : limits_.max_header_bytes;
        if (nl == std::string_view::npos) {
          if (line_.size() > line_limit)
            return done(phase_ == Phase::kChunkSize ? Fail(400, "a chunk-size line is longer than 1024 bytes", "malformed_chunk")
                                                    : Fail(431, "the chunked body's trailers exceed " + std::to_string(limits_.max_header_bytes) + " bytes", "headers_too_large"));
          return done(State::kNeedMore);
        }
        std::string_view line(line_);
        line.remove_suffix(1);
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        if (phase_ == Phase::kTrailers) {
          trailer_bytes_ += line_.size();
          if (trailer_bytes_ > limits_.max_header_bytes)
            return done(Fail(431, "the chunked body's trailers exceed " + std::to_string(limits_.max_header_bytes) + " bytes", "headers_too_large"));
          if (line.empty()) phase_ = Phase::kDone;
          line_.clear();
          break;
        }
        std::string_view size_text = line.substr(0, line.find(';'));
        size_text = Trim(size_text);
        uint64_t size = 0;
        bool ok = !size_text.empty() && size_text.size() <= 15;
        for (char c : size_text) {
          const int h = HexValue(c);
          if (h < 0) { ok = false; break; }
          size = size * 16 + static_cast<uint64_t>(h);
        }
        if (!ok) return done(Fail(400, "malformed chunk size '" + QuoteForMessage(line) + "' (expected hexadecimal digits)", "malformed_chunk"));
        line_.clear();
        if (size == 0) {
          phase_ = Phase::kTrailers;
          break;
        }
        if (request_.body.size() + size > limits_.max_body_bytes)
          return done(Fail(413, "the chunked request body exceeds " + std::to_string(limits_.max_body_bytes) + " bytes", "body_too_large"));
        chunk_left_ = size;
        phase_ = Phase::kChunkData;
        break;
      }
      case Phase::kChunkData: {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk_left_, data.size() - pos));
        request_.body.append(data.substr(pos, n));
        pos += n;
        chunk_left_ -= n;
        if (chunk_left_ == 0) phase_ = Phase::kChunkEnd;
        break;
      }
      case Phase::kChunkEnd: {
        // Exactly CRLF (or LF) must follow a chunk's data.
        line_.push_back(data[pos++]);
        if (line_ == "\n" || line_ == "\r\n") {
          line_.clear();
          phase_ = Phase::kChunkSize;
        } else if (line_ != "\r") {
          return done(Fail(400, "a chunk's data is not followed by CRLF: the chunk size does not match the data sent", "malformed_chunk"));
        }
        break;
      }
      case Phase::kDone:
        return done(State::kComplete);
      case Phase::kFailed:
        return done(State::kError);
    }
  }
  return done(phase_ == Phase::kDone ? State::kComplete : State::kNeedMore);
}

HttpRequestParser::State HttpRequestParser::ParseHead() {
  std::vector<std::string_view> lines;
  std::string_view rest(head_);
  while (!rest.empty()) {
    size_t nl = rest.find('\n');
    std::string_view line = rest.substr(0, nl);
    rest.remove_prefix(nl == std::string_view::npos ? rest.size() : nl + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) break;
    lines.push_back(line);
  }
  const std::string_view request_line = lines.empty() ? std::string_view() : lines[0];
  if (request_line.size() > limits_.max_request_line_bytes)
    return Fail(414, "the request line is " + std::to_string(request_line.size()) + " bytes; the limit is " + std::to_string(limits_.max_request_line_bytes), "uri_too_long");
  const size_t sp1 = request_line.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : request_line.find(' ', sp1 + 1);
  const bool three_parts = sp2 != std::string_view::npos && request_line.find(' ', sp2 + 1) == std::string_view::npos;
  const std::string malformed = "malformed request line '" + QuoteForMessage(request_line) + "' (expected METHOD /path HTTP/1.1)";
  if (!three_parts) return Fail(400, malformed, "malformed_request");
  const std::string_view method = request_line.substr(0, sp1);
  const std::string_view target = request_line.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string_view version = request_line.substr(sp2 + 1);
  if (!IsToken(method) || target.empty()) return Fail(400, malformed, "malformed_request");
  if (version.size() != 8 || version.substr(0, 5) != "HTTP/" || !std::isdigit(static_cast<unsigned char>(version[5])) || version[6] != '.' ||
      !std::isdigit(static_cast<unsigned char>(version[7])))
    return Fail(400, malformed, "malformed_request");
  if (version[5] != '1') return Fail(505, "HTTP version " + std::string(version.substr(5)) + " is not supported (use HTTP/1.1)", "http_version_not_supported");
  request_.method = std::string(method);
  request_.minor_version = version[7] - '0';
  request_.target = std::string(target);
  for (char c : target)
    if (static_cast<unsigned char>(c) <= 0x20 || static_cast<unsigned char>(c) >= 0x7f)
      return Fail(400, "the request target holds a control or non-ASCII byte: " + QuoteForMessage(target), "malformed_request");

  std::string_view path_and_query = target;
  if (path_and_query.rfind("http://", 0) == 0 || path_and_query.rfind("https://", 0) == 0) {
    const size_t slash = path_and_query.find('/', path_and_query.find("//") + 2);
    path_and_query = slash == std::string_view::npos ? std::string_view("/") : path_and_query.substr(slash);
  }
  if (path_and_query == "*" && request_.method == "OPTIONS") path_and_query = "/";
  if (path_and_query.empty() || path_and_query[0] != '/')
    return Fail(400, "the request target '" + QuoteForMessage(target) + "' must be a path starting with '/'", "malformed_request");
  path_and_query = path_and_query.substr(0, path_and_query.find('#'));
  const size_t q = path_and_query.find('?');
  if (!PercentDecode(path_and_query.substr(0, q), false, &request_.path) || request_.path.find('\0') != std::string::npos)
    return Fail(400, "the request path has a malformed percent escape: " + QuoteForMessage(target), "malformed_request");
  if (q != std::string_view::npos) {
    std::string_view query = path_and_query.substr(q + 1);
    size_t start = 0;
    while (start <= query.size()) {
      size_t amp = query.find('&', start);
      if (amp == std::string_view::npos) amp = query.size();
      std::string_view pair = query.substr(start, amp - start);
      start = amp + 1;
      if (pair.empty()) continue;
      const size_t eq = pair.find('=');
      std::string key, value;
      if (!PercentDecode(pair.substr(0, eq), true, &key) || (eq != std::string_view::npos && !PercentDecode(pair.substr(eq + 1), true, &value)))
        return Fail(400, "the query string has a malformed percent escape: " + QuoteForMessage(query), "malformed_request");
      request_.params.emplace_back(std::move(key), std::move(value));
    }
  }

  size_t header_bytes = 0;
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::string_view line = lines[i];
    header_bytes += line.size() + 2;
    if (line[0] == ' ' || line[0] == '\t')
      return Fail(400, "obsolete line folding in the headers is not accepted: '" + QuoteForMessage(line) + "'", "malformed_header");
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos || !IsToken(line.substr(0, colon)))
      return Fail(400, "malformed header line '" + QuoteForMessage(line) + "' (expected Name: value)", "malformed_header");
    const std::string_view value = Trim(line.substr(colon + 1));
    for (char c : value)
      if ((static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7f)
        return Fail(400, "the header '" + QuoteForMessage(line.substr(0, colon)) + "' holds a control character", "malformed_header");
    request_.headers.emplace_back(Lower(line.substr(0, colon)), std::string(value));
  }
  if (header_bytes > limits_.max_header_bytes)
    return Fail(431, "the request headers are " + std::to_string(header_bytes) + " bytes; the limit is " + std::to_string(limits_.max_header_bytes), "headers_too_large");
  if (request_.headers.size() > limits_.max_header_count)
    return Fail(431, "the request has " + std::to_string(request_.headers.size()) + " headers; the limit is " + std::to_string(limits_.max_header_count), "headers_too_large");
  head_.clear();
  return State::kNeedMore;
}

HttpRequestParser::State HttpRequestParser::CheckFraming() {
  // Header lists (RFC 9110): comma-separated, elements trimmed, empty ones dropped.
  std::vector<std::string> lengths;
  std::vector<std::string> codings;
  int hosts = 0;
  bool close = request_.minor_version == 0, keep_alive_token = false;
  for (const auto& [name, value] : request_.headers) {
    if (name == "content-length") {
      std::vector<std::string> items = SplitList(value, ',');
      if (items.empty()) return Fail(400, "Content-Length is empty; it must be a non-negative decimal number", "invalid_content_length");
      lengths.insert(lengths.end(), items.begin(), items.end());
    } else if (name == "transfer-encoding") {
      for (std::string& v : SplitList(value, ',')) codings.push_back(std::move(v));
    } else if (name == "host") {
      ++hosts;
    } else if (name == "connection") {
      for (const std::string& v : SplitList(value, ',')) {
        const std::string token = Lower(v);
        if (token == "close") close = true;
        if (token == "keep-alive") keep_alive_token = true;
      }
    } else if (name == "expect") {
      if (Lower(value) != "100-continue") return Fail(417, "the expectation '" + QuoteForMessage(value) + "' is not supported (only 100-continue)", "expectation_failed");
      expects_continue_ = true;
    }
  }
  request_.keep_alive = !close && (request_.minor_version == 1 || keep_alive_token);
  if (request_.minor_version == 1 && hosts == 0) return Fail(400, "an HTTP/1.1 request needs a Host header", "missing_host");
  if (hosts > 1) return Fail(400, "the request carries more than one Host header", "conflicting_host");

  if (!codings.empty()) {
    if (!lengths.empty()) return Fail(400, "the request carries both Content-Length and Transfer-Encoding; send one", "conflicting_framing");
    if (request_.minor_version == 0) return Fail(400, "Transfer-Encoding is not allowed in an HTTP/1.0 request", "malformed_request");
    if (codings.size() != 1 || Lower(codings[0]) != "chunked")
      return Fail(501, "Transfer-Encoding '" + QuoteForMessage(request_.HeaderValue("transfer-encoding")) + "' is not supported (only chunked)", "unsupported_transfer_encoding");
    chunked_ = true;
    phase_ = Phase::kChunkSize;
    return State::kNeedMore;
  }
  if (!lengths.empty()) {
    for (const std::string& v : lengths) {
      const bool digits = v.size() <= 18 && std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; });
      if (!digits) return Fail(400, "Content-Length must be a non-negative decimal number, got '" + QuoteForMessage(v) + "'", "invalid_content_length");
    }
    content_length_ = std::stoll(lengths[0]);
    for (const std::string& v : lengths)
      if (std::stoll(v) != content_length_)
        return Fail(400, "conflicting Content-Length values '" + lengths[0] + "' and '" + v + "'", "conflicting_content_length");
    if (static_cast<uint64_t>(content_length_) > limits_.max_body_bytes)
      return Fail(413, "the request body is " + std::to_string(content_length_) + " bytes (Content-Length); the limit is " + std::to_string(limits_.max_body_bytes) + " bytes",
                  "body_too_large");
  }
  phase_ = content_length_ > 0 ? Phase::kBody : Phase::kDone;
  return State::kNeedMore;
}

}  // namespace anchorage
