#include "engine/model/weights.h"

namespace anchorage {

namespace {

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

class Mapper {
 public:
  Mapper(const ModelConfig& config, const SafetensorsSet& set, std::string prefix)
      : config_(config), set_(set), prefix_(std::move(prefix)) {}

  // Finds prefix + name with the given shape; a 1-element trailing dim is tolerated for conv weights.
  Status Get(const std::string& name, std::vector<int64_t> shape, TensorView* out) {
    const std::string full = prefix_ + name;
    const TensorView* t = set_.Find(full);
    if (t == nullptr) return NotFound("checkpoint lacks tensor '" + full + "'");
    if (t->shape != shape)
      return InvalidArgument("tensor '" + full + "' in " + t->file + " has shape " + ShapeText(t->shape) + ", expected " + ShapeText(shape));
    *out = *t;
    if (t->dtype == DType::kF8E4M3) return FindScales(full, *t, out);
    return Status::Ok();
  }

 private:
  // An FP8 matrix's block scales: name + "_scale_inv", [ceil(n / block_n), ceil(k / block_k)].
  Status FindScales(const std::string& full, const TensorView& t, TensorView* out) {
    const std::string where = "tensor '" + full + "' in " + t.file;
    if (t.shape.size() != 2) return InvalidArgument(where + " is F8_E4M3; only matrices may be FP8");
    if (config_.fp8_block_n <= 0)
      return InvalidArgument(where + " is F8_E4M3 but config.json has no quantization_config (quant_method fp8, weight_block_size)");
    const std::string scales_name = full + "_scale_inv";
    const TensorView* scales = set_.Find(scales_name);
    if (scales == nullptr) return NotFound("checkpoint lacks tensor '" + scales_name + "', the block scales of " + where);
    const std::vector<int64_t> want{(t.shape[0] + config_.fp8_block_n - 1) / config_.fp8_block_n,
                                    (t.shape[1] + config_.fp8_block_k - 1) / config_.fp8_block_k};
    if (scales->shape != want)
      return InvalidArgument("tensor '" + scales_name + "' in " + scales->file + " has shape " + ShapeText(scales->shape) +
                             ", expected " + ShapeText(want) + " (blocks of " + std::to_string(config_.fp8_block_n) + " x " +
                             std::to_string(config_.fp8_block_k) + ")");
    if (scales->dtype == DType::kF8E4M3) return InvalidArgument("tensor '" + scales_name + "' must be F32, BF16 or F16");
    out->scale_inv = scales;
    out->scale_block_rows = config_.fp8_block_n;
    out->scale_block_cols = config_.fp8_block_k;
    return Status::Ok();
  }

