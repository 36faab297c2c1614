// The session spill through anchorage-server on the tiny model (64-token grid): a conversation's
// server stops with SIGTERM (the drain writes the resident conversation), the next server reads it
// back before its first request, and the next turn resumes where it would have and answers the
// same greedy tokens as a server that never stopped; the stats, /metrics and /health's day of
// writes show the spill, and clear?tier=spill empties it.
#include <QtTest>

#include <signal.h>

#include <filesystem>
#include <set>

#include "engine/core/file_util.h"
#include "tests/server/server_fixture.h"

using anchorage::testing::ServerProcess;
using json = nlohmann::json;

namespace {

std::string LongText() {
  std::string text = "Please keep these notes about spills, blocks and anchors in mind.";
  for (int i = 0; i < 160; ++i) text += " note" + std::to_string(i * 7919 % 1000) + " says block " + std::to_string(i);
  return text;
}

json Turn(const json& messages) { return {{"messages", messages}, {"max_tokens", 12}, {"temperature", 0}, {"session_id", "conv-1"}}; }

}  // namespace

class TestSpillServer : public QObject {
  Q_OBJECT

  static std::string Text(const json& reply) { return reply["choices"][0]["message"]["content"].get<std::string>(); }

 private slots:
  void drainAndRestartResumesTheConversation() {
    const json first = json::array({{{"role", "user"}, {"content", LongText()}}});
    // A server that never stops: the reference.
    QTemporaryDir never;
    QVERIFY(anchorage::testing::WriteSettingsWithoutDiskFloor(never.path()));
    ServerProcess reference;
    QVERIFY(reference.Start(never.path(), {"--grid", "64"}));
    const std::string reply1 = Text(reference.Chat(Turn(first)));
    json second = first;
    second.push_back({{"role", "assistant"}, {"content", reply1}});
    second.push_back({{"role", "user"}, {"content", "And which block comes last?"}});
    const json expected = reference.Chat(Turn(second));

    QTemporaryDir data;
    QVERIFY(anchorage::testing::WriteSettingsWithoutDiskFloor(data.path()));
    {
      ServerProcess a;
      QVERIFY(a.Start(data.path(), {"--grid", "64"}));
      QCOMPARE(Text(a.Chat(Turn(first))), reply1);
      ::kill(static_cast<pid_t>(a.process().processId()), SIGTERM);
      QVERIFY(a.process().waitForFinished(20000));
      QCOMPARE(a.process().exitCode(), 0);
    }
    const std::string sessions = data.filePath("cache/disk/sessions").toStdString();
    QVERIFY(std::filesystem::exists(sessions + "/resident.json"));
    ServerProcess b;
    QVERIFY(b.Start(data.path(), {"--grid", "64"}));
    const json got = b.Chat(Turn(second));
    QCOMPARE(got["usage"]["anchorage"]["cache_source"], expected["usage"]["anchorage"]["cache_source"]);
    QCOMPARE(got["usage"]["anchorage"]["cached_tokens"], expected["usage"]["anchorage"]["cached_tokens"]);
    QVERIFY(got["usage"]["anchorage"]["cached_tokens"].get<int64_t>() > 256);
    QCOMPARE(Text(got), Text(expected));
    const json spill = json::parse(b.Get("/v1/cache/stats")->body)["spill"];
    QVERIFY2(spill["open"].get<bool>() && spill["restores"].get<int64_t>() == 1, spill.dump().c_str());
    QCOMPARE(spill["entries"].get<int64_t>(), int64_t(1));
    QVERIFY(spill["list"][0]["tokens"].get<int64_t>() > 256);
    // Its session id, token counts and sizes, never the conversation's tokens or text.
    std::set<std::string> keys;
    for (const auto& [key, value] : spill["list"][0].items()) keys.insert(key);
    QCOMPARE(keys, std::set<std::string>({"tokens", "bytes", "raw_bytes", "end_length", "used_ms", "has_session", "session"}));
    QVERIFY(b.Get("/metrics")->body.find("anchorage_spill_restores_total 1\n") != std::string::npos);
    // The first server's drain counted toward the day's writes, kept across the restart.
    const json writes = json::parse(b.Get("/health")->body)["cache"]["disk_writes"];
    QCOMPARE(writes["level"].get<std::string>(), std::string("ok"));
    QVERIFY2(writes["today_gb"].get<double>() > 0, writes.dump().c_str());
    QCOMPARE(writes["budget_gb"].get<double>(), 200.0);  // GiB, as the settings count
    auto cleared = b.Post("/v1/cache/clear?tier=spill", "");
    QVERIFY(cleared && cleared->status == 200);
    QCOMPARE(json::parse(cleared->body)["stats"]["spill"]["entries"].get<int64_t>(), int64_t(0));
    QVERIFY(!b.Chat(Turn(first)).empty());
  }

