// anchorage-server's --device: the CUDA backend loaded as a plugin (here the SIMT emulator's build of
// it, named by ANCHORAGE_CUDA_PLUGIN) serves a request resumed from a grid anchor, and from the disk
// tier, with the tokens and logprobs of a cold server on the same device, and decide's reused
// observation with the bits of every branch alone; lookup drafts verified in draft windows on the
// device keep every logprob of plain decoding, and so do the MTP head's drafts; an FP8 checkpoint runs
// there and resumes exactly; images run the tower on the device and resume with a cold server's bits;
// a full device refuses a prompt or an image it cannot hold (503) and goes on serving; a plugin that
// cannot load or find a GPU is a clear error with --device cuda, and the CPU with a note under auto.
#include <QtTest>

#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "engine/core/file_util.h"
#include "tests/server/image_fixture.h"
#include "tests/server/server_fixture.h"

using anchorage::testing::ServerProcess;
using json = nlohmann::json;

namespace {

const QString kEmulatedPlugin = QString(ANCHORAGE_BINARY_DIR) + "/tests/gpu/anchorage-cuda-emulated.so";
const QString kRealPlugin = QString(ANCHORAGE_BINARY_DIR) + "/app/anchorage-cuda.so";

std::string LongText(int notes = 40) {
  std::string text = "Keep these notes about devices, mirrors and anchors in mind.";
  for (int i = 0; i < notes; ++i) text += " note" + std::to_string(i * 7919 % 1000) + " says row " + std::to_string(i);
  return text;
}

json Turn(const json& messages) {
  return {{"messages", messages}, {"max_tokens", 8}, {"temperature", 0}, {"logprobs", true}, {"session_id", "gpu-1"}};
}

// Runs the server to its exit (it is expected to refuse to start) and returns what it printed.
std::string FailedStart(const QString& data_dir, const QStringList& flags, int* exit_code) {
  QProcess p;
  p.start(QString(ANCHORAGE_BINARY_DIR) + "/app/anchorage-server",
          QStringList{"--data-dir", data_dir, "--port", "0", "--threads", "1", "--shadow-model", "off"} + flags);
  if (!p.waitForFinished(120000)) {
    p.kill();
    p.waitForFinished(5000);
    *exit_code = -1;
    return "still running";
  }
  *exit_code = p.exitCode();
  return p.readAllStandardError().toStdString() + p.readAllStandardOutput().toStdString();
}

}  // namespace

class TestDeviceServer : public QObject {
  Q_OBJECT

  static std::string Text(const json& reply) { return reply["choices"][0]["message"]["content"].get<std::string>(); }
  // The tiny model's answers are mostly reasoning: both parts.
  static std::string Said(const json& reply) {
    const json& m = reply["choices"][0]["message"];
    return m.value("reasoning_content", "") + "|" + m["content"].get<std::string>();
  }

 private slots:
  void initTestCase() { qunsetenv("ANCHORAGE_CUDA_PLUGIN"); }
  void cleanup() {
    qunsetenv("ANCHORAGE_CUDA_PLUGIN");
    qunsetenv("ANCHORAGE_EMULATED_DEVICE_BYTES");
  }

