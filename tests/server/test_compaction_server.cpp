// Compaction served as a continuation through anchorage-server on the tiny model: opencode's
// compaction request of a conversation the engine holds resumes at its end anchor and reads only the
// new turn, with usage speaking of the client's prompt; the guard serves it as sent for another
// conversation's history, for a record that already holds the instructions, and with
// compaction.mode client; the continuation written ahead in idle time answers the request (compaction.prepare).
#include <QtTest>

#include "tests/server/server_fixture.h"

using anchorage::testing::ServerProcess;
using json = nlohmann::json;

namespace {

const char* kFirst = "Please refactor the parser module and keep the tests green.";
const char* kSecond = "Now rename the lexer to scanner everywhere.";

json Compaction(const std::string& session, const std::string& first, const std::string& last) {
  const std::string history = "Here is the conversation so far:\n<conversation>\n[User]: " + first + "\n[Assistant]: Done.\n[User]: " + last +
                              "\n[Assistant]: Renamed.\n</conversation>\nProvide a detailed summary of the conversation above.";
  return {{"messages", {{{"role", "system"}, {"content", "You summarize coding sessions for the next agent."}}, {{"role", "user"}, {"content", history}}}},
          {"max_tokens", 16}, {"temperature", 0}, {"session_id", session}};
}

}  // namespace

class TestCompactionServer : public QObject {
  Q_OBJECT
  QTemporaryDir data_;
  ServerProcess server_;
  int64_t conversation_end_ = 0;  // the end anchor's length after the last Converse

  json Post(const json& body) {
    auto r = server_.Post("/v1/chat/completions", body.dump());
    if (r && r->status != 200) qWarning("%d %s", r->status, r->body.c_str());
    return r && r->status == 200 ? json::parse(r->body) : json();
  }
  // Two turns of a conversation in session.
  void Converse(const std::string& session, const std::string& first = kFirst) {
    json messages = json::array({{{"role", "user"}, {"content", first}}});
    const json one = Post({{"messages", messages}, {"max_tokens", 12}, {"temperature", 0}, {"session_id", session}});
    QVERIFY(!one.is_null());
    messages.push_back(one["choices"][0]["message"]);
    messages.push_back({{"role", "user"}, {"content", kSecond}});
    QVERIFY(!Post({{"messages", messages}, {"max_tokens", 12}, {"temperature", 0}, {"session_id", session}}).is_null());
    conversation_end_ = json::parse(server_.Get("/v1/cache/stats")->body)["end"]["length"].get<int64_t>();
  }
  static std::string Source(const json& reply) { return reply["usage"]["anchorage"]["cache_source"].get<std::string>(); }

 private slots:
  void initTestCase() { QVERIFY(server_.Start(data_.path(), {"--grid", "64"})); }