  const ModelConfig& config_;
  const SafetensorsSet& set_;
  std::string prefix_;
};

// A decoder layer's norms and MLP under p.
Status MapNormsAndMlp(const ModelConfig& c, Mapper& m, const std::string& p, LayerWeights& lw) {
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  RETURN_IF_ERROR(m.Get(p + "input_layernorm.weight", {H}, &lw.input_layernorm));
  RETURN_IF_ERROR(m.Get(p + "post_attention_layernorm.weight", {H}, &lw.post_attention_layernorm));
  RETURN_IF_ERROR(m.Get(p + "mlp.gate_proj.weight", {I, H}, &lw.gate_proj));
  RETURN_IF_ERROR(m.Get(p + "mlp.up_proj.weight", {I, H}, &lw.up_proj));
  return m.Get(p + "mlp.down_proj.weight", {H, I}, &lw.down_proj);
}

// Full attention's tensors under q (a layer's self_attn.).
Status MapAttention(const ModelConfig& c, Mapper& m, const std::string& q, AttentionWeights& a) {
  const int64_t H = c.hidden_size, hd = c.head_dim, nh = c.num_attention_heads, nkv = c.num_key_value_heads;
  RETURN_IF_ERROR(m.Get(q + "q_proj.weight", {(c.attn_output_gate ? 2 : 1) * nh * hd, H}, &a.q_proj));
  RETURN_IF_ERROR(m.Get(q + "k_proj.weight", {nkv * hd, H}, &a.k_proj));
  RETURN_IF_ERROR(m.Get(q + "v_proj.weight", {nkv * hd, H}, &a.v_proj));
  RETURN_IF_ERROR(m.Get(q + "o_proj.weight", {H, nh * hd}, &a.o_proj));
  RETURN_IF_ERROR(m.Get(q + "q_norm.weight", {hd}, &a.q_norm));
  return m.Get(q + "k_norm.weight", {hd}, &a.k_norm);
}

Result<MtpWeights> MapMtp(const ModelConfig& c, const SafetensorsSet& set) {
  Mapper m(c, set, "mtp.");
  MtpWeights w;
  const int64_t H = c.hidden_size;
  RETURN_IF_ERROR(m.Get("fc.weight", {H, 2 * H}, &w.fc));
  RETURN_IF_ERROR(m.Get("pre_fc_norm_embedding.weight", {H}, &w.pre_fc_norm_embedding));
  RETURN_IF_ERROR(m.Get("pre_fc_norm_hidden.weight", {H}, &w.pre_fc_norm_hidden));
  RETURN_IF_ERROR(m.Get("norm.weight", {H}, &w.norm));
  w.layer.kind = LayerKind::kFullAttention;
  RETURN_IF_ERROR(MapNormsAndMlp(c, m, "layers.0.", w.layer));
  RETURN_IF_ERROR(MapAttention(c, m, "layers.0.self_attn.", w.layer.attn));
  return w;
}

Result<VisionWeights> MapVision(const ModelConfig& c, const SafetensorsSet& set) {
  const VisionConfig& v = *c.vision;
  Mapper m(c, set, "model.visual.");
  VisionWeights w;
  const int64_t D = v.hidden_size, I = v.intermediate_size, M = v.merged_width(), P = v.patch_size;
  RETURN_IF_ERROR(m.Get("patch_embed.proj.weight", {D, v.in_channels, v.temporal_patch_size, P, P}, &w.patch_embed_weight));
  RETURN_IF_ERROR(m.Get("patch_embed.proj.bias", {D}, &w.patch_embed_bias));
  RETURN_IF_ERROR(m.Get("pos_embed.weight", {v.num_position_embeddings, D}, &w.pos_embed));
  for (int64_t i = 0; i < v.depth; ++i) {
    const std::string p = "blocks." + std::to_string(i) + ".";
    VisionBlockWeights b;
    RETURN_IF_ERROR(m.Get(p + "norm1.weight", {D}, &b.norm1_weight));
    RETURN_IF_ERROR(m.Get(p + "norm1.bias", {D}, &b.norm1_bias));
    RETURN_IF_ERROR(m.Get(p + "attn.qkv.weight", {3 * D, D}, &b.qkv_weight));
    RETURN_IF_ERROR(m.Get(p + "attn.qkv.bias", {3 * D}, &b.qkv_bias));
    RETURN_IF_ERROR(m.Get(p + "attn.proj.weight", {D, D}, &b.proj_weight));
    RETURN_IF_ERROR(m.Get(p + "attn.proj.bias", {D}, &b.proj_bias));
    RETURN_IF_ERROR(m.Get(p + "norm2.weight", {D}, &b.norm2_weight));
    RETURN_IF_ERROR(m.Get(p + "norm2.bias", {D}, &b.norm2_bias));
    RETURN_IF_ERROR(m.Get(p + "mlp.linear_fc1.weight", {I, D}, &b.fc1_weight));
    RETURN_IF_ERROR(m.Get(p + "mlp.linear_fc1.bias", {I}, &b.fc1_bias));
    RETURN_IF_ERROR(m.Get(p + "mlp.linear_fc2.weight", {D, I}, &b.fc2_weight));
    RETURN_IF_ERROR(m.Get(p + "mlp.linear_fc2.bias", {D}, &b.fc2_bias));
    w.blocks.push_back(std::move(b));
  }
  RETURN_IF_ERROR(m.Get("merger.norm.weight", {D}, &w.merger_norm_weight));
  RETURN_IF_ERROR(m.Get("merger.norm.bias", {D}, &w.merger_norm_bias));
  RETURN_IF_ERROR(m.Get("merger.linear_fc1.weight", {M, M}, &w.merger_fc1_weight));
  RETURN_IF_ERROR(m.Get("merger.linear_fc1.bias", {M}, &w.merger_fc1_bias));
  RETURN_IF_ERROR(m.Get("merger.linear_fc2.weight", {v.out_hidden_size, M}, &w.merger_fc2_weight));
  RETURN_IF_ERROR(m.Get("merger.linear_fc2.bias", {v.out_hidden_size}, &w.merger_fc2_bias));
  return w;
}

}  // namespace

Result<ModelWeights> MapWeights(const ModelConfig& c, const SafetensorsSet& set) {
  std::string prefix;
  if (set.Find("model.language_model.embed_tokens.weight") != nullptr) prefix = "model.language_model.";
  else if (set.Find("model.embed_tokens.weight") != nullptr) prefix = "model.";
  else return NotFound("checkpoint lacks 'model.language_model.embed_tokens.weight' and 'model.embed_tokens.weight'");

  Mapper m(c, set, prefix);
  ModelWeights w;
  const int64_t H = c.hidden_size, V = c.vocab_size;
  RETURN_IF_ERROR(m.Get("embed_tokens.weight", {V, H}, &w.embed_tokens));
  RETURN_IF_ERROR(m.Get("norm.weight", {H}, &w.norm));
  if (c.tie_word_embeddings) {
    w.lm_head = w.embed_tokens;
  } else {
    Mapper root(c, set, "");
    RETURN_IF_ERROR(root.Get("lm_head.weight", {V, H}, &w.lm_head));
  }

  const int64_t nv = c.linear_num_value_heads, dv = c.linear_value_head_dim;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    LayerWeights lw;
    lw.kind = c.layer_types[static_cast<size_t>(i)];
    const std::string p = "layers." + std::to_string(i) + ".";
    RETURN_IF_ERROR(MapNormsAndMlp(c, m, p, lw));
    if (lw.kind == LayerKind::kFullAttention) {
      RETURN_IF_ERROR(MapAttention(c, m, p + "self_attn.", lw.attn));
    } else {
      GdnWeights& g = lw.gdn;
      const std::string q = p + "linear_attn.";
      RETURN_IF_ERROR(m.Get(q + "in_proj_qkv.weight", {c.conv_dim(), H}, &g.in_proj_qkv));
      RETURN_IF_ERROR(m.Get(q + "in_proj_z.weight", {nv * dv, H}, &g.in_proj_z));
      RETURN_IF_ERROR(m.Get(q + "in_proj_b.weight", {nv, H}, &g.in_proj_b));
      RETURN_IF_ERROR(m.Get(q + "in_proj_a.weight", {nv, H}, &g.in_proj_a));
      RETURN_IF_ERROR(m.Get(q + "conv1d.weight", {c.conv_dim(), 1, c.linear_conv_kernel_dim}, &g.conv1d));
      RETURN_IF_ERROR(m.Get(q + "A_log", {nv}, &g.A_log));
      RETURN_IF_ERROR(m.Get(q + "dt_bias", {nv}, &g.dt_bias));
      RETURN_IF_ERROR(m.Get(q + "norm.weight", {dv}, &g.norm));
      RETURN_IF_ERROR(m.Get(q + "out_proj.weight", {H, nv * dv}, &g.out_proj));
    }
    w.layers.push_back(std::move(lw));
  }
  if (set.Find("mtp.fc.weight") == nullptr) {
    w.mtp_note = "the checkpoint has no mtp.* tensors";
  } else if (Result<MtpWeights> mtp = MapMtp(c, set); mtp.ok()) {
    w.mtp = std::move(*mtp);
  } else {
    w.mtp_note = mtp.status().message();
  }
  if (!c.vision) {
    w.vision_note = "config.json has no vision_config";
  } else if (Result<VisionWeights> vision = MapVision(c, set); vision.ok()) {
    w.vision = std::move(*vision);
  } else {
    w.vision_note = vision.status().message();
  }
  return w;
}

}  // namespace anchorage