  // Both K/V row dtypes: bf16 (the default) and f32.
  void cudaServesResumedTurnsWithColdBits_data() {
    QTest::addColumn<QString>("kv_dtype");
    QTest::addColumn<QString>("precision");
    QTest::newRow("bf16 (default)") << QString() << QString("exact");
    QTest::newRow("f32") << QString("f32") << QString("exact");
    QTest::newRow("fast products") << QString() << QString("fast");
  }
  void cudaServesResumedTurnsWithColdBits() {
    if (!std::filesystem::exists(kEmulatedPlugin.toStdString())) QSKIP("no emulated CUDA plugin in this build (not x86-64)");
    qputenv("ANCHORAGE_CUDA_PLUGIN", kEmulatedPlugin.toUtf8());
    QFETCH(QString, kv_dtype);
    QFETCH(QString, precision);
    QStringList flags = {"--device", "cuda", "--grid", "64", "--shadow-model", "off", "--precision", precision};
    if (!kv_dtype.isEmpty()) flags += QStringList{"--kv-dtype", kv_dtype};
    // The second request rewrites the first's question: it resumes from a grid anchor below it, a
    // cold prefill's state (an end anchor would be held to the greedy gate only).
    const json first = json::array({{{"role", "user"}, {"content", LongText() + " What does note 7 say?"}}});
    const json second = json::array({{{"role", "user"}, {"content", LongText() + " And which row is last?"}}});

    QTemporaryDir cached_dir;
    QVERIFY(anchorage::testing::WriteSettingsWithoutDiskFloor(cached_dir.path()));
    json settings = json::parse(*anchorage::ReadFile(cached_dir.filePath("settings.json").toStdString()));
    settings["disk_cache"]["admit_after"] = 1;  // the first request's lines go to the disk tier
    settings["disk_cache"]["min_tokens"] = 64;
    QVERIFY(anchorage::WriteFileAtomic(cached_dir.filePath("settings.json").toStdString(), settings.dump()).ok());
    ServerProcess cached;
    QVERIFY(cached.Start(cached_dir.path(), flags));
    QVERIFY2(cached.startup_output().find("cuda, SIMT emulator") != std::string::npos, cached.startup_output().c_str());
    auto health = cached.Get("/health");
    QVERIFY(health && health->status == 200);
    QCOMPARE(json::parse(health->body)["device"].get<std::string>(), std::string("cuda"));
    QCOMPARE(json::parse(health->body)["kv_dtype"].get<std::string>(), kv_dtype.isEmpty() ? std::string("bf16") : kv_dtype.toStdString());
    QCOMPARE(json::parse(health->body)["precision"].get<std::string>(), precision.toStdString());
    QVERIFY(cached.Chat(Turn(first)).contains("choices"));
    const json resumed = cached.Chat(Turn(second));
    QVERIFY(resumed.contains("choices"));
    const json& figures = resumed["usage"]["anchorage"];
    QVERIFY2(figures["cached_tokens"].get<int64_t>() >= 256 && figures["cache_source"] == "resident", figures.dump().c_str());

    // The same device with every cache off: the resumed request's tokens and logprobs are a cold prefill's.
    QTemporaryDir cold_dir;
    QVERIFY(anchorage::testing::WriteSettingsWithoutDiskFloor(cold_dir.path()));
    ServerProcess cold;
    QVERIFY(cold.Start(cold_dir.path(), flags + QStringList{"--caches", "off", "--disk-cache", "off"}));
    const json fresh = cold.Chat(Turn(second));
    QVERIFY(fresh.contains("choices"));
    QCOMPARE(fresh["usage"]["anchorage"]["cached_tokens"].get<int64_t>(), int64_t{0});
    QCOMPARE(QString::fromStdString(Said(fresh)), QString::fromStdString(Said(resumed)));
    const json& a = resumed["choices"][0]["logprobs"]["content"];
    QVERIFY2(a.is_array() && a.size() == 8, resumed.dump().c_str());
    QCOMPARE(QString::fromStdString(fresh["choices"][0]["logprobs"]["content"].dump()), QString::fromStdString(a.dump()));

    // With the RAM tiers cleared the request resumes from the disk tier's files, read into the host
    // state and brought to the device: a cold prefill's tokens and logprobs again.
    auto stats = [&] { return json::parse(cached.Get("/v1/cache/stats")->body); };
    QTRY_VERIFY_WITH_TIMEOUT(stats()["disk"].value("anchors_written", 0) >= 1, 20000);
    QCOMPARE(stats()["memory"]["device"].get<std::string>(), std::string("cuda"));
    QVERIFY(stats()["memory"]["device_bytes"].get<int64_t>() > 0);
    QVERIFY(cached.Post("/v1/cache/clear?tier=ram", "").value().status == 200);
    // Another conversation in between writes its own rows over the device copy's.
    QVERIFY(cached.Chat(Turn(json::array({{{"role", "user"}, {"content", "Something else entirely, " + LongText().substr(30)}}})))
                .contains("choices"));
    const json from_disk = cached.Chat(Turn(second));
    QVERIFY2(from_disk["usage"]["anchorage"]["cache_source"] == "disk", from_disk["usage"].dump().c_str());
    QCOMPARE(QString::fromStdString(Said(from_disk)), QString::fromStdString(Said(fresh)));
    QCOMPARE(QString::fromStdString(from_disk["choices"][0]["logprobs"]["content"].dump()), QString::fromStdString(a.dump()));
  }

