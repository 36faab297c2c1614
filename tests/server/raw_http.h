// A raw-socket HTTP client for tests that send what a well-behaved client library never would.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <string_view>

namespace anchorage::testing {

struct RawResponse {
  int status = 0;            // 0: no status line arrived
  std::string head;          // status line and headers
  std::string body;
  bool closed = false;       // the server closed the connection after answering

  std::string Header(std::string_view name) const {
    std::string lower_head;
    for (char c : head) lower_head += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    std::string key = "\r\n";
    for (char c : name) key += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    key += ":";
    size_t at = lower_head.find(key);
    if (at == std::string::npos) return {};
    size_t start = at + key.size();
    size_t end = head.find("\r\n", start);
    std::string v = head.substr(start, end - start);
    while (!v.empty() && v.front() == ' ') v.erase(0, 1);
    return v;
  }
};

class RawConnection {
 public:
  explicit RawConnection(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      close(fd_);
      fd_ = -1;
    }
  }
  ~RawConnection() {
    if (fd_ >= 0) close(fd_);
  }
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  bool ok() const { return fd_ >= 0; }
  int fd() const { return fd_; }

  // False when the server has closed its side (or reset the connection).
  bool Send(std::string_view data) {
    while (!data.empty()) {
      ssize_t n = send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      data.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

  // Reads one response: the head, then a Content-Length or chunked body, or until close.
  RawResponse Read(int timeout_ms = 15000) {
    RawResponse r;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    size_t head_end = std::string::npos;
    while (true) {
      head_end = buffer_.find("\r\n\r\n");
      if (head_end != std::string::npos) {
        r.head = buffer_.substr(0, head_end + 2);
        std::string rest = buffer_.substr(head_end + 4);
        if (r.head.rfind("HTTP/1.1 100", 0) == 0) {
          buffer_ = rest;
          continue;
        }
        r.status = std::atoi(r.head.c_str() + 9);
        const std::string length = r.Header("content-length");
        const bool chunked = r.Header("transfer-encoding") == "chunked";
        if (!length.empty()) {
          const size_t n = std::stoul(length);
          if (rest.size() >= n) {
            r.body = rest.substr(0, n);
            buffer_ = rest.substr(n);
            break;
          }
        } else if (chunked) {
          std::string decoded;
          size_t pos = 0;
          bool complete = false;
          while (true) {
            size_t nl = rest.find("\r\n", pos);
            if (nl == std::string::npos) break;
            size_t size = std::stoul(rest.substr(pos, nl - pos), nullptr, 16);
            if (size == 0) {
              complete = rest.size() >= nl + 4;
              pos = nl + 4;
              break;
            }
            if (rest.size() < nl + 2 + size + 2) break;
            decoded += rest.substr(nl + 2, size);
            pos = nl + 2 + size + 2;
          }
          if (complete) {
            r.body = decoded;
            buffer_ = rest.substr(pos);
            break;
          }
        } else if (r.status == 204 || r.status == 304) {
          buffer_ = rest;
          break;
        }
      }
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) break;
      pollfd p{fd_, POLLIN, 0};
      const int wait = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count());
      if (poll(&p, 1, wait) <= 0) break;
      char buf[65536];
      ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) {
        r.closed = true;
        if (head_end != std::string::npos) {
          r.head = buffer_.substr(0, head_end + 2);
          r.status = std::atoi(r.head.c_str() + 9);
          r.body = buffer_.substr(head_end + 4);
          buffer_.clear();
        }
        break;
      }
      buffer_.append(buf, static_cast<size_t>(n));
    }
    if (!r.closed && r.Header("connection") == "close") r.closed = WaitClosed(2000);
    return r;
  }

  // Everything received so far once it holds marker, or at timeout_ms (a stream read as it comes).
  const std::string& ReceiveUntil(std::string_view marker, int timeout_ms) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (buffer_.find(marker) == std::string::npos) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) break;
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count())) <= 0) break;
      char buf[65536];
      const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) break;
      buffer_.append(buf, static_cast<size_t>(n));
    }
    return buffer_;
  }

  // Whether the server closes the connection within timeout_ms.
  bool WaitClosed(int timeout_ms) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) <= 0) return false;
    char buf[256];
    return recv(fd_, buf, sizeof(buf), MSG_PEEK | MSG_DONTWAIT) <= 0;
  }

 private:
  int fd_ = -1;
  std::string buffer_;
};

// One request on a fresh connection.
inline RawResponse RawExchange(int port, std::string_view request, int timeout_ms = 15000) {
  RawConnection c(port);
  if (!c.ok()) return {};
  c.Send(request);
  return c.Read(timeout_ms);
}

// A request with a correct Content-Length (and Host) around body.
inline std::string RawRequest(std::string_view method, std::string_view path, std::string_view body,
                              std::string_view extra_headers = "Content-Type: application/json\r\n") {
  std::string r = std::string(method) + " " + std::string(path) + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" + std::string(extra_headers);
  if (!body.empty() || method == "POST" || method == "PUT") r += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  r += "Connection: close\r\n\r\n";
  r += body;
  return r;
}

}  // namespace anchorage::testing
