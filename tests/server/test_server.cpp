// anchorage-server end to end on the tiny model: the official openai client, a table of bad inputs,
// concurrent streams, hang-ups, greedy determinism, the full queue and the SIGTERM drain.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <thread>

#include "tests/server/raw_http.h"
#include "tests/server/server_fixture.h"

using anchorage::testing::ServerProcess;
using anchorage::testing::StreamResult;
using json = nlohmann::json;

namespace {

json Chat(const std::string& text, int max_tokens, bool stream = false) {
  json body = {{"messages", {{{"role", "user"}, {"content", text}}}}, {"max_tokens", max_tokens}, {"temperature", 0}};
  if (stream) body["stream"] = true;
  return body;
}

// Polls /health until the engine is idle; returns the milliseconds it took, or -1.
double WaitIdleMs(ServerProcess& server, int timeout_ms) {
  auto start = std::chrono::steady_clock::now();
  while (true) {
    auto r = server.Get("/health");
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (r && r->status == 200 && json::parse(r->body)["state"] == "idle") return ms;
    if (ms > timeout_ms) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace

class TestServer : public QObject {
  Q_OBJECT

 private:
  QTemporaryDir data_;
  ServerProcess server_;
  std::string model_id_ = "tiny-seed0";

 private slots:
  void initTestCase() {
    QVERIFY(data_.isValid());
    json replies = json::array({
        {{"match", "What is the weather in Paris?"},
         {"reply", "The user wants the weather, so I call the tool.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>"}},
        {{"match", "\"sky\": \"sunny\""}, {"reply", "The tool answered.\n</think>\n\nIt is 22 degrees and sunny in Paris."}},
    });
    std::ofstream(data_.filePath("replies.json").toStdString()) << replies.dump();
    QVERIFY(server_.Start(data_.path(), {"--test-replies", data_.filePath("replies.json"), "--max-queue", "16", "--strict-model-names", "on", "--ctx", "32768"}));
  }

  void openaiClientConformance() {
    const QString tools = QString(ANCHORAGE_SOURCE_DIR) + "/tests/tools";
    QVERIFY2(QFile::exists(tools + "/node_modules/openai/package.json"),
             "tests/tools/node_modules is missing: run the test setup (packaging/test.sh runs npm ci there)");
    QProcess node;
    node.setWorkingDirectory(tools);
    node.start("node", {"openai_conformance.mjs", QString::fromStdString(server_.base_url() + "/v1"), QString::fromStdString(model_id_)});
    QVERIFY2(node.waitForStarted(10000), "node is not installed: run packaging/setup.sh");
    QVERIFY(node.waitForFinished(120000));
    const QByteArray out = node.readAllStandardOutput() + node.readAllStandardError();
    QVERIFY2(node.exitCode() == 0, out.constData());
    QVERIFY2(out.contains("tool round trip streamed"), out.constData());
  }

  void badInputs_data() {
    QTest::addColumn<QString>("path");
    QTest::addColumn<QByteArray>("body");
    QTest::addColumn<int>("status");
    QTest::addColumn<QString>("param");
    QTest::addColumn<QString>("code");
    const QString chat = "/v1/chat/completions";
    QTest::newRow("malformed json") << chat << QByteArray("{\"messages\": [") << 400 << "" << "invalid_json";
    QTest::newRow("not an object") << chat << QByteArray("[1, 2]") << 400 << "" << "invalid_json";
    QTest::newRow("invalid utf-8") << chat << QByteArray("{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\"}]}") << 400 << "" << "invalid_utf8";
    QTest::newRow("empty messages") << chat << QByteArray("{\"messages\": []}") << 400 << "messages" << "";
    QTest::newRow("missing messages") << chat << QByteArray("{\"model\": \"tiny-seed0\"}") << 400 << "messages" << "";
    QTest::newRow("messages not array") << chat << QByteArray("{\"messages\": \"hi\"}") << 400 << "messages" << "";
    QTest::newRow("unknown role") << chat << QByteArray("{\"messages\": [{\"role\": \"wizard\", \"content\": \"x\"}]}") << 400 << "messages[0].role" << "";
    QTest::newRow("content wrong type") << chat << QByteArray("{\"messages\": [{\"role\": \"user\", \"content\": 5}]}") << 400 << "messages[0].content" << "";
    QTest::newRow("unknown model") << chat << QByteArray("{\"model\": \"gpt-9\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}") << 404 << "model" << "model_not_found";
    QTest::newRow("temperature type") << chat << QByteArray("{\"temperature\": \"hot\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}") << 400 << "temperature" << "";
    QTest::newRow("temperature range") << chat << QByteArray("{\"temperature\": 7, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}") << 400 << "temperature" << "";
    QTest::newRow("max_tokens zero") << chat << QByteArray("{\"max_tokens\": 0, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}") << 400 << "max_tokens" << "";
    QTest::newRow("stream type") << chat << QByteArray("{\"stream\": \"yes\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}") << 400 << "stream" << "";
    QTest::newRow("stop type") << chat << QByteArray("{\"stop\": 5, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}") << 400 << "stop" << "";
    QTest::newRow("tools not array") << chat << QByteArray("{\"tools\": {}, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}") << 400 << "tools" << "";
    QTest::newRow("tool without name") << chat << QByteArray("{\"tools\": [{\"type\": \"function\", \"function\": {}}], \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}") << 400 << "tools[0].function.name" << "";
    QTest::newRow("tool bad parameters") << chat << QByteArray("{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": 3}}], \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}") << 400 << "tools[0].function.parameters" << "";
    QTest::newRow("bad tool call arguments") << chat << QByteArray("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", \"tool_calls\": [{\"id\": \"c\", \"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": \"{not json\"}}]}]}") << 400 << "messages[1].tool_calls[0].function.arguments" << "";
    QTest::newRow("template rejects (no user turn)") << chat << QByteArray("{\"messages\": [{\"role\": \"system\", \"content\": \"x\"}]}") << 400 << "messages" << "template_error";
    QByteArray huge = "{\"messages\": [{\"role\": \"user\", \"content\": \"" + QByteArray(40000 * 6, 'a').replace("aaaaaa", "word. ") + "\"}]}";
    QTest::newRow("prompt over the context") << chat << huge << 400 << "messages" << "context_length_exceeded";
    QTest::newRow("completion empty prompt") << "/v1/completions" << QByteArray("{\"prompt\": \"\"}") << 400 << "prompt" << "";
    QTest::newRow("completion id out of vocab") << "/v1/completions" << QByteArray("{\"prompt\": [1, 2, 99999999]}") << 400 << "prompt" << "";
    QTest::newRow("unknown route") << "/v1/engines" << QByteArray("{}") << 404 << "" << "not_found";
    QByteArray too_large = "{\"prompt\": \"" + QByteArray(33 << 20, 'x') + "\"}";
    QTest::newRow("body too large") << "/v1/completions" << too_large << 413 << "" << "body_too_large";
  }

