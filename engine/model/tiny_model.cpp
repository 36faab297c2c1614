#include "engine/model/tiny_model.h"

#include <cmath>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "engine/core/bf16.h"
#include "engine/core/fp8.h"
#include "engine/core/file_util.h"
#include "engine/text/bpe_trainer.h"
#include "engine/model/safetensors.h"
#include "engine/text/tokenizer.h"

namespace anchorage {

namespace embedded {
extern const std::string_view kTinyCorpus;
extern const std::string_view kTinyChatTemplate;
}  // namespace embedded

namespace {

constexpr int kTinyMerges = 400;
constexpr int kSmallMerges = 2000;
constexpr int64_t kSmallVocab = 32768;

// splitmix64: a portable, seedable stream; the same seed gives the same bytes on every platform.
class Random {
 public:
  explicit Random(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [lo, hi), from the top 24 bits so every step is exact in fp32.
  float Uniform(float lo, float hi) { return lo + (hi - lo) * static_cast<float>(Next() >> 40) * (1.0f / 16777216.0f); }

 private:
  uint64_t state_;
};

uint64_t HashName(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

class Writer {
 public:
  explicit Writer(uint64_t seed) : seed_(seed) {}

  // Fills a BF16 tensor uniformly in [center - spread, center + spread); each tensor has its own stream.
  void Bf16(const std::string& name, std::vector<int64_t> shape, float center, float spread) {
    Random rng(seed_ ^ HashName(name));
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::string data(static_cast<size_t>(n) * 2, '\0');
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h = FloatToBf16(rng.Uniform(center - spread, center + spread));
      std::memcpy(&data[static_cast<size_t>(i) * 2], &h, 2);
    }
    tensors_.push_back({name, DType::kBF16, std::move(shape), std::move(data)});
  }

  void F32(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& values) {
    std::string data(values.size() * 4, '\0');
    std::memcpy(data.data(), values.data(), data.size());
    tensors_.push_back({name, DType::kF32, std::move(shape), std::move(data)});
  }

  // Every BF16 projection matrix (the embeddings and lm_head stay BF16) becomes F8_E4M3 with an F32
  // *_scale_inv a block: the power of two that brings the block's largest |w| to at most 448.
  void QuantizeProjectionsToFp8() {
    std::vector<TensorToWrite> out;
    for (TensorToWrite& t : tensors_) {
      const bool projection = t.dtype == DType::kBF16 && t.shape.size() == 2 && t.name.find("embed_tokens") == std::string::npos &&
                              t.name != "lm_head.weight" && t.name.rfind("model.visual.", 0) != 0;
      if (!projection) {
        out.push_back(std::move(t));
        continue;
      }
      const int64_t n = t.shape[0], k = t.shape[1], b = kGeneratedFp8Block;
      const int64_t rows = (n + b - 1) / b, cols = (k + b - 1) / b;
      auto weight = [&t, k](int64_t j, int64_t i) {
        uint16_t h;
        std::memcpy(&h, &t.data[static_cast<size_t>(j * k + i) * 2], 2);
        return Bf16ToFloat(h);
      };
      std::string codes(static_cast<size_t>(n * k), '\0');
      std::vector<float> scales(static_cast<size_t>(rows * cols));
      for (int64_t br = 0; br < rows; ++br)
        for (int64_t bc = 0; bc < cols; ++bc) {
          float largest = 0.0f;
          for (int64_t j = br * b; j < std::min(n, br * b + b); ++j)
            for (int64_t i = bc * b; i < std::min(k, bc * b + b); ++i) largest = std::max(largest, std::fabs(weight(j, i)));
          int exponent = 0;
          std::frexp(largest / 448.0f, &exponent);  // largest / 448 < 2^exponent
          const float scale = largest == 0.0f ? 1.0f : std::ldexp(1.0f, exponent);
          scales[br * cols + bc] = scale;
          for (int64_t j = br * b; j < std::min(n, br * b + b); ++j)
            for (int64_t i = bc * b; i < std::min(k, bc * b + b); ++i)
              codes[static_cast<size_t>(j * k + i)] = static_cast<char>(FloatToFp8E4m3(weight(j, i) / scale));
        }
      std::string scale_bytes(scales.size() * 4, '\0');
      std::memcpy(scale_bytes.data(), scales.data(), scale_bytes.size());
      out.push_back({t.name + "_scale_inv", DType::kF32, {rows, cols}, std::move(scale_bytes)});
      out.push_back({t.name, DType::kF8E4M3, t.shape, std::move(codes)});
    }
    tensors_ = std::move(out);
  }

  uint64_t seed() const { return seed_; }
  const std::vector<TensorToWrite>& tensors() const { return tensors_; }

 private:
  uint64_t seed_;
  std::vector<TensorToWrite> tensors_;
};

int64_t RoundUp(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

}  // namespace

Result<TinyModelSize> ParseTinyModelSize(const std::string& name) {
  if (name == "tiny") return TinyModelSize::kTiny;
  if (name == "small") return TinyModelSize::kSmall;
  if (name == "shadow") return TinyModelSize::kShadow;
  return InvalidArgument("unknown model size '" + name + "' (expected tiny, small or shadow)");
}

const char* TinyModelSizeName(TinyModelSize size) {
  switch (size) {
    case TinyModelSize::kTiny: return "tiny";
    case TinyModelSize::kSmall: return "small";
    case TinyModelSize::kShadow: return "shadow";
  }
  return "tiny";
}

ModelConfig TinyModelConfig(TinyModelSize size, int64_t vocab_size) {
  ModelConfig c;
  c.model_type = "qwen3_5_text";
  c.linear_conv_kernel_dim = 4;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1e7;
  c.partial_rotary_factor = 0.25;
  c.attn_output_gate = true;
  if (size == TinyModelSize::kTiny) {
    c.hidden_size = 64;
    c.num_hidden_layers = 4;
    c.intermediate_size = 128;
    c.num_attention_heads = 2;
    c.num_key_value_heads = 1;
    c.head_dim = 64;
    c.linear_num_key_heads = 2;
    c.linear_num_value_heads = 4;
    c.linear_key_head_dim = 16;
    c.linear_value_head_dim = 16;
    c.vocab_size = RoundUp(vocab_size, 64);
    c.max_position_embeddings = 262144;  // the real Qwen3.5 context, so agent-sized prompts fit
    c.tie_word_embeddings = true;
  } else if (size == TinyModelSize::kShadow) {
    c.hidden_size = 32;
    c.num_hidden_layers = 4;
    c.intermediate_size = 64;
    c.num_attention_heads = 1;
    c.num_key_value_heads = 1;
    c.head_dim = 32;
    c.linear_num_key_heads = 1;
    c.linear_num_value_heads = 2;
    c.linear_key_head_dim = 16;
    c.linear_value_head_dim = 16;
    c.vocab_size = RoundUp(vocab_size, 64);
    c.max_position_embeddings = 262144;
    c.tie_word_embeddings = true;
  } else {
    c.hidden_size = 1024;
    c.num_hidden_layers = 12;
    c.intermediate_size = 3584;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 2;
    c.head_dim = 256;
    c.linear_num_key_heads = 16;
    c.linear_num_value_heads = 16;
    c.linear_key_head_dim = 128;
    c.linear_value_head_dim = 128;
    c.vocab_size = std::max(kSmallVocab, RoundUp(vocab_size, 64));
    c.max_position_embeddings = 262144;
    c.tie_word_embeddings = false;
  }
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    c.layer_types.push_back((i + 1) % 4 == 0 ? LayerKind::kFullAttention : LayerKind::kLinearAttention);
  // Qwen3.5's 11/11/10 of 32 rotary frequencies, scaled to the width.
  c.mrope_section = size == TinyModelSize::kSmall ? std::vector<int64_t>{11, 11, 10}
                    : size == TinyModelSize::kTiny ? std::vector<int64_t>{3, 3, 2} : std::vector<int64_t>{2, 1, 1};
  if (size != TinyModelSize::kShadow) {
    VisionConfig v;
    if (size == TinyModelSize::kTiny) {
      v.depth = 2, v.hidden_size = 48, v.intermediate_size = 96, v.num_heads = 2, v.num_position_embeddings = 64;
    } else {  // Qwen3.5-0.8B's tower
      v.depth = 12, v.hidden_size = 768, v.intermediate_size = 3072, v.num_heads = 12, v.num_position_embeddings = 2304;
    }
    v.out_hidden_size = c.hidden_size;
    c.vision = v;
  }
  return c;
}

Result<GeneratedDtype> ParseGeneratedDtype(const std::string& name) {
  if (name == "bf16") return GeneratedDtype::kBf16;
  if (name == "fp8") return GeneratedDtype::kFp8;
  return InvalidArgument("unknown dtype '" + name + "' (expected bf16 or fp8)");
}

Status GenerateTinyModel(TinyModelSize size, uint64_t seed, const std::string& dir, std::optional<TinyModelSize> tokenizer_of,
                         GeneratedDtype dtype) {
  namespace fs = std::filesystem;
  RETURN_IF_ERROR(MakeDirectories(dir));

  const TinyModelSize vocab_of = tokenizer_of.value_or(size == TinyModelSize::kShadow ? TinyModelSize::kTiny : size);
  const std::string tokenizer_json = BuildTinyTokenizerJson(embedded::kTinyCorpus, vocab_of == TinyModelSize::kSmall ? kSmallMerges : kTinyMerges);
  ASSIGN_OR_RETURN(Tokenizer tokenizer, Tokenizer::Parse(tokenizer_json, "generated tokenizer.json"));
  ModelConfig c = TinyModelConfig(size, tokenizer.vocab_size());
  c.vocab_size = TinyModelConfig(vocab_of, tokenizer.vocab_size()).vocab_size;
  for (const char* eos : {"<|im_end|>", "<|endoftext|>"}) {
    auto id = tokenizer.TokenId(eos);
    if (!id) return Internal(std::string("generated tokenizer lacks ") + eos);
    c.eos_token_ids.push_back(*id);
  }

  Writer w(seed);
  const int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  const float in_h = 1.0f / std::sqrt(static_cast<float>(H)) * std::sqrt(3.0f);
  const float in_i = 1.0f / std::sqrt(static_cast<float>(I)) * std::sqrt(3.0f);
  w.Bf16("model.embed_tokens.weight", {V, H}, 0.0f, 1.0f);
  w.Bf16("model.norm.weight", {H}, 0.0f, 0.1f);
  if (!c.tie_word_embeddings) w.Bf16("lm_head.weight", {V, H}, 0.0f, in_h);
  auto attention = [&](const std::string& p) {
    const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads, hd = c.head_dim;
    const float in_o = 1.0f / std::sqrt(static_cast<float>(nh * hd)) * std::sqrt(3.0f);
    w.Bf16(p + "self_attn.q_proj.weight", {2 * nh * hd, H}, 0.0f, in_h);
    w.Bf16(p + "self_attn.k_proj.weight", {nkv * hd, H}, 0.0f, in_h);
    w.Bf16(p + "self_attn.v_proj.weight", {nkv * hd, H}, 0.0f, in_h);
    w.Bf16(p + "self_attn.o_proj.weight", {H, nh * hd}, 0.0f, in_o);
    w.Bf16(p + "self_attn.q_norm.weight", {hd}, 0.0f, 0.1f);
    w.Bf16(p + "self_attn.k_norm.weight", {hd}, 0.0f, 0.1f);
  };
  auto mlp = [&](const std::string& p) {
    w.Bf16(p + "mlp.gate_proj.weight", {I, H}, 0.0f, in_h);
    w.Bf16(p + "mlp.up_proj.weight", {I, H}, 0.0f, in_h);
    w.Bf16(p + "mlp.down_proj.weight", {H, I}, 0.0f, in_i);
  };
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    w.Bf16(p + "input_layernorm.weight", {H}, 0.0f, 0.1f);
    w.Bf16(p + "post_attention_layernorm.weight", {H}, 0.0f, 0.1f);
    if (c.layer_types[static_cast<size_t>(i)] == LayerKind::kLinearAttention) {
      const int64_t nv = c.linear_num_value_heads, vd = c.value_dim();
      const float in_v = 1.0f / std::sqrt(static_cast<float>(vd)) * std::sqrt(3.0f);
      w.Bf16(p + "linear_attn.in_proj_qkv.weight", {c.conv_dim(), H}, 0.0f, in_h);
      w.Bf16(p + "linear_attn.in_proj_z.weight", {vd, H}, 0.0f, in_h);
      w.Bf16(p + "linear_attn.in_proj_b.weight", {nv, H}, 0.0f, in_h);
      w.Bf16(p + "linear_attn.in_proj_a.weight", {nv, H}, 0.0f, in_h);
      w.Bf16(p + "linear_attn.conv1d.weight", {c.conv_dim(), 1, c.linear_conv_kernel_dim}, 0.0f, 0.8f);
      Random rng(seed ^ HashName(p + "linear_attn.A_log"));
      std::vector<float> a_log;
      for (int64_t h = 0; h < nv; ++h) a_log.push_back(std::log(rng.Uniform(0.5f, 8.0f)));
      w.F32(p + "linear_attn.A_log", {nv}, a_log);
      w.Bf16(p + "linear_attn.dt_bias", {nv}, -3.0f, 2.0f);
      w.Bf16(p + "linear_attn.norm.weight", {c.linear_value_head_dim}, 1.0f, 0.1f);
      w.Bf16(p + "linear_attn.out_proj.weight", {H, vd}, 0.0f, in_v);
    } else {
      attention(p);
    }
    mlp(p);
  }
  if (c.vision) {
    VisionConfig& v = *c.vision;
    for (auto [field, name] : {std::pair{&v.image_token_id, "<|image_pad|>"}, {&v.vision_start_token_id, "<|vision_start|>"},
                               {&v.vision_end_token_id, "<|vision_end|>"}}) {
      auto id = tokenizer.TokenId(name);
      if (!id) return Internal(std::string("generated tokenizer lacks ") + name);
      *field = *id;
    }
    const int64_t D = v.hidden_size, I = v.intermediate_size, M = v.merged_width(), P = v.patch_size;
    const auto fan_in = [](int64_t n) { return 1.0f / std::sqrt(static_cast<float>(n)) * std::sqrt(3.0f); };
    const std::string p = "model.visual.";
    w.Bf16(p + "patch_embed.proj.weight", {D, v.in_channels, v.temporal_patch_size, P, P}, 0.0f, fan_in(v.patch_values()));
    w.Bf16(p + "patch_embed.proj.bias", {D}, 0.0f, 0.02f);
    w.Bf16(p + "pos_embed.weight", {v.num_position_embeddings, D}, 0.0f, 0.5f);
    const auto norm = [&](const std::string& n, int64_t width) {
      w.Bf16(n + ".weight", {width}, 1.0f, 0.1f);
      w.Bf16(n + ".bias", {width}, 0.0f, 0.1f);
    };
    const auto linear = [&](const std::string& n, int64_t rows, int64_t cols) {
      w.Bf16(n + ".weight", {rows, cols}, 0.0f, fan_in(cols));
      w.Bf16(n + ".bias", {rows}, 0.0f, 0.02f);
    };
    for (int64_t i = 0; i < v.depth; ++i) {
      const std::string b = p + "blocks." + std::to_string(i) + ".";
      norm(b + "norm1", D);
      linear(b + "attn.qkv", 3 * D, D);
      linear(b + "attn.proj", D, D);
      norm(b + "norm2", D);
      linear(b + "mlp.linear_fc1", I, D);
      linear(b + "mlp.linear_fc2", D, I);
    }
    norm(p + "merger.norm", D);
    linear(p + "merger.linear_fc1", M, M);
    linear(p + "merger.linear_fc2", v.out_hidden_size, M);
  }
  if (size != TinyModelSize::kShadow) {  // the multi-token-prediction block, as the 27B-class checkpoints ship it
    w.Bf16("mtp.fc.weight", {H, 2 * H}, 0.0f, 1.0f / std::sqrt(static_cast<float>(2 * H)) * std::sqrt(3.0f));
    for (const char* norm : {"mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight",
                             "mtp.layers.0.input_layernorm.weight", "mtp.layers.0.post_attention_layernorm.weight"})
      w.Bf16(norm, {H}, 0.0f, 0.1f);
    attention("mtp.layers.0.");
    mlp("mtp.layers.0.");
  }

