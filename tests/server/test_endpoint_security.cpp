// What web pages and neighbours can reach: the Host check (DNS rebinding), Origin and CORS, the
// JSON content type, API keys and the admin token per route on loopback and non-loopback binds,
// secrets kept out of logs and the journal, and the data folder's file modes.
#include <sys/stat.h>

#include <fstream>
#include <thread>

#include "engine/server/access_policy.h"
#include "tests/server/raw_http.h"
#include "tests/server/server_fixture.h"

using anchorage::testing::RawExchange;
using anchorage::testing::RawRequest;
using anchorage::testing::RawResponse;
using anchorage::testing::ServerProcess;
using json = nlohmann::json;

namespace {

const std::string kChat = R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})";

// A request with the given headers (each ending in CRLF) and a JSON body.
std::string Request(const std::string& method, const std::string& path, const std::string& headers, const std::string& body = "") {
  std::string r = method + " " + path + " HTTP/1.1\r\n" + headers;
  if (!body.empty()) r += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  return r + "Connection: close\r\n\r\n" + body;
}

std::string Json(const std::string& extra = "") { return "Host: 127.0.0.1\r\nContent-Type: application/json\r\n" + extra; }
std::string Bearer(const std::string& token) { return "Authorization: Bearer " + token + "\r\n"; }

std::string ErrorCode(const RawResponse& r) {
  json e = json::parse(r.body, nullptr, false);
  return e.is_object() && e.contains("error") && e["error"]["code"].is_string() ? e["error"]["code"].get<std::string>() : "";
}

std::string ErrorMessage(const RawResponse& r) {
  json e = json::parse(r.body, nullptr, false);
  return e.is_object() && e.contains("error") ? e["error"].value("message", "") : "";
}

int ModeOf(const QString& path) {
  struct stat st {};
  return ::stat(path.toStdString().c_str(), &st) == 0 ? static_cast<int>(st.st_mode & 0777) : -1;
}

