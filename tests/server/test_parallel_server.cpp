// Parallel serving through anchorage-server on the tiny model (64-token grid): requests that run at
// once on several slots (one prefilling in pieces while others decode, greedy and sampled, drafts
// on, two slots' draft windows in one forward) answer the tokens and logprobs each one gets alone; a request that arrives while another
// decodes streams before that one ends; a client that hangs up mid-batch frees its slot and leaves
// the others' answers as they were; a guest on a side slot leaves the resident conversation's end
// anchor to its next turn.
#include <QtTest>

#include <array>
#include <atomic>
#include <chrono>
#include <set>
#include <thread>

#include "engine/core/file_util.h"
#include "tests/server/server_fixture.h"

using anchorage::testing::ServerProcess;
using anchorage::testing::StreamResult;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

std::string Notes(int seed, int lines) {
  std::string text = "Keep these notes about rows and anchors in mind.";
  for (int i = 0; i < lines; ++i) text += " note" + std::to_string((i * 7919 + seed) % 1000) + " says row " + std::to_string(i);
  return text;
}

json Request(const std::string& system, const std::string& user, int max_tokens, double temperature, const std::string& session) {
  json body = {{"messages", json::array({{{"role", "system"}, {"content", system}}, {{"role", "user"}, {"content", user}}})},
               {"max_tokens", max_tokens},
               {"temperature", temperature},
               {"logprobs", true},
               {"top_logprobs", 2},
               {"stream", true},
               {"session_id", session}};
  if (temperature > 0) body["seed"] = 7;
  return body;
}

// A stream's answer: its text, its logprob entries in order, its finish reason, and when its first and last events came.
struct Answer {
  int status = 0;
  std::string text;
  json logprobs = json::array();
  std::string finish;
  Clock::time_point first, last;
  size_t events = 0;
};

Answer Collect(const StreamResult& r, const std::vector<Clock::time_point>& times) {
  Answer a;
  a.status = r.status;
  a.events = r.events.size();
  if (!times.empty()) {
    a.first = times.front();
    a.last = times.back();
  }
  for (const json& e : r.events) {
    if (!e.is_object() || !e.contains("choices") || e["choices"].empty()) continue;
    const json& choice = e["choices"][0];
    const json& delta = choice["delta"];
    for (const char* field : {"reasoning_content", "content"})
      if (delta.contains(field) && delta[field].is_string()) a.text += delta[field].get<std::string>();
    if (choice.contains("logprobs") && choice["logprobs"].is_object())
      for (const json& entry : choice["logprobs"]["content"]) a.logprobs.push_back(entry);
    if (!choice["finish_reason"].is_null()) a.finish = choice["finish_reason"].get<std::string>();
  }
  return a;
}

// Streams body; on_event (optional) sees each event's index and may return false to hang up.
Answer StreamAnswer(ServerProcess& s, const json& body, const std::function<bool(size_t)>& on_event = nullptr) {
  std::vector<Clock::time_point> times;
  const StreamResult r = s.Stream("/v1/chat/completions", body, [&](const json&) {
    times.push_back(Clock::now());
    return on_event ? on_event(times.size()) : true;
  });
  return Collect(r, times);
}

void CompareAnswers(const Answer& got, const Answer& alone, const char* what) {
  QVERIFY2(got.status == 200, what);
  QVERIFY2(!alone.logprobs.empty(), what);
  QVERIFY2(got.text == alone.text, (std::string(what) + ": the text differs from the request's alone").c_str());
  QVERIFY2(got.logprobs == alone.logprobs, (std::string(what) + ": the logprobs differ from the request's alone").c_str());
  QVERIFY2(got.finish == alone.finish, what);
}

// a, then once it streams b and c beside it; their answers in that order.
std::array<Answer, 3> StreamThreeAtOnce(ServerProcess& s, const json& a, const json& b, const json& c) {
  std::array<Answer, 3> got;
  std::atomic<bool> a_streams = false;
  std::thread ta([&] { got[0] = StreamAnswer(s, a, [&](size_t) { return a_streams = true; }); });
  (void)QTest::qWaitFor([&] { return a_streams.load(); }, 30000);  // the callers check the answers' times
  std::thread tb([&] { got[1] = StreamAnswer(s, b); });
  std::thread tc([&] { got[2] = StreamAnswer(s, c); });
  tb.join();
  tc.join();
  ta.join();
  return got;
}

