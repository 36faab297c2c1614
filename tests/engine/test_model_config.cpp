// config.json parsing: real layouts load; every malformed field gives an error that names it and the file.
#include <QtTest>

#include <nlohmann/json.hpp>

#include "engine/model/model_config.h"

using anchorage::LayerKind;
using anchorage::ParseModelConfig;
using json = nlohmann::json;

namespace {

// The text part of Qwen3.5-0.8B's config, as nested under text_config.
json TextConfig08B() {
  return json{{"model_type", "qwen3_5_text"},
              {"hidden_size", 1024},
              {"num_hidden_layers", 24},
              {"intermediate_size", 3584},
              {"num_attention_heads", 8},
              {"num_key_value_heads", 2},
              {"head_dim", 256},
              {"linear_num_key_heads", 16},
              {"linear_num_value_heads", 16},
              {"linear_key_head_dim", 128},
              {"linear_value_head_dim", 128},
              {"linear_conv_kernel_dim", 4},
              {"vocab_size", 248320},
              {"rms_norm_eps", 1e-6},
              {"tie_word_embeddings", true},
              {"full_attention_interval", 4},
              {"eos_token_id", 248044},
              {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 10000000}, {"partial_rotary_factor", 0.25}, {"mrope_section", {11, 11, 10}}, {"mrope_interleaved", true}}}};
}

// Qwen3.5-0.8B's vision_config.
json Vision08B() {
  return json{{"depth", 12}, {"hidden_size", 768}, {"hidden_act", "gelu_pytorch_tanh"}, {"intermediate_size", 3072},
              {"num_heads", 12}, {"in_channels", 3}, {"patch_size", 16}, {"spatial_merge_size", 2},
              {"temporal_patch_size", 2}, {"out_hidden_size", 1024}, {"num_position_embeddings", 2304}};
}

json Wrapped(json text, json vision = Vision08B()) {
  return json{{"architectures", {"Qwen3_5ForConditionalGeneration"}}, {"model_type", "qwen3_5"}, {"text_config", std::move(text)},
              {"vision_config", std::move(vision)}, {"image_token_id", 248056}, {"vision_start_token_id", 248053},
              {"vision_end_token_id", 248054}};
}

}  // namespace

class TestModelConfig : public QObject {
  Q_OBJECT

 private slots:
  void nestedConfigLoads() {
    auto c = ParseModelConfig(Wrapped(TextConfig08B()).dump(), "config.json");
    QVERIFY2(c.ok(), c.status().ToString().c_str());
    QCOMPARE(c->hidden_size, 1024);
    QCOMPARE(c->num_hidden_layers, 24);
    QCOMPARE(c->num_full_attention_layers(), 6);
    QVERIFY(c->layer_types[3] == LayerKind::kFullAttention);
    QVERIFY(c->layer_types[2] == LayerKind::kLinearAttention);
    QCOMPARE(c->conv_dim(), 6144);
    QCOMPARE(c->rotary_dim(), 64);
    QCOMPARE(c->rope_theta, 1e7);
    // qwen35-model.md 6.2: 0.8B K/V per token, bf16, is 12 KiB; fp32 recurrent states 18 MiB.
    QCOMPARE(c->kv_bytes_per_token(), 12 * 1024);
    QCOMPARE(c->anchor_bytes(), 18 * 16 * 128 * 128 * 4 + 18 * 6144 * 3 * 4);
  }

  void flatConfigAndFlatRopeKeysLoad() {
    json flat = TextConfig08B();
    flat.erase("rope_parameters");
    flat["rope_theta"] = 5000000;
    flat["partial_rotary_factor"] = 0.5;
    auto c = ParseModelConfig(flat.dump(), "config.json");
    QVERIFY2(c.ok(), c.status().ToString().c_str());
    QCOMPARE(c->rope_theta, 5e6);
    QCOMPARE(c->rotary_dim(), 128);
  }

  void olderRopeScalingSpellingLoads() {
    json flat = TextConfig08B();
    flat.erase("rope_parameters");
    flat["rope_scaling"] = {{"rope_type", "default"}, {"partial_rotary_factor", 0.25}};
    flat["rope_theta"] = 1000000;
    auto c = ParseModelConfig(flat.dump(), "config.json");
    QVERIFY2(c.ok(), c.status().ToString().c_str());
    QCOMPARE(c->rope_theta, 1e6);
  }

  void explicitLayerTypesWin() {
    json t = TextConfig08B();
    t["num_hidden_layers"] = 3;
    t["layer_types"] = {"full_attention", "linear_attention", "full_attention"};
    auto c = ParseModelConfig(t.dump(), "config.json");
    QVERIFY2(c.ok(), c.status().ToString().c_str());
    QCOMPARE(c->num_full_attention_layers(), 2);
  }

