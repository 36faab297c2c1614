// anchorage-tool end to end: make-model, inspect on a folder laid out like a real Qwen3.5
// checkpoint (multimodal wrapper, shards with an index, vision and MTP tensors), tokenize and
// detokenize round trip, render, generate and logits, and clear errors for broken input.
#include <QProcess>
#include <QTemporaryDir>
#include <QtTest>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "engine/model/safetensors.h"

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

struct Run {
  int code = -1;
  QByteArray out, err;
};

Run Tool(const QStringList& args, const QByteArray& input = {}) {
  QProcess p;
  p.start(QString(ANCHORAGE_BINARY_DIR) + "/app/anchorage-tool", args);
  Run r;
  if (!p.waitForStarted(10000)) return r;
  p.write(input);
  p.closeWriteChannel();
  p.waitForFinished(120000);
  r.code = p.exitCode();
  r.out = p.readAllStandardOutput();
  r.err = p.readAllStandardError();
  return r;
}

}  // namespace

class TestTool : public QObject {
  Q_OBJECT

 private:
  QTemporaryDir tmp_;
  QString Path(const char* name) const { return tmp_.filePath(name); }

 private slots:
  void initTestCase() {
    Run r = Tool({"make-model", "--size", "tiny", "--seed", "3", Path("tiny")});
    QVERIFY2(r.code == 0, r.err.constData());
  }

  void inspectReadsACheckpointLayout() {
    // Re-lay the tiny model as the official checkpoints are: wrapper names, two shards, an index, extra towers.
    const std::string src = Path("tiny").toStdString(), dst = Path("wrapped").toStdString();
    fs::create_directories(dst);
    auto set = anchorage::SafetensorsSet::OpenDirectory(src);
    QVERIFY(set.ok());
    std::vector<anchorage::TensorToWrite> shard1, shard2;
    json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", json::object()}};
    int i = 0;
    for (const auto& [name, t] : set->tensors()) {
      const bool own_prefix = name.rfind("model.visual.", 0) == 0 || name.rfind("mtp.", 0) == 0;
      const std::string n = own_prefix ? name : "model.language_model." + name.substr(6);
      auto& shard = (i++ % 2 == 0) ? shard1 : shard2;
      shard.push_back({n, t.dtype, t.shape, std::string(reinterpret_cast<const char*>(t.data), t.bytes)});
      index["weight_map"][n] = (&shard == &shard1) ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
    }
    QVERIFY(anchorage::WriteSafetensors(dst + "/model-00001-of-00002.safetensors", shard1).ok());
    QVERIFY(anchorage::WriteSafetensors(dst + "/model-00002-of-00002.safetensors", shard2).ok());
    std::ofstream(dst + "/model.safetensors.index.json") << index.dump(2);
    json text = json::parse(std::ifstream(src + "/config.json"));
    text["model_type"] = "qwen3_5_text";
    json wrapper = {{"architectures", {"Qwen3_5ForConditionalGeneration"}}, {"model_type", "qwen3_5"}, {"tie_word_embeddings", true}};
    for (const char* key : {"vision_config", "image_token_id", "vision_start_token_id", "vision_end_token_id"}) {
      wrapper[key] = text[key];
      text.erase(key);
    }
    wrapper["text_config"] = text;
    std::ofstream(dst + "/config.json") << wrapper.dump(2);
    for (const char* f : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}) fs::copy_file(src + "/" + f, dst + "/" + f);

    Run r = Tool({"inspect", Path("wrapped")});
    QVERIFY2(r.code == 0, r.err.constData());
    json out = json::parse(r.out.constData());
    QCOMPARE(out["files"].size(), size_t(2));
    QCOMPARE(out["vision"]["tower"].get<std::string>(), std::string("ready"));
    QCOMPARE(out["vision"]["tensors"].get<int>(), 3 + 2 * 12 + 6);  // patch embedding, positions, 2 blocks, merger
    QCOMPARE(out["vision"]["config"]["depth"].get<int>(), 2);
    QVERIFY(out["mtp_tensors"].get<int>() > 0);
    QCOMPARE(out["config"]["num_hidden_layers"].get<int>(), 4);
    QCOMPARE(out["derived"]["full_attention_layers"].get<int>(), 1);
    QCOMPARE(out["chat_template"].get<std::string>(), std::string("ok"));
    QCOMPARE(out["fingerprint"].get<std::string>().size(), size_t(64));

