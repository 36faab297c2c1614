// Images through anchorage-server on the tiny model (its tower, 64-token grid): a conversation with an image
// resumed from the end anchor, another session's grid anchor and the spill after a restart answers a cold
// server's tokens and logprobs bit for bit; the same pixels under another URL hit (the tower's cache and the
// rows) and new pixels under the same URL miss; the cap leaves the oldest images out in steps; bad images
// get a clear 400 and the server keeps serving; http and https URLs are fetched where allowed, https
// hosts checked against the system's CAs or --image-ca-file.
#include <QThread>
#include <QtTest>

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "engine/core/file_util.h"
#include "engine/server/openai_api.h"
#include "engine/settings/settings.h"
#include "tests/server/image_fixture.h"
#include "tests/server/server_fixture.h"

using anchorage::testing::AnswerLogprobs;
using anchorage::testing::AnswerText;
using anchorage::testing::CachedTokens;
using anchorage::testing::DataUrl;
using anchorage::testing::ImagePart;
using anchorage::testing::Png;
using anchorage::testing::TextPart;
using anchorage::testing::ServerProcess;
using json = nlohmann::json;

namespace {

// A test's image host listening on a thread until the scope ends.
struct Serving {
  explicit Serving(httplib::Server& server) : server(server), thread([&server] { server.listen_after_bind(); }) {}
  ~Serving() {
    for (int i = 0; i < 500 && !server.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));  // stop() before listening is lost
    server.stop();
    thread.join();
  }
  httplib::Server& server;
  std::thread thread;
};

// A self-signed certificate for 127.0.0.1 (an EC P-256 key, an hour long), as PEM files.
bool WriteSelfSignedCertificate(const std::string& cert_path, const std::string& key_path) {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  X509* cert = X509_new();
  bool ok = key != nullptr && cert != nullptr;
  if (ok) {
    X509_set_version(cert, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(cert), 1);
    X509_gmtime_adj(X509_getm_notBefore(cert), -60);
    X509_gmtime_adj(X509_getm_notAfter(cert), 3600);
    X509_set_pubkey(cert, key);
    X509_NAME* name = X509_get_subject_name(cert);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("127.0.0.1"), -1, -1, 0);
    X509_set_issuer_name(cert, name);
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, cert, cert, nullptr, nullptr, 0);
    X509_EXTENSION* san = X509V3_EXT_conf_nid(nullptr, &ctx, NID_subject_alt_name, "IP:127.0.0.1");
    ok = san != nullptr && X509_add_ext(cert, san, -1) == 1 && X509_sign(cert, key, EVP_sha256()) > 0;
    X509_EXTENSION_free(san);
  }
  FILE* cert_file = ok ? std::fopen(cert_path.c_str(), "w") : nullptr;
  FILE* key_file = ok ? std::fopen(key_path.c_str(), "w") : nullptr;
  ok = cert_file != nullptr && key_file != nullptr && PEM_write_X509(cert_file, cert) == 1 &&
       PEM_write_PrivateKey(key_file, key, nullptr, nullptr, 0, nullptr, nullptr) == 1;
  if (cert_file != nullptr) std::fclose(cert_file);
  if (key_file != nullptr) std::fclose(key_file);
  X509_free(cert);
  EVP_PKEY_free(key);
  return ok;
}

std::string Notes() {
  std::string text = "You look at pictures and keep these notes in mind.";
  for (int i = 0; i < 60; ++i) text += " note" + std::to_string((i * 7919) % 1000) + " says row " + std::to_string(i);
  return text;
}

json Turn(const json& messages, const std::string& session) {
  return {{"messages", messages}, {"max_tokens", 8}, {"temperature", 0}, {"logprobs", true}, {"top_logprobs", 2}, {"session_id", session}};
}

int64_t PromptTokens(const json& reply) { return reply["usage"]["prompt_tokens"].get<int64_t>(); }


}  // namespace

class TestImageServer : public QObject {
  Q_OBJECT