  // Images on the device: the tower runs there (beside another request's decode steps), and the image's
  // turn and a follow-up resumed past it answer a cold server's tokens and logprobs on the same device.
  void imagesOnTheDeviceResumeWithColdBits() {
    if (!std::filesystem::exists(kEmulatedPlugin.toStdString())) QSKIP("no emulated CUDA plugin in this build (not x86-64)");
    qputenv("ANCHORAGE_CUDA_PLUGIN", kEmulatedPlugin.toUtf8());
    using anchorage::testing::ImagePart;
    using anchorage::testing::TextPart;
    const QStringList flags = {"--device", "cuda", "--grid", "64", "--shadow-model", "off", "--disk-cache", "off"};
    QTemporaryDir dir, cold_dir;
    ServerProcess server, cold;
    QVERIFY(server.Start(dir.path(), flags));
    QVERIFY(cold.Start(cold_dir.path(), flags + QStringList{"--caches", "off"}));
    const std::string photo = anchorage::testing::DataUrl(anchorage::testing::Png(300, 260, 1));
    const json first = json::array({{{"role", "user"}, {"content", {TextPart(LongText(12) + " What is in this picture?"), ImagePart(photo)}}}});
    json other = Turn(json::array({{{"role", "user"}, {"content", LongText(20) + " Something else."}}}));
    other["max_tokens"] = 24;
    other["session_id"] = "gpu-2";
    json r1, side;
    std::thread beside([&] { side = server.Chat(other); });
    r1 = server.Chat(Turn(first));
    beside.join();
    QVERIFY2(side.contains("choices"), side.dump().c_str());
    QVERIFY2(r1.contains("choices"), r1.dump().c_str());
    QCOMPARE(r1["usage"]["anchorage"]["image_tokens"].get<int64_t>(), int64_t(8 * 9));
    const json images = json::parse(server.Get("/v1/cache/stats")->body)["images"];
    QCOMPARE(images["device"].get<std::string>(), std::string("cuda"));
    QCOMPARE(images["encoded"].get<int64_t>(), int64_t(1));
    QCOMPARE(QString::fromStdString(r1["choices"][0]["logprobs"]["content"].dump()),
             QString::fromStdString(cold.Chat(Turn(first))["choices"][0]["logprobs"]["content"].dump()));
    json second = first;
    second.push_back({{"role", "assistant"}, {"content", Text(r1)}});
    second.push_back({{"role", "user"}, {"content", "And the colours?"}});
    const json r2 = server.Chat(Turn(second));
    QVERIFY2(r2["usage"]["anchorage"]["cached_tokens"].get<int64_t>() >= 128, r2["usage"].dump().c_str());
    QCOMPARE(QString::fromStdString(Said(r2)), QString::fromStdString(Said(cold.Chat(Turn(second)))));
    QCOMPARE(QString::fromStdString(r2["choices"][0]["logprobs"]["content"].dump()),
             QString::fromStdString(cold.Chat(Turn(second))["choices"][0]["logprobs"]["content"].dump()));
  }

  // Decide on the device: the reused observation (anchors saved and restored on host states, each
  // question's choices batched as branches) gives the bits of every branch run alone.
  // Slots on the device: requests that run at once (greedy and seeded sampling, one prefilling while
  // the others decode) answer the tokens and logprobs each gets alone on the same device.
  void concurrentRequestsOnTheDeviceAnswerAsAlone() {
    if (!std::filesystem::exists(kEmulatedPlugin.toStdString())) QSKIP("no emulated CUDA plugin in this build (not x86-64)");
    qputenv("ANCHORAGE_CUDA_PLUGIN", kEmulatedPlugin.toUtf8());
    const QStringList flags = {"--device", "cuda", "--grid", "64", "--shadow-model", "off", "--disk-cache", "off"};
    QTemporaryDir dir, alone_dir;
    ServerProcess server, alone;
    QVERIFY(server.Start(dir.path(), flags + QStringList{"--parallel", "3"}));
    QVERIFY(alone.Start(alone_dir.path(), flags + QStringList{"--parallel", "1", "--caches", "off"}));
    QCOMPARE(json::parse(server.Get("/health")->body)["slots"].size(), size_t(3));
    std::vector<json> bodies;
    for (int i = 0; i < 3; ++i) {
      json body = {{"messages", json::array({{{"role", "user"}, {"content", LongText(10 + 25 * i) + " Request " + std::to_string(i)}}})},
                   {"max_tokens", 12}, {"temperature", i == 1 ? 0.8 : 0.0}, {"seed", 11}, {"logprobs", true}, {"session_id", "dev-" + std::to_string(i)}};
      bodies.push_back(body);
    }
    std::vector<json> got(bodies.size());
    std::vector<std::thread> clients;
    for (size_t i = 0; i < bodies.size(); ++i) clients.emplace_back([&, i] { got[i] = server.Chat(bodies[i]); });
    for (auto& t : clients) t.join();
    for (size_t i = 0; i < bodies.size(); ++i) {
      const json reference = alone.Chat(bodies[i]);
      QVERIFY2(got[i].contains("choices") && reference.contains("choices"), got[i].dump().c_str());
      QCOMPARE(QString::fromStdString(Said(got[i])), QString::fromStdString(Said(reference)));
      QCOMPARE(QString::fromStdString(got[i]["choices"][0]["logprobs"]["content"].dump()),
               QString::fromStdString(reference["choices"][0]["logprobs"]["content"].dump()));
    }
    const json slot_list = json::parse(server.Get("/health")->body)["slots"];
    int used = 0;
    for (const json& slot : slot_list) used += slot["requests"].get<int>() > 0 ? 1 : 0;
    QVERIFY2(used >= 2, slot_list.dump().c_str());
    // The slots' decode rows ran in shared forwards on the device (CudaBackend::DecodeBatch, or beside a prefill piece).
    const std::string metrics = server.Get("/metrics")->body;
    const size_t at = metrics.find("\nanchorage_batched_decode_rows_total ");
    QVERIFY2(at != std::string::npos, metrics.c_str());
    QVERIFY2(std::atoll(metrics.c_str() + at + 37) > 0, metrics.substr(at, 60).c_str());
  }

