#include "engine/server/http_transport.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

namespace anchorage {

namespace {

constexpr int64_t kLingerMs = 2000;  // how long a refused connection is drained after its last byte

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void SetBlocking(int fd, bool blocking, int send_timeout_ms) {
  const int flags = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, blocking ? (flags & ~O_NONBLOCK) : (flags | O_NONBLOCK));
  timeval tv{};
  if (blocking) {
    tv.tv_sec = send_timeout_ms / 1000;
    tv.tv_usec = (send_timeout_ms % 1000) * 1000;
  }
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

// Sends everything or fails (peer gone, or the send timeout passed).
bool SendAll(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

std::string AddressOf(const sockaddr_storage& addr) {
  char text[INET6_ADDRSTRLEN] = {0};
  if (addr.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(addr).sin_addr, text, sizeof(text));
  } else if (addr.ss_family == AF_INET6) {
    const auto& a6 = reinterpret_cast<const sockaddr_in6&>(addr);
    if (IN6_IS_ADDR_V4MAPPED(&a6.sin6_addr)) inet_ntop(AF_INET, &a6.sin6_addr.s6_addr[12], text, sizeof(text));
    else inet_ntop(AF_INET6, &a6.sin6_addr, text, sizeof(text));
  }
  return text;
}

// " of N (Content-Length)" or " of a chunked body", for messages about a cut body.
std::string BodyOf(const HttpRequestParser& parser) {
  return parser.content_length() >= 0 ? " of " + std::to_string(parser.content_length()) + " (Content-Length)" : " of a chunked body";
}

std::string ErrorHead(int status, const HttpResponse& res) {
  std::string head = "HTTP/1.1 " + std::to_string(status) + " " + HttpReasonPhrase(status) + "\r\n";
  head += "Content-Type: " + res.content_type + "\r\nContent-Length: " + std::to_string(res.body.size()) + "\r\n";
  for (const auto& [k, v] : res.headers) head += k + ": " + v + "\r\n";
  head += "Connection: close\r\n\r\n";
  return head;
}

// Whether the peer of a connected socket has closed it (without waiting).
bool PeerClosed(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) return true;
  char byte;
  return (p.revents & POLLIN) && recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

}  // namespace

void HttpResponse::SetHeader(std::string name, std::string value) {
  for (auto& [k, v] : headers) {
    if (k.size() == name.size() && strncasecmp(k.c_str(), name.c_str(), k.size()) == 0) {
      v = std::move(value);
      return;
    }
  }
  headers.emplace_back(std::move(name), std::move(value));
}

struct HttpTransport::Connection {
  Connection(HttpTransport& owner, int fd, std::string address)
      : owner(owner), fd(fd), address(std::move(address)), parser(owner.options_.limits) {}
  ~Connection() {
    close(fd);
    owner.open_connections_.fetch_sub(1);
    std::lock_guard lock(owner.clients_mutex_);
    if (auto it = owner.per_client_.find(address); it != owner.per_client_.end() && --it->second == 0) owner.per_client_.erase(it);
  }

  HttpTransport& owner;
  int fd;
  std::string address;
  uint64_t serial = 0;
  HttpRequestParser parser;
  std::string pending;  // received bytes not yet parsed (a pipelined request)
  int64_t idle_since_ms = 0;
  int64_t request_started_ms = 0;
  int64_t last_byte_ms = 0;
  bool sent_continue = false;
  bool closing = false;  // an error was sent; input is drained until the deadline, then closed
  int64_t closing_deadline_ms = 0;
  size_t discarded_bytes = 0;
};

class HttpTransport::Pool {
 public:
  explicit Pool(int threads) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
  }
  ~Pool() { Join(); }
  void Post(std::function<void()> task) {
    {
      std::lock_guard lock(mutex_);
      tasks_.push_back(std::move(task));
    }
    cv_.notify_one();
  }
  // Finishes the queued tasks, then ends the threads.
  void Join() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_)
      if (t.joinable()) t.join();
  }

 private:
  void Run() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [&] { return done_ || !tasks_.empty(); });
        if (tasks_.empty()) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  std::vector<std::thread> threads_;
  bool done_ = false;
};

class HttpTransport::Stream : public HttpStream {
 public:
  Stream(int fd, bool chunked) : fd_(fd), chunked_(chunked) {}
  bool Write(std::string_view data) override {
    if (failed_ || ClientGone()) return !(failed_ = true);
    if (data.empty()) return true;
    if (!chunked_) return !(failed_ = !SendAll(fd_, data));
    char size_line[24];
    const int n = std::snprintf(size_line, sizeof(size_line), "%zx\r\n", data.size());
    std::string piece(size_line, static_cast<size_t>(n));
    piece.append(data);
    piece += "\r\n";
    return !(failed_ = !SendAll(fd_, piece));
  }
  bool ClientGone() override { return PeerClosed(fd_); }
  bool Finish() {
    if (failed_) return false;
    return chunked_ ? SendAll(fd_, "0\r\n\r\n") : true;
  }
  bool failed() const { return failed_; }

