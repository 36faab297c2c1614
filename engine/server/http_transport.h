// The HTTP/1.1 transport: one event thread reads requests with deadlines and per-client caps,
// worker pools run the routes, so slow or hostile clients cost a socket, never a worker.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "engine/core/status.h"
#include "engine/server/http_request.h"

namespace anchorage {

struct HttpTransportOptions {
  HttpLimits limits;
  int worker_threads = 64;            // run the routes that wait on the engine
  int control_threads = 4;            // run quick routes (health, metrics, stats) and errors
  size_t max_connections = 1024;      // open sockets in all
  size_t max_connections_per_client = 128;
  int header_timeout_ms = 10000;      // from a request's first byte to the end of its head
  int body_idle_timeout_ms = 10000;   // longest pause inside a body
  int keep_alive_timeout_ms = 30000;  // an idle connection's wait for its next request
  int write_timeout_ms = 30000;       // longest a response write may block
};

// Written by a streaming route on its worker thread.
class HttpStream {
 public:
  virtual ~HttpStream() = default;
  // Sends one piece of the body; false once the client is gone (then stop writing).
  virtual bool Write(std::string_view data) = 0;
  // Whether the client has hung up (polls the socket; cheap).
  virtual bool ClientGone() = 0;
};

struct HttpResponse {
  int status = 200;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string content_type = "application/json";
  std::string body;
  std::function<void(HttpStream&)> stream;  // set: the body is written by this function, chunked

  void SetHeader(std::string name, std::string value);
  void SetContent(std::string text, std::string type) {
    body = std::move(text);
    content_type = std::move(type);
  }
};

using HttpHandler = std::function<void(const HttpRequest&, HttpResponse&)>;

enum class RouteClass { kWork, kControl };

class HttpTransport {
 public:
  explicit HttpTransport(HttpTransportOptions options);
  ~HttpTransport();

  void Route(const std::string& method, const std::string& path, RouteClass route_class, HttpHandler handler);
  // Fills the body of an error (transport refusals, 404, 405): status, message, code.
  void SetErrorWriter(std::function<void(HttpResponse&, const HttpError&)> writer) { error_writer_ = std::move(writer); }
  // Runs before every routed handler; returning false skips the handler and sends res as it is.
  void SetGate(std::function<bool(const HttpRequest&, HttpResponse&)> gate) { gate_ = std::move(gate); }
  // Sees every answered request (routed or refused) with its status; called on the answering thread.
  void SetObserver(std::function<void(const HttpRequest&, int status)> observer) { observer_ = std::move(observer); }

  // Binds host:port (port 0 picks a free one).
  Status Bind(const std::string& host, int port);
  int port() const { return port_; }
  // Serves until Stop(); returns after the event thread and every worker have finished.
  void Serve();
  void Stop();

  size_t open_connections() const { return open_connections_.load(); }

 private:
  struct Connection;
  class Pool;
  class Stream;

  void EventLoop();
  void Accept();
  void ReadFrom(Connection& c);
  void Dispatch(std::unique_ptr<Connection> c, HttpRequest request);
  // Answers a transport error on the event thread and lets the connection drain, then close.
  void Refuse(Connection& c, const HttpError& error);
  void Drop(int fd);
  // When the connection's current wait ends: drain, keep-alive idle, request head or body pause.
  int64_t DeadlineOf(const Connection& c) const;
  void Answer(std::unique_ptr<Connection> c, HttpRequest request);
  bool WriteResponse(Connection& c, const HttpRequest& request, HttpResponse& res);
  void Return(std::unique_ptr<Connection> c);
  bool EvictFor(const std::string& address);
  void Wake();

  struct RouteEntry {
    RouteClass route_class;
    HttpHandler handler;
  };

  HttpTransportOptions options_;
  std::map<std::string, std::map<std::string, RouteEntry>> routes_;  // path -> method -> route
  std::function<void(HttpResponse&, const HttpError&)> error_writer_;
  std::function<bool(const HttpRequest&, HttpResponse&)> gate_;
  std::function<void(const HttpRequest&, int)> observer_;

  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<size_t> open_connections_{0};
  uint64_t next_serial_ = 0;

  std::map<int, std::unique_ptr<Connection>> reading_;  // event thread only
  std::mutex returned_mutex_;
  std::vector<std::unique_ptr<Connection>> returned_;  // back from workers for keep-alive
  std::mutex clients_mutex_;
  std::map<std::string, size_t> per_client_;  // open connections by address

  std::unique_ptr<Pool> work_pool_;
  std::unique_ptr<Pool> control_pool_;
};

}  // namespace anchorage
