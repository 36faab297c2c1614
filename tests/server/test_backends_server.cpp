// Backends through anchorage-server: a second anchorage-server (with an API key) as the upstream of
// model "big", a scripted upstream for failures, and a port nobody listens on. Greedy answers
// through the front equal the upstream's own, streamed and not; /v1/models lists every backend's
// models; an upstream that is down, slow or answers 400/500 gives the mapped error and the front
// keeps serving its own model; a hang-up cancels the upstream request; the journal, /health and
// /metrics show the backends and the API key appears nowhere.
#include <QtTest>

#include <atomic>
#include <chrono>
#include <thread>

#include "tests/server/server_fixture.h"

using anchorage::testing::ServerProcess;
using json = nlohmann::json;

namespace {

const char* kKey = "upstream-key-7f3a9c";
const char* kKeyVariable = "ANCHORAGE_TEST_UPSTREAM_KEY";

json Chat(const std::string& model, const std::string& text, int max_tokens, bool stream = false) {
  json body = {{"model", model}, {"messages", {{{"role", "user"}, {"content", text}}}}, {"max_tokens", max_tokens}, {"temperature", 0}};
  if (stream) body["stream"] = true;
  return body;
}

std::string StreamedText(const anchorage::testing::StreamResult& r) {
  std::string text;
  for (const json& e : r.events)
    if (e.contains("choices") && !e["choices"].empty() && e["choices"][0].contains("delta")) {
      const json& d = e["choices"][0]["delta"];
      if (d.contains("content") && d["content"].is_string()) text += d["content"].get<std::string>();
      if (d.contains("reasoning_content") && d["reasoning_content"].is_string()) text += d["reasoning_content"].get<std::string>();
    }
  return text;
}

}  // namespace

class TestBackendsServer : public QObject {
  Q_OBJECT
  QTemporaryDir up_data_, front_data_;
  ServerProcess up_, front_;
  httplib::Server scripted_;
  std::thread scripted_thread_;
  int scripted_port_ = 0;
  std::atomic<int> scripted_requests_{0};

  httplib::Result UpPost(const json& body) {
    return up_.Post("/v1/chat/completions", body.dump(), {{"Authorization", std::string("Bearer ") + kKey}});
  }
  json FrontJson(const std::string& path) {
    auto r = front_.Get(path);
    return r && r->status == 200 ? json::parse(r->body, nullptr, false) : json();
  }
  // The front's own model still answers.
  void FrontServesItsOwn() {
    auto r = front_.Post("/v1/chat/completions", Chat("local", "hello", 4).dump());
    QVERIFY2(r && r->status == 200, r ? r->body.c_str() : "no answer");
    QVERIFY(json::parse(r->body)["usage"].contains("anchorage"));
  }

