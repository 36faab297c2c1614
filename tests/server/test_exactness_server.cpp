// The resident prefix's promises seen from outside, through anchorage-server on the tiny model
// (64-token grid): a resume is a cold prefill's bits (logprobs equal a cold server's), a refused
// request leaves every tier as it was, prompts over the context are refused at once, and an agent
// session's follow-ups resume at the end anchor re-reading no more than the prompt grew.
#include <QtTest>

#include <algorithm>
#include <random>

#include "engine/core/file_util.h"
#include "tests/server/server_fixture.h"

using anchorage::testing::ServerProcess;
using json = nlohmann::json;

namespace {

std::vector<int32_t> Ids(uint32_t seed, size_t n) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> id(20, 600);
  std::vector<int32_t> out(n);
  for (int32_t& x : out) x = id(gen);
  return out;
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

json Completion(const std::vector<int32_t>& ids, int max_tokens, const std::string& session) {
  return {{"prompt", ids}, {"max_tokens", max_tokens}, {"temperature", 0}, {"logprobs", 1}, {"session_id", session}};
}

std::string Words(int n, int seed) {
  static const char* kWords[] = {"alpha", "beta", "gamma", "delta", "grid", "state", "anchor", "rows"};
  std::string s;
  for (int i = 0; i < n; ++i) s += std::string(kWords[(i * 7 + seed) % 8]) + " ";
  return s;
}

}  // namespace

class TestExactnessServer : public QObject {
  Q_OBJECT

  QTemporaryDir data_, cold_data_;
  ServerProcess server_, cold_;

  json Post(ServerProcess& s, const std::string& path, const json& body) {
    auto r = s.Post(path, body.dump());
    if (!r) return {{"status", 0}};
    json out = json::parse(r->body, nullptr, false);
    if (out.is_object()) out["status"] = r->status;
    return out;
  }
  // The answer's tokens and logprobs, which a cold server's must equal bit for bit.
  static json Logprobs(const json& reply) { return reply["choices"][0]["logprobs"]; }
  static int64_t Cached(const json& reply) { return reply["usage"]["anchorage"]["cached_tokens"].get<int64_t>(); }

 private slots:
  void initTestCase() {
    QVERIFY(anchorage::testing::WriteSettingsWithoutDiskFloor(data_.path()));
    QVERIFY(anchorage::testing::WriteSettingsWithoutDiskFloor(cold_data_.path()));
    QVERIFY(server_.Start(data_.path(), {"--grid", "64", "--ctx", "8192"}));
    QVERIFY(cold_.Start(cold_data_.path(), {"--grid", "64", "--ctx", "8192"}));
  }

