// The disk tier through anchorage-server on the tiny model (64-token grid): a conversation's head
// written by one server process is restored by the next one after a SIGKILL, which answers the
// same greedy tokens as the cold run; a corrupted chunk makes a clean cold fallback with a journal
// row; the stats, /metrics and clear?tier=disk show and empty the tier.
#include <QtTest>

#include <filesystem>
#include <fstream>

#include "engine/core/file_util.h"
#include "engine/settings/settings.h"
#include "tests/server/server_fixture.h"

using anchorage::testing::ServerProcess;
using json = nlohmann::json;

namespace {

json Chat(const std::string& text) {
  return {{"messages", {{{"role", "user"}, {"content", text}}}}, {"max_tokens", 12}, {"temperature", 0}};
}

std::string LongText() {
  std::string text = "Please summarise the following notes about anchors, grid lines and restores.";
  for (int i = 0; i < 160; ++i) text += " note" + std::to_string(i * 7919 % 1000) + " says line " + std::to_string(i);
  return text;
}

}  // namespace

class TestDiskCacheServer : public QObject {
  Q_OBJECT
  QTemporaryDir data_;

  std::string DiskDir() const { return data_.filePath("cache/disk").toStdString(); }

  // The disk tier writes from the first cold read, anything over 64 tokens, on any free space.
  void WriteSettings() {
    json doc = anchorage::DefaultSettingsDocument(anchorage::MachineTotalRamBytes());
    doc["disk_cache"]["admit_after"] = 1;
    doc["disk_cache"]["min_tokens"] = 64;
    doc["disk_cache"]["min_free_gb"] = 0;
    QVERIFY(anchorage::MakeDirectories(data_.path().toStdString(), 0700).ok());
    QVERIFY(anchorage::WriteFileAtomic(data_.filePath("settings.json").toStdString(), doc.dump()).ok());
  }

  json Stats(ServerProcess& s) {
    auto r = s.Get("/v1/cache/stats");
    if (!r || r->status != 200) return json::object();
    return json::parse(r->body, nullptr, false);
  }

  json Ask(ServerProcess& s) {
    auto r = s.Post("/v1/chat/completions", Chat(LongText()).dump());
    if (!r || r->status != 200) {
      qWarning() << "chat failed:" << (r ? QString::fromStdString(r->body) : QString("no response"));
      return json::object();
    }
    return json::parse(r->body, nullptr, false);
  }