 private slots:
  void initTestCase() {
    QVERIFY(up_.Start(up_data_.path(), {"--grid", "64", "--api-key", kKey, "--served-model-name", "big-upstream"}));
    scripted_.Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"object":"list","data":[{"id":"scripted"},{"id":"scripted-400"},{"id":"scripted-500"},{"id":"scripted-slow"}]})",
                      "application/json");
    });
    scripted_.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      ++scripted_requests_;
      const std::string model = json::parse(req.body, nullptr, false).value("model", "");
      if (model == "scripted-400") {
        res.status = 400;
        res.set_content(R"({"error":{"message":"max_tokens is too large for this deployment","type":"invalid_request_error"}})", "application/json");
      } else if (model == "scripted-500") {
        res.status = 500;
        res.set_content(R"({"error":{"message":"CUDA out of memory on the upstream"}})", "application/json");
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(2500));
        res.set_content(R"({"choices":[]})", "application/json");
      }
    });
    scripted_port_ = scripted_.bind_to_any_port("127.0.0.1");
    QVERIFY(scripted_port_ > 0);
    scripted_thread_ = std::thread([this] { scripted_.listen_after_bind(); });
    qputenv(kKeyVariable, kKey);
    QVERIFY(front_.Start(front_data_.path(), {"--grid", "64", "--served-model-name", "local", "--backend-timeout-s", "1",
                                              "--backend", "big=" + QString::fromStdString(up_.base_url()) + "/v1,key=" + kKeyVariable,
                                              "--backend", "scripted=http://127.0.0.1:" + QString::number(scripted_port_),
                                              "--backend", "gone=http://127.0.0.1:9"}));
    // Each backend's /v1/models is asked at the start.
    auto contacted = [&] {
      const json health = FrontJson("/health");
      int known = 0;
      for (const json& b : health["backends"]) known += b["state"] != "unknown";
      return known == 3;
    };
    QTRY_VERIFY_WITH_TIMEOUT(contacted(), 20000);
  }

  void cleanupTestCase() {
    scripted_.stop();
    if (scripted_thread_.joinable()) scripted_thread_.join();
  }

  void greedyAnswersEqualTheUpstreams() {
    const json body = Chat("big", "Say something about grids.", 16);
    auto own = UpPost(body);
    QVERIFY(own && own->status == 200);
    auto through = front_.Post("/v1/chat/completions", body.dump(), {{"x-session-id", "forwarded-7"}});
    QVERIFY2(through && through->status == 200, through ? through->body.c_str() : "no answer");
    auto newest_session = [&] {  // the session id goes along
      httplib::Client c("127.0.0.1", up_.port());
      auto r = c.Get("/v1/journal?kind=request&limit=1", {{"Authorization", std::string("Bearer ") + kKey}});
      const json page = r && r->status == 200 ? json::parse(r->body, nullptr, false) : json();
      return page.contains("rows") && !page["rows"].empty() ? page["rows"][0].value("session", std::string()) : std::string();
    };
    QTRY_COMPARE_WITH_TIMEOUT(newest_session(), std::string("forwarded-7"), 5000);
    const json a = json::parse(own->body), b = json::parse(through->body);
    QCOMPARE(b["model"], json("big-upstream"));  // the upstream's answer (named as the upstream lists it), not the front's own
    QCOMPARE(b["choices"][0]["message"], a["choices"][0]["message"]);
    QCOMPARE(b["usage"]["completion_tokens"], a["usage"]["completion_tokens"]);
    // Streamed: the same text, chunk by chunk, with the upstream's usage at the end.
    json streamed = Chat("big", "Say something about grids.", 16, true);
    streamed["stream_options"] = {{"include_usage", true}};
    const auto s = front_.Stream("/v1/chat/completions", streamed);
    QCOMPARE(s.status, 200);
    QVERIFY(s.done_marker);
    const std::string own_text = a["choices"][0]["message"].value("reasoning_content", std::string()) +
                                 (a["choices"][0]["message"]["content"].is_string() ? a["choices"][0]["message"]["content"].get<std::string>() : "");
    QCOMPARE(StreamedText(s), own_text);
    QVERIFY(s.events.back().contains("usage") && s.events.back()["usage"]["completion_tokens"] == a["usage"]["completion_tokens"]);
  }

  void modelsListEveryBackend() {
    const json models = FrontJson("/v1/models");
    std::set<std::string> ids;
    for (const json& m : models["data"]) ids.insert(m["id"].get<std::string>());
    for (const char* id : {"local", "big", "big-upstream", "scripted", "scripted-400", "gone"}) QVERIFY2(ids.count(id), models.dump().c_str());
    const json health = FrontJson("/health");
    QCOMPARE(health["backends"].size(), size_t(3));
    for (const json& b : health["backends"]) {
      if (b["name"] == "gone") {
        QCOMPARE(b["state"], json("down"));
        QVERIFY(b["down_since_ms"].is_number() && b["last_error"].is_string());
      } else {
        QCOMPARE(b["state"], json("up"));
      }
    }
    FrontServesItsOwn();
  }

  void upstreamFailuresAreMapped_data() {
    QTest::addColumn<QString>("model");
    QTest::addColumn<int>("status");
    QTest::addColumn<QString>("code");
    QTest::addColumn<QString>("needle");
    QTest::newRow("a client error keeps its status") << "scripted-400" << 400 << "backend_rejected" << "max_tokens is too large";
    QTest::newRow("an upstream failure is a bad gateway") << "scripted-500" << 502 << "backend_error" << "CUDA out of memory";
    QTest::newRow("a slow upstream times out") << "scripted-slow" << 504 << "backend_timeout" << "did not answer within";
    QTest::newRow("a down upstream is a bad gateway") << "gone" << 502 << "backend_unreachable" << "unreachable";
  }
  void upstreamFailuresAreMapped() {
    QFETCH(QString, model);
    QFETCH(int, status);
    QFETCH(QString, code);
    QFETCH(QString, needle);
    auto r = front_.Post("/v1/chat/completions", Chat(model.toStdString(), "hi", 4).dump());
    QVERIFY(r);
    QCOMPARE(r->status, status);
    const json e = json::parse(r->body, nullptr, false);
    QCOMPARE(e["error"]["code"], json(code.toStdString()));
    QVERIFY2(e["error"]["message"].get<std::string>().find(needle.toStdString()) != std::string::npos, r->body.c_str());
    FrontServesItsOwn();
  }

  void aHangUpCancelsTheUpstreamRequest() {
    const json long_answer = Chat("big", "Count the grid lines one by one, please, and do not stop.", 3000, true);
    int events = 0;
    const auto s = front_.Stream("/v1/chat/completions", long_answer, [&](const json&) { return ++events < 3; });
    QVERIFY(s.aborted);
    auto upstream_finish = [&] {
      httplib::Client c("127.0.0.1", up_.port());
      auto r = c.Get("/v1/journal?kind=request&limit=1", {{"Authorization", std::string("Bearer ") + kKey}});
      const json page = r && r->status == 200 ? json::parse(r->body, nullptr, false) : json();
      return page.contains("rows") && !page["rows"].empty() ? page["rows"][0].value("finish_reason", std::string()) : std::string();
    };
    QTRY_COMPARE_WITH_TIMEOUT(upstream_finish(), std::string("cancelled"), 20000);
    FrontServesItsOwn();
  }

  void theSettingsListChangesBackendsAtRunTime() {
    json settings = FrontJson("/v1/settings");
    settings["backends"]["upstreams"] = "extra=" + up_.base_url() + ",key=" + kKeyVariable;
    auto put = front_.Put("/v1/settings", settings.dump());
    QVERIFY2(put && put->status == 200, put ? put->body.c_str() : "no answer");
    auto state_of = [&](const std::string& name) {
      const json health = FrontJson("/health");
      for (const json& b : health["backends"])
        if (b["name"] == name) return b["state"].get<std::string>();
      return std::string("absent");
    };
    QTRY_COMPARE_WITH_TIMEOUT(state_of("extra"), std::string("up"), 10000);
    QCOMPARE(state_of("big"), std::string("up"));  // the flags' stay
    auto forwarded = front_.Post("/v1/chat/completions", Chat("extra", "hi", 4).dump());
    QVERIFY(forwarded && forwarded->status == 200);
    QCOMPARE(json::parse(forwarded->body)["model"], json("big-upstream"));
    // A bad list is refused naming the field, and changes nothing.
    settings = FrontJson("/v1/settings");
    settings["backends"]["upstreams"] = "extra=ftp://nowhere";
    auto bad = front_.Put("/v1/settings", settings.dump());
    QVERIFY(bad && bad->status == 400 && bad->body.find("backends.upstreams") != std::string::npos);
    QCOMPARE(state_of("extra"), std::string("up"));
    settings["backends"]["upstreams"] = "";
    QVERIFY(front_.Put("/v1/settings", settings.dump())->status == 200);
    QTRY_COMPARE_WITH_TIMEOUT(state_of("extra"), std::string("absent"), 10000);
    // While a backend is down ("gone"), a name no backend that is up lists may be its: 503 naming it.
    auto unrouted = front_.Post("/v1/chat/completions", Chat("extra", "hi", 4).dump());
    QVERIFY(unrouted);
    QCOMPARE(unrouted->status, 503);
    const json error = json::parse(unrouted->body)["error"];
    QCOMPARE(error["code"], json("backend_unavailable"));
    QVERIFY2(error["message"].get<std::string>().find("'gone' at http://127.0.0.1:9") != std::string::npos, unrouted->body.c_str());
    QVERIFY(unrouted->has_header("Retry-After"));
    auto local = front_.Post("/v1/chat/completions", Chat("local", "hi", 4).dump());
    QVERIFY(local && local->status == 200);
    QCOMPARE(json::parse(local->body)["model"], json("local"));
  }

  void theJournalHasARowPerForwardAndTheKeyIsNowhere() {
    auto journal = front_.Get("/v1/journal?kind=request&limit=200");
    QVERIFY(journal && journal->status == 200);
    int forwarded = 0, timeouts = 0;
    const json page = json::parse(journal->body);
    for (const json& row : page["rows"]) {
      if (row["cache_tier"] != "backend") continue;
      ++forwarded;
      timeouts += row["status"] == 504;
      QVERIFY(row["cache_source"].is_string());
    }
    QVERIFY2(forwarded >= 7 && timeouts == 1, ("forwarded " + std::to_string(forwarded) + ", timeouts " + std::to_string(timeouts)).c_str());
    const std::string metrics = front_.Get("/metrics")->body;
    QVERIFY(metrics.find("anchorage_backend_requests_total{backend=\"big\"}") != std::string::npos);
    QVERIFY(metrics.find("anchorage_backend_up{backend=\"gone\"} 0") != std::string::npos);
    for (const char* path : {"/v1/journal?limit=1000", "/v1/settings", "/health", "/metrics", "/v1/models", "/v1/cache/stats"})
      QVERIFY2(front_.Get(path)->body.find(kKey) == std::string::npos, path);
    const std::string logs = front_.startup_output() + front_.process().readAllStandardOutput().toStdString() + front_.Log(false);
    QVERIFY(logs.find("backend big at") != std::string::npos);  // the notes name each backend
    QVERIFY2(logs.find(kKey) == std::string::npos, "the key is in the front's output");
    // Cache routes answer 404 for a backend's model.
    auto peek = front_.Post("/v1/cache/peek", Chat("big", "hi", 4).dump());
    QVERIFY(peek);
    QCOMPARE(peek->status, 404);
  }
};

QTEST_MAIN(TestBackendsServer)
#include "test_backends_server.moc"