  void decideOnTheDeviceGivesTheIndependentBits() {
    if (!std::filesystem::exists(kEmulatedPlugin.toStdString())) QSKIP("no emulated CUDA plugin in this build (not x86-64)");
    qputenv("ANCHORAGE_CUDA_PLUGIN", kEmulatedPlugin.toUtf8());
    QTemporaryDir data;
    ServerProcess server;
    // Grid 256: each question's choices (their rows after the question's 64-line) run as one batch of branches.
    QVERIFY(server.Start(data.path(), {"--device", "cuda", "--grid", "256", "--shadow-model", "off", "--disk-cache", "off"}));
    std::string log = "The build log follows.";
    for (int i = 0; i < 24; ++i) log += "\nstep " + std::to_string(i) + ": compiled unit" + std::to_string(i * 31 % 97);
    const json body = {{"messages", json::array({{{"role", "user"}, {"content", log}}})},
                       {"questions", json::array({{{"question", "Did the build pass?"}, {"choices", {"yes", "no", "unclear"}}},
                                                  {{"question", "Which unit came last?"}, {"candidates", {"unit3", "the last one", "none"}}}})}};
    json alone_body = body;
    alone_body["reuse"] = false;
    auto reused = server.Post("/v1/decide", body.dump());
    auto alone = server.Post("/v1/decide", alone_body.dump());
    QVERIFY(reused && reused->status == 200 && alone && alone->status == 200);
    const json r = json::parse(reused->body), a = json::parse(alone->body);
    QVERIFY2(r["usage"]["shared_prefix_tokens"].get<int64_t>() > 0, r["usage"].dump().c_str());
    for (size_t q = 0; q < 2; ++q) {
      json x = r["answers"][q], y = a["answers"][q];
      x.erase("ms");
      y.erase("ms");
      QCOMPARE(QString::fromStdString(x.dump()), QString::fromStdString(y.dump()));
    }
  }