// The newest request row of session in the journal once its writer has the session's first `requests` rows; null after 5 s without.
json NewestRequestRow(ServerProcess& s, const std::string& session, size_t requests = 1) {
  for (int attempt = 0; attempt < 100; ++attempt) {  // the journal's writer may not have written the newest row yet
    const json rows = json::parse(s.Get("/v1/journal?kind=request&session=" + session)->body)["rows"];
    if (rows.size() >= requests) return rows[0];
    QTest::qWait(50);
  }
  return nullptr;
}

int BusySlots(ServerProcess& s) { return json::parse(s.Get("/health")->body)["busy_slots"].get<int>(); }

// DIR/replies.json: scripted answers forced through the real forward, so a long answer is long on
// every kernel path (a random model's greedy answer may stop early): RECITE about 3,000 tokens (its
// text tokenizes back to its ids, so the next turn can reach its end), SAGA about 16,000.
QString WriteReplies(const QTemporaryDir& dir) {
  std::string recital = "Done.\n</think>\n\n", saga = "Long.\n</think>\n\n";
  for (int i = 0; i < 1500; ++i) recital += " row" + std::to_string(i % 97);
  for (int i = 0; i < 8000; ++i) saga += " row" + std::to_string(i % 89);
  const json replies = json::array({{{"match", "RECITE"}, {"reply", recital}}, {{"match", "SAGA"}, {"reply", saga}}});
  const QString path = dir.filePath("replies.json");
  return anchorage::WriteFileAtomic(path.toStdString(), replies.dump()).ok() ? path : QString();
}

}  // namespace

class TestParallelServer : public QObject {
  Q_OBJECT

  QTemporaryDir data_, alone_data_;
  ServerProcess server_, alone_;  // three slots; one slot and no caches: every request alone and cold

 private slots:
  void initTestCase() {
    // The disk tier writes a head from its first cold read of 64 tokens or more.
    json settings = anchorage::DefaultSettingsDocument(anchorage::MachineTotalRamBytes());
    settings["disk_cache"]["min_free_gb"] = 0;
    settings["disk_cache"]["admit_after"] = 1;
    settings["disk_cache"]["min_tokens"] = 64;
    QVERIFY(anchorage::WriteFileAtomic(data_.filePath("settings.json").toStdString(), settings.dump()).ok());
    const QString replies = WriteReplies(data_), alone_replies = WriteReplies(alone_data_);
    QVERIFY(!replies.isEmpty() && !alone_replies.isEmpty());
    QVERIFY(server_.Start(data_.path(), {"--grid", "64", "--parallel", "3", "--test-replies", replies}));
    QVERIFY(alone_.Start(alone_data_.path(), {"--grid", "64", "--parallel", "1", "--caches", "off", "--test-replies", alone_replies}));
    const json health = json::parse(server_.Get("/health")->body);
    QCOMPARE(health["slots"].size(), size_t(3));
    QCOMPARE(json::parse(alone_.Get("/health")->body)["slots"].size(), size_t(1));
  }