  // A spilled conversation's title (the start of its first user message) goes to a caller the admin
  // token passes, never to one it does not: the stats route keeps conversation text from clients.
  void titlesGoToTheAdminTokenOnly() {
    QTemporaryDir data;
    QVERIFY(anchorage::testing::WriteSettingsWithoutDiskFloor(data.path()));
    const json first = json::array({{{"role", "system"}, {"content", "You keep notes."}}, {{"role", "user"}, {"content", LongText()}}});
    const QStringList flags{"--grid", "64", "--admin-token", "keeper"};
    {
      ServerProcess a;
      QVERIFY(a.Start(data.path(), flags));
      QVERIFY(a.Chat(Turn(first)).contains("choices"));
      ::kill(static_cast<pid_t>(a.process().processId()), SIGTERM);
      QVERIFY(a.process().waitForFinished(20000));
    }
    ServerProcess b;
    QVERIFY(b.Start(data.path(), flags));
    const auto stats = [&](const httplib::Headers& headers) {
      httplib::Client c("127.0.0.1", b.port());
      const auto r = c.Get("/v1/cache/stats", headers);
      return r && r->status == 200 ? json::parse(r->body)["spill"]["list"] : json();
    };
    const json client = stats({});
    QCOMPARE(client.size(), size_t(1));
    QVERIFY2(!client[0].contains("title"), client.dump().c_str());
    QVERIFY(stats({{"Authorization", "Bearer not-the-token"}})[0].is_object() && !stats({{"Authorization", "Bearer not-the-token"}})[0].contains("title"));
    const json admin = stats({{"Authorization", "Bearer keeper"}});
    QVERIFY2(admin[0]["title"].get<std::string>() == LongText().substr(0, 59) + "…", admin.dump().c_str());
  }

  // Two conversations on two slots when the server stops: the drain writes both, and after the
  // restart each resumes most of its prompt (one read back at the start, the other from the spill).
  void aDrainSpillsEverySlot() {
    QTemporaryDir data;
    QVERIFY(anchorage::testing::WriteSettingsWithoutDiskFloor(data.path()));
    auto turn = [](const json& messages, const std::string& session) {
      return json{{"messages", messages}, {"max_tokens", 12}, {"temperature", 0}, {"session_id", session}};
    };
    const json a = json::array({{{"role", "user"}, {"content", LongText()}}});
    const json b = json::array({{{"role", "user"}, {"content", "Other notes. " + LongText()}}});
    json a2 = a, b2 = b;
    {
      ServerProcess s;
      QVERIFY(s.Start(data.path(), {"--grid", "64", "--parallel", "2"}));
      const json ra = s.Chat(turn(a, "A")), rb = s.Chat(turn(b, "B"));
      QVERIFY(!ra.empty() && !rb.empty());
      const json slot_list = json::parse(s.Get("/health")->body)["slots"];
      QVERIFY2(slot_list[0]["requests"].get<int>() + slot_list[1]["requests"].get<int>() == 2, slot_list.dump().c_str());
      QVERIFY2(slot_list[0]["requests"].get<int>() == 1, slot_list.dump().c_str());  // one a slot
      a2.push_back({{"role", "assistant"}, {"content", Text(ra)}});
      a2.push_back({{"role", "user"}, {"content", "And which block comes last?"}});
      b2.push_back({{"role", "assistant"}, {"content", Text(rb)}});
      b2.push_back({{"role", "user"}, {"content", "And which block comes first?"}});
      ::kill(static_cast<pid_t>(s.process().processId()), SIGTERM);
      QVERIFY(s.process().waitForFinished(20000));
      QCOMPARE(s.process().exitCode(), 0);
    }
    ServerProcess s;
    QVERIFY(s.Start(data.path(), {"--grid", "64", "--parallel", "2"}));
    for (const auto& [messages, session] : {std::pair{a2, std::string("A")}, std::pair{b2, std::string("B")}}) {
      const json got = s.Chat(turn(messages, session));
      QVERIFY2(got["usage"]["anchorage"]["cached_tokens"].get<int64_t>() > 256, (session + ": " + got["usage"].dump()).c_str());
    }
  }