  void badInputs() {
    QFETCH(QString, path);
    QFETCH(QByteArray, body);
    QFETCH(int, status);
    QFETCH(QString, param);
    QFETCH(QString, code);
    auto r = server_.Post(path.toStdString(), body.toStdString());
    QVERIFY2(r, "no response");
    QCOMPARE(r->status, status);
    json e = json::parse(r->body, nullptr, false);
    QVERIFY2(e.is_object() && e.contains("error"), r->body.c_str());
    const json& err = e["error"];
    QVERIFY(err["message"].is_string() && !err["message"].get<std::string>().empty());
    QVERIFY(err["type"].is_string());
    QVERIFY(err.contains("param") && err.contains("code"));
    if (!param.isEmpty()) QCOMPARE(QString::fromStdString(err["param"].get<std::string>()), param);
    if (!code.isEmpty()) QCOMPARE(QString::fromStdString(err["code"].get<std::string>()), code);
    auto health = server_.Get("/health");
    QVERIFY(health && health->status == 200);
    QCOMPARE(json::parse(health->body)["generated_model"], json(true));  // no --model: the generated tiny model
  }

  // A reply that looks like a tool call, to a request that sent no tools, is content; with tools it
  // is a tool call, and the journal records the finish reason the client saw.
  void toolCallTextWithoutToolsIsContent() {
    const json tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}])");
    json body = {{"messages", {{{"role", "user"}, {"content", "What is the weather in Paris?"}}}}, {"max_tokens", 200}};
    auto plain = server_.Post("/v1/chat/completions", body.dump());
    QVERIFY(plain && plain->status == 200);
    const json choice = json::parse(plain->body)["choices"][0];
    QCOMPARE(choice["finish_reason"].get<std::string>(), std::string("stop"));
    QVERIFY(!choice["message"].contains("tool_calls"));
    QVERIFY2(choice["message"]["content"].get<std::string>().find("<tool_call>\n<function=get_weather>") != std::string::npos, plain->body.c_str());

    body["stream"] = true;
    StreamResult streamed = server_.Stream("/v1/chat/completions", body);
    QCOMPARE(streamed.status, 200);
    std::string content;
    for (const json& e : streamed.events) {
      if (!e.contains("choices") || e["choices"].empty()) continue;
      const json& delta = e["choices"][0]["delta"];
      QVERIFY(!delta.contains("tool_calls"));
      if (delta.contains("content") && delta["content"].is_string()) content += delta["content"].get<std::string>();
    }
    QVERIFY2(content.find("<tool_call>\n<function=get_weather>") != std::string::npos, content.c_str());

    body.erase("stream");
    body["tools"] = tools;
    auto with_tools = server_.Post("/v1/chat/completions", body.dump(), {{"x-session-id", "weather-journal"}});
    QVERIFY(with_tools && with_tools->status == 200);
    QCOMPARE(json::parse(with_tools->body)["choices"][0]["finish_reason"].get<std::string>(), std::string("tool_calls"));
    json row;
    for (int attempt = 0; attempt < 50 && row.is_null(); ++attempt) {
      auto page = server_.Get("/v1/journal?kind=request&session=weather-journal");
      QVERIFY(page && page->status == 200);
      const json rows = json::parse(page->body)["rows"];
      if (!rows.empty()) row = rows[0];
      else std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    QVERIFY2(!row.is_null(), "no journal row for the request");
    QVERIFY2(row.dump().find("\"finish_reason\":\"tool_calls\"") != std::string::npos, row.dump().c_str());
  }

  void healthAndMetricsAfterBadInputs() {
    auto ok = server_.Post("/v1/chat/completions", Chat("Still serving?", 3).dump());
    QVERIFY(ok && ok->status == 200);
    auto metrics = server_.Get("/metrics");
    QVERIFY(metrics && metrics->status == 200);
    QVERIFY2(metrics->body.find("anchorage_requests_total{route=\"/v1/chat/completions\",status=\"400\"}") != std::string::npos, metrics->body.c_str());
    QVERIFY(metrics->body.find("anchorage_ttft_ms_bucket{le=\"+Inf\"}") != std::string::npos);
    QVERIFY(metrics->body.find("anchorage_queue_depth 0") != std::string::npos);
  }

  void eightConcurrentStreams() {
    std::vector<StreamResult> results(8);
    std::vector<std::thread> clients;
    for (int i = 0; i < 8; ++i)
      clients.emplace_back([&, i] { results[i] = server_.Stream("/v1/chat/completions", Chat("Client " + std::to_string(i) + " says hello", 40, true)); });
    for (auto& t : clients) t.join();
    for (int i = 0; i < 8; ++i) {
      const StreamResult& r = results[i];
      QCOMPARE(r.status, 200);
      QVERIFY2(r.done_marker, ("client " + std::to_string(i) + " got no [DONE]").c_str());
      int finishes = 0, tokens = 0;
      std::string id;
      for (const json& e : r.events) {
        QVERIFY(e.is_object());
        QCOMPARE(e["object"].get<std::string>(), std::string("chat.completion.chunk"));
        if (id.empty()) id = e["id"];
        QCOMPARE(e["id"].get<std::string>(), id);
        const json& delta = e["choices"][0]["delta"];
        if (delta.contains("reasoning_content") || (delta.contains("content") && !delta["content"].get<std::string>().empty())) ++tokens;
        if (!e["choices"][0]["finish_reason"].is_null()) ++finishes;
      }
      QCOMPARE(finishes, 1);
      QVERIFY(tokens > 0);
    }
  }

  void hangUpFreesTheEngine() {
    json body = Chat("Tell me a very long story", 30000, true);
    int seen = 0;
    StreamResult r = server_.Stream("/v1/chat/completions", body, [&](const json&) { return ++seen < 5; });
    QVERIFY(r.aborted);
    const double idle_ms = WaitIdleMs(server_, 5000);
    QVERIFY2(idle_ms >= 0, "the engine kept generating after the client hung up");
    auto health = server_.Get("/health");
    const int64_t generated = json::parse(health->body)["last_request"]["completion_tokens"];
    qInfo() << "engine idle" << idle_ms << "ms after the hang-up; it generated" << generated << "of 30000 tokens";
    QVERIFY2(generated < 3000, std::to_string(generated).c_str());
  }

  // A stream queued behind a long answer gets its headers and a queued comment (with its place)
  // before the engine starts it, then its answer once the engine is free (one slot).
  void aQueuedStreamGetsItsHeadersAtOnce() {
    ServerProcess one;
    QVERIFY(one.Start(data_.path(), {"--parallel", "1"}));
    std::atomic<bool> started = false, release = false;
    std::thread busy([&] {
      (void)one.Stream("/v1/chat/completions", Chat("Tell me a very long story", 30000, true), [&](const json&) {
        started = true;
        return !release.load();
      });
    });
    QTRY_VERIFY_WITH_TIMEOUT(started.load(), 20000);
    anchorage::testing::RawConnection c(one.port());
    QVERIFY(c.ok());
    QVERIFY(c.Send(anchorage::testing::RawRequest("POST", "/v1/chat/completions", Chat("Queued behind the story", 8, true).dump())));
    const std::string early = c.ReceiveUntil(": queued, position 1\n\n", 5000);
    const bool still_busy = !release.load() && started.load();
    release = true;  // the long answer's client hangs up; the engine takes the queued stream
    busy.join();
    QVERIFY2(still_busy, "the long answer ended before the queued stream was checked");
    QVERIFY2(early.rfind("HTTP/1.1 200", 0) == 0, early.c_str());
    QVERIFY2(early.find("text/event-stream") != std::string::npos, early.c_str());
    QVERIFY2(early.find(": queued, position 1\n\n") != std::string::npos, early.c_str());
    QVERIFY2(early.find("data: {") == std::string::npos, early.c_str());  // nothing of the answer before the engine took it
    const std::string all = c.ReceiveUntil("data: [DONE]", 30000);
    QVERIFY2(all.find("data: [DONE]") != std::string::npos, all.c_str());
    QVERIFY(all.find("\"finish_reason\":\"") != std::string::npos);
  }

  void greedyTwiceSameTokens() {
    json body = Chat("Repeat after me: anchors hold", 24);
    body["logprobs"] = true;
    auto a = server_.Post("/v1/chat/completions", body.dump());
    auto b = server_.Post("/v1/chat/completions", body.dump());
    QVERIFY(a && b && a->status == 200 && b->status == 200);
    json ja = json::parse(a->body), jb = json::parse(b->body);
    QVERIFY(!ja["choices"][0]["logprobs"]["content"].empty());
    QCOMPARE(ja["choices"][0]["logprobs"]["content"].dump(), jb["choices"][0]["logprobs"]["content"].dump());
    QCOMPARE(ja["choices"][0]["message"].dump(), jb["choices"][0]["message"].dump());
  }

  void fullQueueAnswers503() {
    ServerProcess small;
    QVERIFY(small.Start(data_.path(), {"--max-queue", "0", "--parallel", "1"}));
    std::atomic<bool> started{false};
    StreamResult first;
    std::thread t([&] { first = small.Stream("/v1/chat/completions", Chat("long", 2000, true), [&](const json&) { started = true; return true; }); });
    while (!started) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    auto second = small.Post("/v1/chat/completions", Chat("second", 2).dump());
    t.join();
    QVERIFY(second);
    QCOMPARE(second->status, 503);
    QVERIFY(second->has_header("Retry-After"));
    QCOMPARE(json::parse(second->body)["error"]["code"].get<std::string>(), std::string("queue_full"));
    QVERIFY2(first.done_marker, (first.error + " after " + std::to_string(first.events.size()) + " events; server: " + small.Log()).c_str());
    auto third = small.Post("/v1/chat/completions", Chat("third", 2).dump());
    QVERIFY(third && third->status == 200);
  }

  void nonLoopbackNeedsTheAdminToken() {
    QProcess bare;
    bare.start(QString(ANCHORAGE_BINARY_DIR) + "/app/anchorage-server", {"--data-dir", data_.path(), "--host", "0.0.0.0", "--port", "0"});
    QVERIFY(bare.waitForFinished(30000));
    QCOMPARE(bare.exitCode(), 2);
    const QByteArray err = bare.readAllStandardError();
    QVERIFY2(err.contains("warning: binding 0.0.0.0") && err.contains("needs --admin-token"), err.constData());

    ServerProcess guarded;
    QVERIFY(guarded.Start(data_.path(), {"--admin-token", "s3cret"}));
    auto refused = guarded.Post("/v1/cache/clear?tier=all", "");
    QVERIFY(refused && refused->status == 401);
    QCOMPARE(json::parse(refused->body)["error"]["code"].get<std::string>(), std::string("admin_token_required"));
    auto allowed = guarded.Post("/v1/cache/clear?tier=all", "", {{"Authorization", "Bearer s3cret"}});
    QVERIFY(allowed && allowed->status == 200);
    auto chat = guarded.Post("/v1/chat/completions", Chat("no token needed to chat", 2).dump());
    QVERIFY(chat && chat->status == 200);
  }

  // --weights int8 and an FP8 checkpoint serve, say how the weights are held, and key their caches apart;
  // a broken FP8 checkpoint stops the start with the tensor named.
  void eightBitWeights() {
    QTemporaryDir own;
    ServerProcess int8;
    QVERIFY(int8.Start(own.path(), {"--weights", "int8", "--disk-cache", "off"}));
    const std::string log = int8.Log(false);
    QVERIFY2(log.find("weights int8:") != std::string::npos && log.find("fixed 64-token prompt") != std::string::npos, log.c_str());
    const json health = json::parse(int8.Get("/health")->body);
    QCOMPARE(health["weights"].get<std::string>(), std::string("int8"));
    QVERIFY(health["state_fingerprint"] != json::parse(server_.Get("/health")->body)["state_fingerprint"]);
    auto chat = int8.Post("/v1/chat/completions", Chat("int8 weights", 3).dump());
    QVERIFY(chat && chat->status == 200);

    const QString tool = QString(ANCHORAGE_BINARY_DIR) + "/app/anchorage-tool";
    const QString fp8_dir = own.filePath("fp8");
    QCOMPARE(QProcess::execute(tool, {"make-model", "--size", "tiny", "--seed", "0", "--dtype", "fp8", fp8_dir}), 0);
    ServerProcess fp8;
    QVERIFY(fp8.Start(own.path(), {"--model", fp8_dir, "--disk-cache", "off"}));
    QCOMPARE(json::parse(fp8.Get("/health")->body)["weights"].get<std::string>(), std::string("fp8-e4m3 + bf16"));
    chat = fp8.Post("/v1/chat/completions", Chat("fp8 weights", 3).dump());
    QVERIFY(chat && chat->status == 200);
    fp8.Kill();

    // A scale of zero: the start fails and says which tensor.
    QFile checkpoint(fp8_dir + "/model.safetensors");
    QVERIFY(checkpoint.open(QIODevice::ReadWrite));
    const QByteArray bytes = checkpoint.readAll();
    const uint64_t header_size = *reinterpret_cast<const uint64_t*>(bytes.constData());
    const json header = json::parse(bytes.mid(8, static_cast<int>(header_size)).toStdString());
    const std::string scales = "model.layers.0.mlp.down_proj.weight_scale_inv";
    const int64_t offset = 8 + static_cast<int64_t>(header_size) + header[scales]["data_offsets"][0].get<int64_t>();
    QVERIFY(checkpoint.seek(offset));
    const float zero = 0.0f;
    QCOMPARE(checkpoint.write(reinterpret_cast<const char*>(&zero), 4), qint64(4));
    checkpoint.close();
    QProcess broken;
    broken.start(QString(ANCHORAGE_BINARY_DIR) + "/app/anchorage-server",
                 {"--data-dir", own.path(), "--model", fp8_dir, "--port", "0", "--disk-cache", "off"});
    QVERIFY(broken.waitForFinished(60000));
    QVERIFY(broken.exitCode() != 0);
    const QByteArray err = broken.readAllStandardError();
    QVERIFY2(err.contains("model.layers.0.mlp.down_proj.weight") && err.contains("positive"), err.constData());
  }

  void sigtermDrainsThenExits() {
    ServerProcess draining;
    QVERIFY(draining.Start(data_.path(), {}));
    std::atomic<bool> started{false};
    StreamResult stream;
    std::thread t([&] { stream = draining.Stream("/v1/chat/completions", Chat("long", 1500, true), [&](const json&) { started = true; return true; }); });
    while (!started) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    ::kill(static_cast<pid_t>(draining.process().processId()), SIGTERM);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    auto refused = draining.Post("/v1/chat/completions", Chat("late", 2).dump());
    t.join();
    QVERIFY2(stream.done_marker, "the request in flight did not finish");
    QCOMPARE(stream.events[stream.events.size() - 1]["choices"][0]["finish_reason"].get<std::string>(), std::string("length"));
    if (refused) QCOMPARE(refused->status, 503);  // or the socket was already closed
    QVERIFY(draining.process().waitForFinished(10000));
    QCOMPARE(draining.process().exitStatus(), QProcess::NormalExit);
    QCOMPARE(draining.process().exitCode(), 0);
  }
};

QTEST_GUILESS_MAIN(TestServer)
#include "test_server.moc"