  // A long greedy answer; once it streams, a sampled one and one whose long prompt prefills in pieces
  // between the others' decode steps. Each answers as alone, and the later ones stream before the first ends.
  void concurrentRequestsAnswerAsAlone() {
    const json a = Request(Notes(1, 40), "RECITE the rows back.", 3000, 0, "A");
    const json b = Request(Notes(2, 30), "Pick a row at random.", 200, 0.9, "B");
    const json c = Request(Notes(3, 400), "Which note is the last?", 40, 0, "C");
    const auto [got_a, got_b, got_c] = StreamThreeAtOnce(server_, a, b, c);
    CompareAnswers(got_a, StreamAnswer(alone_, a), "the long greedy answer");
    CompareAnswers(got_b, StreamAnswer(alone_, b), "the sampled answer");
    CompareAnswers(got_c, StreamAnswer(alone_, c), "the long prompt's answer");
    QVERIFY2(got_a.events > 1000, std::to_string(got_a.events).c_str());  // long enough to overlap the others
    QVERIFY2(got_b.first < got_a.last, "the sampled request waited for the long answer to end");
    QVERIFY2(got_c.first < got_a.last, "the long prompt waited for the long answer to end");
    const json slot_list = json::parse(server_.Get("/health")->body)["slots"];
    int used = 0;
    for (const json& slot : slot_list) used += slot["requests"].get<int>() > 0 ? 1 : 0;
    QVERIFY2(used == 3, slot_list.dump().c_str());
    // /metrics counts the rows that shared a forward (not every step: the long answer walks its draft windows alone).
    const std::string metrics = server_.Get("/metrics")->body;
    const size_t at = metrics.find("\nanchorage_batched_decode_rows_total ");
    QVERIFY2(at != std::string::npos && std::atoll(metrics.c_str() + at + 37) > 0, metrics.c_str());
    // The journal names each request's slot: three that ran at once ran on three.
    std::set<int> journal_slots;
    for (const char* session : {"A", "B", "C"}) {
      const json row = NewestRequestRow(server_, session);
      QVERIFY2(row.contains("slot") && row.value("queue_position", -1) == 0, row.dump().c_str());  // each found a free slot
      journal_slots.insert(row["slot"].get<int>());
    }
    QCOMPARE(journal_slots.size(), size_t(3));
  }

  // Two reciting answers at once, the second wholly beside the first, with drafts beside others on:
  // both draft (their windows go in one forward with each other's rows) and each answers its alone
  // tokens and logprobs. (auto would leave the second plain here: the tiny model's rows cost as much
  // as its steps, so no acceptance pays for them.)
  void draftWindowsOfTwoSlotsRunInOneBatch() {
    const auto beside_others = [&](const char* value) {
      json doc = json::parse(server_.Get("/v1/settings")->body);
      doc["speculative"]["beside_others"] = value;
      const auto put = server_.Put("/v1/settings", doc.dump());
      QVERIFY2(put && put->status == 200, put ? put->body.c_str() : "no answer");
    };
    beside_others("on");
    const json a = Request(Notes(4, 20), "RECITE the rows back.", 3000, 0, "D1");
    const json b = Request(Notes(5, 25), "RECITE the rows back, please.", 600, 0.9, "D2");
    Answer got_a, got_b;
    std::atomic<bool> a_streams = false;
    std::thread ta([&] { got_a = StreamAnswer(server_, a, [&](size_t) { return a_streams = true; }); });
    QVERIFY(QTest::qWaitFor([&] { return a_streams.load(); }, 30000));
    got_b = StreamAnswer(server_, b);
    ta.join();
    CompareAnswers(got_a, StreamAnswer(alone_, a), "the long answer");
    CompareAnswers(got_b, StreamAnswer(alone_, b), "the answer beside it");
    QVERIFY2(got_b.last < got_a.last, "the second answer did not run wholly beside the first");
    const json costs = json::parse(server_.Get("/v1/cache/stats")->body)["drafts_beside_others"];
    for (const char* session : {"D1", "D2"}) {
      const json row = NewestRequestRow(server_, session);
      QVERIFY2(row.value("drafted_tokens", 0) > 0 && row.value("accepted_tokens", 0) > 0, (row.dump() + costs.dump()).c_str());
    }
    // It fitted a line to the steps it timed (the slope's sign is the machine's noise on the tiny model: not asserted).
    QVERIFY2(costs["fitted"].get<bool>() && costs["step_fixed_ms"].get<double>() + costs["step_row_ms"].get<double>() > 0,
             costs.dump().c_str());
    const std::string metrics = server_.Get("/metrics")->body;  // windows ran in shared forwards
    const size_t at = metrics.find("\nanchorage_batched_window_rows_total ");
    QVERIFY2(at != std::string::npos && std::atoll(metrics.c_str() + at + 37) > 0, metrics.c_str());
    beside_others("auto");
  }

