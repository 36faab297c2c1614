// The tiny-model generator: deterministic bytes for a seed, the real Qwen3.5 structure, and a loader
// that reads it back and names what is wrong with a broken folder.
#include <QtTest>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "engine/core/file_util.h"
#include "engine/model/model.h"
#include "engine/model/tiny_model.h"

using namespace anchorage;
namespace fs = std::filesystem;

namespace {

std::string Slurp(const std::string& path) {
  auto r = ReadFile(path);
  return r.ok() ? *r : std::string();
}

void CopyFolder(const std::string& from, const std::string& to) {
  fs::create_directories(to);
  for (const auto& e : fs::directory_iterator(from)) fs::copy_file(e.path(), fs::path(to) / e.path().filename(), fs::copy_options::overwrite_existing);
}

}  // namespace

class TestTinyModel : public QObject {
  Q_OBJECT

 private:
  QTemporaryDir tmp_;
  std::string Path(const std::string& name) { return (fs::path(tmp_.path().toStdString()) / name).string(); }

  void ExpectLoadError(const std::string& dir, const std::string& expected) {
    auto m = LoadModel(dir);
    QVERIFY2(!m.ok(), ("expected an error loading " + dir).c_str());
    QVERIFY2(m.status().message().find(expected) != std::string::npos, m.status().message().c_str());
  }

