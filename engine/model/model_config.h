// The text-model configuration of a Qwen3.5 checkpoint (config.json, flat or under text_config).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "engine/core/kv_dtype.h"
#include "engine/core/status.h"

namespace anchorage {

enum class LayerKind { kLinearAttention, kFullAttention };

Result<KvDtype> ParseKvDtype(const std::string& name);

struct ModelConfig {
  std::string model_type;               // "qwen3_5" or "qwen3_5_text"
  int64_t hidden_size = 0;              // H
  int64_t num_hidden_layers = 0;        // L
  int64_t intermediate_size = 0;        // I
  int64_t num_attention_heads = 0;      // Nh
  int64_t num_key_value_heads = 0;      // Nkv
  int64_t head_dim = 0;                 // attention head width
  int64_t linear_num_key_heads = 0;     // Nk
  int64_t linear_num_value_heads = 0;   // Nv
  int64_t linear_key_head_dim = 0;      // dk
  int64_t linear_value_head_dim = 0;    // dv
  int64_t linear_conv_kernel_dim = 0;   // conv taps, 4
  int64_t vocab_size = 0;               // rows of embed_tokens (padded)
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 1e7;
  double partial_rotary_factor = 0.25;
  bool tie_word_embeddings = false;
  bool attn_output_gate = true;
  std::vector<LayerKind> layer_types;   // one per layer
  std::vector<int64_t> eos_token_ids;
  // quantization_config's weight_block_size in an FP8 checkpoint (quant_method fp8, fmt e4m3); 0: not FP8.
  int64_t fp8_block_n = 0, fp8_block_k = 0;
  // Not in config.json: the server's --kv-dtype, which every state of this model follows.
  KvDtype kv_dtype = KvDtype::kF32;

  // Derived sizes.
  int64_t rotary_dim() const;            // rotated dims per attention head
  int64_t key_dim() const { return linear_num_key_heads * linear_key_head_dim; }
  int64_t value_dim() const { return linear_num_value_heads * linear_value_head_dim; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
  int64_t num_full_attention_layers() const;
  int64_t num_linear_attention_layers() const { return num_hidden_layers - num_full_attention_layers(); }

  // Bytes of one anchor: fp32 recurrent states plus fp32 conv tails of every GDN layer.
  int64_t anchor_bytes() const;
  // Bytes of K and V rows (bf16) of one token over every attention layer.
  int64_t kv_bytes_per_token() const;

  nlohmann::json ToJson() const;
};

// Parses config.json text; `source` names the file in errors. Every missing or invalid field is named.
Result<ModelConfig> ParseModelConfig(const std::string& text, const std::string& source);
Result<ModelConfig> LoadModelConfig(const std::string& path);

}  // namespace anchorage