  QTemporaryDir cold_data_, images_;
  ServerProcess cold_;  // caches off: every answer a cold prefill's

  json Stats(ServerProcess& s) { return json::parse(s.Get("/v1/cache/stats")->body); }

 private slots:
  void initTestCase() { QVERIFY(cold_.Start(cold_data_.path(), {"--grid", "64", "--caches", "off"})); }

  void everyResumeWithAnImageAnswersAsCold() {
    QTemporaryDir data;
    QVERIFY(anchorage::testing::WriteSettingsWithoutDiskFloor(data.path()));
    const std::string photo = DataUrl(Png(300, 260, 1));
    const json first = json::array({{{"role", "system"}, {"content", Notes()}},
                                     {{"role", "user"}, {"content", {TextPart("What is in this picture?"), ImagePart(photo)}}}});
    json second = first, third;
    {
      ServerProcess s;
      QVERIFY(s.Start(data.path(), {"--grid", "64"}));
      const json r1 = s.Chat(Turn(first, "A"));
      QVERIFY2(r1.is_object() && r1.contains("choices"), r1.dump().c_str());
      QCOMPARE(AnswerLogprobs(r1), AnswerLogprobs(cold_.Chat(Turn(first, "cold"))));
      QCOMPARE(r1["usage"]["anchorage"]["image_tokens"].get<int64_t>(), int64_t(8 * 9));  // 300 x 260 is resized to 288 x 256
      // Another image in its place answers otherwise: the rows are the image's, not the placeholder's.
      json elsewhere = first;
      elsewhere[1]["content"][1] = ImagePart(DataUrl(Png(300, 260, 2)));
      QVERIFY(AnswerLogprobs(cold_.Chat(Turn(elsewhere, "cold"))) != AnswerLogprobs(r1));
      // The follow-up resumes where A's rows part from it, past the image (the end anchor or the grid line below).
      second.push_back({{"role", "assistant"}, {"content", AnswerText(r1)}});
      second.push_back({{"role", "user"}, {"content", "And the colours?"}});
      const json r2 = s.Chat(Turn(second, "A"));
      QVERIFY2(CachedTokens(r2) > PromptTokens(r1) - 128, r2["usage"].dump().c_str());  // the picture's rows come last but for its line
      QCOMPARE(AnswerLogprobs(r2), AnswerLogprobs(cold_.Chat(Turn(second, "cold"))));
      // Another session with the same notes and picture resumes at a grid line past the image.
      json other = first;
      other[1]["content"][0] = TextPart("Describe it briefly, please.");
      json moved = other;
      moved[1]["content"] = {ImagePart(photo), TextPart("Describe it briefly, please.")};
      const json rb = s.Chat(Turn(moved, "B"));
      QCOMPARE(AnswerLogprobs(rb), AnswerLogprobs(cold_.Chat(Turn(moved, "cold"))));
      QVERIFY2(CachedTokens(rb) >= 64, rb["usage"].dump().c_str());
      // The tower ran once: every request showed the same photo.
      const json images = Stats(s)["images"];
      QCOMPARE(images["encoded"].get<int64_t>(), int64_t(1));
      QVERIFY(images["hits"].get<int64_t>() >= 2);
      // A follow-up that brings a new picture: text alignment cannot see images, so none drops it.
      json fourth = second;
      fourth.push_back({{"role", "assistant"}, {"content", AnswerText(r2)}});
      fourth.push_back({{"role", "user"}, {"content", {TextPart("And this one?"), ImagePart(DataUrl(Png(260, 300, 9)))}}});
      QCOMPARE(AnswerLogprobs(s.Chat(Turn(fourth, "A"))), AnswerLogprobs(cold_.Chat(Turn(fourth, "cold"))));
      QVERIFY(s.Chat(Turn(second, "A")).is_object());
      third = second;
      third.push_back({{"role", "assistant"}, {"content", AnswerText(r2)}});
      third.push_back({{"role", "user"}, {"content", "Count the shapes."}});
      QVERIFY(s.Terminate());
    }
    // After a restart the spill holds A's rows; the image is encoded anew to the same key ids.
    ServerProcess s;
    QVERIFY(s.Start(data.path(), {"--grid", "64"}));
    const json r3 = s.Chat(Turn(third, "A"));
    QVERIFY2(CachedTokens(r3) > 256, r3["usage"].dump().c_str());
    QCOMPARE(Stats(s)["spill"]["restores"].get<int64_t>(), int64_t(1));
    QCOMPARE(AnswerLogprobs(r3), AnswerLogprobs(cold_.Chat(Turn(third, "cold"))));
  }