  // Session A's end anchor at 501 forwarded nothing; its longer prompt must not resume off the
  // 64-lines there, or the lines it computes would be offered to B as a cold prefill's.
  void noStateAboveAnOffLineResumeIsServedAsExact() {
    QVERIFY(server_.Post("/v1/cache/clear?tier=all", "")->status == 200);
    const std::vector<int32_t> head = Ids(1, 501), more = Ids(2, 1200), others = Ids(3, 150);
    const json a1 = Post(server_, "/v1/completions", Completion(head, 1, "A"));
    QCOMPARE(a1["status"].get<int>(), 200);
    const std::vector<int32_t> a2_ids = Concat(head, more);
    const json a2 = Post(server_, "/v1/completions", Completion(a2_ids, 1, "A"));
    QCOMPARE(a2["status"].get<int>(), 200);
    QCOMPARE(Logprobs(a2), Logprobs(Post(cold_, "/v1/completions", Completion(a2_ids, 1, "cold-a2"))));
    const std::vector<int32_t> b_ids = Concat(Concat(head, std::vector<int32_t>(more.begin(), more.begin() + 1000)), others);
    const json b = Post(server_, "/v1/completions", Completion(b_ids, 4, "B"));
    QCOMPARE(b["status"].get<int>(), 200);
    QVERIFY2(Cached(b) > 501, b["usage"].dump().c_str());  // it still resumes above the old end, on a cold prefill's line
    QVERIFY(cold_.Post("/v1/cache/clear?tier=all", "")->status == 200);
    const json cold_b = Post(cold_, "/v1/completions", Completion(b_ids, 4, "cold-b"));
    QCOMPARE(Cached(cold_b), int64_t(0));
    QCOMPARE(Logprobs(b), Logprobs(cold_b));
  }
  // A request refused for memory (the ceiling and the prefill peak lowered through the settings)
  // leaves every tier as it was, and the next turn, with the settings restored, resumes at its end.
  void aRefusalChangesNoTier() {
    QVERIFY(server_.Post("/v1/cache/clear?tier=all", "")->status == 200);
    json messages = json::array({{{"role", "user"}, {"content", Words(800, 1)}}});
    const json no_thinking = {{"enable_thinking", false}};  // a reply cut inside its reasoning would not resume at its end
    const json first = server_.Chat({{"messages", messages}, {"max_tokens", 20}, {"temperature", 0}, {"session_id", "s"}, {"chat_template_kwargs", no_thinking}});
    QVERIFY(!first.empty());
    messages.push_back({{"role", "assistant"}, {"content", first["choices"][0]["message"]["content"]}});
    const json settings = json::parse(server_.Get("/v1/settings")->body);
    json low = settings;
    low["memory"]["ceiling_gb"] = 0.0001;
    low["memory"]["prefill_peak_gb"] = 0.0001;
    auto put = server_.Put("/v1/settings", low.dump());
    QVERIFY2(put && put->status == 200, put ? put->body.c_str() : "no answer");
    auto tiers = [&] {
      const json stats = json::parse(server_.Get("/v1/cache/stats")->body);
      json out;
      for (const char* tier : {"anchors", "end", "park", "pin", "store", "resident"}) out[tier] = stats[tier];
      return out;
    };
    const json before = tiers();
    json big = messages;
    big.push_back({{"role", "user"}, {"content", Words(1500, 2)}});
    auto refused = server_.Post("/v1/chat/completions", json{{"messages", big}, {"max_tokens", 5}, {"session_id", "s"}}.dump());
    QVERIFY(refused);
    QCOMPARE(refused->status, 503);
    QCOMPARE(json::parse(refused->body)["error"]["code"].get<std::string>(), std::string("memory_exhausted"));
    QCOMPARE(tiers(), before);
    json restored = json::parse(server_.Get("/v1/settings")->body);
    restored["memory"] = settings["memory"];
    put = server_.Put("/v1/settings", restored.dump());
    QVERIFY2(put && put->status == 200, put ? put->body.c_str() : "no answer");
    messages.push_back({{"role", "user"}, {"content", "and then?"}});
    const json next = server_.Chat({{"messages", messages}, {"max_tokens", 5}, {"temperature", 0}, {"session_id", "s"}, {"chat_template_kwargs", no_thinking}});
    QCOMPARE(next["usage"]["anchorage"]["cache_source"].get<std::string>(), std::string("end"));
    QCOMPARE(next["usage"]["anchorage"]["cached_tokens"].get<int64_t>(), before["end"]["length"].get<int64_t>());
  }
  // A prompt over the context is an immediate 400 in the OpenAI shape naming its length and the
  // context, on both routes, streamed or not; the server serves on.
  void promptsOverTheContextAreRefusedAtOnce() {
    auto check = [&](const std::string& path, const json& body, const std::string& param) {
      QElapsedTimer timer;
      timer.start();
      auto r = server_.Post(path, body.dump());
      QVERIFY(r);
      QVERIFY2(timer.elapsed() < 10000, "the refusal took long");
      QCOMPARE(r->status, 400);
      const json error = json::parse(r->body)["error"];
      QCOMPARE(error["code"].get<std::string>(), std::string("context_length_exceeded"));
      QCOMPARE(error["type"].get<std::string>(), std::string("invalid_request_error"));
      QCOMPARE(error["param"].get<std::string>(), param);
      const std::string message = error["message"].get<std::string>();
      QVERIFY2(message.find("8192 tokens") != std::string::npos && message.find("holds") != std::string::npos, message.c_str());
    };
    const json messages = json::array({{{"role", "user"}, {"content", Words(6000, 3)}}});
    check("/v1/chat/completions", {{"messages", messages}, {"max_tokens", 4}}, "messages");
    check("/v1/chat/completions", {{"messages", messages}, {"max_tokens", 4}, {"stream", true}}, "messages");
    check("/v1/completions", {{"prompt", Ids(4, 9000)}, {"max_tokens", 200}}, "prompt");
    check("/v1/completions", {{"prompt", Ids(4, 8192)}, {"max_tokens", 1}, {"stream", true}}, "prompt");
    QVERIFY(!server_.Chat({{"messages", json::array({{{"role", "user"}, {"content", "still there?"}}})}, {"max_tokens", 2}}).empty());
  }