  void servedAsTheContinuation() {
    Converse("c1");
    const json as_sent = Post(Compaction("nobody", kFirst, kSecond));  // no conversation held: as sent (c1 is parked)
    QVERIFY(Source(as_sent) != "continuation");
    const json cont = Post(Compaction("c1", kFirst, kSecond));  // c1's rows come back from the park
    QCOMPARE(Source(cont), std::string("continuation"));
    const json& usage = cont["usage"];
    QCOMPARE(usage["prompt_tokens"], as_sent["usage"]["prompt_tokens"]);  // the client's prompt
    const int64_t reread = usage["anchorage"]["reread_tokens"].get<int64_t>();
    QVERIFY2(reread > 0 && reread < as_sent["usage"]["anchorage"]["reread_tokens"].get<int64_t>() / 2, usage.dump().c_str());
    // usage's cached_tokens is the client's prompt less what was forwarded; the anchorage block counts
    // the served prompt (the conversation's record and the instruction turn), resumed at its end anchor.
    QCOMPARE(usage["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), usage["prompt_tokens"].get<int64_t>() - reread);
    const int64_t served = usage["anchorage"]["served_prompt_tokens"].get<int64_t>();
    QCOMPARE(usage["anchorage"]["cached_tokens"].get<int64_t>() + reread, served);
    QCOMPARE(usage["anchorage"]["cached_tokens"].get<int64_t>(), conversation_end_);
    QVERIFY(!cont["choices"][0]["message"]["content"].is_null());
    // The record now holds these instructions: a second compaction is served as sent.
    QVERIFY(Source(Post(Compaction("c1", kFirst, kSecond))) != "continuation");
  }

  void theGuardServesOthersAsSent() {
    Converse("c2");
    QVERIFY(Source(Post(Compaction("c2", "A first line this conversation never had.", kSecond))) != "continuation");
    Converse("c3");
    QVERIFY(Source(Post(Compaction("c3", kFirst, "A last line it never had either."))) != "continuation");
    // Not a compaction's shape: served as sent.
    json plain = Compaction("c3", kFirst, kSecond);
    plain["messages"][1]["content"] = "Summarize what we did.";
    QVERIFY(Source(Post(plain)) != "continuation");
  }

  void clientModeServesAsSent() {
    json settings = json::parse(server_.Get("/v1/settings")->body);
    settings["compaction"]["mode"] = "client";
    QVERIFY(server_.Put("/v1/settings", settings.dump())->status == 200);
    Converse("c4");
    QVERIFY(Source(Post(Compaction("c4", kFirst, kSecond))) != "continuation");
    settings = json::parse(server_.Get("/v1/settings")->body);
    settings["compaction"]["mode"] = "continuation";
    QVERIFY(server_.Put("/v1/settings", settings.dump())->status == 200);
    Converse("c5");
    QCOMPARE(Source(Post(Compaction("c5", kFirst, kSecond))), std::string("continuation"));
  }

  // A conversation the engine holds only in the session spill: served as its continuation too (the
  // record comes from the spill entry; the prefill resumes where the tiers hold it).
  void spilledConversationServedAsItsContinuation() {
    Converse("s0");
    const json resident = Post(Compaction("s0", kFirst, kSecond));
    QCOMPARE(Source(resident), std::string("continuation"));
    json settings = json::parse(server_.Get("/v1/settings")->body);
    settings["resident"]["park_gb"] = 0;  // a switch of sessions spills the one it replaces
    settings["resident"]["guest_max_tokens"] = 0;  // (no turn is a guest beside it)
    settings["spill"]["min_tokens"] = 0;
    settings["disk_cache"]["min_free_gb"] = 0;
    settings["state_store"]["enabled"] = false;  // (nor kept in the state store)
    QVERIFY(server_.Put("/v1/settings", settings.dump())->status == 200);
    auto spill_saves = [&] { return json::parse(server_.Get("/v1/cache/stats")->body)["spill"]["saves"].get<int64_t>(); };
    const int64_t saves_before = spill_saves();
    Converse("s1");
    Converse("s2", "Something else entirely: list the open pull requests.");  // s1 goes to the spill (its list names no sessions)
    QVERIFY(spill_saves() > saves_before);
    const json got = Post(Compaction("s1", kFirst, kSecond));
    QCOMPARE(Source(got), std::string("continuation"));
    QCOMPARE(got["usage"]["prompt_tokens"], resident["usage"]["prompt_tokens"]);
    QVERIFY(got["usage"]["anchorage"]["cached_tokens"].get<int64_t>() > 0);
    QVERIFY(!got["choices"][0]["message"]["content"].is_null());
    settings = json::parse(server_.Get("/v1/settings")->body);
    settings["resident"]["park_gb"] = 4;
    settings["resident"]["guest_max_tokens"] = 8192;
    settings["state_store"]["enabled"] = true;
    QVERIFY(server_.Put("/v1/settings", settings.dump())->status == 200);
  }

  // compaction.prepare: after idle_s without a request, the resident conversation's continuation
  // is written ahead with the last compaction request's instructions; that request is then answered
  // from it with the live continuation's answer.
  void writtenAheadWhileIdle() {
    Converse("w1");
    const json live = Post(Compaction("w1", kFirst, kSecond));  // teaches the instructions
    QCOMPARE(Source(live), std::string("continuation"));
    Converse("w2");  // the same turns: the same record as w1's
    // Only now short enough to write ahead: never between w2's two turns.
    json settings = json::parse(server_.Get("/v1/settings")->body);
    settings["compaction"]["idle_s"] = 0.2;
    settings["compaction"]["min_tokens"] = 1;
    QVERIFY(server_.Put("/v1/settings", settings.dump())->status == 200);
    auto prepared_for = [&](const std::string& session, int tries) {
      for (int i = 0; i < tries; ++i) {
        const json stats = json::parse(server_.Get("/v1/cache/stats")->body);
        if (stats["prepared"]["entries"] == 1 && stats["prepared"]["session"] == session) return true;
        QTest::qWait(100);
      }
      return false;
    };
    QVERIFY2(prepared_for("w2", 150), server_.Get("/v1/cache/stats")->body.c_str());
    const json answered = Post(Compaction("w2", kFirst, kSecond));
    QCOMPARE(Source(answered), std::string("prepared"));
    QCOMPARE(answered["choices"][0]["message"], live["choices"][0]["message"]);
    QCOMPARE(answered["choices"][0]["finish_reason"], live["choices"][0]["finish_reason"]);
    QCOMPARE(answered["usage"]["prompt_tokens"], live["usage"]["prompt_tokens"]);
    QCOMPARE(answered["usage"]["completion_tokens"], live["usage"]["completion_tokens"]);
    QCOMPARE(answered["usage"]["anchorage"]["reread_tokens"].get<int64_t>(), int64_t(0));
    QVERIFY(server_.Post("/v1/cache/clear?tier=prepared", "")->status == 200);
    QCOMPARE(json::parse(server_.Get("/v1/cache/stats")->body)["prepared"]["entries"].get<int64_t>(), int64_t(0));
    // compaction.prepare off: nothing is written ahead.
    settings = json::parse(server_.Get("/v1/settings")->body);
    settings["compaction"]["prepare"] = "off";
    QVERIFY(server_.Put("/v1/settings", settings.dump())->status == 200);
    Converse("w3");
    QVERIFY(!prepared_for("w3", 15));  // 1.5 s: over seven idle periods
    QCOMPARE(Source(Post(Compaction("w3", kFirst, kSecond))), std::string("continuation"));
  }
};

QTEST_MAIN(TestCompactionServer)
#include "test_compaction_server.moc"