  // A reply with reasoning comes back without it, so the next turn meets the rows only by text alignment,
  // which cannot see images: a new picture in that turn is served, not aligned away (and the answer is the
  // cold server's).
  void aNewImageAfterAReasoningTurnIsServed() {
    QTemporaryDir data, cold_data;
    const json replies = json::array({{{"match", "PICTURE"}, {"reply", "Looking at the shapes first.\n</think>\n\nA square and a circle."}}});
    for (const QTemporaryDir* d : {&data, &cold_data}) {
      QVERIFY(anchorage::testing::WriteSettingsWithoutDiskFloor(d->path()));
      QVERIFY(anchorage::WriteFileAtomic(d->filePath("replies.json").toStdString(), replies.dump()).ok());
    }
    ServerProcess s, cold;
    QVERIFY(s.Start(data.path(), {"--grid", "64", "--test-replies", data.filePath("replies.json")}));
    QVERIFY(cold.Start(cold_data.path(), {"--grid", "64", "--caches", "off", "--test-replies", cold_data.filePath("replies.json")}));
    json messages = json::array({{{"role", "system"}, {"content", Notes()}},
                                 {{"role", "user"}, {"content", {TextPart("PICTURE one"), ImagePart(DataUrl(Png(256, 256, 11)))}}}});
    const auto whole = [](const json& m, const std::string& session) {  // the scripted reply to its end
      json body = Turn(m, session);
      body["max_tokens"] = 100;
      return body;
    };
    const json first = s.Chat(whole(messages, "R"));
    QVERIFY2(first["choices"][0]["message"].contains("reasoning_content"), first.dump().c_str());
    messages.push_back(first["choices"][0]["message"]);
    messages.push_back({{"role", "user"}, {"content", {TextPart("PICTURE two"), ImagePart(DataUrl(Png(256, 256, 12)))}}});
    const json second = s.Chat(whole(messages, "R"));
    QCOMPARE(second["usage"]["anchorage"]["image_tokens"].get<int64_t>(), int64_t(128));  // both pictures' rows
    QCOMPARE(AnswerLogprobs(second), AnswerLogprobs(cold.Chat(whole(messages, "cold"))));
  }

  // The disk tier (after a SIGKILL: nothing spilled) and the response cache answer a prompt with an image as cold.
  void theDiskTierAndTheResponseCacheResumeImages() {
    QTemporaryDir data;
    json doc = anchorage::DefaultSettingsDocument(anchorage::MachineTotalRamBytes());
    doc["disk_cache"]["admit_after"] = 1;
    doc["disk_cache"]["min_tokens"] = 64;
    doc["disk_cache"]["min_free_gb"] = 0;
    doc["response_cache"]["enabled"] = true;
    QVERIFY(anchorage::WriteFileAtomic(data.filePath("settings.json").toStdString(), doc.dump()).ok());
    const json messages = json::array({{{"role", "user"}, {"content", {ImagePart(DataUrl(Png(320, 256, 8))), TextPart(Notes())}}}});
    const json want = AnswerLogprobs(cold_.Chat(Turn(messages, "cold")));
    {
      ServerProcess a;
      QVERIFY(a.Start(data.path(), {"--grid", "64"}));
      QCOMPARE(AnswerLogprobs(a.Chat(Turn(messages, "D"))), want);
      QTRY_VERIFY_WITH_TIMEOUT(Stats(a)["disk"].value("anchors_written", 0) >= 1, 20000);
      a.Kill();
    }
    ServerProcess b;
    QVERIFY(b.Start(data.path(), {"--grid", "64"}));
    const json from_disk = b.Chat(Turn(messages, "E"));
    QCOMPARE(from_disk["usage"]["anchorage"]["cache_source"].get<std::string>(), std::string("disk"));
    QVERIFY2(CachedTokens(from_disk) >= 128, from_disk["usage"].dump().c_str());  // past the picture's 80 rows
    QCOMPARE(AnswerLogprobs(from_disk), want);
    const json replayed = b.Chat(Turn(messages, "E"));
    QCOMPARE(replayed["usage"]["anchorage"]["cache_source"].get<std::string>(), std::string("response"));
    QCOMPARE(AnswerLogprobs(replayed), want);
  }

