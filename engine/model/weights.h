// The Qwen3.5 text model's tensors by role, mapped from Hugging Face names (with or without the
// multimodal wrapper's model.language_model. prefix) and the vision tower's (model.visual.).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/model/model_config.h"
#include "engine/model/safetensors.h"

namespace anchorage {

struct GdnWeights {
  TensorView in_proj_qkv;  // [conv_dim, H]
  TensorView in_proj_z;    // [Nv*dv, H]
  TensorView in_proj_b;    // [Nv, H]
  TensorView in_proj_a;    // [Nv, H]
  TensorView conv1d;       // [conv_dim, 1, K]
  TensorView A_log;        // [Nv], fp32 or bf16 in the file
  TensorView dt_bias;      // [Nv]
  TensorView norm;         // [dv], plain weight (no +1)
  TensorView out_proj;     // [H, Nv*dv]
};

struct AttentionWeights {
  TensorView q_proj;  // [2*Nh*head_dim, H], per head [query | gate]
  TensorView k_proj;  // [Nkv*head_dim, H]
  TensorView v_proj;  // [Nkv*head_dim, H]
  TensorView o_proj;  // [H, Nh*head_dim]
  TensorView q_norm;  // [head_dim], zero-centred
  TensorView k_norm;  // [head_dim], zero-centred
};

struct LayerWeights {
  LayerKind kind = LayerKind::kLinearAttention;
  TensorView input_layernorm;           // [H], zero-centred
  TensorView post_attention_layernorm;  // [H], zero-centred
  GdnWeights gdn;                       // set for linear-attention layers
  AttentionWeights attn;                // set for full-attention layers
  TensorView gate_proj;                 // [I, H]
  TensorView up_proj;                   // [I, H]
  TensorView down_proj;                 // [H, I]
};

// The multi-token-prediction block (mtp.*): one full-attention decoder layer over fc(e, h).
struct MtpWeights {
  TensorView fc;                    // [H, 2H], the embedding's half first
  TensorView pre_fc_norm_embedding; // [H], zero-centred
  TensorView pre_fc_norm_hidden;    // [H], zero-centred
  TensorView norm;                  // [H], zero-centred
  LayerWeights layer;               // mtp.layers.0, a full-attention layer
};

// One block of the vision tower (model.visual.blocks.N.): pre-norm attention and MLP, LayerNorms with bias.
struct VisionBlockWeights {
  TensorView norm1_weight, norm1_bias;  // [D]
  TensorView qkv_weight, qkv_bias;      // [3D, D], [3D]: q, k, v, each heads of head_dim
  TensorView proj_weight, proj_bias;    // [D, D], [D]
  TensorView norm2_weight, norm2_bias;  // [D]
  TensorView fc1_weight, fc1_bias;      // [I, D], [I]
  TensorView fc2_weight, fc2_bias;      // [D, I], [D]
};

// The vision tower (model.visual.*).
struct VisionWeights {
  TensorView patch_embed_weight;  // [D, C, T, P, P]: a Conv3d whose stride is its kernel
  TensorView patch_embed_bias;    // [D]
  TensorView pos_embed;           // [num_position_embeddings, D]
  std::vector<VisionBlockWeights> blocks;
  TensorView merger_norm_weight, merger_norm_bias;  // [D]
  TensorView merger_fc1_weight, merger_fc1_bias;    // [4D, 4D], [4D]
  TensorView merger_fc2_weight, merger_fc2_bias;    // [out, 4D], [out]
};

struct ModelWeights {
  TensorView embed_tokens;  // [V, H]
  TensorView norm;          // [H], zero-centred
  TensorView lm_head;       // [V, H]; equals embed_tokens when tied
  std::vector<LayerWeights> layers;
  std::optional<MtpWeights> mtp;  // set when the checkpoint has every mtp.* tensor
  std::string mtp_note;           // why mtp is unset: no mtp.* tensors, or the first bad one
  std::optional<VisionWeights> vision;  // set when the config has a vision_config and every model.visual.* tensor is there
  std::string vision_note;              // why vision is unset: no vision_config, or the first bad tensor
};

// Finds and shape-checks every tensor the forward needs; an error names the tensor and the file.
Result<ModelWeights> MapWeights(const ModelConfig& config, const SafetensorsSet& set);

}  // namespace anchorage