  // Two slots repeating files at once on the device with drafts beside others on: their windows go in
  // one forward (CudaBackend::DecodeWindowsBatch), both draft and keep drafts, and each answer has the
  // logprobs of the same request on a server that does not draft.
  void draftWindowsOfTwoSlotsRunInOneBatchOnTheDevice() {
    if (!std::filesystem::exists(kEmulatedPlugin.toStdString())) QSKIP("no emulated CUDA plugin in this build (not x86-64)");
    qputenv("ANCHORAGE_CUDA_PLUGIN", kEmulatedPlugin.toUtf8());
    QTemporaryDir data, plain_data;
    std::string files[2];
    for (int f = 0; f < 2; ++f)
      for (int i = 0; i < 5; ++i) files[f] += "int v" + std::to_string(f) + "_" + std::to_string(i) + " = f(" + std::to_string(i * 7 % 13) + ");\n";
    const std::string replies = data.filePath("replies.json").toStdString();
    std::ofstream(replies) << json::array({{{"match", "Repeat file 0"}, {"reply", "</think>\n\n" + files[0]}},
                                           {{"match", "Repeat file 1"}, {"reply", "</think>\n\n" + files[1]}}}).dump();
    const QStringList flags = {"--device", "cuda", "--grid", "64", "--shadow-model", "off", "--disk-cache", "off", "--parallel", "2",
                               "--test-replies", QString::fromStdString(replies)};
    ServerProcess server, plain;
    QVERIFY(server.Start(data.path(), flags));
    QVERIFY(plain.Start(plain_data.path(), flags + QStringList{"--caches", "off"}));
    const auto set = [](ServerProcess& s, const char* section, const char* key, const char* value) {
      json doc = json::parse(s.Get("/v1/settings")->body);
      doc[section][key] = value;
      const auto put = s.Put("/v1/settings", doc.dump());
      QVERIFY2(put && put->status == 200, put ? put->body.c_str() : "no answer");
    };
    set(server, "speculative", "beside_others", "on");
    set(plain, "speculative", "mode", "off");
    const auto body = [&](int f) {
      return json{{"messages", {{{"role", "user"}, {"content", "Repeat file " + std::to_string(f) + " exactly:\n" + files[f]}}}}, {"max_tokens", 200},
                  {"temperature", 0}, {"logprobs", true}, {"session_id", "file-" + std::to_string(f)}};
    };
    json got[2];
    std::thread other([&] { got[1] = server.Chat(body(1)); });
    got[0] = server.Chat(body(0));
    other.join();
    for (int f = 0; f < 2; ++f) {
      QVERIFY2(got[f].contains("usage"), got[f].dump().c_str());
      QCOMPARE(QString::fromStdString(Text(got[f])), QString::fromStdString(files[f]));
      const json& usage = got[f]["usage"]["anchorage"];
      QVERIFY2(usage["accepted_tokens"].get<int64_t>() > 0, usage.dump().c_str());
      const json reference = plain.Chat(body(f));
      QCOMPARE(reference["usage"]["anchorage"]["drafted_tokens"].get<int64_t>(), int64_t{0});
      QCOMPARE(QString::fromStdString(got[f]["choices"][0]["logprobs"]["content"].dump()),
               QString::fromStdString(reference["choices"][0]["logprobs"]["content"].dump()));
    }
    const std::string metrics = server.Get("/metrics")->body;  // both windows ran in shared forwards
    const size_t at = metrics.find("\nanchorage_batched_window_rows_total ");
    QVERIFY2(at != std::string::npos && std::atoll(metrics.c_str() + at + 37) > 0, metrics.c_str());
  }

  // A reply that repeats a file from the prompt (forced through the forward by --test-replies) is
  // drafted by lookup and mostly accepted in draft windows on the device, with the logprobs of the
  // same request with drafts off.
  void draftsOnTheDeviceKeepTheLogprobs() {
    if (!std::filesystem::exists(kEmulatedPlugin.toStdString())) QSKIP("no emulated CUDA plugin in this build (not x86-64)");
    qputenv("ANCHORAGE_CUDA_PLUGIN", kEmulatedPlugin.toUtf8());
    QTemporaryDir data;
    std::string file;
    for (int i = 0; i < 6; ++i) file += "int value" + std::to_string(i) + " = compute(" + std::to_string(i * 7 % 13) + ", grid);\n";
    const std::string replies = data.filePath("replies.json").toStdString();
    std::ofstream(replies) << json::array({{{"match", "Repeat the file"}, {"reply", "</think>\n\n" + file}}}).dump();
    ServerProcess server;
    QVERIFY(server.Start(data.path(), {"--device", "cuda", "--grid", "64", "--shadow-model", "off", "--disk-cache", "off", "--test-replies",
                                       QString::fromStdString(replies)}));
    const std::string notes = server.Log(false);  // start notes go to stderr
    QVERIFY2(notes.find("anchorage-server: ") != std::string::npos && notes.find("no drafts") == std::string::npos, notes.c_str());
    auto ask = [&](const std::string& session) {
      return server.Chat({{"messages", {{{"role", "user"}, {"content", "Repeat the file exactly:\n" + file}}}}, {"max_tokens", 300},
                          {"temperature", 0}, {"logprobs", true}, {"session_id", session}});
    };
    const json on = ask("drafting");
    QCOMPARE(QString::fromStdString(Text(on)), QString::fromStdString(file));
    const json& usage = on["usage"]["anchorage"];
    const int64_t drafted = usage["drafted_tokens"].get<int64_t>(), accepted = usage["accepted_tokens"].get<int64_t>();
    QVERIFY2(accepted > on["usage"]["completion_tokens"].get<int64_t>() / 2 && accepted <= drafted, usage.dump().c_str());

    json settings = json::parse(server.Get("/v1/settings")->body);
    settings["speculative"]["mode"] = "off";
    auto put = server.Put("/v1/settings", settings.dump());
    QVERIFY(put && put->status == 200);
    const json off = ask("plain");
    QCOMPARE(off["usage"]["anchorage"]["drafted_tokens"].get<int64_t>(), int64_t{0});
    QCOMPARE(QString::fromStdString(Text(off)), QString::fromStdString(file));
    const json& logprobs = on["choices"][0]["logprobs"]["content"];
    QVERIFY2(logprobs.is_array() && logprobs.size() > 20, on.dump().c_str());
    QCOMPARE(QString::fromStdString(off["choices"][0]["logprobs"]["content"].dump()), QString::fromStdString(logprobs.dump()));
  }

