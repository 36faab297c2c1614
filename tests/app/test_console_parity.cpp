// The endpoint the console serves answers the same greedy tokens and logprobs as anchorage-server.
#include <QSignalSpy>
#include <QTemporaryDir>
#include <QtTest>

#include "app/engine_host.h"
#include "tests/server/server_fixture.h"

class TestConsoleParity : public QObject {
  Q_OBJECT

 private slots:
  void sameGreedyTokensAsTheServer() {
    QTemporaryDir serverDir, consoleDir;
    QVERIFY(serverDir.isValid() && consoleDir.isValid());
    anchorage::testing::ServerProcess server;
    QVERIFY(server.Start(serverDir.path(), {"--grid", "64"}));

    const std::string dir = consoleDir.path().toStdString();
    std::vector<std::string> words = {"anchorage", "--data-dir", dir, "--port", "0", "--grid", "64", "--threads", "1"};
    std::vector<char*> argv;
    for (auto& w : words) argv.push_back(w.data());
    auto config = anchorage::ParseServerCommandLine(static_cast<int>(argv.size()), argv.data());
    QVERIFY(config.ok());
    EngineHost host(*config);
    QSignalSpy ready(&host, &EngineHost::ready);
    host.start();
    QVERIFY(ready.wait(120000));
    const QUrl url(ready[0][0].toString());
    QCOMPARE(url.host(), QString("127.0.0.1"));

    const nlohmann::json body = {{"messages", {{{"role", "user"}, {"content", "Tell me about anchors and grids."}}}},
                                 {"temperature", 0}, {"max_tokens", 16}, {"logprobs", true}, {"top_logprobs", 2}};
    auto fromServer = server.Post("/v1/chat/completions", body.dump());
    httplib::Client client("127.0.0.1", url.port());
    client.set_read_timeout(60, 0);
    auto fromConsole = client.Post("/v1/chat/completions", body.dump(), "application/json");
    QVERIFY(fromServer && fromConsole);
    QCOMPARE(fromServer->status, 200);
    QCOMPARE(fromConsole->status, 200);
    const nlohmann::json a = nlohmann::json::parse(fromServer->body);
    const nlohmann::json b = nlohmann::json::parse(fromConsole->body);
    const nlohmann::json& la = a["choices"][0]["logprobs"]["content"];
    const nlohmann::json& lb = b["choices"][0]["logprobs"]["content"];
    QVERIFY(la.is_array() && !la.empty());
    QCOMPARE(la.size(), lb.size());
    QCOMPARE(a["usage"]["completion_tokens"].get<int>(), 16);
    for (size_t i = 0; i < la.size(); ++i) {
      QCOMPARE(QString::fromStdString(lb[i]["token"].get<std::string>()), QString::fromStdString(la[i]["token"].get<std::string>()));
      // Same model, same kernels, same grid: the same bits, so the printed logprobs are equal.
      QCOMPARE(lb[i]["logprob"].get<double>(), la[i]["logprob"].get<double>());
      QCOMPARE(lb[i]["top_logprobs"].dump(), la[i]["top_logprobs"].dump());
    }
    QCOMPARE(QString::fromStdString(b["choices"][0]["message"].dump()), QString::fromStdString(a["choices"][0]["message"].dump()));
    QCOMPARE(b["usage"]["prompt_tokens"], a["usage"]["prompt_tokens"]);

    host.drain();
    QVERIFY(host.wait(30000));
  }
};

QTEST_MAIN(TestConsoleParity)
#include "test_console_parity.moc"
