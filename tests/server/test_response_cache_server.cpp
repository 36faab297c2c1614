// The response cache through anchorage-server on the tiny model: off by default; once on, an
// identical greedy request is answered from memory with the identical bytes (plain and streamed),
// any changed field or prompt misses, sampled requests are never cached, the stats count it, and
// clear?tier=response forgets every answer.
#include <QtTest>

#include "tests/server/server_fixture.h"

using anchorage::testing::ServerProcess;
using json = nlohmann::json;

namespace {

json Chat(const std::string& text, double temperature = 0, int max_tokens = 24) {
  return {{"messages", {{{"role", "user"}, {"content", text}}}}, {"max_tokens", max_tokens}, {"temperature", temperature}, {"seed", 3}};
}

}  // namespace

class TestResponseCacheServer : public QObject {
  Q_OBJECT
  QTemporaryDir data_;
  ServerProcess server_;

  json Post(const json& body) {
    auto r = server_.Post("/v1/chat/completions", body.dump());
    return r && r->status == 200 ? json::parse(r->body) : json();
  }
  static std::string Source(const json& reply) { return reply["usage"]["anchorage"]["cache_source"].get<std::string>(); }
  void Enable(bool on) {
    json settings = json::parse(server_.Get("/v1/settings")->body);
    settings["response_cache"]["enabled"] = on;
    QVERIFY(server_.Put("/v1/settings", settings.dump())->status == 200);
  }

 private slots:
  void initTestCase() { QVERIFY(server_.Start(data_.path(), {"--grid", "64"})); }

  void offByDefault() {
    QVERIFY(Source(Post(Chat("Tell me about grids."))) != "response");
    QVERIFY(Source(Post(Chat("Tell me about grids."))) != "response");
    QCOMPARE(json::parse(server_.Get("/v1/cache/stats")->body)["response"]["enabled"].get<bool>(), false);
  }

  void identicalGreedyRequestsAreAnsweredFromMemory() {
    Enable(true);
    const json first = Post(Chat("Say something about chunks."));
    const json second = Post(Chat("Say something about chunks."));
    QVERIFY(Source(first) != "response");
    QCOMPARE(Source(second), std::string("response"));
    QCOMPARE(second["choices"].dump(), first["choices"].dump());
    QCOMPARE(second["usage"]["completion_tokens"], first["usage"]["completion_tokens"]);
    QCOMPARE(second["usage"]["prompt_tokens"], first["usage"]["prompt_tokens"]);
    // Streamed, it is the same text as the live answer.
    json stream = Chat("Say something about chunks.");
    stream["stream"] = true;
    auto streamed = server_.Post("/v1/chat/completions", stream.dump());
    QVERIFY(streamed && streamed->status == 200);
    std::string text;
    size_t at = 0;
    while ((at = streamed->body.find("data: {", at)) != std::string::npos) {
      const size_t end = streamed->body.find("\n\n", at);
      const json chunk = json::parse(streamed->body.substr(at + 6, end - at - 6));
      if (!chunk["choices"].empty() && chunk["choices"][0]["delta"].contains("content")) text += chunk["choices"][0]["delta"]["content"].get<std::string>();
      at = end;
    }
    QCOMPARE(text, first["choices"][0]["message"]["content"].get<std::string>());
    // Any changed field or prompt is another request.
    QVERIFY(Source(Post(Chat("Say something about chunks!"))) != "response");
    QVERIFY(Source(Post(Chat("Say something about chunks.", 0, 23))) != "response");
    json stopped = Chat("Say something about chunks.");
    stopped["stop"] = {"zz"};
    QVERIFY(Source(Post(stopped)) != "response");
    // Sampled requests are never answered from memory, seed or not.
    QVERIFY(Source(Post(Chat("A sampled one.", 0.8))) != "response");
    QVERIFY(Source(Post(Chat("A sampled one.", 0.8))) != "response");
    const json stats = json::parse(server_.Get("/v1/cache/stats")->body)["response"];
    QVERIFY2(stats["hits"].get<int64_t>() >= 2 && stats["entries"].get<int64_t>() >= 4, stats.dump().c_str());
  }

  void clearForgetsEveryAnswer() {
    QCOMPARE(Source(Post(Chat("Say something about chunks."))), std::string("response"));
    auto cleared = server_.Post("/v1/cache/clear?tier=response", "");
    QVERIFY(cleared && cleared->status == 200);
    QCOMPARE(json::parse(server_.Get("/v1/cache/stats")->body)["response"]["entries"].get<int64_t>(), int64_t{0});
    QVERIFY(Source(Post(Chat("Say something about chunks."))) != "response");
    Enable(false);
    QVERIFY(Source(Post(Chat("Say something about chunks."))) != "response");
  }
};

QTEST_MAIN(TestResponseCacheServer)
#include "test_response_cache_server.moc"
