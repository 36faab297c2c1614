// Every way a state resumes, walked through anchorage-server on the tiny model (64-token grid) for one
// configuration (a K/V dtype, a precision): the end anchor, another session's grid anchor and the spill after a
// planned stop each answer the tokens and logprobs of a cold server of that configuration, and a server of
// another configuration on the same folders reads none of its files (another fingerprint: swept and counted).
#pragma once

#include <QtTest>

#include <functional>

#include "tests/server/server_fixture.h"

namespace anchorage::testing {

inline std::string NotesAboutRows(int seed) {
  std::string text = "Keep these notes about rows and anchors in mind.";
  for (int i = 0; i < 150; ++i) text += " note" + std::to_string((i * 7919 + seed) % 1000) + " says row " + std::to_string(i);
  return text;
}

// A greedy turn of 10 tokens with their logprobs.
inline nlohmann::json LogprobTurn(const nlohmann::json& messages, const std::string& session) {
  return {{"messages", messages}, {"max_tokens", 10}, {"temperature", 0}, {"logprobs", true}, {"top_logprobs", 2}, {"session_id", session}};
}

inline nlohmann::json CacheStats(ServerProcess& s) { return nlohmann::json::parse(s.Get("/v1/cache/stats")->body); }

struct ResumeWalk {
  QStringList flags;          // the configuration walked
  QStringList restart_flags;  // the same configuration as its next start names it
  QStringList other_flags;    // another configuration, whose answers and fingerprint differ
  ServerProcess* cold = nullptr;        // the configuration with every cache off
  ServerProcess* other_cold = nullptr;  // the other configuration with every cache off
  std::function<void(ServerProcess&)> while_running;  // more checks on the first server, after its resumes
};

// QVERIFY and QCOMPARE return from here on a failure; the calling test fails with it.
inline void WalkResumes(const ResumeWalk& w) {
  using nlohmann::json;
  QTemporaryDir data;
  QVERIFY(WriteSettingsWithoutDiskFloor(data.path()));
  const json first = json::array({{{"role", "system"}, {"content", NotesAboutRows(1)}}, {{"role", "user"}, {"content", "Which row comes first?"}}});
  json second = first, third;
  {
    ServerProcess s;
    QVERIFY(s.Start(data.path(), w.flags));
    QVERIFY(json::parse(s.Get("/health")->body)["state_fingerprint"] != json::parse(w.other_cold->Get("/health")->body)["state_fingerprint"]);
    const json r1 = s.Chat(LogprobTurn(first, "A"));
    QCOMPARE(AnswerLogprobs(r1), AnswerLogprobs(w.cold->Chat(LogprobTurn(first, "cold"))));
    QVERIFY2(AnswerLogprobs(r1) != AnswerLogprobs(w.other_cold->Chat(LogprobTurn(first, "cold"))), "the other configuration's logprobs");
    // A follow-up resumes at A's end anchor.
    second.push_back({{"role", "assistant"}, {"content", AnswerText(r1)}});
    second.push_back({{"role", "user"}, {"content", "And which comes last?"}});
    const json r2 = s.Chat(LogprobTurn(second, "A"));
    QVERIFY2(CachedTokens(r2) > r1["usage"]["prompt_tokens"].get<int64_t>() - 64, r2["usage"].dump().c_str());
    QCOMPARE(AnswerLogprobs(r2), AnswerLogprobs(w.cold->Chat(LogprobTurn(second, "cold"))));
    // Another session with the same notes resumes at a grid anchor of A's rows.
    const json other = json::array({{{"role", "system"}, {"content", NotesAboutRows(1)}}, {{"role", "user"}, {"content", "Name a middle row."}}});
    const json rb = s.Chat(LogprobTurn(other, "B"));
    QVERIFY2(CachedTokens(rb) >= 512, rb["usage"].dump().c_str());
    QCOMPARE(AnswerLogprobs(rb), AnswerLogprobs(w.cold->Chat(LogprobTurn(other, "cold"))));
    if (w.while_running) {
      w.while_running(s);
      if (QTest::currentTestFailed()) return;
    }
    // Back to A, then a planned stop: the drain spills A's rows.
    QVERIFY(s.Chat(LogprobTurn(second, "A")).is_object());
    third = second;
    third.push_back({{"role", "assistant"}, {"content", AnswerText(r2)}});
    third.push_back({{"role", "user"}, {"content", "Now count them."}});
    QVERIFY(s.Terminate());
  }
  {
    ServerProcess s;
    QVERIFY(s.Start(data.path(), w.restart_flags));
    const json r3 = s.Chat(LogprobTurn(third, "A"));
    QVERIFY2(CachedTokens(r3) > 256, r3["usage"].dump().c_str());
    QCOMPARE(CacheStats(s)["spill"]["restores"].get<int64_t>(), int64_t(1));
    QCOMPARE(AnswerLogprobs(r3), AnswerLogprobs(w.cold->Chat(LogprobTurn(third, "cold"))));
    QVERIFY(s.Terminate());
  }
  // A server of the other configuration on the same folders: the files are another fingerprint's, never read.
  ServerProcess s;
  QVERIFY(s.Start(data.path(), w.other_flags));
  const json before = CacheStats(s);
  QVERIFY2(before["spill"]["swept"].get<int64_t>() > 0, before["spill"].dump().c_str());
  QCOMPARE(before["spill"]["entries"].get<int64_t>(), int64_t(0));
  const json r = s.Chat(LogprobTurn(third, "A"));
  QCOMPARE(CachedTokens(r), int64_t(0));
  QCOMPARE(AnswerLogprobs(r), AnswerLogprobs(w.other_cold->Chat(LogprobTurn(third, "cold"))));
  const json after = CacheStats(s);
  QCOMPARE(after["spill"]["restores"].get<int64_t>(), int64_t(0));
  QCOMPARE(after["disk"]["restores"].get<int64_t>(), int64_t(0));
}

}  // namespace anchorage::testing