 private slots:
  void headSurvivesARestart() {
    WriteSettings();
    std::string cold_text;
    int64_t prompt_tokens = 0;
    {
      ServerProcess a;
      QVERIFY(a.Start(data_.path(), {"--grid", "64"}));
      const json cold = Ask(a);
      QCOMPARE(cold["usage"]["anchorage"]["cache_source"].get<std::string>(), std::string("cold"));
      cold_text = cold["choices"][0]["message"]["content"].get<std::string>();
      prompt_tokens = cold["usage"]["prompt_tokens"].get<int64_t>();
      QVERIFY2(prompt_tokens > 256, "the prompt spans several lines");
      QTRY_VERIFY_WITH_TIMEOUT(Stats(a)["disk"].value("anchors_written", 0) >= 1, 20000);
      a.Kill();  // SIGKILL: nothing is flushed at exit
    }
    ServerProcess b;
    QVERIFY(b.Start(data_.path(), {"--grid", "64"}));
    const json warm = Ask(b);
    QCOMPARE(warm["usage"]["anchorage"]["cache_source"].get<std::string>(), std::string("disk"));
    QCOMPARE(warm["usage"]["anchorage"]["cache_tier"].get<std::string>(), std::string("disk"));
    const int64_t cached = warm["usage"]["anchorage"]["cached_tokens"].get<int64_t>();
    QVERIFY(cached > 0 && cached % 64 == 0 && cached < prompt_tokens);
    QCOMPARE(warm["choices"][0]["message"]["content"].get<std::string>(), cold_text);
    const json disk = Stats(b)["disk"];
    QVERIFY2(disk.contains("hits") && disk.contains("top_prefixes"), disk.dump().c_str());
    QCOMPARE(disk["hits"].get<int64_t>(), int64_t(1));
    QCOMPARE(disk["mode"].get<std::string>(), std::string("readwrite"));
    QVERIFY(disk["top_prefixes"].size() >= 1);
    QVERIFY(!disk["top_prefixes"][0].contains("text"));  // token counts, never a user's text
    auto metrics = b.Get("/metrics");
    QVERIFY(metrics && metrics->body.find("anchorage_disk_cache_hits_total 1\n") != std::string::npos);

    // A flipped byte in a chunk: the next request that would read it starts cold, answers the same, and the journal says why.
    QVERIFY(b.Post("/v1/cache/clear?tier=ram", "").value().status == 200);
    std::string victim;
    for (const auto& e : std::filesystem::directory_iterator(DiskDir()))
      if (e.path().string().ends_with(".chunk")) victim = e.path().string();
    QVERIFY(!victim.empty());
    std::string bytes = *anchorage::ReadFile(victim);
    bytes[bytes.size() - 64] ^= 0x04;
    QVERIFY(anchorage::WriteFileAtomic(victim, bytes).ok());
    const json fallback = Ask(b);
    QVERIFY(fallback["usage"]["anchorage"]["cache_source"].get<std::string>() != "disk");
    QCOMPARE(fallback["choices"][0]["message"]["content"].get<std::string>(), cold_text);
    QCOMPARE(Stats(b)["disk"]["failed_restores"].get<int64_t>(), int64_t(1));
    QTRY_VERIFY_WITH_TIMEOUT(b.Get("/v1/journal?kind=failed_restore&limit=10").value().body.find("checksum") != std::string::npos, 10000);

    // clear?tier=disk empties the files and keeps serving.
    auto cleared = b.Post("/v1/cache/clear?tier=disk", "");
    QVERIFY(cleared && cleared->status == 200);
    QCOMPARE(json::parse(cleared->body)["stats"]["disk"]["files"].get<int64_t>(), int64_t(0));
    QVERIFY(!Ask(b).empty());
  }
  // A file whose header no longer reads is deleted when the next process opens the tier: the
  // journal names it, the start says so, and the request it would have served reads cold.
  void anUnreadableFileIsNamedInTheJournal() {
    WriteSettings();
    std::string cold_text;
    {
      ServerProcess a;
      QVERIFY(a.Start(data_.path(), {"--grid", "64"}));
      QVERIFY(a.Post("/v1/cache/clear?tier=disk", "").value().status == 200);
      const json cold = Ask(a);
      cold_text = cold["choices"][0]["message"]["content"].get<std::string>();
      QTRY_VERIFY_WITH_TIMEOUT(Stats(a)["disk"].value("anchors_written", 0) >= 1, 20000);
      a.Kill();
    }
    std::string victim;
    for (const auto& e : std::filesystem::directory_iterator(DiskDir()))
      if (e.path().string().ends_with(".anchor")) victim = e.path().filename().string();
    QVERIFY(!victim.empty());
    const std::string path = DiskDir() + "/" + victim;
    std::string bytes = *anchorage::ReadFile(path);
    bytes[0] ^= 0x20;  // the magic
    QVERIFY(anchorage::WriteFileAtomic(path, bytes).ok());
    ServerProcess b;
    QVERIFY(b.Start(data_.path(), {"--grid", "64"}));
    QVERIFY2(b.startup_output().find("unreadable") != std::string::npos || b.Log(false).find("unreadable") != std::string::npos, b.startup_output().c_str());
    QTRY_VERIFY_WITH_TIMEOUT(b.Get("/v1/journal?kind=failed_restore&limit=10").value().body.find(victim) != std::string::npos, 10000);
    QCOMPARE(Stats(b)["disk"]["swept_corrupt"].get<int64_t>(), int64_t(1));
    const json fallback = Ask(b);
    QCOMPARE(fallback["usage"]["anchorage"]["cache_source"].get<std::string>(), std::string("cold"));
    QCOMPARE(fallback["choices"][0]["message"]["content"].get<std::string>(), cold_text);
  }
};

QTEST_MAIN(TestDiskCacheServer)
#include "test_disk_cache_server.moc"
