// Starts anchorage-server on the tiny model in a temporary folder and talks to it over HTTP.
#pragma once

#include <QProcess>
#include <QRegularExpression>
#include <QTemporaryDir>
#include <QtTest>

#include <httplib.h>

#include <signal.h>
#include <sys/prctl.h>

#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/core/file_util.h"
#include "engine/settings/settings.h"

namespace anchorage::testing {

// One SSE stream read to its end (or until on_event returns false, which hangs up).
struct StreamResult {
  int status = 0;
  std::vector<nlohmann::json> events;  // parsed data: payloads, [DONE] excluded
  bool done_marker = false;
  bool aborted = false;
  std::string error;  // the client's error, when the exchange failed
};

// Writes DIR/settings.json with the defaults but no free-space floor for the disk tier (a test
// machine's disk may be nearly full); false where it cannot.
inline bool WriteSettingsWithoutDiskFloor(const QString& dir) {
  nlohmann::json doc = DefaultSettingsDocument(MachineTotalRamBytes());
  doc["disk_cache"]["min_free_gb"] = 0;
  return MakeDirectories(dir.toStdString(), 0700).ok() && WriteFileAtomic((dir + "/settings.json").toStdString(), doc.dump()).ok();
}

class ServerProcess {
 public:
  // Starts the server with extra flags; data_dir holds the generated tiny model (shared across runs).
  bool Start(const QString& data_dir, const QStringList& extra_flags) {
    process_ = std::make_unique<QProcess>();
    process_->setProcessChannelMode(QProcess::SeparateChannels);
    // The server dies with the test (its starting thread): a test that aborts leaves no server loading the next ones.
    process_->setChildProcessModifier([] { ::prctl(PR_SET_PDEATHSIG, SIGKILL); });
    QStringList args = {"--data-dir", data_dir, "--port", "0", "--threads", "1"};
    args += extra_flags;
    process_->start(QString(ANCHORAGE_BINARY_DIR) + "/app/anchorage-server", args);
    if (!process_->waitForStarted(10000)) return false;
    QByteArray out;
    QElapsedTimer timer;
    timer.start();
    while (timer.elapsed() < 60000) {
      process_->waitForReadyRead(200);
      out += process_->readAllStandardOutput();
      const QRegularExpressionMatch served = QRegularExpression("http://[^ /]+:(\\d+)/v1").match(QString::fromUtf8(out));
      if (served.hasMatch()) {
        startup_output_ = out.toStdString();
        port_ = served.captured(1).toInt();
        return port_ > 0;
      }
      if (process_->state() != QProcess::Running) break;
    }
    const QByteArray err = process_->readAllStandardError();
    startup_output_ = (out + err).toStdString();
    qWarning() << "server did not start:" << out << err;
    return false;
  }

  ~ServerProcess() { Kill(); }

  // SIGTERM, as a planned stop: true once it exited 0 within 20 s (the drain spills what it holds).
  bool Terminate() {
    ::kill(static_cast<pid_t>(process_->processId()), SIGTERM);
    return process_->waitForFinished(20000) && process_->exitCode() == 0;
  }
  void Kill() {
    if (process_ && process_->state() == QProcess::Running) {
      process_->kill();
      process_->waitForFinished(5000);
    }
  }

  int port() const { return port_; }
  // What the server printed to stderr so far, and whether it still runs.
  std::string Log(bool wait_for_exit = true) {
    if (wait_for_exit) process_->waitForFinished(500);
    else process_->waitForReadyRead(200);
    std::string out = process_->readAllStandardError().toStdString();
    out += process_->state() == QProcess::Running ? " [running]" : " [exited " + std::to_string(process_->exitCode()) + "]";
    return out;
  }
  QProcess& process() { return *process_; }
  // What the server printed to stdout until it served (and to stderr, where it did not start).
  const std::string& startup_output() const { return startup_output_; }
  std::string base_url() const { return "http://127.0.0.1:" + std::to_string(port_); }

  httplib::Result Get(const std::string& path) {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(60, 0);
    return c.Get(path.c_str());
  }

  httplib::Result Post(const std::string& path, const std::string& body, const httplib::Headers& headers = {}) {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(60, 0);
    return c.Post(path.c_str(), headers, body, "application/json");
  }

  // A chat completion's parsed answer; an empty object (and a warning) where it failed.
  nlohmann::json Chat(const nlohmann::json& body) {
    auto r = Post("/v1/chat/completions", body.dump());
    if (!r || r->status != 200) {
      qWarning() << "chat failed:" << (r ? QString::fromStdString(r->body) : QString("no response"));
      return nlohmann::json::object();
    }
    return nlohmann::json::parse(r->body, nullptr, false);
  }

  httplib::Result Put(const std::string& path, const std::string& body) {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(60, 0);
    return c.Put(path.c_str(), body, "application/json");
  }

  // Posts a streaming request; on_event sees each parsed event and may return false to hang up.
  StreamResult Stream(const std::string& path, const nlohmann::json& body,
                      const std::function<bool(const nlohmann::json&)>& on_event = nullptr) {
    StreamResult result;
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(120, 0);
    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    std::string buffer;
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      buffer.append(data, n);
      size_t sep;
      while ((sep = buffer.find("\n\n")) != std::string::npos) {
        std::string event = buffer.substr(0, sep);
        buffer.erase(0, sep + 2);
        if (event.rfind("data: ", 0) != 0) continue;
        std::string payload = event.substr(6);
        if (payload == "[DONE]") {
          result.done_marker = true;
          continue;
        }
        result.events.push_back(nlohmann::json::parse(payload, nullptr, false));
        if (on_event && !on_event(result.events.back())) {
          result.aborted = true;
          return false;
        }
      }
      return true;
    };
    httplib::Response res;
    httplib::Error error;
    if (!c.send(req, res, error)) result.error = httplib::to_string(error);
    result.status = res.status;
    return result;
  }

 private:
  std::unique_ptr<QProcess> process_;
  int port_ = 0;
  std::string startup_output_;
};

// A chat completion's logprobs, answer text and reused rows.
inline nlohmann::json AnswerLogprobs(const nlohmann::json& reply) { return reply["choices"][0]["logprobs"]; }
inline std::string AnswerText(const nlohmann::json& reply) { return reply["choices"][0]["message"]["content"].get<std::string>(); }
inline int64_t CachedTokens(const nlohmann::json& reply) { return reply["usage"]["anchorage"]["cached_tokens"].get<int64_t>(); }

}  // namespace anchorage::testing