  // The shadow reader has no tower: it reads an image's rows as its placeholder token, without an error.
  void theShadowReaderReadsPastImages() {
    QTemporaryDir data;
    ServerProcess s;
    QVERIFY(s.Start(data.path(), {"--grid", "64"}));
    const json messages = json::array({{{"role", "user"}, {"content", {ImagePart(DataUrl(Png(256, 256, 6))), TextPart(Notes() + Notes())}}}});
    QVERIFY(s.Chat(Turn(messages, "S")).contains("choices"));
    json shadow;
    for (int i = 0; i < 100; ++i, QThread::msleep(100)) {  // it reads in idle windows, 512 rows a chunk
      shadow = json::parse(s.Get("/v1/shadow/status")->body);
      if (shadow["tokens_read"].get<int64_t>() >= 512 || !shadow["last_error"].is_null()) break;
    }
    QVERIFY2(shadow["last_error"].is_null(), shadow.dump().c_str());
    QVERIFY2(shadow["tokens_read"].get<int64_t>() >= 512, shadow.dump().c_str());
  }

  void samePixelsHitUnderAnotherUrlAndNewPixelsMiss() {
    QTemporaryDir data;
    const std::string png = Png(256, 256, 3);
    const std::string file = images_.filePath("shot.png").toStdString();
    std::ofstream(file, std::ios::binary) << png;
    ServerProcess s;
    QVERIFY(s.Start(data.path(), {"--grid", "64", "--image-folder", images_.path()}));
    const auto ask = [](const std::string& url) {
      return json::array({{{"role", "system"}, {"content", Notes()}}, {{"role", "user"}, {"content", {ImagePart(url), TextPart("What changed?")}}}});
    };
    const json a = s.Chat(Turn(ask(DataUrl(png)), "A"));
    QVERIFY2(a.contains("choices"), a.dump().c_str());
    // The same pixels from a file: the tower's cache answers, and the rows through the image are reused.
    const json b = s.Chat(Turn(ask(file), "B"));
    QCOMPARE(AnswerLogprobs(b), AnswerLogprobs(a));
    QVERIFY2(CachedTokens(b) >= PromptTokens(b) - 64, b["usage"].dump().c_str());
    json images = Stats(s)["images"];
    QCOMPARE(images["encoded"].get<int64_t>(), int64_t(1));
    QCOMPARE(images["hits"].get<int64_t>(), int64_t(1));
    // New pixels under the same path: encoded anew, and the rows stop matching where the image starts.
    std::ofstream(file, std::ios::binary | std::ios::trunc) << Png(256, 256, 4);
    const json c = s.Chat(Turn(ask(file), "C"));
    QCOMPARE(Stats(s)["images"]["encoded"].get<int64_t>(), int64_t(2));
    QVERIFY2(CachedTokens(c) < PromptTokens(c) - 64, c["usage"].dump().c_str());
    QCOMPARE(AnswerLogprobs(c), AnswerLogprobs(cold_.Chat(Turn(ask(DataUrl(Png(256, 256, 4))), "cold"))));
    QVERIFY(AnswerLogprobs(c) != AnswerLogprobs(a));
  }

