// A real coding agent against anchorage-server on the tiny model: Qwen Code (npm
// @qwen-code/qwen-code, the `qwen` CLI) in non-interactive mode lists a folder, reads a file and
// answers, three requests with scripted replies (the test-reply knob). Every request succeeds,
// both tool calls round-trip through the CLI's own tools, and turns 2 and 3 resume at the end anchor.
#include <QDir>
#include <QFile>
#include <QProcess>
#include <QProcessEnvironment>
#include <QTemporaryDir>
#include <QtTest>

#include <algorithm>
#include <fstream>

#include "tests/server/server_fixture.h"

using json = nlohmann::json;
using anchorage::testing::ServerProcess;

class TestAgentClient : public QObject {
  Q_OBJECT

 private slots:
  void qwenCodeListsReadsAndAnswers() {
    const QString cli = QString(ANCHORAGE_SOURCE_DIR) + "/tests/tools/agent/node_modules/@qwen-code/qwen-code/cli.js";
    QVERIFY2(QFile::exists(cli), "tests/tools/agent/node_modules is missing Qwen Code: run the test setup (packaging/test.sh installs it)");
    QProcess version;
    version.start("node", {"--version"});
    QVERIFY2(version.waitForFinished(10000), "node is not installed: run packaging/setup.sh");
    const QString node = QString::fromLatin1(version.readAllStandardOutput()).trimmed();
    if (node.mid(1).section('.', 0, 0).toInt() < 20) QSKIP(qPrintable("Qwen Code 0.15 needs Node.js 20 or newer; this machine has " + node));
    QTemporaryDir data, home, work;
    QVERIFY(data.isValid() && home.isValid() && work.isValid());
    const std::string folder = QDir(work.path()).canonicalPath().toStdString();
    {
      QFile notes(work.filePath("notes.txt"));
      QVERIFY(notes.open(QIODevice::WriteOnly));
      notes.write("The secret word is PINEAPPLE-42.\n");
    }
    // The newest user turn picks the reply: the prompt, then the listing (a tool result), then the file.
    const json replies = json::array({
        {{"match", "PINEAPPLE-42"}, {"reply", "The file holds the word.\n</think>\n\nThe secret word is PINEAPPLE-42."}},
        {{"match", "notes.txt"},
         {"reply", "One file; I read it.\n</think>\n\n<tool_call>\n<function=read_file>\n<parameter=file_path>\n" + folder +
                       "/notes.txt\n</parameter>\n</function>\n</tool_call>"}},
        {{"match", "ANCHORAGE-AGENT-TEST"},
         {"reply", "I list the folder first.\n</think>\n\n<tool_call>\n<function=list_directory>\n<parameter=path>\n" + folder +
                       "\n</parameter>\n</function>\n</tool_call>"}},
    });
    std::ofstream(data.filePath("replies.json").toStdString()) << replies.dump();
    ServerProcess server;
    QVERIFY(server.Start(data.path(), {"--test-replies", data.filePath("replies.json")}));

    // Everything off that would reach past the endpoint: usage statistics, telemetry, updates, the IDE, MCP, the web.
    const json settings = {
        {"security", {{"auth", {{"selectedType", "openai"}}}}},
        {"model", {{"name", "tiny-seed0"}, {"skipNextSpeakerCheck", true}, {"skipLoopDetection", true}}},
        {"privacy", {{"usageStatisticsEnabled", false}}},
        {"telemetry", {{"enabled", false}, {"logPrompts", false}}},
        {"general", {{"enableAutoUpdate", false}, {"chatRecording", false}}},
        {"ide", {{"enabled", false}}},
        {"tools", {{"approvalMode", "yolo"}, {"exclude", {"web_fetch"}}}},
        {"mcpServers", json::object()},
    };
    QVERIFY(QDir(home.path()).mkpath(".qwen"));
    std::ofstream(home.filePath(".qwen/settings.json").toStdString()) << settings.dump(2);

    QProcessEnvironment env;
    env.insert("PATH", qEnvironmentVariable("PATH"));
    env.insert("HOME", home.path());
    env.insert("OPENAI_BASE_URL", QString::fromStdString(server.base_url() + "/v1"));
    env.insert("OPENAI_API_KEY", "sk-anchorage-test");
    env.insert("OPENAI_MODEL", "tiny-seed0");
    env.insert("QWEN_CODE_NO_RELAUNCH", "1");
    env.insert("QWEN_CODE_DISABLE_PRECONNECT", "1");
    env.insert("QWEN_DISABLE_AUTO_TITLE", "1");
    env.insert("NO_BROWSER", "1");
    QProcess agent;
    agent.setProcessEnvironment(env);
    agent.setWorkingDirectory(QString::fromStdString(folder));
    agent.setStandardInputFile(QProcess::nullDevice());
    agent.start("node", {cli, "--yolo", "-p", QString("ANCHORAGE-AGENT-TEST: find the secret word in the files of %1.").arg(QString::fromStdString(folder))});
    QVERIFY2(agent.waitForStarted(10000), "node is not installed: run packaging/setup.sh");
    const bool finished = agent.waitForFinished(300000);
    const QByteArray out = agent.readAllStandardOutput();
    const QByteArray err = agent.readAllStandardError();
    QVERIFY2(finished, err.constData());
    QVERIFY2(agent.exitCode() == 0, (out + err).constData());
    QVERIFY2(out.contains("The secret word is PINEAPPLE-42."), (out + err).constData());

    json rows;  // the journal writes in the background
    auto journaled = [&] {
      auto page = server.Get("/v1/journal?kind=request&limit=10");
      rows = page && page->status == 200 ? json::parse(page->body)["rows"] : json::array();
      return rows.size() >= 3;
    };
    QTRY_VERIFY_WITH_TIMEOUT(journaled(), 5000);
    QCOMPARE(rows.size(), size_t(3));
    std::reverse(rows.begin(), rows.end());  // oldest first
    for (const json& row : rows) {
      qInfo("%s: %lld prompt tokens, %lld cached from %s, TTFT %.1f ms", row["finish_reason"].get<std::string>().c_str(),
            static_cast<long long>(row["prompt_tokens"].get<int64_t>()), static_cast<long long>(row["cached_tokens"].get<int64_t>()),
            row["cache_source"].get<std::string>().c_str(), row["ttft_ms"].get<double>());
      QCOMPARE(row["status"].get<int>(), 200);
      QCOMPARE(QString::fromStdString(row["route"].get<std::string>()), QString("/v1/chat/completions"));
    }
    QCOMPARE(QString::fromStdString(rows[0]["cache_source"].get<std::string>()), QString("cold"));
    QCOMPARE(QString::fromStdString(rows[0]["finish_reason"].get<std::string>()), QString("tool_calls"));
    QCOMPARE(QString::fromStdString(rows[1]["finish_reason"].get<std::string>()), QString("tool_calls"));
    QCOMPARE(QString::fromStdString(rows[2]["finish_reason"].get<std::string>()), QString("stop"));
    for (int turn : {1, 2}) {
      QVERIFY2(rows[turn]["cache_source"] == "end", rows[turn].dump().c_str());
      QVERIFY2(rows[turn]["cached_tokens"].get<int64_t>() > rows[0]["prompt_tokens"].get<int64_t>(), rows[turn].dump().c_str());
    }
  }
};

QTEST_MAIN(TestAgentClient)
#include "test_agent_client.moc"