  // The checkpoint's MTP head drafting on the device: the same replies and logprobs as drafts off, greedy
  // and sampled, and the head did draft.
  void mtpDraftsOnTheDeviceKeepTheReply() {
    if (!std::filesystem::exists(kEmulatedPlugin.toStdString())) QSKIP("no emulated CUDA plugin in this build (not x86-64)");
    qputenv("ANCHORAGE_CUDA_PLUGIN", kEmulatedPlugin.toUtf8());
    QTemporaryDir data;
    QVERIFY(anchorage::testing::WriteSettingsWithoutDiskFloor(data.path()));
    json start_settings = json::parse(*anchorage::ReadFile(data.filePath("settings.json").toStdString()));
    start_settings["speculative"]["mode"] = "mtp";  // a backend without the head would say so at start
    QVERIFY(anchorage::WriteFileAtomic(data.filePath("settings.json").toStdString(), start_settings.dump()).ok());
    ServerProcess server;
    QVERIFY(server.Start(data.path(), {"--device", "cuda", "--grid", "64", "--shadow-model", "off", "--disk-cache", "off"}));
    const std::string notes = server.Log(false);  // start notes go to stderr
    QVERIFY2(notes.find("anchorage-server: ") != std::string::npos && notes.find("no MTP drafts") == std::string::npos, notes.c_str());
    std::map<std::string, json> replies;
    for (const char* mode : {"off", "mtp"}) {
      json settings = json::parse(server.Get("/v1/settings")->body);
      settings["speculative"]["mode"] = mode;
      auto put = server.Put("/v1/settings", settings.dump());
      QVERIFY2(put && put->status == 200, put ? put->body.c_str() : "no answer");
      for (double temperature : {0.0, 0.8}) {
        const json reply = server.Chat({{"messages", {{{"role", "user"}, {"content", "Say something about grids."}}}}, {"max_tokens", 32},
                                        {"temperature", temperature}, {"seed", 5}, {"logprobs", true},
                                        {"session_id", std::string(mode) + std::to_string(temperature)}});
        QVERIFY2(reply.contains("choices"), reply.dump().c_str());
        const std::string key = std::to_string(temperature);
        if (replies.count(key) == 0) replies[key] = reply["choices"][0];
        QCOMPARE(QString::fromStdString(reply["choices"][0].dump()), QString::fromStdString(replies[key].dump()));
        if (std::string(mode) == "mtp") QVERIFY2(reply["usage"]["anchorage"]["drafted_tokens"].get<int64_t>() > 0, reply["usage"].dump().c_str());
      }
    }
  }

