// The shadow reader through anchorage-server on the tiny model and the generated shadow model: a
// turn is read in idle time, the agreement question is answered by both models and journaled,
// POST /v1/shadow/ask answers a letter softmax (the same bits twice, and again after a planned stop
// wrote the session and the next server read it back), bad questions get parsed errors, /metrics
// counts the reads, and clear?tier=shadow forgets every session.
#include <QtTest>

#include <signal.h>

#include <cmath>
#include <filesystem>
#include <thread>

#include "engine/core/file_util.h"
#include "engine/settings/settings.h"
#include "tests/server/server_fixture.h"

using anchorage::testing::ServerProcess;
using json = nlohmann::json;

namespace {

std::string LongText() {
  std::string text = "Please keep these notes about shadows, chunks and grids in mind.";
  for (int i = 0; i < 400; ++i) text += " note" + std::to_string(i * 7919 % 1000) + " says chunk " + std::to_string(i);
  return text;
}

const json kQuestion = {{"session", "conv-1"}, {"question", "Is this about chunks?"}, {"choices", {"yes", "no", "unsure"}}};

}  // namespace

class TestShadowServer : public QObject {
  Q_OBJECT

  void WriteSettings(const QTemporaryDir& data) {
    json doc = anchorage::DefaultSettingsDocument(anchorage::MachineTotalRamBytes());
    doc["shadow"]["min_tokens"] = 100;
    QVERIFY(anchorage::MakeDirectories(data.path().toStdString(), 0700).ok());
    QVERIFY(anchorage::WriteFileAtomic(data.filePath("settings.json").toStdString(), doc.dump()).ok());
  }
  static json Status(ServerProcess& s) { return json::parse(s.Get("/v1/shadow/status")->body); }
  static bool WaitFor(const std::function<bool()>& condition) {
    for (int i = 0; i < 2000; ++i) {
      if (condition()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
  static std::pair<int, json> AskShadow(ServerProcess& s, const json& body) {
    auto r = s.Post("/v1/shadow/ask", body.dump());
    if (!r) return {0, json()};
    return {r->status, json::parse(r->body, nullptr, false)};
  }

 private slots:
  void readsAsksAndSurvivesAStop() {
    QTemporaryDir data;
    WriteSettings(data);
    json answer;
    {
      ServerProcess a;
      QVERIFY(a.Start(data.path(), {"--ctx", "8192"}));
      const json turn = {{"messages", {{{"role", "user"}, {"content", LongText()}}}}, {"max_tokens", 16}, {"temperature", 0}, {"session_id", "conv-1"}};
      auto r = a.Post("/v1/chat/completions", turn.dump());
      QVERIFY(r && r->status == 200);
      const int64_t prompt_tokens = json::parse(r->body)["usage"]["prompt_tokens"].get<int64_t>();
      QVERIFY(prompt_tokens > 1024);
      QVERIFY(WaitFor([&] {
        const json st = Status(a);
        return !st["last_answers"].empty() && !st["sessions"].empty() && st["sessions"][0]["backlog_tokens"].get<int64_t>() < 512;
      }));
      json st = Status(a);
      QVERIFY2(st["loaded"].get<bool>() && st["enabled"].get<bool>(), st.dump().c_str());
      QCOMPARE(st["grid_tokens"].get<int64_t>(), int64_t{512});
      QCOMPARE(st["sessions"][0]["session"].get<std::string>(), std::string("conv-1"));
      const int64_t known = st["sessions"][0]["known_tokens"].get<int64_t>();
      QVERIFY(known >= prompt_tokens);
      const json& agreement = st["last_answers"][0];
      QVERIFY2(agreement["shadow"].is_object() && agreement["main"].is_object() && agreement["agree"].is_boolean(), agreement.dump().c_str());
      QCOMPARE(st["agreement"]["compared"].get<int64_t>(), int64_t{1});

      auto [status, got] = AskShadow(a, kQuestion);
      QCOMPARE(status, 200);
      double sum = 0;
      for (const json& p : got["probabilities"]) sum += p.get<double>();
      QVERIFY(std::abs(sum - 1.0) < 1e-9);
      QCOMPARE(got["read_tokens"].get<int64_t>(), known);
      QCOMPARE(got["behind_tokens"].get<int64_t>(), int64_t{0});
      QVERIFY(got["choice"].is_string() && got["ms"].get<double>() >= 0);
      QCOMPARE(AskShadow(a, kQuestion).second["probabilities"], got["probabilities"]);
      answer = got;

      // Bad questions: each a parsed error, and the server goes on.
      json unknown = kQuestion;
      unknown["session"] = "nobody";
      auto [s404, e404] = AskShadow(a, unknown);
      QCOMPARE(s404, 404);
      QCOMPARE(e404["error"]["code"].get<std::string>(), std::string("unknown_session"));
      json empty = kQuestion;
      empty["choices"] = json::array();
      QCOMPARE(AskShadow(a, empty).first, 400);
      json many = kQuestion;
      many["choices"] = json::array();
      for (int i = 0; i < 27; ++i) many["choices"].push_back("c" + std::to_string(i));
      QCOMPARE(AskShadow(a, many).first, 400);
      json typed = kQuestion;
      typed["choices"] = {1, 2};
      QCOMPARE(AskShadow(a, typed).first, 400);
      json huge = kQuestion;
      std::string long_question;
      for (int i = 0; i < 3000; ++i) long_question += "word" + std::to_string(i) + " ";
      huge["question"] = long_question;
      auto [s_huge, e_huge] = AskShadow(a, huge);
      QCOMPARE(s_huge, 400);
      QVERIFY2(e_huge["error"]["message"].get<std::string>().find("context") != std::string::npos, e_huge.dump().c_str());
      auto broken = a.Post("/v1/shadow/ask", "{\"session\": ");
      QVERIFY(broken && broken->status == 400);

      auto journal = a.Get("/v1/journal?kind=shadow");
      QVERIFY(journal && journal->status == 200);
      const json rows = json::parse(journal->body)["rows"];
      QCOMPARE(rows.size(), size_t{1});
      QCOMPARE(rows[0]["session"].get<std::string>(), std::string("conv-1"));
      QVERIFY(a.Get("/metrics")->body.find("anchorage_shadow_tokens_read_total") != std::string::npos);

      ::kill(static_cast<pid_t>(a.process().processId()), SIGTERM);
      QVERIFY(a.process().waitForFinished(20000));
      QCOMPARE(a.process().exitCode(), 0);
    }
    bool written = false;
    for (const auto& e : std::filesystem::directory_iterator(data.filePath("cache/shadow").toStdString())) written |= e.path().extension() == ".shadow";
    QVERIFY(written);

    ServerProcess b;
    QVERIFY(b.Start(data.path(), {"--ctx", "8192"}));
    json st = Status(b);
    QCOMPARE(st["sessions"].size(), size_t{1});
    QVERIFY(st["sessions"][0]["on_disk"].get<bool>());
    auto [status, again] = AskShadow(b, kQuestion);
    QCOMPARE(status, 200);
    QCOMPARE(again["probabilities"], answer["probabilities"]);  // the same bits after the disk round trip
    QCOMPARE(again["read_tokens"], answer["read_tokens"]);
    auto cleared = b.Post("/v1/cache/clear?tier=shadow", "");
    QVERIFY(cleared && cleared->status == 200);
    QCOMPARE(Status(b)["sessions"].size(), size_t{0});
    QCOMPARE(AskShadow(b, kQuestion).first, 404);
  }
};

QTEST_MAIN(TestShadowServer)
#include "test_shadow_server.moc"