 private:
  int fd_;
  bool chunked_;
  bool failed_ = false;
};

HttpTransport::HttpTransport(HttpTransportOptions options) : options_(std::move(options)) {
  error_writer_ = [](HttpResponse& res, const HttpError& e) {
    res.SetContent("{\"error\":{\"message\":\"" + QuoteForMessage(e.message, 1000) + "\"}}", "application/json");
  };
}

HttpTransport::~HttpTransport() {
  Stop();
  work_pool_.reset();
  control_pool_.reset();
  returned_.clear();
  reading_.clear();
  if (listen_fd_ >= 0) close(listen_fd_);
  if (epoll_fd_ >= 0) close(epoll_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

void HttpTransport::Route(const std::string& method, const std::string& path, RouteClass route_class, HttpHandler handler) {
  routes_[path][method] = RouteEntry{route_class, std::move(handler)};
}

Status HttpTransport::Bind(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found); rc != 0)
    return IoError("bind " + host + ": " + gai_strerror(rc));
  std::string last_error = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 1024) == 0) {
      listen_fd_ = fd;
      break;
    }
    last_error = std::strerror(errno);
    close(fd);
  }
  freeaddrinfo(found);
  if (listen_fd_ < 0)
    return IoError("bind " + host + ":" + std::to_string(port) + " failed: " + last_error + " (in use, or not an address of this machine)");
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6&>(addr).sin6_port) : ntohs(reinterpret_cast<sockaddr_in&>(addr).sin_port);

  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_fd_ < 0 || wake_fd_ < 0) return IoError(std::string("epoll/eventfd: ") + std::strerror(errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = listen_fd_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
  ev.data.fd = wake_fd_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  return Status::Ok();
}

void HttpTransport::Serve() {
  if (listen_fd_ < 0) return;
  work_pool_ = std::make_unique<Pool>(options_.worker_threads);
  control_pool_ = std::make_unique<Pool>(options_.control_threads);
  EventLoop();
  reading_.clear();
  work_pool_->Join();
  control_pool_->Join();
  std::lock_guard lock(returned_mutex_);
  returned_.clear();
}

void HttpTransport::Stop() {
  stopping_ = true;
  Wake();
}

void HttpTransport::Wake() {
  if (wake_fd_ < 0) return;
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));
}

void HttpTransport::EventLoop() {
  epoll_event events[64];
  while (!stopping_) {
    int64_t now = NowMs();
    int64_t next = now + 1000;
    for (auto& [fd, c] : reading_) next = std::min(next, DeadlineOf(*c));
    const int n = epoll_wait(epoll_fd_, events, 64, static_cast<int>(std::clamp<int64_t>(next - now, 1, 1000)));
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == listen_fd_) {
        Accept();
      } else if (fd == wake_fd_) {
        uint64_t v;
        [[maybe_unused]] ssize_t r = read(wake_fd_, &v, sizeof(v));
      } else if (auto it = reading_.find(fd); it != reading_.end()) {
        ReadFrom(*it->second);
      }
    }
    std::vector<std::unique_ptr<Connection>> back;
    {
      std::lock_guard lock(returned_mutex_);
      back.swap(returned_);
    }
    for (auto& c : back) {
      const int fd = c->fd;
      c->idle_since_ms = NowMs();
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.fd = fd;
      epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
      Connection& ref = *c;
      reading_[fd] = std::move(c);
      if (!ref.pending.empty()) ReadFrom(ref);
    }

    now = NowMs();
    std::vector<int> expired;
    for (auto& [fd, c] : reading_) {
      if (now < DeadlineOf(*c)) continue;
      if (c->closing || !c->parser.started()) expired.push_back(fd);  // drained, or idle past keep-alive
      else if (!c->parser.head_done())
        Refuse(*c, {408, "the request head did not arrive within " + std::to_string(options_.header_timeout_ms) + " ms", "request_timeout"});
      else
        Refuse(*c, {408, "the request body stopped after " + std::to_string(c->parser.body_bytes()) + " bytes" + BodyOf(c->parser) + ": nothing arrived for " +
                             std::to_string(options_.body_idle_timeout_ms) + " ms",
                    "request_timeout"});
    }
    for (int fd : expired) Drop(fd);
  }
  for (auto& [fd, c] : reading_) epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
}