std::string ReadAll(const QString& path) {
  std::ifstream in(path.toStdString(), std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

class TestEndpointSecurity : public QObject {
  Q_OBJECT

 private:
  QTemporaryDir data_;
  ServerProcess open_;   // loopback, with allowed hosts and one CORS origin
  ServerProcess keyed_;  // loopback, API keys and an admin token

 private slots:
  void initTestCase() {
    QVERIFY(data_.isValid());
    QVERIFY(open_.Start(data_.filePath("open"), {"--grid", "64", "--allowed-hosts", "box.lan, .example.com", "--cors-origins", "http://app.local:3000/"}));
    std::ofstream(data_.filePath("keys.txt").toStdString()) << "# one key a line\n  file-key-2  \n\n";
    QVERIFY(keyed_.Start(data_.filePath("keyed"), {"--grid", "64", "--api-key", "key-1", "--api-keys-file", data_.filePath("keys.txt"), "--admin-token", "admin-T"}));
  }

  // Pure checks of the policy: constant-time comparison, Host parsing, the credential table.
  void policyUnits() {
    using anchorage::AccessPolicy;
    using anchorage::ConstantTimeEquals;
    using anchorage::HostOfHeader;
    using anchorage::RouteAccess;
    QVERIFY(ConstantTimeEquals("secret", "secret"));
    QVERIFY(!ConstantTimeEquals("secret", "secreT"));
    QVERIFY(!ConstantTimeEquals("secret", "secret2"));
    QVERIFY(!ConstantTimeEquals("", "x"));
    QVERIFY(ConstantTimeEquals("", ""));
    QVERIFY(!ConstantTimeEquals(std::string("a\0b", 3), "a"));
    QCOMPARE(HostOfHeader("Example.COM:8000"), std::string("example.com"));
    QCOMPARE(HostOfHeader("[::1]:8000"), std::string("::1"));
    QCOMPARE(HostOfHeader("[::1]"), std::string("::1"));
    QCOMPARE(HostOfHeader("localhost"), std::string("localhost"));

    anchorage::HttpRequest req;
    auto with_auth = [&](const std::string& value) {
      req.headers = {{"host", "localhost"}};
      if (!value.empty()) req.headers.emplace_back("authorization", value);
      return req;
    };
    AccessPolicy open({"127.0.0.1", {}, {}, {}, ""});
    QVERIFY(!open.Authorize(RouteAccess::kClient, with_auth("")));
    QVERIFY(!open.Authorize(RouteAccess::kAdmin, with_auth("")));
    AccessPolicy keyed({"127.0.0.1", {}, {}, {"k1", "k2"}, "adm"});
    QVERIFY(keyed.Authorize(RouteAccess::kClient, with_auth("")));
    QVERIFY(!keyed.Authorize(RouteAccess::kClient, with_auth("Bearer k2")));
    QVERIFY(!keyed.Authorize(RouteAccess::kClient, with_auth("bearer  k1")));
    QVERIFY(!keyed.Authorize(RouteAccess::kClient, with_auth("Bearer adm")));
    QVERIFY(keyed.Authorize(RouteAccess::kClient, with_auth("Bearer k3")));
    QVERIFY(keyed.Authorize(RouteAccess::kClient, with_auth("Basic k1")));
    QVERIFY(keyed.Authorize(RouteAccess::kAdmin, with_auth("Bearer k1")));
    QVERIFY(!keyed.Authorize(RouteAccess::kAdmin, with_auth("Bearer adm")));
    QVERIFY(!keyed.Authorize(RouteAccess::kPublic, with_auth("")));
    AccessPolicy exposed({"0.0.0.0", {}, {}, {}, "adm"});
    QVERIFY(exposed.Authorize(RouteAccess::kClient, with_auth("")));
    QVERIFY(!exposed.Authorize(RouteAccess::kClient, with_auth("Bearer adm")));
    QVERIFY(!exposed.Authorize(RouteAccess::kPublic, with_auth("")));
  }

  void hostCheck_data() {
    QTest::addColumn<QString>("host");
    QTest::addColumn<int>("status");
    for (const char* ok : {"127.0.0.1", "127.0.0.1:8000", "localhost", "LOCALHOST:1", "[::1]:8000", "app.localhost", "127.1.2.3", "box.lan", "box.lan:8000", "a.example.com", "a.b.example.com:99"})
      QTest::newRow(ok) << ok << 200;
    for (const char* bad : {"evil.com", "evil.com:8000", "localhost.evil.com", "127.0.0.1.evil.com", "example.com", "xexample.com", "box.lan.evil", "192.168.1.5", "0.0.0.0", "[::]"})
      QTest::newRow(bad) << bad << 403;
  }

  // A request through a name other than loopback or an allowed one is refused (DNS rebinding).
  void hostCheck() {
    QFETCH(QString, host);
    QFETCH(int, status);
    RawResponse r = RawExchange(open_.port(), Request("POST", "/v1/chat/completions", "Host: " + host.toStdString() + "\r\nContent-Type: application/json\r\n", kChat), 60000);
    QCOMPARE(r.status, status);
    if (status == 403) {
      QCOMPARE(ErrorCode(r), std::string("host_not_allowed"));
      QVERIFY(ErrorMessage(r).find("--allowed-hosts") != std::string::npos);
    }
  }

  // A web page's Origin is refused unless allowed; an allowed one gets CORS answers, preflight too.
  void originAndCors() {
    RawResponse evil = RawExchange(open_.port(), Request("POST", "/v1/chat/completions", Json("Origin: http://evil.com\r\n"), kChat));
    QCOMPARE(evil.status, 403);
    QCOMPARE(ErrorCode(evil), std::string("origin_not_allowed"));
    QVERIFY(ErrorMessage(evil).find("'http://evil.com' is not in --cors-origins") != std::string::npos);
    QVERIFY(evil.Header("access-control-allow-origin").empty());
    RawResponse null_origin = RawExchange(open_.port(), Request("GET", "/v1/models", "Host: 127.0.0.1\r\nOrigin: null\r\n"));
    QCOMPARE(null_origin.status, 403);
    RawResponse evil_get = RawExchange(open_.port(), Request("GET", "/v1/cache/stats", "Host: 127.0.0.1\r\nOrigin: http://evil.com\r\n"));
    QCOMPARE(evil_get.status, 403);

    RawResponse app = RawExchange(open_.port(), Request("POST", "/v1/chat/completions", Json("Origin: http://app.local:3000\r\n"), kChat), 60000);
    QCOMPARE(app.status, 200);
    QCOMPARE(app.Header("access-control-allow-origin"), std::string("http://app.local:3000"));
    QCOMPARE(app.Header("vary"), std::string("Origin"));

    const std::string preflight = "Host: 127.0.0.1\r\nAccess-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: authorization, content-type\r\n";
    RawResponse pre = RawExchange(open_.port(), Request("OPTIONS", "/v1/chat/completions", preflight + "Origin: http://app.local:3000\r\n"));
    QCOMPARE(pre.status, 204);
    QCOMPARE(pre.Header("access-control-allow-origin"), std::string("http://app.local:3000"));
    QVERIFY(pre.Header("access-control-allow-methods").find("POST") != std::string::npos);
    QVERIFY(pre.Header("access-control-allow-headers").find("Authorization") != std::string::npos);
    QVERIFY(pre.Header("access-control-allow-headers").find("Content-Type") != std::string::npos);
    RawResponse pre_evil = RawExchange(open_.port(), Request("OPTIONS", "/v1/chat/completions", preflight + "Origin: http://evil.com\r\n"));
    QCOMPARE(pre_evil.status, 403);
    QVERIFY(pre_evil.Header("access-control-allow-origin").empty());
  }

  void contentType_data() {
    QTest::addColumn<QString>("header");
    QTest::addColumn<int>("status");
    QTest::newRow("json") << "Content-Type: application/json\r\n" << 200;
    QTest::newRow("json with charset") << "Content-Type: application/json; charset=utf-8\r\n" << 200;
    QTest::newRow("json in capitals") << "Content-Type: Application/JSON\r\n" << 200;
    QTest::newRow("text/plain (a simple cross-origin POST)") << "Content-Type: text/plain\r\n" << 415;
    QTest::newRow("form (curl -d's default)") << "Content-Type: application/x-www-form-urlencoded\r\n" << 415;
    QTest::newRow("multipart") << "Content-Type: multipart/form-data; boundary=x\r\n" << 415;
    QTest::newRow("none") << "" << 415;
    QTest::newRow("json lookalike") << "Content-Type: application/jsonp\r\n" << 415;
  }

  // Bodies must be declared JSON, so a page cannot send a "simple" request that reaches a route.
  void contentType() {
    QFETCH(QString, header);
    QFETCH(int, status);
    RawResponse r = RawExchange(open_.port(), Request("POST", "/v1/chat/completions", "Host: 127.0.0.1\r\n" + header.toStdString(), kChat), 60000);
    QCOMPARE(r.status, status);
    if (status == 415) {
      QCOMPARE(ErrorCode(r), std::string("unsupported_media_type"));
      QVERIFY2(ErrorMessage(r).find("Content-Type: application/json") != std::string::npos, r.body.c_str());
    }
  }

  void keysPerRoute_data() {
    QTest::addColumn<QString>("method");
    QTest::addColumn<QString>("path");
    QTest::addColumn<QString>("token");
    QTest::addColumn<int>("status");
    QTest::addColumn<QString>("code");
    const QString chat = "/v1/chat/completions";
    QTest::newRow("chat without a key") << "POST" << chat << "" << 401 << "missing_api_key";
    QTest::newRow("chat with a wrong key") << "POST" << chat << "key-0" << 401 << "invalid_api_key";
    QTest::newRow("chat with a key prefix") << "POST" << chat << "key-" << 401 << "invalid_api_key";
    QTest::newRow("chat with the flag's key") << "POST" << chat << "key-1" << 200 << "";
    QTest::newRow("chat with the file's key") << "POST" << chat << "file-key-2" << 200 << "";
    QTest::newRow("chat with the admin token") << "POST" << chat << "admin-T" << 200 << "";
    QTest::newRow("the comment is no key") << "POST" << chat << "# one key a line" << 401 << "invalid_api_key";
    QTest::newRow("completions without a key") << "POST" << "/v1/completions" << "" << 401 << "missing_api_key";
    QTest::newRow("models without a key") << "GET" << "/v1/models" << "" << 401 << "missing_api_key";
    QTest::newRow("models with a key") << "GET" << "/v1/models" << "key-1" << 200 << "";
    QTest::newRow("stats without a key") << "GET" << "/v1/cache/stats" << "" << 401 << "missing_api_key";
    QTest::newRow("metrics without a key") << "GET" << "/metrics" << "" << 401 << "missing_api_key";
    QTest::newRow("settings without a key") << "GET" << "/v1/settings" << "" << 401 << "missing_api_key";
    QTest::newRow("settings with a key") << "GET" << "/v1/settings" << "key-1" << 200 << "";
    QTest::newRow("health needs nothing") << "GET" << "/health" << "" << 200 << "";
    QTest::newRow("journal with a key") << "GET" << "/v1/journal" << "key-1" << 401 << "admin_token_required";
    QTest::newRow("journal with the admin token") << "GET" << "/v1/journal" << "admin-T" << 200 << "";
    QTest::newRow("clear with a key") << "POST" << "/v1/cache/clear?tier=store" << "key-1" << 401 << "admin_token_required";
    QTest::newRow("clear with the admin token") << "POST" << "/v1/cache/clear?tier=store" << "admin-T" << 200 << "";
    QTest::newRow("prewarm with a key") << "POST" << "/v1/cache/prewarm" << "key-1" << 401 << "admin_token_required";
    QTest::newRow("settings put with a key") << "PUT" << "/v1/settings" << "key-1" << 401 << "admin_token_required";
  }

  // Keys and the admin token per route on a loopback bind with keys configured.
  void keysPerRoute() {
    QFETCH(QString, method);
    QFETCH(QString, path);
    QFETCH(QString, token);
    QFETCH(int, status);
    QFETCH(QString, code);
    const bool post = method != "GET";
    const std::string body = path.contains("completions") ? (path.contains("chat") ? kChat : R"({"prompt": "x", "max_tokens": 2})") : post && path.contains("prewarm") ? kChat : "";
    const std::string headers = Json(token.isEmpty() ? "" : Bearer(token.toStdString()));
    RawResponse r = RawExchange(keyed_.port(), Request(method.toStdString(), path.toStdString(), headers, body), 60000);
    QVERIFY2(r.status == status, (std::to_string(r.status) + " " + r.body).c_str());
    if (!code.isEmpty()) {
      QCOMPARE(ErrorCode(r), code.toStdString());
      QVERIFY(ErrorMessage(r).find("Authorization: Bearer") != std::string::npos);
    }
  }

  // Credentials are checked before the body is parsed: an unauthenticated bad body gets 401.
  void authBeforeParsing() {
    for (const std::string& body : {std::string("{not json"), std::string("[1]"), std::string("\xff\xfe"), std::string(200, '[')}) {
      RawResponse r = RawExchange(keyed_.port(), Request("POST", "/v1/chat/completions", Json(), body));
      QCOMPARE(r.status, 401);
      QCOMPARE(ErrorCode(r), std::string("missing_api_key"));
    }
    RawResponse text = RawExchange(keyed_.port(), Request("POST", "/v1/chat/completions", "Host: 127.0.0.1\r\nContent-Type: text/plain\r\n", kChat));
    QCOMPARE(text.status, 401);
  }

  // The operator's natural `curl -X POST localhost:8000/v1/cache/clear?tier=all`: no body, no type.
  void bodylessClear() {
    RawResponse without = RawExchange(keyed_.port(), Request("POST", "/v1/cache/clear?tier=all", "Host: localhost:8000\r\n"));
    QCOMPARE(without.status, 401);
    QCOMPARE(ErrorCode(without), std::string("admin_token_required"));
    QVERIFY(ErrorMessage(without).find("admin token") != std::string::npos);
    RawResponse with = RawExchange(keyed_.port(), Request("POST", "/v1/cache/clear?tier=all", "Host: localhost:8000\r\n" + Bearer("admin-T")));
    QCOMPARE(with.status, 200);
    QCOMPARE(json::parse(with.body)["cleared"].get<std::string>(), std::string("all"));
    RawResponse open = RawExchange(open_.port(), Request("POST", "/v1/cache/clear?tier=all", "Host: localhost\r\nContent-Length: 0\r\n"));
    QCOMPARE(open.status, 200);
  }

  // /health says what the caller's own credentials pass, so a console can grey what would be refused.
  void healthSaysWhatTheCallerMayDo() {
    const auto access = [&](ServerProcess& s, const std::string& headers) {
      const RawResponse r = RawExchange(s.port(), Request("GET", "/health", "Host: localhost:8000\r\n" + headers));
      return r.status == 200 ? json::parse(r.body)["access"] : json();
    };
    QCOMPARE(access(keyed_, ""), json({{"client", false}, {"admin", false}}));
    QCOMPARE(access(keyed_, Bearer("key-1")), json({{"client", true}, {"admin", false}}));
    QCOMPARE(access(keyed_, Bearer("admin-T")), json({{"client", true}, {"admin", true}}));
    QCOMPARE(access(open_, ""), json({{"client", true}, {"admin", true}}));
  }

  // On a non-loopback bind every route but /health needs a key or the admin token.
  void nonLoopbackBind() {
    ServerProcess exposed;
    QVERIFY(exposed.Start(data_.filePath("exposed"), {"--grid", "64", "--host", "0.0.0.0", "--admin-token", "adm-2"}));
    const std::string host = "Host: 127.0.0.1\r\nContent-Type: application/json\r\n";
    QCOMPARE(RawExchange(exposed.port(), Request("GET", "/health", host)).status, 200);
    for (const auto& [method, path] : std::vector<std::pair<std::string, std::string>>{
             {"GET", "/v1/models"}, {"GET", "/metrics"}, {"GET", "/v1/cache/stats"}, {"GET", "/v1/settings"}, {"GET", "/v1/journal"}}) {
      RawResponse r = RawExchange(exposed.port(), Request(method, path, host));
      QVERIFY2(r.status == 401, (path + " " + std::to_string(r.status)).c_str());
      QCOMPARE(RawExchange(exposed.port(), Request(method, path, host + Bearer("adm-2"))).status, 200);
    }
    QCOMPARE(RawExchange(exposed.port(), Request("POST", "/v1/chat/completions", host, kChat)).status, 401);
    QCOMPARE(RawExchange(exposed.port(), Request("POST", "/v1/chat/completions", host + Bearer("adm-2"), kChat), 60000).status, 200);
    QCOMPARE(RawExchange(exposed.port(), Request("GET", "/v1/models", "Host: 192.168.7.7:8000\r\n" + Bearer("adm-2"))).status, 403);
  }

  // The official openai client with an API key: served with the key, AuthenticationError without.
  void openaiClientWithKey() {
    const QString tools = QString(ANCHORAGE_SOURCE_DIR) + "/tests/tools";
    QVERIFY2(QFile::exists(tools + "/node_modules/openai/package.json"), "tests/tools/node_modules is missing: run packaging/test.sh");
    QProcess node;
    node.setWorkingDirectory(tools);
    node.start("node", {"openai_api_key.mjs", QString::fromStdString(keyed_.base_url() + "/v1"), "tiny-seed0", "key-1"});
    QVERIFY(node.waitForStarted(10000));
    QVERIFY(node.waitForFinished(120000));
    const QByteArray out = node.readAllStandardOutput() + node.readAllStandardError();
    QVERIFY2(node.exitCode() == 0 && out.contains("api key checks passed"), out.constData());
  }

  // Keys and tokens never reach the server's output or the journal, whether right or wrong.
  void secretsNotLoggedOrJournaled() {
    for (const char* token : {"key-1", "file-key-2", "admin-T", "wrong-guess-123"})
      RawExchange(keyed_.port(), Request("POST", "/v1/chat/completions", Json(Bearer(token)), kChat), 60000);
    RawExchange(keyed_.port(), Request("POST", "/v1/cache/clear?tier=store", Json(Bearer("wrong-guess-123"))));
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // the journal's writer commits
    std::string stored = ReadAll(data_.filePath("keyed/journal.db")) + ReadAll(data_.filePath("keyed/journal.db-wal"));
    RawResponse rows = RawExchange(keyed_.port(), Request("GET", "/v1/journal?limit=1000", Json(Bearer("admin-T"))));
    QCOMPARE(rows.status, 200);
    QVERIFY(json::parse(rows.body)["rows"].size() > 0);
    stored += rows.body;
    const std::string log = keyed_.Log(false);
    for (const char* secret : {"key-1", "file-key-2", "admin-T", "wrong-guess-123"}) {
      QVERIFY2(stored.find(secret) == std::string::npos, secret);
      QVERIFY2(log.find(secret) == std::string::npos, secret);
    }
  }

  // The data folder is private: 0700 folders and 0600 files, created so and tightened at start.
  void dataFolderModes() {
    const QString dir = data_.filePath("keyed");
    RawResponse doc = RawExchange(keyed_.port(), Request("GET", "/v1/settings", Json(Bearer("key-1"))));
    QCOMPARE(doc.status, 200);
    RawResponse put = RawExchange(keyed_.port(), Request("PUT", "/v1/settings", Json(Bearer("admin-T")), doc.body));
    QVERIFY2(put.status == 200, put.body.c_str());
    QCOMPARE(ModeOf(dir), 0700);
    for (const char* file : {"journal.db", "journal.db-wal", "settings.json", "models/tiny-seed0/config.json"}) QVERIFY2(ModeOf(dir + "/" + file) == 0600, file);

    const QString loose = data_.filePath("loose");
    QDir().mkpath(loose);
    ::chmod(loose.toStdString().c_str(), 0755);
    std::ofstream(loose.toStdString() + "/notes.txt") << "x";
    ::chmod((loose + "/notes.txt").toStdString().c_str(), 0644);
    ServerProcess s;
    QVERIFY(s.Start(loose, {"--grid", "64"}));
    QCOMPARE(ModeOf(loose), 0700);
    QCOMPARE(ModeOf(loose + "/notes.txt"), 0600);
    QCOMPARE(ModeOf(loose + "/journal.db"), 0600);
    QCOMPARE(ModeOf(loose + "/models"), 0700);
    const std::string log = s.Log(false);
    QVERIFY2(log.find("warning: data folder:") != std::string::npos && log.find("mode 755") != std::string::npos, log.c_str());
  }
};

QTEST_GUILESS_MAIN(TestEndpointSecurity)
#include "test_endpoint_security.moc"