  // Another session that goes on from a conversation held on a busy slot takes a free slot and resumes
  // from that slot's state store (its prefix snapshot), not cold; it answers its alone tokens and
  // logprobs. No disk tier, which would serve it too.
  void aFreeSlotResumesFromAnotherSlotsStore() {
    QTemporaryDir data;
    QVERIFY(anchorage::testing::WriteSettingsWithoutDiskFloor(data.path()));
    const QString replies = WriteReplies(data);
    ServerProcess s;
    QVERIFY(s.Start(data.path(), {"--grid", "64", "--parallel", "3", "--disk-cache", "off", "--test-replies", replies}));
    json first = Request(Notes(41, 300), "Which note is the last?", 8, 0, "P0");
    first["stream"] = false;
    const json r1 = s.Chat(first);
    QVERIFY2(r1.contains("choices"), r1.dump().c_str());
    json long_turn = first;
    long_turn["messages"].push_back({{"role", "assistant"}, {"content", anchorage::testing::AnswerText(r1)}});
    long_turn["messages"].push_back({{"role", "user"}, {"content", "RECITE the rows back."}});
    long_turn["max_tokens"] = 3000;
    long_turn["stream"] = true;
    json other = first;
    other["messages"].push_back({{"role", "assistant"}, {"content", anchorage::testing::AnswerText(r1)}});
    other["messages"].push_back({{"role", "user"}, {"content", "Name one row."}});
    other["session_id"] = "G1";
    std::atomic<bool> streams = false;
    Answer recited;
    std::thread t([&] { recited = StreamAnswer(s, long_turn, [&](size_t) { return streams = true; }); });
    QVERIFY(QTest::qWaitFor([&] { return streams.load(); }, 30000));
    const json beside = s.Chat(other);
    t.join();
    QVERIFY2(beside.contains("choices"), beside.dump().c_str());
    const json& figures = beside["usage"]["anchorage"];
    QVERIFY2(figures["cache_source"] == "store" && figures["cached_tokens"].get<int64_t>() >= 1024, figures.dump().c_str());
    json alone = other;
    alone["session_id"] = "G1-alone";
    const json cold = alone_.Chat(alone);
    QCOMPARE(QString::fromStdString(beside["choices"][0]["logprobs"]["content"].dump()),
             QString::fromStdString(cold["choices"][0]["logprobs"]["content"].dump()));
    QVERIFY2(recited.status == 200 && recited.last > recited.first, "the long turn did not stream");
  }

  // The long answer's client hangs up while another request decodes beside it: its slot is free at
  // once and the other's answer is its alone answer.
  void aHangUpMidBatchFreesItsSlot() {
    const json a = Request(Notes(4, 20), "Tell me a SAGA.", 30000, 0, "H1");
    const json b = Request(Notes(5, 20), "Count the rows.", 600, 0, "H2");
    std::atomic<bool> a_streams = false, b_streams = false;
    Answer got_a, got_b;
    std::thread ta([&] {
      got_a = StreamAnswer(server_, a, [&](size_t) {
        a_streams = true;
        return !b_streams.load();
      });
    });
    QTRY_VERIFY_WITH_TIMEOUT(a_streams.load(), 30000);
    std::thread tb([&] { got_b = StreamAnswer(server_, b, [&](size_t n) { return (b_streams = n >= 5), true; }); });
    tb.join();
    ta.join();
    QVERIFY2(got_a.finish.empty(), got_a.finish.c_str());  // it hung up before its answer ended
    CompareAnswers(got_b, StreamAnswer(alone_, b), "the answer beside the hang-up");
    QTRY_COMPARE_WITH_TIMEOUT(BusySlots(server_), 0, 10000);
  }

