// Speculative decoding through anchorage-server on the tiny model: a reply that repeats a file from
// the prompt (forced through the real forward by --test-replies) is drafted by lookup and almost
// every draft accepted; usage, /metrics and the journal count them; with speculative.mode off the
// same request drafts nothing and answers the same text. The model's own replies are the same with
// the MTP head drafting (modes mtp and both) as with drafts off, and the head did draft.
#include <QtTest>

#include <fstream>
#include <map>

#include "tests/server/server_fixture.h"

using anchorage::testing::ServerProcess;
using json = nlohmann::json;

namespace {

std::string File() {
  std::string text;
  for (int i = 0; i < 30; ++i) text += "int value" + std::to_string(i) + " = compute(" + std::to_string(i * 7 % 13) + ", grid);\n";
  return text;
}

json Repeat(const std::string& session) {
  return {{"messages", {{{"role", "user"}, {"content", "Repeat the file exactly:\n" + File()}}}}, {"max_tokens", 600}, {"temperature", 0}, {"session_id", session}};
}

}  // namespace

class TestSpeculativeServer : public QObject {
  Q_OBJECT
  QTemporaryDir data_;

 private slots:
  void copiesAreDraftedAndCounted() {
    std::ofstream(data_.filePath("replies.json").toStdString()) << json::array({{{"match", "Repeat the file"}, {"reply", "</think>\n\n" + File()}}}).dump();
    ServerProcess s;
    QVERIFY(s.Start(data_.path(), {"--grid", "64", "--test-replies", data_.filePath("replies.json")}));
    auto r = s.Post("/v1/chat/completions", Repeat("a").dump());
    QVERIFY(r && r->status == 200);
    const json on = json::parse(r->body);
    QCOMPARE(on["choices"][0]["message"]["content"].get<std::string>(), File());
    const json& usage = on["usage"]["anchorage"];
    const int64_t drafted = usage["drafted_tokens"].get<int64_t>(), accepted = usage["accepted_tokens"].get<int64_t>();
    const int64_t completion = on["usage"]["completion_tokens"].get<int64_t>();
    QVERIFY2(accepted > completion / 2 && accepted <= drafted, usage.dump().c_str());
    const std::string metrics = s.Get("/metrics")->body;
    QVERIFY(metrics.find("anchorage_accepted_tokens_total " + std::to_string(accepted) + "\n") != std::string::npos);
    json rows;  // the journal writes in the background
    auto journaled = [&] {
      auto journal = s.Get("/v1/journal?kind=request");
      rows = journal && journal->status == 200 ? json::parse(journal->body)["rows"] : json::array();
      return !rows.empty();
    };
    QTRY_VERIFY_WITH_TIMEOUT(journaled(), 5000);
    QCOMPARE(rows[0]["drafted_tokens"].get<int64_t>(), drafted);
    // The request's ids go to the suffix store after the reply (token counts only in the stats).
    json suffix;
    auto appended = [&] {
      suffix = json::parse(s.Get("/v1/cache/stats")->body)["suffix_store"];
      return suffix["open"].get<bool>() && suffix["ids"].get<int64_t>() > completion;
    };
    QTRY_VERIFY2_WITH_TIMEOUT(appended(), suffix.dump().c_str(), 5000);

    json settings = json::parse(s.Get("/v1/settings")->body);
    settings["speculative"]["mode"] = "off";
    auto put = s.Put("/v1/settings", settings.dump());
    QVERIFY(put && put->status == 200);
    auto again = s.Post("/v1/chat/completions", Repeat("b").dump());
    QVERIFY(again && again->status == 200);
    const json off = json::parse(again->body);
    QCOMPARE(off["choices"][0]["message"]["content"].get<std::string>(), File());
    QCOMPARE(off["usage"]["anchorage"]["drafted_tokens"].get<int64_t>(), int64_t{0});
    QCOMPARE(off["usage"]["completion_tokens"], on["usage"]["completion_tokens"]);
  }

  void mtpDraftsKeepTheReply() {
    ServerProcess s;
    QVERIFY(s.Start(data_.path(), {"--grid", "64"}));
    std::map<std::string, json> replies;
    for (const char* mode : {"off", "mtp", "both"}) {
      json settings = json::parse(s.Get("/v1/settings")->body);
      settings["speculative"]["mode"] = mode;
      auto put = s.Put("/v1/settings", settings.dump());
      QVERIFY2(put && put->status == 200, put ? put->body.c_str() : "no answer");
      for (double temperature : {0.0, 0.8}) {
        const json body = {{"messages", {{{"role", "user"}, {"content", "Say something about grids."}}}}, {"max_tokens", 48},
                           {"temperature", temperature}, {"seed", 5}, {"session_id", std::string(mode) + std::to_string(temperature)}};
        auto r = s.Post("/v1/chat/completions", body.dump());
        QVERIFY(r && r->status == 200);
        const json reply = json::parse(r->body);
        const std::string key = std::to_string(temperature);
        if (replies.count(key) == 0) replies[key] = reply["choices"][0]["message"];
        QCOMPARE(reply["choices"][0]["message"], replies[key]);
        if (std::string(mode) == "mtp") QVERIFY2(reply["usage"]["anchorage"]["drafted_tokens"].get<int64_t>() > 0, reply["usage"].dump().c_str());
      }
    }
  }
};

QTEST_MAIN(TestSpeculativeServer)
#include "test_speculative_server.moc"