  if (dtype == GeneratedDtype::kFp8) {
    w.QuantizeProjectionsToFp8();
    c.fp8_block_n = c.fp8_block_k = kGeneratedFp8Block;
  }

  nlohmann::ordered_json config;
  config["architectures"] = {c.vision ? "Qwen3_5ForConditionalGeneration" : "Qwen3_5ForCausalLM"};
  const nlohmann::json fields = c.ToJson();
  for (auto& [k, v] : fields.items()) config[k] = v;
  config["mtp_num_hidden_layers"] = size == TinyModelSize::kShadow ? 0 : 1;
  config["dtype"] = "bfloat16";
  config["anchorage_generator"] = {{"size", TinyModelSizeName(size)}, {"seed", seed}};
  if (dtype == GeneratedDtype::kFp8) config["anchorage_generator"]["dtype"] = "fp8";

  nlohmann::ordered_json tokenizer_config = {
      {"add_bos_token", false},
      {"bos_token", nullptr},
      {"eos_token", "<|im_end|>"},
      {"pad_token", "<|endoftext|>"},
      {"model_max_length", c.max_position_embeddings},
      {"tokenizer_class", "Qwen2Tokenizer"}};

  const fs::path d(dir);
  RETURN_IF_ERROR(WriteFileAtomic((d / "config.json").string(), config.dump(2) + "\n"));
  RETURN_IF_ERROR(WriteFileAtomic((d / "tokenizer.json").string(), tokenizer_json));
  RETURN_IF_ERROR(WriteFileAtomic((d / "tokenizer_config.json").string(), tokenizer_config.dump(2) + "\n"));
  RETURN_IF_ERROR(WriteFileAtomic((d / "chat_template.jinja").string(), embedded::kTinyChatTemplate));
  return WriteSafetensors((d / "model.safetensors").string(), w.tensors());
}

}  // namespace anchorage