  // A session's side request (a title, a guest through slot 0's stash) runs long on the slot that
  // holds the session's rows; the session's next long turn waits for that slot and resumes from its
  // rows, instead of prefilling the conversation again on a free slot.
  void aLongTurnWaitsForItsSessionsSlot() {
    QTemporaryDir dir;
    QVERIFY(anchorage::testing::WriteSettingsWithoutDiskFloor(dir.path()));
    json settings = json::parse(*anchorage::ReadFile(dir.filePath("settings.json").toStdString()));
    settings["resident"]["guest_max_tokens"] = 256;
    QVERIFY(anchorage::WriteFileAtomic(dir.filePath("settings.json").toStdString(), settings.dump()).ok());
    ServerProcess s;
    QVERIFY(s.Start(dir.path(), {"--grid", "64", "--parallel", "2", "--shadow-model", "off", "--test-replies", WriteReplies(dir)}));
    json messages = json::array({{{"role", "system"}, {"content", Notes(20, 150)}}, {{"role", "user"}, {"content", "Which row comes first?"}}});
    const json r1 = s.Chat({{"messages", messages}, {"max_tokens", 8}, {"temperature", 0}, {"session_id", "W"}});
    QVERIFY(!r1.empty());
    std::atomic<bool> title_streams = false;
    Answer title;
    std::thread t([&] {
      title = StreamAnswer(s, Request("Write a title.", "RECITE rows.", 3000, 0, "W"), [&](size_t) { return (title_streams = true), true; });
    });
    QTRY_VERIFY_WITH_TIMEOUT(title_streams.load(), 30000);
    messages.push_back(r1["choices"][0]["message"]);
    messages.push_back({{"role", "user"}, {"content", "And the last?"}});
    const json r2 = s.Chat({{"messages", messages}, {"max_tokens", 8}, {"temperature", 0}, {"session_id", "W"}});
    const Clock::time_point r2_done = Clock::now();
    t.join();
    QVERIFY(!r2.empty());
    QVERIFY2(title.events > 1000, std::to_string(title.events).c_str());
    QVERIFY2(title.last < r2_done, "the turn ran beside the title instead of waiting for its slot");
    const json& usage = r2["usage"];  // from its rows in place: the end anchor, or the exact line below the new text
    QVERIFY2(usage["anchorage"]["cache_source"] == "end" || usage["anchorage"]["cache_source"] == "resident", usage.dump().c_str());
    QVERIFY2(usage["anchorage"]["cached_tokens"].get<int64_t>() > usage["prompt_tokens"].get<int64_t>() - 64, usage.dump().c_str());
  }

  // A memory budget that holds two long requests but not three: the third waits at the head of the
  // queue (nothing is refused) until one of the two ends, then runs.
  void aBudgetForTwoRequestsQueuesTheThird() {
    QTemporaryDir dir;
    QVERIFY(anchorage::testing::WriteSettingsWithoutDiskFloor(dir.path()));
    ServerProcess s;
    QVERIFY(s.Start(dir.path(), {"--grid", "64", "--parallel", "3", "--shadow-model", "off", "--disk-cache", "off", "--test-replies", WriteReplies(dir)}));
    auto health = [&] { return json::parse(s.Get("/health")->body); };
    auto long_request = [](int i) { return Request(Notes(10 + i, 10), "Tell me a SAGA.", 20000, 0, "M" + std::to_string(i)); };
    // What one such request holds while it runs.
    int64_t held = 0;
    {
      std::atomic<bool> streams = false, release = false;
      std::thread t([&] { (void)StreamAnswer(s, long_request(0), [&](size_t) { return (streams = true), !release.load(); }); });
      QTRY_VERIFY_WITH_TIMEOUT(streams.load(), 30000);
      const json slot_list = health()["slots"];
      for (const json& slot : slot_list) held = std::max(held, slot["bytes"].get<int64_t>());
      release = true;
      t.join();
    }
    QTRY_COMPARE_WITH_TIMEOUT(BusySlots(s), 0, 10000);
    QVERIFY2(held > 20000 * 64, std::to_string(held).c_str());  // its rows to the last token
    json settings = json::parse(s.Get("/v1/settings")->body);
    const double budget_gb = 2.5 * static_cast<double>(held) / (1 << 30);
    settings["memory"]["prefill_peak_gb"] = budget_gb;
    settings["memory"]["ceiling_gb"] = budget_gb;
    settings["memory"]["allocator_slack_gb"] = 0;
    QVERIFY(s.Put("/v1/settings", settings.dump())->status == 200);
    std::atomic<bool> release = false;
    std::atomic<int> streaming = 0;
    Answer got[3];
    std::vector<std::thread> clients;
    for (int i = 1; i <= 2; ++i)
      clients.emplace_back([&, i] {
        got[i - 1] = StreamAnswer(s, long_request(i), [&, first = true](size_t) mutable {
          if (first) ++streaming;
          first = false;
          return !release.load();
        });
      });
    QTRY_COMPARE_WITH_TIMEOUT(streaming.load(), 2, 30000);
    std::atomic<bool> third_streams = false;
    clients.emplace_back([&] { got[2] = StreamAnswer(s, long_request(3), [&](size_t n) { return (third_streams = true), n < 20; }); });
    QTRY_COMPARE_WITH_TIMEOUT(health()["queue"].get<int>(), 1, 10000);  // waiting, not refused
    QCOMPARE(BusySlots(s), 2);
    QVERIFY(!third_streams.load());
    release = true;  // the two hang up: the third gets their memory
    for (auto& t : clients) t.join();
    QVERIFY2(got[2].status == 200 && got[2].events >= 20, std::to_string(got[2].status).c_str());
    // The journal says the third waited, first in line; the two before it did not.
    const json third = NewestRequestRow(s, "M3"), second = NewestRequestRow(s, "M2");
    QVERIFY2(third.value("queue_position", -1) == 1 && third.value("queue_ms", 0.0) > 0, third.dump().c_str());
    QVERIFY2(second.value("queue_position", -1) == 0, second.dump().c_str());
  }

