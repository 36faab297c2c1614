#include "engine/model/model_config.h"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "engine/core/file_util.h"

namespace anchorage {

namespace {

using json = nlohmann::json;

// Reads fields of one JSON object, remembering the first error with the field and file named.
class FieldReader {
 public:
  FieldReader(const json& object, const json* fallback, std::string source)
      : object_(object), fallback_(fallback), source_(std::move(source)) {}

  const json* Find(const char* key) const {
    if (object_.contains(key)) return &object_[key];
    if (fallback_ != nullptr && fallback_->is_object() && fallback_->contains(key)) return &(*fallback_)[key];
    return nullptr;
  }

  int64_t Int(const char* key, std::optional<int64_t> default_value, int64_t min_value = 1) {
    const json* v = Find(key);
    if (v == nullptr || v->is_null()) {
      if (default_value) return *default_value;
      Fail(std::string("missing field '") + key + "'");
      return 0;
    }
    if (!v->is_number_integer()) {
      Fail(std::string("field '") + key + "' must be an integer, got " + v->dump());
      return 0;
    }
    int64_t x = v->get<int64_t>();
    if (x < min_value) Fail(std::string("field '") + key + "' must be >= " + std::to_string(min_value) + ", got " + std::to_string(x));
    return x;
  }

  double Number(const char* key, double default_value, double min_exclusive) {
    const json* v = Find(key);
    if (v == nullptr || v->is_null()) return default_value;
    if (!v->is_number()) {
      Fail(std::string("field '") + key + "' must be a number, got " + v->dump());
      return default_value;
    }
    double x = v->get<double>();
    if (!(x > min_exclusive)) Fail(std::string("field '") + key + "' must be > " + std::to_string(min_exclusive) + ", got " + v->dump());
    return x;
  }

  bool Bool(const char* key, bool default_value) {
    const json* v = Find(key);
    if (v == nullptr || v->is_null()) return default_value;
    if (!v->is_boolean()) {
      Fail(std::string("field '") + key + "' must be true or false, got " + v->dump());
      return default_value;
    }
    return v->get<bool>();
  }

  void Fail(const std::string& message) {
    if (error_.empty()) error_ = source_ + ": " + message;
  }
  const std::string& error() const { return error_; }

 private:
  const json& object_;
  const json* fallback_;
  std::string source_;
  std::string error_;
};

}  // namespace

int64_t VisionConfig::grid_per_side() const {
  return static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(num_position_embeddings))));
}

nlohmann::json VisionConfig::ToJson() const {
  return json{{"depth", depth},
              {"hidden_size", hidden_size},
              {"hidden_act", "gelu_pytorch_tanh"},
              {"intermediate_size", intermediate_size},
              {"num_heads", num_heads},
              {"in_channels", in_channels},
              {"patch_size", patch_size},
              {"spatial_merge_size", spatial_merge_size},
              {"temporal_patch_size", temporal_patch_size},
              {"out_hidden_size", out_hidden_size},
              {"num_position_embeddings", num_position_embeddings}};
}

int64_t ModelConfig::rotary_dim() const {
  int64_t d = static_cast<int64_t>(static_cast<double>(head_dim) * partial_rotary_factor);
  return d - d % 2;
}

int64_t ModelConfig::num_full_attention_layers() const {
  int64_t n = 0;
  for (LayerKind k : layer_types) n += k == LayerKind::kFullAttention;
  return n;
}

int64_t ModelConfig::anchor_bytes() const {
  int64_t state = linear_num_value_heads * linear_key_head_dim * linear_value_head_dim * 4;
  int64_t tail = conv_dim() * (linear_conv_kernel_dim - 1) * 4;
  return num_linear_attention_layers() * (state + tail);
}

Result<KvDtype> ParseKvDtype(const std::string& name) {
  if (name == "f32") return KvDtype::kF32;
  if (name == "bf16") return KvDtype::kBf16;
  if (name == "fp8") return KvDtype::kFp8;
  return InvalidArgument("kv dtype must be f32, bf16 or fp8, got '" + name + "'");
}

int64_t ModelConfig::kv_bytes_per_token() const {
  return num_full_attention_layers() * 2 * num_key_value_heads * head_dim * 2;
}