  // An FP8 checkpoint runs on the device as it is stored (codes and block scales): /health names the
  // weights, and a request resumed from the first's anchor answers with the logprobs of a cold server.
  // 8-bit weights on the device (an FP8 checkpoint, or --weights int8): a resumed turn has a cold one's bits.
  void eightBitWeightsRunOnTheDevice_data() {
    QTest::addColumn<QString>("dtype");
    QTest::addColumn<QStringList>("extra");
    QTest::addColumn<QString>("weights");
    QTest::newRow("fp8 checkpoint") << "fp8" << QStringList{} << "fp8-e4m3 + bf16";
    QTest::newRow("--weights int8") << "bf16" << QStringList{"--weights", "int8"} << "int8";
  }
  void eightBitWeightsRunOnTheDevice() {
    QFETCH(QString, dtype);
    QFETCH(QStringList, extra);
    QFETCH(QString, weights);
    if (!std::filesystem::exists(kEmulatedPlugin.toStdString())) QSKIP("no emulated CUDA plugin in this build (not x86-64)");
    qputenv("ANCHORAGE_CUDA_PLUGIN", kEmulatedPlugin.toUtf8());
    QTemporaryDir data;
    const QString model_dir = data.filePath("model");
    QCOMPARE(QProcess::execute(QString(ANCHORAGE_BINARY_DIR) + "/app/anchorage-tool", {"make-model", "--size", "tiny", "--seed", "0", "--dtype", dtype, model_dir}), 0);
    const QStringList flags = QStringList{"--device", "cuda", "--model", model_dir, "--grid", "64", "--shadow-model", "off", "--disk-cache", "off"} + extra;
    const json first = json::array({{{"role", "user"}, {"content", LongText() + " What does note 7 say?"}}});
    const json second = json::array({{{"role", "user"}, {"content", LongText() + " And which row is last?"}}});
    ServerProcess cached;
    QVERIFY(cached.Start(data.filePath("cached"), flags));
    const json health = json::parse(cached.Get("/health")->body);
    QCOMPARE(health["device"].get<std::string>(), std::string("cuda"));
    QCOMPARE(QString::fromStdString(health["weights"].get<std::string>()), weights);
    if (!extra.isEmpty()) {  // int8 at load: the server says what it costs against the stored weights
      const std::string log = cached.Log(false);
      QVERIFY2(log.find("weights int8:") != std::string::npos && log.find("fixed 64-token prompt") != std::string::npos, log.c_str());
    }
    QVERIFY(cached.Chat(Turn(first)).contains("choices"));
    const json resumed = cached.Chat(Turn(second));
    QVERIFY2(resumed["usage"]["anchorage"]["cached_tokens"].get<int64_t>() >= 256, resumed["usage"].dump().c_str());
    ServerProcess cold;
    QVERIFY(cold.Start(data.filePath("cold"), flags + QStringList{"--caches", "off"}));
    const json fresh = cold.Chat(Turn(second));
    QCOMPARE(fresh["usage"]["anchorage"]["cached_tokens"].get<int64_t>(), int64_t{0});
    QCOMPARE(QString::fromStdString(Said(fresh)), QString::fromStdString(Said(resumed)));
    QCOMPARE(QString::fromStdString(fresh["choices"][0]["logprobs"]["content"].dump()),
             QString::fromStdString(resumed["choices"][0]["logprobs"]["content"].dump()));
  }