  // Both slots idle, each holding a long conversation; a request that fits only without the other
  // slot's rows takes them: that slot gives its memory back (journaled as a shed of tier "slot")
  // and the request runs instead of getting 503.
  void anIdleSlotGivesBackItsMemory() {
    const QStringList flags = {"--grid", "64", "--parallel", "2", "--shadow-model", "off", "--disk-cache", "off"};
    const json z = Request("Short.", "Tell me a SAGA.", 20000, 0, "Z");
    auto held_while_streaming = [](ServerProcess& s, const json& body) {
      int64_t held = 0;
      std::atomic<bool> streams = false, release = false;
      std::thread t([&] { (void)StreamAnswer(s, body, [&](size_t) { return (streams = true), !release.load(); }); });
      for (int i = 0; i < 3000 && !streams.load(); ++i) QTest::qWait(10);
      const json slot_list = json::parse(s.Get("/health")->body)["slots"];
      for (const json& slot : slot_list) held = std::max(held, slot["bytes"].get<int64_t>());
      release = true;
      t.join();
      return held;
    };
    // What the request holds on an empty slot of a fresh server.
    QTemporaryDir fresh_dir;
    QVERIFY(anchorage::testing::WriteSettingsWithoutDiskFloor(fresh_dir.path()));
    ServerProcess fresh;
    QVERIFY(fresh.Start(fresh_dir.path(), flags + QStringList{"--test-replies", WriteReplies(fresh_dir)}));
    const int64_t alone = held_while_streaming(fresh, z);
    QVERIFY2(alone > 20000 * 64, std::to_string(alone).c_str());

    QTemporaryDir dir;
    QVERIFY(anchorage::testing::WriteSettingsWithoutDiskFloor(dir.path()));
    ServerProcess s;
    QVERIFY(s.Start(dir.path(), flags + QStringList{"--test-replies", WriteReplies(dir)}));
    QVERIFY(!s.Chat({{"messages", json::array({{{"role", "user"}, {"content", Notes(30, 300)}}})}, {"max_tokens", 8}, {"session_id", "X"}}).empty());
    QVERIFY(!s.Chat({{"messages", json::array({{{"role", "user"}, {"content", Notes(31, 300)}}})}, {"max_tokens", 8}, {"session_id", "Y"}}).empty());
    const json slot_list = json::parse(s.Get("/health")->body)["slots"];
    const int64_t other = std::min(slot_list[0]["bytes"].get<int64_t>(), slot_list[1]["bytes"].get<int64_t>());
    QVERIFY2(other > (1 << 20), slot_list.dump().c_str());
    json settings = json::parse(s.Get("/v1/settings")->body);
    const double budget_gb = static_cast<double>(alone + other / 2) / (1 << 30);
    settings["memory"]["prefill_peak_gb"] = budget_gb;
    settings["memory"]["ceiling_gb"] = budget_gb;
    settings["memory"]["allocator_slack_gb"] = 0;
    QVERIFY(s.Put("/v1/settings", settings.dump())->status == 200);
    const Answer got = StreamAnswer(s, z, [](size_t n) { return n < 10; });
    QVERIFY2(got.status == 200 && got.events >= 10, std::to_string(got.status).c_str());
    json sheds;
    for (int attempt = 0; attempt < 50; ++attempt) {
      sheds = json::parse(s.Get("/v1/journal?kind=shed")->body)["rows"];
      bool found = false;
      for (const json& row : sheds) found = found || row["tier"] == "slot";
      if (found) return;
      QTest::qWait(50);
    }
    QFAIL(("no shed of tier slot in the journal: " + sheds.dump()).c_str());
  }

