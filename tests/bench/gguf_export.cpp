#include "gguf_export.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>

#include <nlohmann/json.hpp>

#include "engine/core/file_util.h"
#include "engine/model/model_config.h"
#include "engine/model/safetensors.h"

namespace anchorage {
namespace {

enum : uint32_t { kU32 = 4, kI32 = 5, kF32Value = 6, kBool = 7, kString = 8, kArray = 9 };
enum : uint32_t { kGgmlF32 = 0, kGgmlBf16 = 30 };
constexpr uint64_t kAlignment = 32;

class Writer {
 public:
  template <typename T>
  void Raw(T v) { bytes_.append(reinterpret_cast<const char*>(&v), sizeof v); }
  void String(const std::string& s) { Raw<uint64_t>(s.size()); bytes_ += s; }
  void Key(const std::string& key, uint32_t type) { String(key); Raw(type); ++kv_count_; }
  void U32(const std::string& key, uint32_t v) { Key(key, kU32); Raw(v); }
  void F32(const std::string& key, float v) { Key(key, kF32Value); Raw(v); }
  void Bool(const std::string& key, bool v) { Key(key, kBool); Raw<uint8_t>(v); }
  void Str(const std::string& key, const std::string& v) { Key(key, kString); String(v); }
  void I32s(const std::string& key, const std::vector<int32_t>& v) {
    Key(key, kArray);
    Raw(kI32);
    Raw<uint64_t>(v.size());
    for (int32_t x : v) Raw(x);
  }
  void Strs(const std::string& key, const std::vector<std::string>& v) {
    Key(key, kArray);
    Raw(kString);
    Raw<uint64_t>(v.size());
    for (const auto& s : v) String(s);
  }
  std::string& bytes() { return bytes_; }
  uint64_t kv_count() const { return kv_count_; }

 private:
  std::string bytes_;
  uint64_t kv_count_ = 0;
};

struct OutTensor {
  std::string name;
  std::vector<int64_t> shape;  // PyTorch order; GGUF lists it reversed
  uint32_t type;
  std::function<std::string()> bytes;
};

// Grouped value heads (HF: head j reads key head j / r) to tiled ones (GGUF: j reads j % Nk).
int64_t TiledHead(int64_t j, int64_t num_k_heads, int64_t per_k) { return (j % per_k) * num_k_heads + j / per_k; }

Result<const TensorView*> Need(const SafetensorsSet& set, const std::string& name) {
  const TensorView* t = set.Find(name);
  if (!t) return NotFound("the checkpoint has no tensor " + name);
  return t;
}

std::string FloatBytes(const std::vector<float>& v) { return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float)); }

std::vector<float> Floats(const TensorView& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  t.ToFloat(0, t.numel(), v.data());
  return v;
}

}  // namespace