nlohmann::json ModelConfig::ToJson() const {
  json layers = json::array();
  for (LayerKind k : layer_types) layers.push_back(k == LayerKind::kFullAttention ? "full_attention" : "linear_attention");
  json out{{"model_type", model_type},
              {"hidden_size", hidden_size},
              {"num_hidden_layers", num_hidden_layers},
              {"intermediate_size", intermediate_size},
              {"num_attention_heads", num_attention_heads},
              {"num_key_value_heads", num_key_value_heads},
              {"head_dim", head_dim},
              {"linear_num_key_heads", linear_num_key_heads},
              {"linear_num_value_heads", linear_num_value_heads},
              {"linear_key_head_dim", linear_key_head_dim},
              {"linear_value_head_dim", linear_value_head_dim},
              {"linear_conv_kernel_dim", linear_conv_kernel_dim},
              {"vocab_size", vocab_size},
              {"max_position_embeddings", max_position_embeddings},
              {"rms_norm_eps", rms_norm_eps},
              {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", rope_theta}, {"partial_rotary_factor", partial_rotary_factor},
                                   {"mrope_section", mrope_section}, {"mrope_interleaved", true}}},
              {"tie_word_embeddings", tie_word_embeddings},
              {"attn_output_gate", attn_output_gate},
              {"hidden_act", "silu"},
              {"layer_types", layers},
              {"eos_token_id", eos_token_ids.size() == 1 ? json(eos_token_ids[0]) : json(eos_token_ids)}};
  if (vision) {
    out["vision_config"] = vision->ToJson();
    out["image_token_id"] = vision->image_token_id;
    out["vision_start_token_id"] = vision->vision_start_token_id;
    out["vision_end_token_id"] = vision->vision_end_token_id;
  }
  if (fp8_block_n > 0)
    out["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"},
                                  {"weight_block_size", {fp8_block_n, fp8_block_k}}};
  return out;
}

