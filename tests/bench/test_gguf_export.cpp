// The GGUF export read back by a reader written here from the format's definition: the header, the
// metadata llama.cpp's qwen35 loader asks for, every tensor's offset aligned and inside the file, and the
// values moved as §3.5 says (+1 on norms but ssm_norm, -exp(A_log), value heads in tiled order).
#include <QTemporaryDir>
#include <QtTest>

#include <cmath>
#include <cstring>
#include <map>

#include "engine/core/file_util.h"
#include "engine/model/model_config.h"
#include "engine/model/safetensors.h"
#include "engine/model/tiny_model.h"
#include "gguf_export.h"

using namespace anchorage;

namespace {

struct GgufTensor {
  std::vector<uint64_t> dims;
  uint32_t type = 0;
  uint64_t offset = 0;
};

struct Gguf {
  std::map<std::string, std::string> strings;
  std::map<std::string, uint64_t> numbers;
  std::map<std::string, uint64_t> array_sizes;
  std::map<std::string, GgufTensor> tensors;
  uint64_t data_start = 0;
  std::string bytes;
};

class Reader {
 public:
  explicit Reader(const std::string& b) : b_(b) {}
  template <typename T>
  T Get() {
    if (at_ + sizeof(T) > b_.size()) throw std::runtime_error("past the end");
    T v;
    std::memcpy(&v, b_.data() + at_, sizeof v);
    at_ += sizeof v;
    return v;
  }
  std::string String() {
    const uint64_t n = Get<uint64_t>();
    if (at_ + n > b_.size()) throw std::runtime_error("string past the end");
    std::string s = b_.substr(at_, n);
    at_ += n;
    return s;
  }
  // A value of a type; numbers as uint64, strings kept, arrays skipped (their length kept).
  void Value(uint32_t type, const std::string& key, Gguf& g) {
    static const std::map<uint32_t, size_t> widths = {{0, 1}, {1, 1}, {2, 2}, {3, 2}, {4, 4}, {5, 4}, {6, 4}, {7, 1}, {10, 8}, {11, 8}, {12, 8}};
    if (type == 8) { g.strings[key] = String(); return; }
    if (type == 9) {
      const uint32_t elem = Get<uint32_t>();
      const uint64_t n = Get<uint64_t>();
      g.array_sizes[key] = n;
      for (uint64_t i = 0; i < n; ++i) Value(elem, "", g);
      return;
    }
    const size_t w = widths.at(type);
    uint64_t v = 0;
    std::memcpy(&v, b_.data() + at_, w);
    at_ += w;
    if (!key.empty()) g.numbers[key] = v;
  }
  size_t at() const { return at_; }

 private:
  const std::string& b_;
  size_t at_ = 0;
};

Gguf Parse(std::string bytes) {
  Gguf g;
  g.bytes = std::move(bytes);
  Reader r(g.bytes);
  if (r.Get<uint32_t>() != 0x46554747u || r.Get<uint32_t>() != 3) throw std::runtime_error("not GGUF v3");
  const uint64_t tensors = r.Get<uint64_t>(), kvs = r.Get<uint64_t>();
  for (uint64_t i = 0; i < kvs; ++i) {
    const std::string key = r.String();
    r.Value(r.Get<uint32_t>(), key, g);
  }
  for (uint64_t i = 0; i < tensors; ++i) {
    const std::string name = r.String();
    GgufTensor t;
    t.dims.resize(r.Get<uint32_t>());
    for (auto& d : t.dims) d = r.Get<uint64_t>();
    t.type = r.Get<uint32_t>();
    t.offset = r.Get<uint64_t>();
    g.tensors[name] = t;
  }
  const uint64_t alignment = g.numbers.count("general.alignment") ? g.numbers["general.alignment"] : 32;
  g.data_start = (r.at() + alignment - 1) / alignment * alignment;
  return g;
}

float F32At(const Gguf& g, const std::string& name, uint64_t i) {
  float v;
  std::memcpy(&v, g.bytes.data() + g.data_start + g.tensors.at(name).offset + 4 * i, 4);
  return v;
}

}  // namespace

class TestGgufExport : public QObject {
  Q_OBJECT

 private:
  QTemporaryDir tmp_;