  // A conversation's head, written to the disk tier and gone from every slot's rows, is restored into
  // a side slot's own buffers while another slot decodes: the answer is the cold server's.
  void aSideSlotRestoredFromTheDiskAnswersAsCold() {
    const std::string notes = Notes(9, 300);
    QCOMPARE(StreamAnswer(server_, Request(notes, "Which note is the first?", 4, 0, "D")).status, 200);
    auto disk_writes = [&] { return json::parse(server_.Get("/v1/journal?kind=write&tier=disk&session=D")->body)["total"].get<int64_t>(); };
    QTRY_VERIFY_WITH_TIMEOUT(disk_writes() > 0, 30000);
    QCOMPARE(server_.Post("/v1/cache/clear?tier=ram", "")->status, 200);
    const json busy = Request(Notes(10, 40), "RECITE the rows back.", 3000, 0, "E");
    Answer got_busy;
    std::atomic<bool> busy_streams = false;
    std::thread t([&] { got_busy = StreamAnswer(server_, busy, [&](size_t) { return busy_streams = true; }); });
    QTRY_VERIFY_WITH_TIMEOUT(busy_streams.load(), 30000);
    const json restored = Request(notes, "Which note is the last?", 24, 0, "D");
    const Answer got = StreamAnswer(server_, restored);
    t.join();
    CompareAnswers(got, StreamAnswer(alone_, restored), "the answer restored from the disk");
    QVERIFY2(got.last < got_busy.last, "the restored request waited for the busy slot's answer to end");
    const json row = NewestRequestRow(server_, "D", 2), busy_row = NewestRequestRow(server_, "E");
    QVERIFY(!row.is_null() && !busy_row.is_null());
    QVERIFY2(row["cache_tier"] == "disk", row.dump().c_str());
    QVERIFY2(row["slot"] != busy_row["slot"], row.dump().c_str());
  }

  // engine.parallel applies live. Raised from auto (2) to 3, three requests at once each find a free slot
  // and answer as alone; lowered to 1, the removed slots' conversations go to the spill, and the next
  // turn of one that was not on slot 0 resumes from the spill and answers as alone.
  void theSlotCountFollowsTheSettings() {
    QTemporaryDir data;
    json settings = anchorage::DefaultSettingsDocument(anchorage::MachineTotalRamBytes());
    settings["disk_cache"]["min_free_gb"] = 0;
    settings["spill"]["min_tokens"] = 64;
    QVERIFY(anchorage::WriteFileAtomic(data.filePath("settings.json").toStdString(), settings.dump()).ok());
    const QString replies = WriteReplies(data);
    ServerProcess s;
    QVERIFY(s.Start(data.path(), {"--grid", "64", "--test-replies", replies}));  // engine.parallel 0: auto
    const auto slot_count = [&] { return json::parse(s.Get("/health")->body)["slots"].size(); };
    QCOMPARE(slot_count(), size_t(2));
    const auto set_parallel = [&](int n) {
      json doc = json::parse(s.Get("/v1/settings")->body);
      doc["engine"]["parallel"] = n;
      const auto put = s.Put("/v1/settings", doc.dump());
      QVERIFY2(put && put->status == 200, put ? put->body.c_str() : "no answer");
    };
    set_parallel(3);
    QTRY_COMPARE_WITH_TIMEOUT(slot_count(), size_t(3), 5000);
    const json a = Request(Notes(21, 40), "RECITE the rows back.", 3000, 0, "LA");
    const json b = Request(Notes(22, 30), "Which row is the first?", 30, 0, "LB");
    const json c = Request(Notes(23, 30), "Which row is the last?", 30, 0, "LC");
    const auto [got_a, got_b, got_c] = StreamThreeAtOnce(s, a, b, c);
    QVERIFY2(got_b.first < got_a.last && got_c.first < got_a.last, "the requests did not run at once");
    CompareAnswers(got_a, StreamAnswer(alone_, a), "the long answer beside them");
    CompareAnswers(got_b, StreamAnswer(alone_, b), "a request on an added slot");
    CompareAnswers(got_c, StreamAnswer(alone_, c), "another request on an added slot");
    std::set<int> used;
    std::string moved;  // a session that ran on a slot that goes
    for (const char* session : {"LA", "LB", "LC"}) {
      const json row = NewestRequestRow(s, session);
      QVERIFY2(!row.is_null() && row.value("queue_position", -1) == 0, row.dump().c_str());
      used.insert(row["slot"].get<int>());
      if (row["slot"].get<int>() != 0 && session != std::string("LA")) moved = session;
    }
    QCOMPARE(used.size(), size_t(3));
    QVERIFY(!moved.empty());
    const int64_t saves = json::parse(s.Get("/v1/cache/stats")->body)["spill"]["saves"].get<int64_t>();
    set_parallel(1);
    QTRY_COMPARE_WITH_TIMEOUT(slot_count(), size_t(1), 5000);
    QVERIFY(json::parse(s.Get("/v1/cache/stats")->body)["spill"]["saves"].get<int64_t>() >= saves + 2);
    const json& first = moved == "LB" ? b : c;
    const Answer& first_answer = moved == "LB" ? got_b : got_c;
    json next = first;
    next["messages"].push_back({{"role", "assistant"}, {"content", first_answer.text}});
    next["messages"].push_back({{"role", "user"}, {"content", "And the one after it?"}});
    next["max_tokens"] = 12;
    CompareAnswers(StreamAnswer(s, next), StreamAnswer(alone_, next), "the next turn of a removed slot's conversation");
    const json row = NewestRequestRow(s, moved, 2);
    QVERIFY2(row["cache_tier"] == "spill" && row["slot"] == 0, row.dump().c_str());
  }