int64_t HttpTransport::DeadlineOf(const Connection& c) const {
  if (c.closing) return c.closing_deadline_ms;
  if (!c.parser.started()) return c.idle_since_ms + options_.keep_alive_timeout_ms;
  if (!c.parser.head_done()) return c.request_started_ms + options_.header_timeout_ms;
  return c.last_byte_ms + options_.body_idle_timeout_ms;
}

void HttpTransport::Accept() {
  for (;;) {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    const int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR) continue;
      return;
    }
    const std::string address = AddressOf(addr);
    size_t from_client = 0;
    {
      std::lock_guard lock(clients_mutex_);
      if (auto it = per_client_.find(address); it != per_client_.end()) from_client = it->second;
    }
    const bool client_full = from_client >= options_.max_connections_per_client;
    const bool all_full = open_connections_.load() >= options_.max_connections;
    if ((client_full || all_full) && !EvictFor(client_full ? address : std::string())) {
      HttpResponse res;
      const std::string why = client_full ? "too many open connections from " + address + " (the limit is " + std::to_string(options_.max_connections_per_client) + ")"
                                          : "too many open connections (the limit is " + std::to_string(options_.max_connections) + ")";
      error_writer_(res, {503, why, "too_many_connections"});
      res.SetHeader("Retry-After", "1");
      const std::string out = ErrorHead(503, res) + res.body;
      [[maybe_unused]] ssize_t n = send(fd, out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      close(fd);
      if (observer_) observer_(HttpRequest(), 503);
      continue;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    open_connections_.fetch_add(1);
    {
      std::lock_guard lock(clients_mutex_);
      ++per_client_[address];
    }
    auto c = std::make_unique<Connection>(*this, fd, address);
    c->serial = next_serial_++;
    c->idle_since_ms = NowMs();
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
    reading_[fd] = std::move(c);
  }
}

bool HttpTransport::EvictFor(const std::string& address) {
  // The victim: a refused connection being drained, the oldest unfinished head, the longest idle, a body.
  Connection* victim = nullptr;
  auto rank = [](const Connection& c) { return std::make_pair(c.closing ? 0 : c.parser.head_done() ? 3 : c.parser.started() ? 1 : 2, c.serial); };
  for (auto& [fd, c] : reading_) {
    if (!address.empty() && c->address != address) continue;
    if (victim == nullptr || rank(*c) < rank(*victim)) victim = c.get();
  }
  if (victim == nullptr) return false;
  Drop(victim->fd);
  return true;
}