 private slots:
  void sameSeedSameBytes() {
    QVERIFY(GenerateTinyModel(TinyModelSize::kTiny, 7, Path("a")).ok());
    QVERIFY(GenerateTinyModel(TinyModelSize::kTiny, 7, Path("b")).ok());
    QVERIFY(GenerateTinyModel(TinyModelSize::kTiny, 8, Path("c")).ok());
    for (const char* f : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}) {
      const std::string a = Slurp(Path("a") + "/" + f);
      QVERIFY2(!a.empty(), f);
      QVERIFY2(a == Slurp(Path("b") + "/" + f), f);
    }
    QVERIFY(Slurp(Path("a") + "/model.safetensors") != Slurp(Path("c") + "/model.safetensors"));
  }

  void loaderReadsItBack() {
    QVERIFY(GenerateTinyModel(TinyModelSize::kTiny, 7, Path("load")).ok());
    auto m = LoadModel(Path("load"));
    QVERIFY2(m.ok(), m.status().ToString().c_str());
    const ModelConfig& c = (*m)->config;
    QCOMPARE(c.num_hidden_layers, 4);
    QVERIFY(c.layer_types[3] == LayerKind::kFullAttention);
    QCOMPARE(c.num_full_attention_layers(), 1);
    QCOMPARE(c.max_position_embeddings, int64_t(262144));  // the real context: agent-sized prompts are not refused
    QCOMPARE(c.linear_num_value_heads / c.linear_num_key_heads, 2);  // grouped value heads exercised
    QCOMPARE((*m)->weights.layers.size(), size_t(4));
    QCOMPARE((*m)->weights.layers[0].gdn.A_log.dtype, DType::kF32);
    QCOMPARE((*m)->weights.layers[3].attn.q_proj.shape, (std::vector<int64_t>{2 * 2 * 64, 64}));
    QCOMPARE((*m)->weights.lm_head.data, (*m)->weights.embed_tokens.data);  // tied
    QVERIFY((*m)->tokenizer.vocab_size() <= c.vocab_size);
    QCOMPARE(c.eos_token_ids.size(), size_t(2));
    QCOMPARE((*m)->fingerprint.size(), size_t(64));
    QVERIFY((*m)->weights.mtp.has_value());  // the multi-token-prediction block, at the root like the 27B's
    QCOMPARE((*m)->weights.mtp->fc.shape, (std::vector<int64_t>{64, 128}));
    QCOMPARE((*m)->weights.mtp->layer.attn.q_proj.name, std::string("mtp.layers.0.self_attn.q_proj.weight"));

    auto ids = (*m)->tokenizer.Encode("<|im_start|>user\nhello world<|im_end|>");
    QVERIFY(ids.ok());
    QCOMPARE((*m)->tokenizer.Decode(*ids), std::string("<|im_start|>user\nhello world<|im_end|>"));

    // The fingerprint follows the weights.
    QVERIFY(GenerateTinyModel(TinyModelSize::kTiny, 8, Path("load8")).ok());
    auto m8 = LoadModel(Path("load8"));
    QVERIFY(m8.ok());
    QVERIFY((*m8)->fingerprint != (*m)->fingerprint);
  }

  void wrapperPrefixAndVisionTensorsAreAccepted() {
    QVERIFY(GenerateTinyModel(TinyModelSize::kTiny, 3, Path("plain")).ok());
    auto set = SafetensorsSet::OpenDirectory(Path("plain"));
    QVERIFY(set.ok());
    std::vector<TensorToWrite> renamed;
    for (const auto& [name, t] : set->tensors()) {
      std::string n = name.rfind("model.", 0) == 0 ? "model.language_model." + name.substr(6) : name;
      renamed.push_back({n, t.dtype, t.shape, std::string(reinterpret_cast<const char*>(t.data), t.bytes)});
    }
    renamed.push_back({"model.visual.blocks.0.attn.qkv.weight", DType::kBF16, {2, 2}, std::string(8, '\0')});
    const std::string d = Path("wrapped");
    CopyFolder(Path("plain"), d);
    fs::remove(d + "/model.safetensors");
    QVERIFY(WriteSafetensors(d + "/model-00001-of-00001.safetensors", renamed).ok());
    nlohmann::json config = nlohmann::json::parse(Slurp(d + "/config.json"));
    nlohmann::json wrapped = {{"architectures", {"Qwen3_5ForConditionalGeneration"}}, {"model_type", "qwen3_5"}, {"text_config", config}, {"tie_word_embeddings", true}};
    wrapped["text_config"]["model_type"] = "qwen3_5_text";
    std::ofstream(d + "/config.json") << wrapped.dump(2);
    auto m = LoadModel(d);
    QVERIFY2(m.ok(), m.status().ToString().c_str());
    QCOMPARE((*m)->weights.layers[1].gdn.in_proj_qkv.name, std::string("model.language_model.layers.1.linear_attn.in_proj_qkv.weight"));
  }

  void brokenFolders() {
    QVERIFY(GenerateTinyModel(TinyModelSize::kTiny, 5, Path("good")).ok());
    ExpectLoadError(Path("nowhere"), "does not exist");

    CopyFolder(Path("good"), Path("noconfig"));
    fs::remove(Path("noconfig") + "/config.json");
    ExpectLoadError(Path("noconfig"), "config.json: no such file");

    CopyFolder(Path("good"), Path("notok"));
    fs::remove(Path("notok") + "/tokenizer.json");
    ExpectLoadError(Path("notok"), "tokenizer.json");

    // A truncated weight file names the tensor that no longer fits.
    CopyFolder(Path("good"), Path("trunc"));
    std::string w = Slurp(Path("trunc") + "/model.safetensors");
    std::ofstream(Path("trunc") + "/model.safetensors", std::ios::binary).write(w.data(), static_cast<std::streamsize>(w.size() - 100));
    ExpectLoadError(Path("trunc"), "lies outside the file's");

    // A config that disagrees with the tensors names the tensor and both shapes.
    CopyFolder(Path("good"), Path("shape"));
    nlohmann::json config = nlohmann::json::parse(Slurp(Path("shape") + "/config.json"));
    config["intermediate_size"] = 96;
    std::ofstream(Path("shape") + "/config.json") << config.dump();
    ExpectLoadError(Path("shape"), "tensor 'model.layers.0.mlp.gate_proj.weight' in model.safetensors has shape [128, 64], expected [96, 64]");

    // A missing tensor is named.
    CopyFolder(Path("good"), Path("missing"));
    auto set = SafetensorsSet::OpenDirectory(Path("good"));
    QVERIFY(set.ok());
    std::vector<TensorToWrite> kept;
    for (const auto& [name, t] : set->tensors())
      if (name != "model.layers.2.linear_attn.dt_bias") kept.push_back({name, t.dtype, t.shape, std::string(reinterpret_cast<const char*>(t.data), t.bytes)});
    QVERIFY(WriteSafetensors(Path("missing") + "/model.safetensors", kept).ok());
    ExpectLoadError(Path("missing"), "checkpoint lacks tensor 'model.layers.2.linear_attn.dt_bias'");

    // The MTP block is optional: a mis-shaped tensor of it leaves the head off, named, and the trunk loads.
    CopyFolder(Path("good"), Path("badmtp"));
    std::vector<TensorToWrite> bad;
    for (const auto& [name, t] : set->tensors()) {
      TensorToWrite copy{name, t.dtype, t.shape, std::string(reinterpret_cast<const char*>(t.data), t.bytes)};
      if (name == "mtp.layers.0.mlp.up_proj.weight") copy.shape = {t.shape[1], t.shape[0]};
      bad.push_back(std::move(copy));
    }
    QVERIFY(WriteSafetensors(Path("badmtp") + "/model.safetensors", bad).ok());
    auto m = LoadModel(Path("badmtp"));
    QVERIFY2(m.ok(), m.status().ToString().c_str());
    QVERIFY(!(*m)->weights.mtp.has_value());
    QVERIFY2((*m)->weights.mtp_note.find("mtp.layers.0.mlp.up_proj.weight") != std::string::npos, (*m)->weights.mtp_note.c_str());
    QVERIFY(GenerateTinyModel(TinyModelSize::kShadow, 5, Path("shadow")).ok());
    auto shadow = LoadModel(Path("shadow"));
    QVERIFY(shadow.ok());
    QVERIFY(!(*shadow)->weights.mtp.has_value());
    QCOMPARE((*shadow)->weights.mtp_note, std::string("the checkpoint has no mtp.* tensors"));
  }

  void smallConfigHasTheRealHeadShapes() {
    ModelConfig c = TinyModelConfig(TinyModelSize::kSmall, 2300);
    QCOMPARE(c.hidden_size, 1024);
    QCOMPARE(c.vocab_size, 32768);
    QCOMPARE(c.num_full_attention_layers(), 3);
    int64_t params = 2 * c.vocab_size * c.hidden_size;  // embeddings and untied lm_head
    for (LayerKind k : c.layer_types) {
      params += 3 * c.intermediate_size * c.hidden_size + 2 * c.hidden_size;
      if (k == LayerKind::kLinearAttention)
        params += (c.conv_dim() + 2 * c.value_dim() + 2 * c.linear_num_value_heads) * c.hidden_size + c.conv_dim() * 4;
      else
        params += (3 * c.num_attention_heads * c.head_dim + 2 * c.num_key_value_heads * c.head_dim) * c.hidden_size;
    }
    QVERIFY2(params > 310'000'000 && params < 320'000'000, std::to_string(params).c_str());
  }
};

QTEST_APPLESS_MAIN(TestTinyModel)
#include "test_tiny_model.moc"