  void theCapLeavesTheOldestImagesOutInSteps() {
    QTemporaryDir data;
    ServerProcess s;
    QVERIFY(s.Start(data.path(), {"--grid", "64", "--image-max-count", "4"}));
    const auto with_images = [](int count, int left_out_as_text) {
      json content = json::array({TextPart("Compare these.")});
      for (int i = 0; i < count; ++i) content.push_back(i < left_out_as_text ? TextPart(anchorage::kLeftOutImage) : ImagePart(DataUrl(Png(256, 256, 10 + i))));
      return json::array({{{"role", "user"}, {"content", content}}});
    };
    // Five images over a cap of four: the oldest two (half the cap) are left out, as the fixed text.
    const json five = s.Chat(Turn(with_images(5, 0), "cap"));
    const json written = cold_.Chat(Turn(with_images(5, 2), "cold"));
    QCOMPARE(PromptTokens(five), PromptTokens(written));
    QCOMPARE(AnswerLogprobs(five), AnswerLogprobs(written));
    // Six: still two left out, so the head is the same and resumes through the images it keeps.
    const json six = s.Chat(Turn(with_images(6, 0), "cap"));
    QCOMPARE(PromptTokens(six), PromptTokens(cold_.Chat(Turn(with_images(6, 2), "cold"))));
    QVERIFY2(CachedTokens(six) >= 3 * 64, six["usage"].dump().c_str());
    // Seven: the next step leaves four out.
    QCOMPARE(PromptTokens(s.Chat(Turn(with_images(7, 0), "cap"))), PromptTokens(cold_.Chat(Turn(with_images(7, 4), "cold"))));
  }

  // --image-urls allow fetches http:// images (a server of the test's own serves one).
  void httpImagesAreFetchedWhenAllowed() {
    const std::string png = Png(256, 256, 7);
    httplib::Server images;
    images.Get("/shot.png", [&](const httplib::Request&, httplib::Response& res) { res.set_content(png, "image/png"); });
    const int port = images.bind_to_any_port("127.0.0.1");
    Serving serving(images);
    QTemporaryDir data;
    ServerProcess s;
    QVERIFY(s.Start(data.path(), {"--grid", "64", "--image-urls", "allow"}));
    const auto ask = [](const std::string& url) { return json::array({{{"role", "user"}, {"content", {TextPart("What is it?"), ImagePart(url)}}}}); };
    const std::string base = "http://127.0.0.1:" + std::to_string(port);
    const json fetched = s.Chat(Turn(ask(base + "/shot.png"), ""));
    QVERIFY2(fetched.contains("choices"), fetched.dump().c_str());
    QCOMPARE(AnswerLogprobs(fetched), AnswerLogprobs(cold_.Chat(Turn(ask(DataUrl(png)), "cold"))));
    // https: a host whose certificate the system's CAs do not vouch for is refused; with its CA named
    // by --image-ca-file the same picture is fetched and answered as before.
    QTemporaryDir tls_dir;
    const std::string cert = tls_dir.filePath("cert.pem").toStdString(), key = tls_dir.filePath("key.pem").toStdString();
    QVERIFY(WriteSelfSignedCertificate(cert, key));
    httplib::SSLServer secure(cert.c_str(), key.c_str());
    QVERIFY(secure.is_valid());
    secure.Get("/shot.png", [&](const httplib::Request&, httplib::Response& res) { res.set_content(png, "image/png"); });
    const int secure_port = secure.bind_to_any_port("127.0.0.1");
    Serving secure_serving(secure);
    const std::string secure_url = "https://127.0.0.1:" + std::to_string(secure_port) + "/shot.png";
    for (const auto& [url, says] : {std::pair<std::string, std::string>{base + "/none.png", "answered HTTP 404"},
                                    {secure_url, "certificate is not trusted"}}) {
      auto r = s.Post("/v1/chat/completions", Turn(ask(url), "").dump());
      QVERIFY(r && r->status == 400);
      QVERIFY2(r->body.find(says) != std::string::npos, r->body.c_str());
    }
    QTemporaryDir trusting_data;
    ServerProcess trusting;
    QVERIFY(trusting.Start(trusting_data.path(), {"--grid", "64", "--image-urls", "allow", "--image-ca-file", QString::fromStdString(cert)}));
    const json over_tls = trusting.Chat(Turn(ask(secure_url), ""));
    QVERIFY2(over_tls.contains("choices"), over_tls.dump().c_str());
    QCOMPARE(AnswerLogprobs(over_tls), AnswerLogprobs(fetched));
    QTemporaryDir refused_data;
    ServerProcess refused;
    QVERIFY(!refused.Start(refused_data.path(), {"--image-urls", "allow", "--image-ca-file", QString::fromStdString(key)}));
    QVERIFY2(refused.startup_output().find("is not a readable file of PEM certificates") != std::string::npos, refused.startup_output().c_str());
  }