Result<ModelConfig> ParseModelConfig(const std::string& text, const std::string& source) {
  json root = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return InvalidArgument(source + ": not valid JSON");
  if (!root.is_object()) return InvalidArgument(source + ": the top level must be an object");

  const json* fallback = nullptr;
  const json* text_config = &root;
  if (root.contains("text_config")) {
    if (!root["text_config"].is_object()) return InvalidArgument(source + ": field 'text_config' must be an object");
    text_config = &root["text_config"];
    fallback = &root;
  }
  FieldReader r(*text_config, fallback, source);
  ModelConfig c;

  const json* type = r.Find("model_type");
  if (type != nullptr && type->is_string()) c.model_type = type->get<std::string>();
  if (!c.model_type.empty() && c.model_type != "qwen3_5" && c.model_type != "qwen3_5_text" && c.model_type != "qwen3_5_moe_text")
    return Unsupported(source + ": model_type '" + c.model_type + "' is not a Qwen3.5 text model");

  c.hidden_size = r.Int("hidden_size", std::nullopt);
  c.num_hidden_layers = r.Int("num_hidden_layers", std::nullopt);
  c.intermediate_size = r.Int("intermediate_size", std::nullopt);
  c.num_attention_heads = r.Int("num_attention_heads", std::nullopt);
  c.num_key_value_heads = r.Int("num_key_value_heads", std::nullopt);
  c.head_dim = r.Int("head_dim", std::nullopt);
  c.linear_num_key_heads = r.Int("linear_num_key_heads", std::nullopt);
  c.linear_num_value_heads = r.Int("linear_num_value_heads", std::nullopt);
  c.linear_key_head_dim = r.Int("linear_key_head_dim", std::nullopt);
  c.linear_value_head_dim = r.Int("linear_value_head_dim", std::nullopt);
  c.linear_conv_kernel_dim = r.Int("linear_conv_kernel_dim", 4, 2);
  c.vocab_size = r.Int("vocab_size", std::nullopt);
  c.max_position_embeddings = r.Int("max_position_embeddings", 262144);
  c.rms_norm_eps = r.Number("rms_norm_eps", 1e-6, 0.0);
  c.tie_word_embeddings = r.Bool("tie_word_embeddings", false);
  c.attn_output_gate = r.Bool("attn_output_gate", true);

  // RoPE: rope_parameters, the same keys flat, or rope_scaling + rope_theta.
  const json* rope = r.Find("rope_parameters");
  if (rope == nullptr) rope = r.Find("rope_scaling");
  if (rope != nullptr && !rope->is_null() && !rope->is_object()) r.Fail("field 'rope_parameters' must be an object");
  json rope_object = (rope != nullptr && rope->is_object()) ? *rope : json::object();
  FieldReader rr(rope_object, text_config, source);
  c.rope_theta = rr.Number("rope_theta", 1e7, 0.0);
  c.partial_rotary_factor = rr.Number("partial_rotary_factor", 0.25, 0.0);
  if (!rr.error().empty()) r.Fail(rr.error().substr(source.size() + 2));
  if (rope_object.contains("rope_type") && rope_object["rope_type"].is_string()) {
    std::string t = rope_object["rope_type"].get<std::string>();
    if (t != "default" && t != "mrope") r.Fail("rope_type '" + t + "' is not supported (only default RoPE)");
  }
  if (c.partial_rotary_factor > 1.0) r.Fail("field 'partial_rotary_factor' must be <= 1");
  if (const json* section = rr.Find("mrope_section"); section != nullptr && !section->is_null()) {
    const bool valid = section->is_array() && section->size() == 3 &&
                       std::all_of(section->begin(), section->end(), [](const json& v) { return v.is_number_integer() && v.get<int64_t>() >= 0; });
    if (!valid) r.Fail("field 'mrope_section' must be three non-negative integers");
    else c.mrope_section = section->get<std::vector<int64_t>>();
  }
  const json* interleaved = rr.Find("mrope_interleaved");
  if (interleaved != nullptr && !interleaved->is_null() && !interleaved->is_boolean()) r.Fail("field 'mrope_interleaved' must be true or false");
  const bool sections_interleaved = interleaved == nullptr || !interleaved->is_boolean() || interleaved->get<bool>();
  if (const json* vision = root.contains("vision_config") ? &root["vision_config"] : nullptr; vision != nullptr && !vision->is_null()) {
    if (!vision->is_object()) {
      r.Fail("field 'vision_config' must be an object");
    } else {
      FieldReader vr(*vision, nullptr, source);
      VisionConfig v;
      v.depth = vr.Int("depth", std::nullopt);
      v.hidden_size = vr.Int("hidden_size", std::nullopt);
      v.intermediate_size = vr.Int("intermediate_size", std::nullopt);
      v.num_heads = vr.Int("num_heads", std::nullopt);
      v.in_channels = vr.Int("in_channels", 3);
      v.patch_size = vr.Int("patch_size", 16);
      v.spatial_merge_size = vr.Int("spatial_merge_size", 2);
      v.temporal_patch_size = vr.Int("temporal_patch_size", 2);
      v.out_hidden_size = vr.Int("out_hidden_size", std::nullopt);
      v.num_position_embeddings = vr.Int("num_position_embeddings", 2304);
      const json* act = vr.Find("hidden_act");
      if (act != nullptr && *act != "gelu_pytorch_tanh") vr.Fail("vision_config's hidden_act " + act->dump() + " is not supported (only gelu_pytorch_tanh)");
      if (vision->contains("deepstack_visual_indexes") && !(*vision)["deepstack_visual_indexes"].empty())
        vr.Fail("vision_config's deepstack_visual_indexes are not supported (a Qwen3-VL tower, not Qwen3.5's)");
      FieldReader ids(root, nullptr, source);
      v.image_token_id = ids.Int("image_token_id", std::nullopt, 0);
      v.vision_start_token_id = ids.Int("vision_start_token_id", std::nullopt, 0);
      v.vision_end_token_id = ids.Int("vision_end_token_id", std::nullopt, 0);
      if (!vr.error().empty()) r.Fail(vr.error().substr(source.size() + 2));
      else if (!ids.error().empty()) r.Fail(ids.error().substr(source.size() + 2));
      else c.vision = v;
    }
  }

  // Layer pattern: layer_types, else full_attention_interval.
  const json* types = r.Find("layer_types");
  if (types != nullptr && !types->is_null()) {
    if (!types->is_array()) {
      r.Fail("field 'layer_types' must be an array");
    } else {
      for (const json& t : *types) {
        if (t == "linear_attention") c.layer_types.push_back(LayerKind::kLinearAttention);
        else if (t == "full_attention") c.layer_types.push_back(LayerKind::kFullAttention);
        else { r.Fail("field 'layer_types' has unknown entry " + t.dump()); break; }
      }
      if (r.error().empty() && static_cast<int64_t>(c.layer_types.size()) != c.num_hidden_layers)
        r.Fail("field 'layer_types' has " + std::to_string(c.layer_types.size()) + " entries for " + std::to_string(c.num_hidden_layers) + " layers");
    }
  } else {
    int64_t interval = r.Int("full_attention_interval", 4);
    for (int64_t i = 0; i < c.num_hidden_layers; ++i)
      c.layer_types.push_back((i + 1) % interval == 0 ? LayerKind::kFullAttention : LayerKind::kLinearAttention);
  }

  const json* eos = r.Find("eos_token_id");
  if (eos != nullptr) {
    if (eos->is_number_integer()) c.eos_token_ids.push_back(eos->get<int64_t>());
    else if (eos->is_array()) {
      for (const json& e : *eos) {
        if (!e.is_number_integer()) { r.Fail("field 'eos_token_id' must hold integers"); break; }
        c.eos_token_ids.push_back(e.get<int64_t>());
      }
    } else if (!eos->is_null()) r.Fail("field 'eos_token_id' must be an integer or a list of integers");
  }

  const json* quantization = r.Find("quantization_config");
  if (quantization != nullptr && !quantization->is_null()) {
    const json& q = *quantization;
    const json method = q.is_object() ? q.value("quant_method", json()) : json();
    const json block = q.is_object() ? q.value("weight_block_size", json()) : json();
    if (!q.is_object()) r.Fail("field 'quantization_config' must be an object");
    else if (method != "fp8") r.Fail("quantization_config's quant_method " + method.dump() + " is not supported (only \"fp8\")");
    else if (q.contains("fmt") && q["fmt"] != "e4m3") r.Fail("quantization_config's fmt " + q["fmt"].dump() + " is not supported (only \"e4m3\")");
    else if (!block.is_array() || block.size() != 2 || !block[0].is_number_integer() || !block[1].is_number_integer() ||
             block[0].get<int64_t>() <= 0 || block[1].get<int64_t>() <= 0)
      r.Fail("quantization_config's weight_block_size must be two positive integers (per-tensor FP8 is not supported)");
    else {
      c.fp8_block_n = block[0].get<int64_t>();
      c.fp8_block_k = block[1].get<int64_t>();
    }
  }

  if (r.error().empty()) {
    if (c.num_attention_heads % c.num_key_value_heads != 0)
      r.Fail("num_attention_heads (" + std::to_string(c.num_attention_heads) + ") must be a multiple of num_key_value_heads (" + std::to_string(c.num_key_value_heads) + ")");
    else if (c.linear_num_value_heads % c.linear_num_key_heads != 0)
      r.Fail("linear_num_value_heads (" + std::to_string(c.linear_num_value_heads) + ") must be a multiple of linear_num_key_heads (" + std::to_string(c.linear_num_key_heads) + ")");
    else if (c.rotary_dim() < 2)
      r.Fail("head_dim * partial_rotary_factor gives no rotary dimensions");
    else if (c.vision && !sections_interleaved)
      r.Fail("mrope_interleaved false (M-RoPE in contiguous sections) is not supported; Qwen3.5 interleaves them");
    else if (c.vision && c.mrope_section[0] + c.mrope_section[1] + c.mrope_section[2] != c.rotary_dim() / 2)
      r.Fail("mrope_section must add up to the rotary frequencies (" + std::to_string(c.rotary_dim() / 2) + ")");
    else if (c.vision) {
      const VisionConfig& v = *c.vision;
      if (v.hidden_size % v.num_heads != 0 || v.head_dim() % 4 != 0)
        r.Fail("vision_config's hidden_size / num_heads must be a multiple of 4 (two rotary halves of pairs)");
      else if (v.grid_per_side() * v.grid_per_side() != v.num_position_embeddings)
        r.Fail("vision_config's num_position_embeddings must be a square");
      else if (v.out_hidden_size != c.hidden_size)
        r.Fail("vision_config's out_hidden_size (" + std::to_string(v.out_hidden_size) + ") must equal the text hidden_size (" +
               std::to_string(c.hidden_size) + ")");
    }
  }
  if (!r.error().empty()) return InvalidArgument(r.error());
  return c;
}

Result<ModelConfig> LoadModelConfig(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  return ParseModelConfig(text, path);
}

}  // namespace anchorage