 private slots:
  void theTinyModelReadsBackAsQwen35() {
    const std::string dir = tmp_.filePath("tiny").toStdString(), out = tmp_.filePath("tiny.gguf").toStdString();
    QVERIFY(GenerateTinyModel(TinyModelSize::kTiny, 5, dir).ok());
    const Status s = ExportGguf(dir, out);
    QVERIFY2(s.ok(), s.ToString().c_str());
    auto bytes = ReadFile(out);
    QVERIFY(bytes.ok());
    const Gguf g = Parse(*bytes);
    auto config = LoadModelConfig(dir + "/config.json");
    auto set = SafetensorsSet::OpenDirectory(dir);
    QVERIFY(config.ok() && set.ok());
    const ModelConfig& c = *config;

    QCOMPARE(g.strings.at("general.architecture"), std::string("qwen35"));
    QCOMPARE(g.strings.at("tokenizer.ggml.pre"), std::string("qwen35"));
    QCOMPARE(g.numbers.at("qwen35.block_count"), uint64_t(c.num_hidden_layers));
    QCOMPARE(g.numbers.at("qwen35.ssm.group_count"), uint64_t(c.linear_num_key_heads));
    QCOMPARE(g.numbers.at("qwen35.ssm.time_step_rank"), uint64_t(c.linear_num_value_heads));
    QCOMPARE(g.numbers.at("qwen35.rope.dimension_count"), uint64_t(c.rotary_dim()));
    QCOMPARE(g.array_sizes.at("tokenizer.ggml.tokens"), uint64_t(c.vocab_size));
    QCOMPARE(g.array_sizes.at("qwen35.rope.dimension_sections"), uint64_t(4));

    // 3 + per layer: 5 shared, 6 attention or 9 delta-rule tensors.
    const int64_t full = c.num_full_attention_layers(), linear = c.num_hidden_layers - full;
    QCOMPARE(int64_t(g.tensors.size()), 3 + 5 * c.num_hidden_layers + 6 * full + 9 * linear);
    for (const auto& [name, t] : g.tensors) {
      uint64_t numel = 1;
      for (uint64_t d : t.dims) numel *= d;
      QVERIFY2(t.offset % 32 == 0, name.c_str());
      QVERIFY2(g.data_start + t.offset + numel * (t.type == 0 ? 4 : 2) <= g.bytes.size(), name.c_str());
    }

    // Dims innermost first: the embedding is {H, V}, the conv taps {4, conv_dim}.
    QCOMPARE(g.tensors.at("token_embd.weight").dims, (std::vector<uint64_t>{uint64_t(c.hidden_size), uint64_t(c.vocab_size)}));
    QCOMPARE(g.tensors.at("blk.0.ssm_conv1d.weight").dims, (std::vector<uint64_t>{4, uint64_t(c.conv_dim())}));
    const TensorView* embed = set->Find("model.embed_tokens.weight");
    QVERIFY(std::memcmp(g.bytes.data() + g.data_start + g.tensors.at("token_embd.weight").offset, embed->data, embed->bytes) == 0);

    const TensorView* norm = set->Find("model.layers.0.input_layernorm.weight");
    const TensorView* ssm_norm = set->Find("model.layers.0.linear_attn.norm.weight");
    for (int64_t i = 0; i < c.hidden_size; ++i) QCOMPARE(F32At(g, "blk.0.attn_norm.weight", i), 1.0f + norm->At(i));
    for (int64_t i = 0; i < c.linear_value_head_dim; ++i) QCOMPARE(F32At(g, "blk.0.ssm_norm.weight", i), ssm_norm->At(i));

    // Value head j (grouped: it reads key head j / r) lands at (j % r) * Nk + j / r.
    const int64_t Nk = c.linear_num_key_heads, Nv = c.linear_num_value_heads, r = Nv / Nk, dv = c.linear_value_head_dim;
    QVERIFY2(r > 1, "the tiny model must have more value heads than key heads for this test to move any");
    const TensorView* a_log = set->Find("model.layers.0.linear_attn.A_log");
    const TensorView* qkv = set->Find("model.layers.0.linear_attn.in_proj_qkv.weight");
    const char* gguf_qkv = g.bytes.data() + g.data_start + g.tensors.at("blk.0.attn_qkv.weight").offset;
    const int64_t H = c.hidden_size, v_rows = 2 * c.key_dim();
    for (int64_t j = 0; j < Nv; ++j) {
      const int64_t tiled = (j % r) * Nk + j / r;
      QCOMPARE(F32At(g, "blk.0.ssm_a", tiled), -std::exp(a_log->At(j)));
      QVERIFY(std::memcmp(gguf_qkv + 2 * (v_rows + tiled * dv) * H, qkv->data + 2 * (v_rows + j * dv) * H, 2 * dv * H) == 0);
    }
    QVERIFY(std::memcmp(gguf_qkv, qkv->data, 2 * v_rows * H) == 0);  // q and k rows stay
  }

  void aCheckpointWithoutATensorIsRefused() {
    const std::string dir = tmp_.filePath("broken").toStdString();
    QVERIFY(GenerateTinyModel(TinyModelSize::kTiny, 5, dir).ok());
    auto set = SafetensorsSet::OpenDirectory(dir);
    QVERIFY(set.ok());
    std::vector<TensorToWrite> kept;
    for (const auto& [name, t] : set->tensors())
      if (name != "model.layers.1.linear_attn.A_log") kept.push_back({name, t.dtype, t.shape, std::string(reinterpret_cast<const char*>(t.data), t.bytes)});
    QVERIFY(WriteSafetensors(dir + "/model.safetensors", kept).ok());
    const Status s = ExportGguf(dir, tmp_.filePath("broken.gguf").toStdString());
    QVERIFY(!s.ok());
    QVERIFY2(s.message().find("model.layers.1.linear_attn.A_log") != std::string::npos, s.ToString().c_str());
    QVERIFY(!FileExists(tmp_.filePath("broken.gguf").toStdString()));
  }
};

QTEST_GUILESS_MAIN(TestGgufExport)
#include "test_gguf_export.moc"