Status ExportGguf(const std::string& model_dir, const std::string& out_path, bool visible_padding) {
  ASSIGN_OR_RETURN(ModelConfig c, LoadModelConfig(model_dir + "/config.json"));
  ASSIGN_OR_RETURN(SafetensorsSet set, SafetensorsSet::OpenDirectory(model_dir));
  ASSIGN_OR_RETURN(std::string tokenizer_text, ReadFile(model_dir + "/tokenizer.json"));
  const nlohmann::json tokenizer = nlohmann::json::parse(tokenizer_text, nullptr, false);
  if (tokenizer.is_discarded() || !tokenizer.contains("model")) return InvalidArgument("tokenizer.json is not a BPE tokenizer");
  std::string chat_template;
  if (FileExists(model_dir + "/chat_template.jinja")) {
    ASSIGN_OR_RETURN(chat_template, ReadFile(model_dir + "/chat_template.jinja"));
  }

  const int64_t interval = 4;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    if ((c.layer_types[i] == LayerKind::kFullAttention) != ((i + 1) % interval == 0))
      return Unsupported("llama.cpp's qwen35 wants every fourth layer full attention; layer " + std::to_string(i) + " is not so");
  if (c.linear_key_head_dim != c.linear_value_head_dim) return Unsupported("qwen35 in GGUF has one head width for keys and values");
  const int64_t Nk = c.linear_num_key_heads, Nv = c.linear_num_value_heads, per_k = Nv / Nk, dv = c.linear_value_head_dim;

  Writer w;
  const std::string a = "qwen35.";
  w.Str("general.architecture", "qwen35");
  w.Str("general.name", "anchorage-export");
  w.U32("general.alignment", kAlignment);
  w.U32(a + "block_count", static_cast<uint32_t>(c.num_hidden_layers));
  w.U32(a + "context_length", static_cast<uint32_t>(c.max_position_embeddings));
  w.U32(a + "embedding_length", static_cast<uint32_t>(c.hidden_size));
  w.U32(a + "feed_forward_length", static_cast<uint32_t>(c.intermediate_size));
  w.U32(a + "attention.head_count", static_cast<uint32_t>(c.num_attention_heads));
  w.U32(a + "attention.head_count_kv", static_cast<uint32_t>(c.num_key_value_heads));
  w.U32(a + "attention.key_length", static_cast<uint32_t>(c.head_dim));
  w.U32(a + "attention.value_length", static_cast<uint32_t>(c.head_dim));
  w.F32(a + "attention.layer_norm_rms_epsilon", static_cast<float>(c.rms_norm_eps));
  w.F32(a + "rope.freq_base", static_cast<float>(c.rope_theta));
  w.U32(a + "rope.dimension_count", static_cast<uint32_t>(c.rotary_dim()));
  std::vector<int32_t> sections(c.mrope_section.begin(), c.mrope_section.end());
  sections.resize(4, 0);
  w.I32s(a + "rope.dimension_sections", sections);
  w.U32(a + "ssm.conv_kernel", static_cast<uint32_t>(c.linear_conv_kernel_dim));
  w.U32(a + "ssm.state_size", static_cast<uint32_t>(c.linear_key_head_dim));
  w.U32(a + "ssm.group_count", static_cast<uint32_t>(Nk));
  w.U32(a + "ssm.time_step_rank", static_cast<uint32_t>(Nv));
  w.U32(a + "ssm.inner_size", static_cast<uint32_t>(c.value_dim()));
  w.U32(a + "full_attention_interval", interval);

  // Vocabulary: every id up to the embedding's rows, the added tokens at theirs, the rest padding.
  std::vector<std::string> tokens(static_cast<size_t>(c.vocab_size));
  std::vector<int32_t> types(tokens.size(), visible_padding ? 1 : 5);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = "[PAD" + std::to_string(i) + "]";
  for (const auto& [text, id] : tokenizer["model"]["vocab"].items())
    if (id.get<int64_t>() < c.vocab_size) tokens[id.get<size_t>()] = text, types[id.get<size_t>()] = 1;
  for (const auto& added : tokenizer["added_tokens"])
    if (added["id"].get<int64_t>() < c.vocab_size) {
      tokens[added["id"].get<size_t>()] = added["content"].get<std::string>();
      types[added["id"].get<size_t>()] = added.value("special", false) ? 3 : 4;
    }
  std::vector<std::string> merges;
  for (const auto& m : tokenizer["model"]["merges"])
    merges.push_back(m.is_string() ? m.get<std::string>() : m[0].get<std::string>() + " " + m[1].get<std::string>());
  w.Str("tokenizer.ggml.model", "gpt2");
  w.Str("tokenizer.ggml.pre", "qwen35");
  w.Strs("tokenizer.ggml.tokens", tokens);
  w.I32s("tokenizer.ggml.token_type", types);
  w.Strs("tokenizer.ggml.merges", merges);
  if (!c.eos_token_ids.empty()) w.U32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(c.eos_token_ids.front()));
  for (const auto& added : tokenizer["added_tokens"])
    if (added["content"] == "<|endoftext|>") w.U32("tokenizer.ggml.padding_token_id", added["id"].get<uint32_t>());
  w.Bool("tokenizer.ggml.add_bos_token", false);
  if (!chat_template.empty()) w.Str("tokenizer.chat_template", chat_template);

  std::vector<OutTensor> out;
  // A BF16 matrix whose value heads (blocks of `block` rows from first_row on, or of columns) move to
  // tiled order; block 0: as stored.
  auto copy_tiled = [&](const std::string& from, const std::string& to, int64_t first_row, int64_t block, bool columns) -> Status {
    ASSIGN_OR_RETURN(const TensorView* t, Need(set, from));
    if (t->dtype != DType::kBF16) return Unsupported(from + " is " + DTypeName(t->dtype) + "; the export takes BF16 matrices");
    out.push_back({to, t->shape, kGgmlBf16, [=] {
      std::string bytes(reinterpret_cast<const char*>(t->data), t->bytes);
      if (per_k == 1 || block == 0) return bytes;
      const int64_t cols = t->shape[1];
      for (int64_t j = 0; j < Nv; ++j) {
        const int64_t to_head = TiledHead(j, Nk, per_k);
        if (columns)
          for (int64_t r = 0; r < t->shape[0]; ++r)
            std::memcpy(&bytes[2 * (r * cols + to_head * block)], t->data + 2 * (r * cols + j * block), 2 * block);
        else
          std::memcpy(&bytes[2 * (first_row + to_head * block) * cols], t->data + 2 * (first_row + j * block) * cols, 2 * block * cols);
      }
      return bytes;
    }});
    return Status::Ok();
  };
  auto copy = [&](const std::string& from, const std::string& to) { return copy_tiled(from, to, 0, 0, false); };
  // An F32 vector or small matrix: transform of each value, then (first_row >= 0) its value heads, blocks
  // of `block` rows from first_row on, in tiled order.
  auto floats = [&](const std::string& from, const std::string& to, std::vector<int64_t> shape, std::function<float(float)> transform,
                    int64_t first_row = -1, int64_t block = 1) -> Status {
    ASSIGN_OR_RETURN(const TensorView* t, Need(set, from));
    out.push_back({to, shape, kGgmlF32, [=] {
      std::vector<float> v = Floats(*t);
      for (float& x : v) x = transform(x);
      if (first_row >= 0 && per_k > 1) {
        const int64_t width = static_cast<int64_t>(v.size()) / t->shape[0];
        std::vector<float> moved = v;
        for (int64_t j = 0; j < Nv; ++j)
          std::memcpy(&moved[(first_row + TiledHead(j, Nk, per_k) * block) * width], &v[(first_row + j * block) * width], 4 * block * width);
        v = std::move(moved);
      }
      return FloatBytes(v);
    }});
    return Status::Ok();
  };
  const auto same = [](float x) { return x; };
  const auto plus_one = [](float x) { return 1.0f + x; };

  RETURN_IF_ERROR(copy("model.embed_tokens.weight", "token_embd.weight"));
  RETURN_IF_ERROR(copy(c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight", "output.weight"));
  RETURN_IF_ERROR(floats("model.norm.weight", "output_norm.weight", {c.hidden_size}, plus_one));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string m = "model.layers." + std::to_string(i) + ".", b = "blk." + std::to_string(i) + ".";
    RETURN_IF_ERROR(floats(m + "input_layernorm.weight", b + "attn_norm.weight", {c.hidden_size}, plus_one));
    RETURN_IF_ERROR(floats(m + "post_attention_layernorm.weight", b + "post_attention_norm.weight", {c.hidden_size}, plus_one));
    RETURN_IF_ERROR(copy(m + "mlp.gate_proj.weight", b + "ffn_gate.weight"));
    RETURN_IF_ERROR(copy(m + "mlp.up_proj.weight", b + "ffn_up.weight"));
    RETURN_IF_ERROR(copy(m + "mlp.down_proj.weight", b + "ffn_down.weight"));
    if (c.layer_types[i] == LayerKind::kFullAttention) {
      RETURN_IF_ERROR(copy(m + "self_attn.q_proj.weight", b + "attn_q.weight"));
      RETURN_IF_ERROR(copy(m + "self_attn.k_proj.weight", b + "attn_k.weight"));
      RETURN_IF_ERROR(copy(m + "self_attn.v_proj.weight", b + "attn_v.weight"));
      RETURN_IF_ERROR(copy(m + "self_attn.o_proj.weight", b + "attn_output.weight"));
      RETURN_IF_ERROR(floats(m + "self_attn.q_norm.weight", b + "attn_q_norm.weight", {c.head_dim}, plus_one));
      RETURN_IF_ERROR(floats(m + "self_attn.k_norm.weight", b + "attn_k_norm.weight", {c.head_dim}, plus_one));
      continue;
    }
    const std::string l = m + "linear_attn.";
    RETURN_IF_ERROR(copy_tiled(l + "in_proj_qkv.weight", b + "attn_qkv.weight", 2 * c.key_dim(), dv, false));
    RETURN_IF_ERROR(copy_tiled(l + "in_proj_z.weight", b + "attn_gate.weight", 0, dv, false));
    RETURN_IF_ERROR(copy_tiled(l + "in_proj_b.weight", b + "ssm_beta.weight", 0, 1, false));
    RETURN_IF_ERROR(copy_tiled(l + "in_proj_a.weight", b + "ssm_alpha.weight", 0, 1, false));
    RETURN_IF_ERROR(copy_tiled(l + "out_proj.weight", b + "ssm_out.weight", 0, dv, true));
    RETURN_IF_ERROR(floats(l + "conv1d.weight", b + "ssm_conv1d.weight", {c.conv_dim(), c.linear_conv_kernel_dim}, same, 2 * c.key_dim(), dv));
    RETURN_IF_ERROR(floats(l + "A_log", b + "ssm_a", {Nv}, [](float x) { return -std::exp(x); }, 0, 1));
    RETURN_IF_ERROR(floats(l + "dt_bias", b + "ssm_dt.bias", {Nv}, same, 0, 1));
    RETURN_IF_ERROR(floats(l + "norm.weight", b + "ssm_norm.weight", {dv}, same));
  }

  // Tensor infos: names, dims innermost first, types and offsets into the aligned data section.
  std::vector<uint64_t> sizes;
  uint64_t offset = 0;
  Writer tw;
  for (const OutTensor& t : out) {
    uint64_t numel = 1;
    for (int64_t d : t.shape) numel *= static_cast<uint64_t>(d);
    sizes.push_back(numel * (t.type == kGgmlF32 ? 4 : 2));
    tw.String(t.name);
    tw.Raw<uint32_t>(static_cast<uint32_t>(t.shape.size()));
    for (auto d = t.shape.rbegin(); d != t.shape.rend(); ++d) tw.Raw<uint64_t>(static_cast<uint64_t>(*d));
    tw.Raw(t.type);
    tw.Raw(offset);
    offset += (sizes.back() + kAlignment - 1) / kAlignment * kAlignment;
  }

  Writer head;
  head.bytes() = "GGUF";
  head.Raw<uint32_t>(3);
  head.Raw<uint64_t>(out.size());
  head.Raw<uint64_t>(w.kv_count());
  std::string file = head.bytes() + w.bytes() + tw.bytes();
  file.resize((file.size() + kAlignment - 1) / kAlignment * kAlignment, '\0');
  const std::string partial = out_path + ".partial";
  {
    std::ofstream f(partial, std::ios::binary | std::ios::trunc);
    f.write(file.data(), static_cast<std::streamsize>(file.size()));
    for (size_t i = 0; i < out.size(); ++i) {  // one tensor's bytes in memory at a time
      const std::string d = out[i].bytes();
      if (d.size() != sizes[i]) return Internal(out[i].name + ": its bytes do not match its shape");
      f.write(d.data(), static_cast<std::streamsize>(d.size()));
      const std::string pad((kAlignment - d.size() % kAlignment) % kAlignment, '\0');
      f.write(pad.data(), static_cast<std::streamsize>(pad.size()));
    }
    if (!f.flush()) return IoError("cannot write " + partial);
  }
  if (std::rename(partial.c_str(), out_path.c_str()) != 0) return IoError("cannot rename " + partial + " to " + out_path);
  return Status::Ok();
}

}  // namespace anchorage