  void badImagesGetAClear400() {
    QTemporaryDir data;
    ServerProcess s;
    QVERIFY(s.Start(data.path(), {"--grid", "64", "--image-folder", images_.path()}));
    const std::string png = Png(64, 64, 5);
    std::filesystem::create_symlink("/etc/hostname", images_.filePath("escape.png").toStdString());
    const struct {
      const char* name;
      std::string url;
      const char* says;
    } cases[] = {
        {"truncated", DataUrl(png.substr(0, png.size() / 2)), "truncated or corrupt"},
        {"not base64", "data:image/png;base64,@@@@", "outside the alphabet"},
        {"not an image", DataUrl("GIF89a and then some"), "not PNG, JPEG or WebP"},
        {"over http", "https://example.com/cat.png", "are not fetched (start the server with --image-urls allow)"},
        {"outside the folder", "/etc/hostname", "outside --image-folder"},
        {"missing file", "nothing-here.png", "does not exist"},
        {"a link out of the folder", "escape.png", "outside --image-folder"},
        {"a parent folder", "nothing/../../etc/hostname", "names a parent folder"},
        {"no base64 marker", "data:image/png,abc", "must be base64"},
    };
    for (const auto& c : cases) {
      const json body = Turn(json::array({{{"role", "user"}, {"content", {TextPart("Look."), ImagePart(c.url)}}}}), "");
      auto r = s.Post("/v1/chat/completions", body.dump());
      QVERIFY2(r && r->status == 400, c.name);
      const json error = json::parse(r->body)["error"];
      QVERIFY2(error["message"].get<std::string>().find(c.says) != std::string::npos, (std::string(c.name) + ": " + error.dump()).c_str());
      QCOMPARE(error["code"].get<std::string>(), std::string("invalid_image"));
    }
    auto no_url = s.Post("/v1/chat/completions", Turn(json::array({{{"role", "user"}, {"content", {{{"type", "image_url"}}}}}}), "").dump());
    QVERIFY(no_url && no_url->status == 400);
    QVERIFY(no_url->body.find("image_url.url") != std::string::npos);
    // /v1/decide reads text only: an image in its observation is a clear 400, not its placeholder token read as text.
    const json decide = {{"messages", json::array({{{"role", "user"}, {"content", {TextPart("Look."), ImagePart(DataUrl(png))}}}})},
                         {"questions", json::array({{{"question", "Is it red?"}, {"choices", {"yes", "no"}}}})}};
    auto refused = s.Post("/v1/decide", decide.dump());
    QVERIFY(refused && refused->status == 400);
    QVERIFY2(refused->body.find("images_unsupported") != std::string::npos, refused->body.c_str());
    // Still serving.
    QVERIFY(s.Chat(Turn(json::array({{{"role", "user"}, {"content", {TextPart("Look."), ImagePart(DataUrl(png))}}}}), "")).contains("choices"));
  }
};

QTEST_GUILESS_MAIN(TestImageServer)
#include "test_image_server.moc"