  void malformedConfigs_data() {
    QTest::addColumn<QString>("text");
    QTest::addColumn<QString>("expected");
    auto without = [](const char* key) { json t = TextConfig08B(); t.erase(key); return QString::fromStdString(Wrapped(t).dump()); };
    auto with = [](const char* key, json value) { json t = TextConfig08B(); t[key] = value; return QString::fromStdString(Wrapped(t).dump()); };
    QTest::newRow("not json") << "{\"hidden_size\": " << "not valid JSON";
    QTest::newRow("array") << "[1,2]" << "top level must be an object";
    QTest::newRow("missing hidden_size") << without("hidden_size") << "missing field 'hidden_size'";
    QTest::newRow("missing head_dim") << without("head_dim") << "missing field 'head_dim'";
    QTest::newRow("missing linear_num_value_heads") << without("linear_num_value_heads") << "missing field 'linear_num_value_heads'";
    QTest::newRow("string layers") << with("num_hidden_layers", "24") << "field 'num_hidden_layers' must be an integer";
    QTest::newRow("zero heads") << with("num_attention_heads", 0) << "field 'num_attention_heads' must be >= 1";
    QTest::newRow("negative vocab") << with("vocab_size", -5) << "field 'vocab_size' must be >= 1";
    QTest::newRow("float eps string") << with("rms_norm_eps", "tiny") << "field 'rms_norm_eps' must be a number";
    QTest::newRow("tie not bool") << with("tie_word_embeddings", 1) << "field 'tie_word_embeddings' must be true or false";
    QTest::newRow("gqa mismatch") << with("num_key_value_heads", 3) << "must be a multiple of num_key_value_heads";
    QTest::newRow("gdn mismatch") << with("linear_num_value_heads", 24 + 1) << "must be a multiple of linear_num_key_heads";
    QTest::newRow("layer_types length") << with("layer_types", json::array({"linear_attention"})) << "has 1 entries for 24 layers";
    QTest::newRow("layer_types entry") << with("layer_types", json::array({"mamba"})) << "unknown entry \"mamba\"";
    QTest::newRow("eos type") << with("eos_token_id", "eos") << "field 'eos_token_id' must be an integer";
    QTest::newRow("rope type") << with("rope_parameters", {{"rope_type", "yarn"}}) << "rope_type 'yarn' is not supported";
    QTest::newRow("text_config type") << "{\"text_config\": 5}" << "field 'text_config' must be an object";
    QTest::newRow("other model") << "{\"model_type\": \"llama\"}" << "model_type 'llama' is not a Qwen3.5 text model";
  }

  void visionConfigLoads() {
    auto c = ParseModelConfig(Wrapped(TextConfig08B()).dump(), "config.json");
    QVERIFY2(c.ok(), c.status().ToString().c_str());
    QVERIFY(c->vision.has_value());
    QCOMPARE(c->vision->head_dim(), int64_t(64));
    QCOMPARE(c->vision->grid_per_side(), int64_t(48));
    QCOMPARE(c->vision->patch_values(), int64_t(1536));
    QCOMPARE(c->vision->image_token_id, int64_t(248056));
    QCOMPARE(c->mrope_section, (std::vector<int64_t>{11, 11, 10}));
    json flat = TextConfig08B();
    auto text_only = ParseModelConfig(flat.dump(), "config.json");
    QVERIFY(text_only.ok());
    QVERIFY(!text_only->vision.has_value());
  }

  void malformedVisionConfigs_data() {
    QTest::addColumn<QString>("text");
    QTest::addColumn<QString>("expected");
    auto vision = [](const char* key, json value) {
      json v = Vision08B();
      if (value.is_null()) v.erase(key);
      else v[key] = value;
      return QString::fromStdString(Wrapped(TextConfig08B(), v).dump());
    };
    json no_image_id = Wrapped(TextConfig08B());
    no_image_id.erase("image_token_id");
    json bad_section = Wrapped(TextConfig08B());
    bad_section["text_config"]["rope_parameters"]["mrope_section"] = {11, 11, 11};
    QTest::newRow("missing depth") << vision("depth", nullptr) << "missing field 'depth'";
    QTest::newRow("other activation") << vision("hidden_act", "relu") << "hidden_act \"relu\" is not supported";
    QTest::newRow("deepstack") << vision("deepstack_visual_indexes", {8, 16}) << "deepstack_visual_indexes are not supported";
    QTest::newRow("out width") << vision("out_hidden_size", 2048) << "out_hidden_size (2048) must equal the text hidden_size (1024)";
    QTest::newRow("head width") << vision("num_heads", 7) << "hidden_size / num_heads must be a multiple of 4";
    QTest::newRow("positions") << vision("num_position_embeddings", 2000) << "num_position_embeddings must be a square";
    QTest::newRow("not an object") << QString::fromStdString(Wrapped(TextConfig08B(), 5).dump()) << "field 'vision_config' must be an object";
    QTest::newRow("image id") << QString::fromStdString(no_image_id.dump()) << "missing field 'image_token_id'";
    QTest::newRow("mrope sum") << QString::fromStdString(bad_section.dump()) << "mrope_section must add up to the rotary frequencies (32)";
    json contiguous = Wrapped(TextConfig08B());
    contiguous["text_config"]["rope_parameters"]["mrope_interleaved"] = false;
    QTest::newRow("mrope not interleaved") << QString::fromStdString(contiguous.dump()) << "mrope_interleaved false";
  }
  void malformedVisionConfigs() { malformedConfigs(); }

  void malformedConfigs() {
    QFETCH(QString, text);
    QFETCH(QString, expected);
    auto c = ParseModelConfig(text.toStdString(), "/models/x/config.json");
    QVERIFY(!c.ok());
    const std::string message = c.status().message();
    QVERIFY2(message.find("/models/x/config.json") != std::string::npos, message.c_str());
    QVERIFY2(message.find(expected.toStdString()) != std::string::npos, message.c_str());
  }
};

QTEST_APPLESS_MAIN(TestModelConfig)
#include "test_model_config.moc"