void HttpTransport::ReadFrom(Connection& c) {
  const int fd = c.fd;
  bool eof = false;
  char buf[65536];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n > 0) {
      if (c.closing) {
        // A client that writes its whole body before reading gets it swallowed, then sees the answer.
        c.discarded_bytes += static_cast<size_t>(n);
        c.closing_deadline_ms = NowMs() + kLingerMs;
        if (c.discarded_bytes > 2 * options_.limits.max_body_bytes + (1u << 20)) {
          eof = true;
          break;
        }
        continue;
      }
      c.pending.append(buf, static_cast<size_t>(n));
      break;  // parse before reading more, so a fast sender never piles up unparsed bytes
    }
    if (n < 0 && errno == EINTR) continue;
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) eof = true;
    break;
  }
  if (c.closing) {
    if (eof) Drop(fd);
    return;
  }
  const int64_t now = NowMs();
  while (!c.pending.empty()) {
    if (!c.parser.started()) c.request_started_ms = now;
    c.last_byte_ms = now;
    size_t consumed = 0;
    const HttpRequestParser::State state = c.parser.Feed(c.pending, &consumed);
    c.pending.erase(0, consumed);
    if (state == HttpRequestParser::State::kError) return Refuse(c, c.parser.error());
    if (state == HttpRequestParser::State::kComplete) {
      HttpRequest request = c.parser.TakeRequest();
      request.remote_address = c.address;
      c.parser.Reset();
      c.sent_continue = false;
      epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
      auto node = reading_.extract(fd);
      Dispatch(std::move(node.mapped()), std::move(request));
      return;
    }
    if (c.parser.head_done() && c.parser.expects_continue() && !c.sent_continue) {
      c.sent_continue = true;
      [[maybe_unused]] ssize_t n = send(fd, "HTTP/1.1 100 Continue\r\n\r\n", 25, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    if (consumed == 0) break;
  }
  if (eof) {
    if (c.parser.started() && c.parser.head_done())
      return Refuse(c, {400, "the client closed its side after " + std::to_string(c.parser.body_bytes()) + " bytes of the request body" + BodyOf(c.parser), "incomplete_body"});
    Drop(fd);
  }
}

void HttpTransport::Refuse(Connection& c, const HttpError& error) {
  HttpResponse res;
  res.status = error.status;
  error_writer_(res, error);
  const std::string out = ErrorHead(error.status, res) + res.body;
  [[maybe_unused]] ssize_t n = send(c.fd, out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  // Half-close and drain what the client still sends, so its unread bytes do not reset the answer away.
  shutdown(c.fd, SHUT_WR);
  c.closing = true;
  c.closing_deadline_ms = NowMs() + kLingerMs;
  c.pending.clear();
  if (observer_) observer_(HttpRequest(), error.status);
}

void HttpTransport::Drop(int fd) {
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  reading_.erase(fd);
}

void HttpTransport::Dispatch(std::unique_ptr<Connection> c, HttpRequest request) {
  RouteClass route_class = RouteClass::kControl;
  if (auto path = routes_.find(request.path); path != routes_.end())
    if (auto m = path->second.find(request.method); m != path->second.end()) route_class = m->second.route_class;
  Pool& pool = route_class == RouteClass::kWork ? *work_pool_ : *control_pool_;
  auto shared = std::make_shared<std::pair<std::unique_ptr<Connection>, HttpRequest>>(std::move(c), std::move(request));
  pool.Post([this, shared] { Answer(std::move(shared->first), std::move(shared->second)); });
}

void HttpTransport::Answer(std::unique_ptr<Connection> c, HttpRequest request) {
  HttpResponse res;
  auto path = routes_.find(request.path);
  const RouteEntry* route = nullptr;
  if (path != routes_.end())
    if (auto m = path->second.find(request.method); m != path->second.end()) route = &m->second;
  if (route == nullptr) {
    std::string allow;
    if (path != routes_.end()) {
      for (const auto& [method, entry] : path->second) allow += (allow.empty() ? "" : ", ") + method;
      allow += ", OPTIONS";
    }
    if (path == routes_.end()) {
      res.status = 404;
      error_writer_(res, {404, "no route " + QuoteForMessage(request.method) + " " + QuoteForMessage(request.path), "not_found"});
    } else if (request.method == "OPTIONS") {
      res.status = 204;
      res.SetHeader("Allow", allow);
    } else {
      res.status = 405;
      res.SetHeader("Allow", allow);
      error_writer_(res, {405, "method " + QuoteForMessage(request.method) + " is not allowed on " + request.path + "; allowed: " + allow, "method_not_allowed"});
    }
    if (gate_ && request.method == "OPTIONS" && res.status == 204) gate_(request, res);
  } else if (!gate_ || gate_(request, res)) {
    request.client_gone = [fd = c->fd] { return PeerClosed(fd); };
    try {
      route->handler(request, res);
    } catch (const std::exception& e) {
      res = HttpResponse();
      res.status = 500;
      error_writer_(res, {500, std::string("internal error: ") + e.what(), "internal_error"});
    }
  }
  SetBlocking(c->fd, true, options_.write_timeout_ms);
  const bool ok = WriteResponse(*c, request, res);
  if (observer_) observer_(request, res.status);
  if (ok && request.keep_alive && !stopping_) Return(std::move(c));
}

bool HttpTransport::WriteResponse(Connection& c, const HttpRequest& request, HttpResponse& res) {
  const bool streamed = static_cast<bool>(res.stream);
  const bool chunked = streamed && request.minor_version >= 1;
  bool keep_alive = request.keep_alive && !stopping_ && (!streamed || chunked);
  for (const auto& [k, v] : res.headers)
    if (strcasecmp(k.c_str(), "connection") == 0 && strcasecmp(v.c_str(), "close") == 0) keep_alive = false;
  std::string head = "HTTP/1.1 " + std::to_string(res.status) + " " + HttpReasonPhrase(res.status) + "\r\n";
  const bool has_body = res.status != 204 && res.status != 304;
  if (has_body && (streamed || !res.body.empty())) head += "Content-Type: " + res.content_type + "\r\n";
  for (const auto& [k, v] : res.headers)
    if (strcasecmp(k.c_str(), "connection") != 0) head += k + ": " + v + "\r\n";
  if (chunked) head += "Transfer-Encoding: chunked\r\n";
  else if (has_body && !streamed) head += "Content-Length: " + std::to_string(res.body.size()) + "\r\n";
  head += keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
  if (!streamed) {
    if (request.method != "HEAD" && has_body) head += res.body;
    return SendAll(c.fd, head) && keep_alive;
  }
  if (!SendAll(c.fd, head)) return false;
  Stream stream(c.fd, chunked);
  try {
    res.stream(stream);
  } catch (const std::exception&) {
    return false;
  }
  return stream.Finish() && keep_alive;
}

void HttpTransport::Return(std::unique_ptr<Connection> c) {
  SetBlocking(c->fd, false, 0);
  {
    std::lock_guard lock(returned_mutex_);
    returned_.push_back(std::move(c));
  }
  Wake();
}


}  // namespace anchorage