  // A conversation is drained with its end anchor; after the restart its next turn resumes at that
  // end, as on a server that never stopped, and answers the same logprobs: answers that close their
  // reasoning (the copies leave it out), and answers with thinking off (the copies leave the empty
  // think block out).
  void aDrainedConversationResumesAtItsEnd_data() {
    QTest::addColumn<bool>("thinking");
    QTest::newRow("reasoning closed") << true;
    QTest::newRow("thinking off") << false;
  }
  void aDrainedConversationResumesAtItsEnd() {
    QFETCH(bool, thinking);
    QTemporaryDir data, never;
    json replies = json::array();
    for (int t = 0; t < 4; ++t)
      replies.push_back({{"match", "TURN" + std::to_string(t) + "X"}, {"reply", LongText().substr(0, 200) + "\n</think>\n\nAnswer " + std::to_string(t)}});
    for (const QTemporaryDir* dir : {&data, &never}) {
      QVERIFY(anchorage::testing::WriteSettingsWithoutDiskFloor(dir->path()));
      QVERIFY(anchorage::WriteFileAtomic(dir->filePath("replies.json").toStdString(), replies.dump()).ok());
    }
    auto flags = [](const QTemporaryDir& dir) { return QStringList{"--grid", "64", "--test-replies", dir.filePath("replies.json")}; };
    auto turn = [&](ServerProcess& s, const json& messages) {
      json body = {{"messages", messages}, {"max_tokens", thinking ? 200 : 20}, {"temperature", 0}, {"logprobs", true}, {"session_id", "c"}};
      if (!thinking) body["chat_template_kwargs"] = {{"enable_thinking", false}};
      return s.Chat(body);
    };
    const std::string tag = thinking ? "TURN" : "PLAIN";  // only TURN<n>X is answered from the replies
    json messages = json::array({{{"role", "user"}, {"content", tag + "0X " + LongText() + LongText()}}});
    ServerProcess reference, a;
    QVERIFY(reference.Start(never.path(), flags(never)));
    QVERIFY(a.Start(data.path(), flags(data)));
    for (int t = 0; t < 3; ++t) {
      const json reply = turn(a, messages);
      if (thinking) QCOMPARE(reply["choices"][0]["finish_reason"].get<std::string>(), std::string("stop"));
      QCOMPARE(turn(reference, messages)["choices"][0]["message"], reply["choices"][0]["message"]);
      const json& assistant = reply["choices"][0]["message"];
      QCOMPARE(assistant.contains("reasoning_content"), thinking);
      messages.push_back(assistant);
      messages.push_back({{"role", "user"}, {"content", tag + std::to_string(t + 1) + "X " + LongText().substr(0, 400)}});
    }
    const int64_t end = json::parse(a.Get("/v1/cache/stats")->body)["end"]["length"].get<int64_t>();
    ::kill(static_cast<pid_t>(a.process().processId()), SIGTERM);
    QVERIFY(a.process().waitForFinished(20000));
    QCOMPARE(a.process().exitCode(), 0);
    ServerProcess b;
    QVERIFY(b.Start(data.path(), flags(data)));
    const json got = turn(b, messages), expected = turn(reference, messages);
    QCOMPARE(expected["usage"]["anchorage"]["cache_source"].get<std::string>(), std::string("end"));
    QCOMPARE(got["usage"]["anchorage"]["cache_source"].get<std::string>(), std::string("end"));
    QCOMPARE(got["usage"]["anchorage"]["cached_tokens"].get<int64_t>(), end);
    QCOMPARE(got["usage"]["anchorage"]["cached_tokens"], expected["usage"]["anchorage"]["cached_tokens"]);
    QVERIFY(got["choices"][0]["logprobs"]["content"].size() > 0);
    QCOMPARE(got["choices"][0]["logprobs"], expected["choices"][0]["logprobs"]);
  }
};

QTEST_MAIN(TestSpillServer)
#include "test_spill_server.moc"
