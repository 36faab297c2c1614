// The journal and settings routes over a running server: a scripted session's rows and cache events,
// filters and paging; settings versions (409), invalid fields (400), a change applied from the next
// request that survives a restart, and a truncated settings file at start.
#include <fstream>
#include <thread>

#include "tests/server/server_fixture.h"

using anchorage::testing::ServerProcess;
using json = nlohmann::json;

namespace {

json Chat(const std::string& session, const std::vector<std::pair<std::string, std::string>>& turns) {
  json messages = json::array();
  for (const auto& [role, content] : turns) messages.push_back({{"role", role}, {"content", content}});
  return {{"messages", messages}, {"max_tokens", turns.size() == 1 ? 64 : 6}, {"temperature", 0}, {"conversation_id", session}};
}

// Polls GET path until pred(body) holds; returns the last body.
json PollJson(ServerProcess& s, const std::string& path, const std::function<bool(const json&)>& pred) {
  json body;
  for (int i = 0; i < 200; ++i) {
    auto r = s.Get(path);
    if (r && r->status == 200) {
      body = json::parse(r->body, nullptr, false);
      if (pred(body)) return body;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  return body;
}

}  // namespace

class TestOperationsRoutes : public QObject {
  Q_OBJECT

 private:
  QTemporaryDir data_;

 private slots:
  void journalRecordsTheSession() {
    json replies = json::array({{{"match", "Tell me about anchors"}, {"reply", "Anchors sit on grid lines.\n</think>\n\nThey are copies of the recurrent state."}}});
    std::ofstream(data_.filePath("replies.json").toStdString()) << replies.dump();
    ServerProcess s;
    QVERIFY(s.Start(data_.path(), {"--grid", "64", "--test-replies", data_.filePath("replies.json")}));
    auto first = s.Post("/v1/chat/completions", Chat("s1", {{"user", "Tell me about anchors and grid lines please"}}).dump());
    QVERIFY(first && first->status == 200);
    json a = json::parse(first->body);
    const std::string answer = a["choices"][0]["message"].value("content", std::string());
    QCOMPARE(answer, std::string("They are copies of the recurrent state."));
    // The client sends the answer back without its reasoning, as Open WebUI does.
    json follow = Chat("s1", {{"user", "Tell me about anchors and grid lines please"}, {"assistant", answer}, {"user", "And the end anchor?"}});
    auto second = s.Post("/v1/chat/completions", follow.dump());
    QVERIFY(second && second->status == 200);
    auto bad = s.Post("/v1/chat/completions", "{\"messages\": [], \"conversation_id\": \"s1\"}", {{"x-session-id", "s1"}});
    QVERIFY(bad && bad->status == 400);

    json page = PollJson(s, "/v1/journal?kind=request", [](const json& b) { return b.value("total", 0) >= 3; });
    QCOMPARE(page["total"].get<int>(), 3);
    const json& rows = page["rows"];
    QCOMPARE(rows[0]["status"].get<int>(), 400);
    QVERIFY(rows[0]["error"].get<std::string>().find("at least one message") != std::string::npos);
    QCOMPARE(rows[1]["status"].get<int>(), 200);
    QCOMPARE(rows[1]["session"].get<std::string>(), std::string("s1"));
    QCOMPARE(rows[1]["route"].get<std::string>(), std::string("/v1/chat/completions"));
    QCOMPARE(rows[1]["model"].get<std::string>(), std::string("tiny-seed0"));
    QVERIFY2(rows[1]["cache_source"] == "end", rows[1].dump().c_str());
    QVERIFY(rows[1]["cached_tokens"].get<int>() > 0);
    QCOMPARE(rows[1]["output_tokens"].get<int>(), 6);
    QCOMPARE(rows[2]["output_tokens"].get<int>(), json::parse(first->body)["usage"]["completion_tokens"].get<int>());
    QCOMPARE(rows[2]["cache_source"].get<std::string>(), std::string("cold"));
    QCOMPARE(rows[2]["cached_tokens"].get<int>(), 0);
    QVERIFY(rows[2]["ttft_ms"].get<double>() > 0);

    // Cache events: the second request's hit, the writes of both.
    json hits = PollJson(s, "/v1/journal?kind=hit", [](const json& b) { return b.value("total", 0) >= 1; });
    QCOMPARE(hits["total"].get<int>(), 1);
    QCOMPARE(hits["rows"][0]["session"].get<std::string>(), std::string("s1"));
    QCOMPARE(hits["rows"][0]["tier"].get<std::string>(), std::string("end"));
    QCOMPARE(hits["rows"][0]["reason"].get<std::string>(), std::string("end alignment"));
    // The hit counts the engine's resume point; the request row the client's cached tokens, as usage does.
    const json usage = json::parse(second->body)["usage"];
    QCOMPARE(hits["rows"][0]["tokens"].get<int>(), usage["anchorage"]["cached_tokens"].get<int>());
    QCOMPARE(rows[1]["cached_tokens"].get<int>(), usage["prompt_tokens_details"]["cached_tokens"].get<int>());
    QCOMPARE(rows[1]["cached_tokens"].get<int>(), rows[1]["prompt_tokens"].get<int>() - rows[1]["reread_tokens"].get<int>());
    json ends = PollJson(s, "/v1/journal?kind=write&tier=end", [](const json& b) { return b.value("total", 0) >= 2; });
    QCOMPARE(ends["total"].get<int>(), 2);
    for (const json& e : ends["rows"]) {
      QCOMPARE(e["type"].get<std::string>(), std::string("cache_event"));
      QVERIFY(e["bytes"].get<int64_t>() > 0);
    }

    // Paging: one row at a time walks the same rows newest first.
    json all = PollJson(s, "/v1/journal?limit=1000", [](const json&) { return true; });
    std::vector<int64_t> ids;
    for (const json& r : all["rows"]) ids.push_back(r["id"]);
    std::vector<int64_t> paged;
    std::string cursor;
    for (int i = 0; i < 100; ++i) {
      json p = PollJson(s, "/v1/journal?limit=2" + cursor, [](const json&) { return true; });
      for (const json& r : p["rows"]) paged.push_back(r["id"]);
      if (p["next_cursor"].is_null()) break;
      cursor = "&before=" + std::to_string(p["next_cursor"].get<int64_t>());
    }
    QCOMPARE(paged, ids);
    json text = PollJson(s, "/v1/journal?text=AT%20LEAST", [](const json&) { return true; });
    QCOMPARE(text["total"].get<int>(), 1);
    auto wrong = s.Get("/v1/journal?limit=0");
    QVERIFY(wrong && wrong->status == 400);
  }

  void settingsVersionsValidationAndPersistence() {
    ServerProcess s;
    QVERIFY(s.Start(data_.path(), {"--grid", "64"}));
    auto got = s.Get("/v1/settings");
    QVERIFY(got && got->status == 200);
    json doc = json::parse(got->body);
    const int64_t v = doc["version"];

    json stale = doc;
    stale["version"] = v - 1;
    stale["resident"]["enabled"] = false;
    auto r = s.Post("/v1/settings", stale.dump());  // POST is not the verb
    QVERIFY(r && r->status == 405);
    QCOMPARE(QString::fromStdString(r->get_header_value("Allow")), QString("GET, PUT, OPTIONS"));
    httplib::Client c("127.0.0.1", s.port());
    auto put = [&](const json& d) { return c.Put("/v1/settings", d.dump(), "application/json"); };
    auto res = put(stale);
    QVERIFY(res);
    QCOMPARE(res->status, 409);
    QCOMPARE(json::parse(s.Get("/v1/settings")->body)["version"].get<int64_t>(), v);

    json invalid = doc;
    invalid["resident"]["resident_gb"] = "lots";
    invalid["memory"]["bogus"] = 1;
    res = put(invalid);
    QVERIFY(res);
    QCOMPARE(res->status, 400);
    QVERIFY2(res->body.find("resident.resident_gb") != std::string::npos && res->body.find("memory.bogus") != std::string::npos, res->body.c_str());

    // A valid change applies from the next request: a follow-up that would resume serves cold.
    auto warm = s.Post("/v1/chat/completions", Chat("s2", {{"user", "one two three four five six seven eight nine ten"}}).dump());
    QVERIFY(warm && warm->status == 200);
    json change = doc;
    change["resident"]["enabled"] = false;
    res = put(change);
    QVERIFY(res);
    QCOMPARE(res->status, 200);
    QCOMPARE(json::parse(res->body)["version"].get<int64_t>(), v + 1);
    auto cold = s.Post("/v1/chat/completions", Chat("s2", {{"user", "one two three four five six seven eight nine ten"}}).dump());
    QVERIFY(cold && cold->status == 200);
    QCOMPARE(json::parse(cold->body)["usage"]["anchorage"]["cache_source"].get<std::string>(), std::string("cold"));

    s.Kill();
    ServerProcess again;
    QVERIFY(again.Start(data_.path(), {"--grid", "64"}));
    json reread = json::parse(again.Get("/v1/settings")->body);
    QCOMPARE(reread["version"].get<int64_t>(), v + 1);
    QCOMPARE(reread["resident"]["enabled"].get<bool>(), false);
    again.Kill();

    // A truncated settings file at start is reported and the previous good version kept.
    const std::string path = data_.filePath("settings.json").toStdString();
    std::string text;
    {
      std::ifstream in(path);
      text.assign(std::istreambuf_iterator<char>(in), {});
    }
    std::ofstream(path, std::ios::trunc) << text.substr(0, text.size() / 2);
    ServerProcess third;
    QVERIFY(third.Start(data_.path(), {"--grid", "64"}));
    const std::string log = third.Log(false);
    QVERIFY2(log.find("settings:") != std::string::npos, log.c_str());
    json kept = json::parse(third.Get("/v1/settings")->body);
    QVERIFY(kept["version"].get<int64_t>() >= v);
  }

  void cacheRoutesPeekClearAndMemoryRefusal() {
    QTemporaryDir dir;
    ServerProcess s;
    QVERIFY(s.Start(dir.path(), {"--grid", "64"}));
    json body = Chat("p1", {{"user", std::string(600, 'x') + " what follows?"}});
    // Peek before anything ran: cold; then the request reports what peek said.
    auto peek = s.Post("/v1/cache/peek", body.dump());
    QVERIFY(peek && peek->status == 200);
    json p = json::parse(peek->body);
    QCOMPARE(p["tier"].get<std::string>(), std::string("cold"));
    QVERIFY(p["reread_eta_ms"].is_null());  // nothing measured yet
    auto first = s.Post("/v1/chat/completions", body.dump());
    QVERIFY(first && first->status == 200);
    // The same conversation again resumes; peek predicts it exactly and now has a rate for the ETA.
    peek = s.Post("/v1/cache/peek", body.dump(), {{"x-session-id", "p1"}});
    p = json::parse(peek->body);
    auto second = s.Post("/v1/chat/completions", body.dump());
    json usage = json::parse(second->body)["usage"]["anchorage"];
    QCOMPARE(p["tier"].get<std::string>(), usage["cache_source"].get<std::string>());
    QCOMPARE(p["cached_tokens"].get<int64_t>(), usage["cached_tokens"].get<int64_t>());
    QCOMPARE(p["reread_tokens"].get<int64_t>(), usage["reread_tokens"].get<int64_t>());
    QVERIFY(p["cached_tokens"].get<int64_t>() > 0);
    QVERIFY(p["reread_eta_ms"].is_number());

    json stats = json::parse(s.Get("/v1/cache/stats")->body);
    QVERIFY(stats["store"]["entries"].get<int>() > 0);
    auto cleared = s.Post("/v1/cache/clear?tier=store", "");
    QVERIFY(cleared && cleared->status == 200);
    stats = json::parse(s.Get("/v1/cache/stats")->body);
    QCOMPARE(stats["store"]["entries"].get<int>(), 0);
    QVERIFY(stats["anchors"]["entries"].get<int>() > 0);  // only the tier named
    auto bogus = s.Post("/v1/cache/clear?tier=attic", "");
    QVERIFY(bogus && bogus->status == 400);
    auto prewarm = s.Post("/v1/cache/prewarm", body.dump());
    QVERIFY(prewarm && prewarm->status == 200);
    QCOMPARE(json::parse(prewarm->body)["prewarmed"].get<bool>(), false);

    // A prefill that cannot fit the memory peak gets 503 with Retry-After and changes no tier; the server keeps serving.
    httplib::Client c("127.0.0.1", s.port());
    json doc = json::parse(s.Get("/v1/settings")->body);
    json tight = doc;
    tight["memory"]["ceiling_gb"] = 0;
    tight["memory"]["prefill_peak_gb"] = 0.000001;
    tight["memory"]["allocator_slack_gb"] = 0;
    auto put = c.Put("/v1/settings", tight.dump(), "application/json");
    QVERIFY(put && put->status == 200);
    auto refused = s.Post("/v1/chat/completions", Chat("p2", {{"user", "a new question"}}).dump());
    QVERIFY(refused);
    QCOMPARE(refused->status, 503);
    QVERIFY(refused->has_header("Retry-After"));
    QCOMPARE(json::parse(refused->body)["error"]["code"].get<std::string>(), std::string("memory_exhausted"));
    json relaxed = json::parse(put->body);
    relaxed["memory"] = doc["memory"];
    put = c.Put("/v1/settings", relaxed.dump(), "application/json");
    QVERIFY(put && put->status == 200);
    auto ok = s.Post("/v1/chat/completions", Chat("p2", {{"user", "a new question"}}).dump());
    QVERIFY(ok && ok->status == 200);
    // The refusal is journaled, and it gave back no cache to make room it could not make.
    json drops = PollJson(s, "/v1/journal?kind=drop", [](const json& b) { return b.value("total", 0) > 0; });
    QVERIFY2(drops["total"].get<int>() > 0, drops.dump().c_str());
    QCOMPARE(json::parse(s.Get("/v1/journal?kind=shed")->body)["total"].get<int>(), 0);
  }

  void flagsOverrideTheDocumentAndSaySo() {
    ServerProcess s;
    QVERIFY(s.Start(data_.path(), {"--grid", "64", "--resident-gb", "1.5"}));
    json doc = json::parse(s.Get("/v1/settings")->body);
    QVERIFY2(doc.contains("overrides") && doc["overrides"].contains("resident.resident_gb"), doc.dump().c_str());
    const std::string log = s.Log(false);
    QVERIFY2(log.find("--resident-gb 1.5 overrides") != std::string::npos, log.c_str());
  }

  // --precision: /health says what runs; fast on a path without bf16 units runs exact and the start
  // says so (a CPU with them runs fast and its state fingerprint differs); another word is refused.
  void precisionIsReportedAndRefusedWhenUnknown() {
    QTemporaryDir dir;
    ServerProcess exact, fast;
    QVERIFY(exact.Start(dir.path(), {"--grid", "64", "--caches", "off"}));
    QTemporaryDir other;
    QVERIFY(fast.Start(other.path(), {"--grid", "64", "--caches", "off", "--precision", "fast"}));
    const json a = json::parse(exact.Get("/health")->body), b = json::parse(fast.Get("/health")->body);
    QCOMPARE(a["precision"].get<std::string>(), std::string("exact"));
    const bool units = b["kernel_path"] == "avx512-bf16" || b["kernel_path"] == "amx-bf16";
    QCOMPARE(b["precision"].get<std::string>(), std::string(units ? "fast" : "exact"));
    QCOMPARE(a["state_fingerprint"] != b["state_fingerprint"], units);
    bool said = false;
    for (const json& note : b["notes"]) said |= note.get<std::string>().find("fast asked, exact runs") != std::string::npos;
    QCOMPARE(said, !units);
    QProcess p;
    p.start(QString(ANCHORAGE_BINARY_DIR) + "/app/anchorage-server", {"--data-dir", dir.path(), "--port", "0", "--precision", "quick"});
    QVERIFY(p.waitForFinished(30000));
    QCOMPARE(p.exitCode(), 2);
    const QString err = QString::fromUtf8(p.readAllStandardError());
    QVERIFY2(err.contains("precision must be exact or fast, got 'quick'"), qPrintable(err));
  }
};

QTEST_GUILESS_MAIN(TestOperationsRoutes)
#include "test_operations_routes.moc"