  // A device without room for a prompt's rows refuses that request before any tier changes (503
  // memory_exhausted, with the GPU named); the server goes on serving, the same bits as before.
  void aFullDeviceRefusesAndKeepsServing() {
    if (!std::filesystem::exists(kEmulatedPlugin.toStdString())) QSKIP("no emulated CUDA plugin in this build (not x86-64)");
    qputenv("ANCHORAGE_CUDA_PLUGIN", kEmulatedPlugin.toUtf8());
    const QStringList flags = {"--device", "cuda", "--shadow-model", "off", "--disk-cache", "off"};
    const json short_turn = Turn(json::array({{{"role", "user"}, {"content", LongText(10)}}}));
    const json long_turn = Turn(json::array({{{"role", "user"}, {"content", LongText(160)}}}));
    QTemporaryDir data;
    int64_t device_bytes = 0, row_bytes = 0;
    std::string expected;
    {
      ServerProcess roomy;
      QVERIFY(roomy.Start(data.path(), flags));
      expected = Said(roomy.Chat(short_turn));
      const json health = json::parse(roomy.Get("/health")->body);  // the emulated device holds 1 TiB
      device_bytes = (int64_t{1} << 40) - health["device_free_bytes"].get<int64_t>();
      QVERIFY(health["device_bytes"].get<int64_t>() > 0 && health["device_bytes"].get<int64_t>() <= device_bytes);
      json resident;  // the stats may trail the answer a moment
      QTRY_VERIFY_WITH_TIMEOUT((resident = json::parse(roomy.Get("/v1/cache/stats")->body)["resident"])["rows"].get<int64_t>() > 0, 10000);
      row_bytes = resident["row_bytes"].get<int64_t>() / resident["rows"].get<int64_t>();  // K/V bytes a token
      const json long_reply = roomy.Chat(long_turn);
      QVERIFY2(long_reply["usage"]["prompt_tokens"].get<int64_t>() > 1024, long_reply["usage"].dump().c_str());
    }
    QVERIFY2(device_bytes > 0 && row_bytes > 0, (std::to_string(device_bytes) + " " + std::to_string(row_bytes)).c_str());
    // Room for the short request's state and 1,024 rows more: growing to 2,048 rows needs 2,048 beside the old.
    qputenv("ANCHORAGE_EMULATED_DEVICE_BYTES", QByteArray::number(static_cast<qint64>(device_bytes + 1024 * row_bytes)));
    ServerProcess full;
    const bool started = full.Start(data.path(), flags);
    qunsetenv("ANCHORAGE_EMULATED_DEVICE_BYTES");
    QVERIFY2(started, full.Log().c_str());
    QCOMPARE(QString::fromStdString(Said(full.Chat(short_turn))), QString::fromStdString(expected));
    auto refused = full.Post("/v1/chat/completions", long_turn.dump());
    QVERIFY(refused);
    QCOMPARE(refused->status, 503);
    const json error = json::parse(refused->body)["error"];
    QVERIFY2(error["code"] == "memory_exhausted" && error["message"].get<std::string>().find("the GPU has") != std::string::npos, refused->body.c_str());
    QCOMPARE(QString::fromStdString(Said(full.Chat(short_turn))), QString::fromStdString(expected));
    // A large image's tower work (tens of MiB) does not fit either: a 503 that says so, not a bad image's 400.
    const json picture = Turn(json::array({{{"role", "user"}, {"content", {anchorage::testing::TextPart("What is this?"),
        anchorage::testing::ImagePart(anchorage::testing::DataUrl(anchorage::testing::Png(1024, 1024, 3)))}}}}));
    auto no_room = full.Post("/v1/chat/completions", picture.dump());
    QVERIFY(no_room);
    QCOMPARE(no_room->status, 503);
    QVERIFY2(json::parse(no_room->body)["error"]["message"].get<std::string>().find("no room to encode an image") != std::string::npos,
             no_room->body.c_str());
    QCOMPARE(QString::fromStdString(Said(full.Chat(short_turn))), QString::fromStdString(expected));
  }

  void aPluginThatCannotLoadIsAClearErrorOrTheCpu() {
    QTemporaryDir data;
    qputenv("ANCHORAGE_CUDA_PLUGIN", "/nonexistent/anchorage-cuda.so");
    int code = 0;
    const std::string out = FailedStart(data.path(), {"--device", "cuda"}, &code);
    QVERIFY2(code != 0, out.c_str());
    QVERIFY2(out.find("--device cuda: cannot load the CUDA plugin /nonexistent/anchorage-cuda.so") != std::string::npos, out.c_str());

    ServerProcess fallback;
    QVERIFY(fallback.Start(data.path(), {"--device", "auto", "--shadow-model", "off"}));
    QVERIFY2(fallback.startup_output().find("(model ") != std::string::npos && fallback.startup_output().find(", cpu, kernel path ") != std::string::npos,
             fallback.startup_output().c_str());
    const std::string log = fallback.Log(false);
    QVERIFY2(log.find("device: the CPU runs the model (cannot load the CUDA plugin") != std::string::npos, log.c_str());
  }

  void theRealPluginWithoutAGpuSaysWhy() {
    if (!std::filesystem::exists(kRealPlugin.toStdString())) QSKIP("this build has no CUDA toolkit, so no anchorage-cuda.so");
    if (std::filesystem::exists("/dev/nvidiactl")) QSKIP("this machine has an NVIDIA driver: the device check covers the GPU");
    QTemporaryDir data;
    int code = 0;
    const std::string out = FailedStart(data.path(), {"--device", "cuda"}, &code);
    QVERIFY2(code != 0, out.c_str());
    // The plugin loaded (every engine symbol it needs came from the server) and found no device.
    QVERIFY2(out.find("--device cuda: no usable CUDA device") != std::string::npos, out.c_str());
  }

  void badDeviceValuesAreRefused() {
    QTemporaryDir data;
    int code = 0;
    const std::string out = FailedStart(data.path(), {"--device", "tpu"}, &code);
    QVERIFY2(code != 0 && out.find("device must be cpu, cuda or auto, got 'tpu'") != std::string::npos, out.c_str());
  }
};

QTEST_GUILESS_MAIN(TestDeviceServer)
#include "test_device_server.moc"