    // A missing shard is named.
    fs::remove(dst + "/model-00002-of-00002.safetensors");
    r = Tool({"inspect", Path("wrapped")});
    QCOMPARE(r.code, 1);
    QVERIFY2(r.err.contains("model-00002-of-00002.safetensors, which is missing"), r.err.constData());
  }

  void tokenizeDetokenizeRoundTrip() {
    const QByteArray text = "Anchors hold the state 中文 🙂\n<|im_start|>user";
    Run t = Tool({"tokenize", "--model", Path("tiny")}, text);
    QVERIFY2(t.code == 0, t.err.constData());
    json ids = json::parse(t.out.constData());
    QVERIFY(ids.is_array() && ids.size() > 5);
    Run d = Tool({"detokenize", "--model", Path("tiny")}, t.out);
    QVERIFY2(d.code == 0, d.err.constData());
    QCOMPARE(d.out, text);
    Run bad = Tool({"detokenize", "--model", Path("tiny")}, "[1, 99999999]");
    QCOMPARE(bad.code, 1);
    QVERIFY(bad.err.contains("not in the vocabulary"));
    Run invalid = Tool({"tokenize", "--model", Path("tiny")}, "ok \xff\xfe");
    QCOMPARE(invalid.code, 1);
  }

  void renderUsesTheCheckpointTemplate() {
    Run r = Tool({"render", "--model", Path("tiny")}, R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]})");
    QVERIFY2(r.code == 0, r.err.constData());
    QCOMPARE(r.out, QByteArray("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n"));
    Run bad = Tool({"render", "--model", Path("tiny")}, R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "wizard", "content": "x"}]})");
    QCOMPARE(bad.code, 1);
    QVERIFY(bad.err.contains("Unexpected message role"));
  }

  void generateAndLogits() {
    Run g = Tool({"generate", "--model", Path("tiny"), "--max-tokens", "5", "--temperature", "0"}, "Hello there");
    QVERIFY2(g.code == 0, g.err.constData());
    Run again = Tool({"generate", "--model", Path("tiny"), "--max-tokens", "5", "--temperature", "0"}, "Hello there");
    QCOMPARE(again.out, g.out);
    std::ofstream(Path("ids.json").toStdString()) << "[1, 2, 3, 4]";
    Run l = Tool({"logits", "--model", Path("tiny"), "--ids", Path("ids.json")});
    QVERIFY2(l.code == 0, l.err.constData());
    json logits = json::parse(l.out.constData());
    QVERIFY(logits.is_array() && logits.size() >= 64);
    // Token ids need no tokenizer: a folder without tokenizer.json or a template gives the same logits.
    QDir().mkpath(Path("weights-only"));
    for (const char* f : {"config.json", "model.safetensors"}) QVERIFY(QFile::copy(Path("tiny") + "/" + f, Path("weights-only") + "/" + f));
    Run bare = Tool({"logits", "--model", Path("weights-only"), "--ids", Path("ids.json")});
    QVERIFY2(bare.code == 0, bare.err.constData());
    QCOMPARE(bare.out, l.out);
  }

  void usageErrors() {
    QCOMPARE(Tool({}).code, 2);
    QCOMPARE(Tool({"frobnicate"}).code, 2);
    QCOMPARE(Tool({"make-model", "--size", "huge", Path("x")}).code, 2);
    Run r = Tool({"inspect", Path("nowhere")});
    QCOMPARE(r.code, 1);
    QVERIFY(r.err.contains("does not exist"));
  }
};

QTEST_GUILESS_MAIN(TestTool)
#include "test_tool.moc"