  // A conversation's turn decodes on slot 0 while a short side request of the same session (a title)
  // runs on a side slot; the conversation's next turn still resumes at its end anchor.
  void aGuestOnASideSlotLeavesTheEndAnchor() {
    const std::string notes = Notes(6, 120);
    json messages = json::array({{{"role", "system"}, {"content", notes}}, {{"role", "user"}, {"content", "Which row comes first?"}}});
    json first = {{"messages", messages}, {"max_tokens", 16}, {"temperature", 0}, {"session_id", "G"}};
    const json r1 = server_.Chat(first);
    QVERIFY(!r1.empty());
    messages.push_back(r1["choices"][0]["message"]);
    messages.push_back({{"role", "user"}, {"content", "RECITE every row."}});
    const json second = {{"messages", messages}, {"max_tokens", 3000}, {"temperature", 0}, {"session_id", "G"}};
    json r2;
    Clock::time_point second_done;
    std::thread t([&] {
      r2 = server_.Chat(second);
      second_done = Clock::now();
    });
    QTRY_VERIFY_WITH_TIMEOUT(BusySlots(server_) == 1, 30000);
    const json title = Request("Write a five-word title for the conversation.", "Which row comes first?", 12, 0, "G");
    const Answer got_title = StreamAnswer(server_, title);
    t.join();
    QVERIFY(!r2.empty());
    CompareAnswers(got_title, StreamAnswer(alone_, title), "the title");
    QVERIFY2(got_title.last < second_done, "the title waited for the conversation's turn to end");
    QVERIFY2(r2["usage"]["completion_tokens"].get<int64_t>() > 1000, r2["usage"].dump().c_str());
    // The next turn resumes at the end anchor the long turn left.
    messages.push_back(r2["choices"][0]["message"]);
    messages.push_back({{"role", "user"}, {"content", "Thanks."}});
    const json third = {{"messages", messages}, {"max_tokens", 8}, {"temperature", 0}, {"session_id", "G"}};
    const json r3 = server_.Chat(third);
    QVERIFY(!r3.empty());
    const json& usage = r3["usage"];
    QVERIFY2(usage["anchorage"]["cache_source"] == "end", usage.dump().c_str());
    QVERIFY2(usage["anchorage"]["cached_tokens"].get<int64_t>() > usage["prompt_tokens"].get<int64_t>() - 64, usage.dump().c_str());
  }
};

QTEST_GUILESS_MAIN(TestParallelServer)
#include "test_parallel_server.moc"