  // A context past the model's positions is refused at start, naming both.
  void aContextPastTheModelIsRefusedAtStart() {
    QProcess p;
    p.start(QString(ANCHORAGE_BINARY_DIR) + "/app/anchorage-server", {"--data-dir", data_.path(), "--port", "0", "--ctx", "300000"});
    QVERIFY(p.waitForFinished(60000));
    QVERIFY(p.exitCode() != 0);
    const QString err = QString::fromUtf8(p.readAllStandardError());
    QVERIFY2(err.contains("--ctx 300000") && err.contains("max_position_embeddings is 262144"), qPrintable(err));
  }
  // A short greedy reply is cut inside its reasoning; the follow-up (the reply sent back as the
  // server gave it) is served the client's own tokens and answers a cold server's logprobs.
  void aFollowUpAfterACutReasoningAnswersAsCold() {
    QVERIFY(server_.Post("/v1/cache/clear?tier=all", "")->status == 200);
    json messages = json::array({{{"role", "user"}, {"content", Words(400, 5)}}});
    const json first = server_.Chat({{"messages", messages}, {"max_tokens", 8}, {"temperature", 0}, {"session_id", "r"}});
    QCOMPARE(first["choices"][0]["finish_reason"].get<std::string>(), std::string("length"));
    json reply = first["choices"][0]["message"];
    QVERIFY2(reply.contains("reasoning_content"), reply.dump().c_str());  // the tiny model thinks first
    messages.push_back(reply);
    messages.push_back({{"role", "user"}, {"content", "and then?"}});
    const json body = {{"messages", messages}, {"max_tokens", 8}, {"temperature", 0}, {"logprobs", true}};
    json with_session = body;
    with_session["session_id"] = "r";
    const json follow = server_.Chat(with_session);
    QCOMPARE(follow["usage"]["anchorage"]["served_prompt_tokens"], follow["usage"]["prompt_tokens"]);
    QVERIFY(cold_.Post("/v1/cache/clear?tier=all", "")->status == 200);
    const json cold = cold_.Chat(body);
    QCOMPARE(cold["usage"]["anchorage"]["cached_tokens"].get<int64_t>(), int64_t(0));
    QCOMPARE(Logprobs(follow), Logprobs(cold));
  }
  // With thinking off the rows keep each answer's empty think block, which the client's copy leaves
  // out. A client that rewrote the last reply parts from the rows inside it: it resumes at the last
  // line below the second prompt's end (aligned past the first answer), not below the first answer.
  void anEditedReplyResumesBelowWhereItParts() {
    QVERIFY(server_.Post("/v1/cache/clear?tier=all", "")->status == 200);
    const json no_thinking = {{"enable_thinking", false}};
    auto turn = [&](const json& messages, int max_tokens) {
      return server_.Chat({{"messages", messages}, {"max_tokens", max_tokens}, {"temperature", 0}, {"session_id", "edit"}, {"chat_template_kwargs", no_thinking}});
    };
    json messages = json::array({{{"role", "user"}, {"content", Words(300, 1)}}});
    const json first = turn(messages, 40);
    messages.push_back({{"role", "assistant"}, {"content", first["choices"][0]["message"]["content"]}});
    messages.push_back({{"role", "user"}, {"content", Words(30, 5)}});
    const json second = turn(messages, 40);
    QCOMPARE(second["usage"]["anchorage"]["cache_source"].get<std::string>(), std::string("end"));
    const int64_t served = second["usage"]["anchorage"]["served_prompt_tokens"].get<int64_t>();
    const int64_t line = (served - 1) / 64 * 64;
    QVERIFY2(served - line > 8 && line > first["usage"]["prompt_tokens"].get<int64_t>(), "the sizes no longer make the case");
    messages.push_back({{"role", "assistant"}, {"content", "Edited answer here."}});
    messages.push_back({{"role", "user"}, {"content", "ok"}});
    const json copy = turn(messages, 2);
    const json& usage = copy["usage"]["anchorage"];
    QCOMPARE(usage["cache_source"].get<std::string>(), std::string("resident"));
    QCOMPARE(usage["cached_tokens"].get<int64_t>(), line);
    QCOMPARE(usage["served_prompt_tokens"].get<int64_t>(), line + usage["reread_tokens"].get<int64_t>());
  }
  // A-B-A: session A's rows are parked with their end when B takes the rows; A's next turn (its
  // earlier reasoning left out, so it reaches the parked end only by alignment) resumes at that end
  // and re-reads what the same turn re-reads on a server that served A alone.
  void aParkedEndServesAnAlignedCopy() {
    QTemporaryDir dir, solo_dir;
    const json replies = json::array({{{"match", "TASKA"}, {"reply", Words(30, 7) + "\n</think>\n\n" + Words(20, 8)}},
                                      {{"match", "TASKB"}, {"reply", Words(10, 9) + "\n</think>\n\n" + Words(10, 3)}}});
    for (const QTemporaryDir* d : {&dir, &solo_dir}) {
      QVERIFY(anchorage::testing::WriteSettingsWithoutDiskFloor(d->path()));
      QVERIFY(anchorage::WriteFileAtomic(d->filePath("replies.json").toStdString(), replies.dump()).ok());
    }
    ServerProcess shared, solo;
    // One slot: B takes A's, which parks (with a free side slot B would take that and nothing parks).
    QVERIFY(shared.Start(dir.path(), {"--grid", "64", "--parallel", "1", "--test-replies", dir.filePath("replies.json")}));
    QVERIFY(solo.Start(solo_dir.path(), {"--grid", "64", "--test-replies", solo_dir.filePath("replies.json")}));
    auto turn = [](ServerProcess& s, const json& messages, const std::string& session) {
      return s.Chat({{"messages", messages}, {"max_tokens", 400}, {"session_id", session}});
    };
    json a = json::array({{{"role", "system"}, {"content", Words(400, 1)}}, {{"role", "user"}, {"content", "TASKA " + Words(50, 2)}}});
    const json a1 = turn(shared, a, "A");
    QCOMPARE(turn(solo, a, "A")["choices"][0]["message"], a1["choices"][0]["message"]);
    QVERIFY2(a1["choices"][0]["message"].contains("reasoning_content"), a1.dump().c_str());
    a.push_back(a1["choices"][0]["message"]);
    a.push_back({{"role", "user"}, {"content", "TASKA again " + Words(20, 4)}});
    const json b = json::array({{{"role", "system"}, {"content", Words(450, 5)}}, {{"role", "user"}, {"content", "TASKB " + Words(40, 6)}}});
    QVERIFY(!turn(shared, b, "B").empty());
    const json stats = json::parse(shared.Get("/v1/cache/stats")->body);
    QVERIFY2(stats["park"]["entries"].get<int64_t>() == 1, stats["park"].dump().c_str());
    const json back = turn(shared, a, "A"), alone = turn(solo, a, "A");
    QCOMPARE(alone["usage"]["anchorage"]["cache_source"].get<std::string>(), std::string("end"));
    QCOMPARE(back["usage"]["anchorage"]["cache_source"].get<std::string>(), std::string("park"));
    QCOMPARE(back["usage"]["anchorage"]["cached_tokens"], alone["usage"]["anchorage"]["cached_tokens"]);
    QCOMPARE(back["usage"]["anchorage"]["reread_tokens"], alone["usage"]["anchorage"]["reread_tokens"]);
    QCOMPARE(back["choices"][0]["message"], alone["choices"][0]["message"]);
    // The journal's cached_tokens is the client's, as usage says, though the served prompt is longer.
    const json& usage = back["usage"];
    QVERIFY(usage["anchorage"]["served_prompt_tokens"].get<int64_t>() > usage["prompt_tokens"].get<int64_t>());
    json row;
    QTRY_VERIFY_WITH_TIMEOUT((row = json::parse(shared.Get("/v1/journal?kind=request&limit=1")->body)["rows"][0], row["session"] == "A"), 5000);
    QCOMPARE(row["prompt_tokens"], usage["prompt_tokens"]);
    QCOMPARE(row["cached_tokens"], usage["prompt_tokens_details"]["cached_tokens"]);
  }
  // An id-less client that moves its date reminder from the previous user message into the new one
  // each turn, and leaves earlier reasoning out: each turn resumes at a line below the rewritten
  // message, and once it keeps the conversation's opening it parks nothing, being the same one.
  void anIdlessClientMovingItsReminderKeepsItsConversation() {
    QTemporaryDir dir;
    QVERIFY(anchorage::testing::WriteSettingsWithoutDiskFloor(dir.path()));
    json replies = json::array();
    for (int t = 0; t < 4; ++t)
      replies.push_back({{"match", "TASK" + std::to_string(t) + "X"}, {"reply", Words(30, 20 + t) + "\n</think>\n\n" + Words(25, 30 + t)}});
    QVERIFY(anchorage::WriteFileAtomic(dir.filePath("replies.json").toStdString(), replies.dump()).ok());
    ServerProcess qwen_code;
    QVERIFY(qwen_code.Start(dir.path(), {"--grid", "64", "--test-replies", dir.filePath("replies.json")}));
    const std::string reminder = "<system-reminder>Today's date is day %d.</system-reminder>\n";
    json answers = json::array();
    int64_t previous_prompt = 0, previous_cached = -1;
    for (int t = 0; t < 4; ++t) {
      json messages = json::array({{{"role", "system"}, {"content", Words(300, 1)}}});
      for (int k = 0; k <= t; ++k) {
        std::string text = "TASK" + std::to_string(k) + "X " + Words(20, 40 + k);
        if (k == t) text = QString::asprintf(reminder.c_str(), t).toStdString() + text;
        messages.push_back({{"role", "user"}, {"content", text}});
        if (k < t) messages.push_back(answers[k]);
      }
      const json reply = qwen_code.Chat({{"messages", messages}, {"max_tokens", 300}});
      QCOMPARE(reply["choices"][0]["finish_reason"].get<std::string>(), std::string("stop"));
      answers.push_back(reply["choices"][0]["message"]);
      QVERIFY(answers.back().contains("reasoning_content"));
      const int64_t cached = reply["usage"]["anchorage"]["cached_tokens"].get<int64_t>();
      // Each turn resumes above where the turn before did: at the line below the message it rewrote.
      if (t >= 1) QVERIFY2(cached > previous_cached && cached < previous_prompt, (std::to_string(cached) + " cached; the turn before " + std::to_string(previous_cached) + " of " + std::to_string(previous_prompt)).c_str());
      if (t >= 1) QCOMPARE(reply["usage"]["anchorage"]["cache_source"].get<std::string>(), std::string("resident"));
      previous_cached = cached;
      previous_prompt = reply["usage"]["prompt_tokens"].get<int64_t>();
    }
    const json park = json::parse(qwen_code.Get("/v1/cache/stats")->body)["park"];
    // The second turn rewrote the first user message, which another conversation's first turn would
    // differ in too: that one parks; the later turns keep the opening and park nothing.
    QCOMPARE(park["parks"].get<int64_t>(), int64_t(1));
  }
  // An agent-shaped session (a tool call with reasoning, its result, an answer; the template drops
  // earlier reasoning): every follow-up resumes at the end anchor and re-reads, at the median, no
  // more than the client's prompt grew.
  void anAgentReplayReReadsNoMoreThanThePromptGrew() {
    QTemporaryDir dir;
    QVERIFY(anchorage::testing::WriteSettingsWithoutDiskFloor(dir.path()));
    json replies = json::array();
    const int turns = 5;
    for (int t = 0; t < turns; ++t) {
      replies.push_back({{"match", "RESULT" + std::to_string(t) + "X"}, {"reply", Words(25, 300 + t) + "\n</think>\n\n" + Words(20, 400 + t)}});
      replies.push_back({{"match", "TASK" + std::to_string(t) + "X"},
                         {"reply", Words(25, 600 + t) + "\n</think>\n\n<tool_call>\n<function=read_file>\n<parameter=path>\nsrc/f" +
                                       std::to_string(t) + ".cpp\n</parameter>\n</function>\n</tool_call>"}});
    }
    QVERIFY(anchorage::WriteFileAtomic(dir.filePath("replies.json").toStdString(), replies.dump()).ok());
    ServerProcess agent;
    QVERIFY(agent.Start(dir.path(), {"--grid", "64", "--test-replies", dir.filePath("replies.json")}));
    const json tools = json::array({{{"type", "function"},
                                     {"function", {{"name", "read_file"}, {"description", Words(40, 100)},
                                                   {"parameters", {{"type", "object"}, {"properties", {{"path", {{"type", "string"}}}}}}}}}}});
    json messages = json::array({{{"role", "system"}, {"content", Words(300, 1)}}});
    std::vector<int64_t> beyond;
    int64_t previous = -1;
    for (int t = 0; t < turns; ++t) {
      messages.push_back({{"role", "user"}, {"content", "TASK" + std::to_string(t) + "X " + Words(30, 200 + t)}});
      for (int step = 0; step < 2; ++step) {
        const json reply = agent.Chat({{"messages", messages}, {"tools", tools}, {"session_id", "agent"}, {"max_tokens", 200}});
        QVERIFY(!reply.empty());
        const json& usage = reply["usage"];
        const int64_t prompt = usage["prompt_tokens"].get<int64_t>();
        if (previous >= 0) {
          QCOMPARE(usage["anchorage"]["cache_source"].get<std::string>(), std::string("end"));
          beyond.push_back(usage["anchorage"]["reread_tokens"].get<int64_t>() - (prompt - previous));
        }
        previous = prompt;
        const json& m = reply["choices"][0]["message"];
        json assistant = {{"role", "assistant"}, {"content", m.value("content", json("")).is_null() ? json("") : m["content"]}};
        if (m.contains("reasoning_content")) assistant["reasoning_content"] = m["reasoning_content"];
        if (step == 0) {
          QVERIFY2(m.contains("tool_calls"), m.dump().c_str());
          assistant["tool_calls"] = m["tool_calls"];
          messages.push_back(assistant);
          messages.push_back({{"role", "tool"}, {"tool_call_id", m["tool_calls"][0]["id"]}, {"content", "RESULT" + std::to_string(t) + "X " + Words(60, 500 + t)}});
        } else {
          messages.push_back(assistant);
        }
      }
    }
    std::sort(beyond.begin(), beyond.end());
    const int64_t median = beyond[beyond.size() / 2];
    qInfo("re-read beyond the growth: median %lld of %zu follow-ups", static_cast<long long>(median), beyond.size());
    QVERIFY2(median <= 0, ("median re-read beyond the growth " + std::to_string(median)).c_str());
  }
};

QTEST_MAIN(TestExactnessServer)
#include "test_exactness_server.moc"
