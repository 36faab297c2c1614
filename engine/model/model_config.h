// The text-model configuration of a Qwen3.5 checkpoint (config.json, flat or under text_config).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "engine/core/kv_dtype.h"
#include "engine/core/status.h"

namespace anchorage {

enum class LayerKind { kLinearAttention, kFullAttention };

Result<KvDtype> ParseKvDtype(const std::string& name);

// The vision tower of a Qwen3.5 checkpoint (config.json's vision_config; Qwen3-VL's tower without deepstack).
struct VisionConfig {
  int64_t depth = 0;                      // blocks
  int64_t hidden_size = 0;                // the tower's width
  int64_t intermediate_size = 0;          // its MLP's
  int64_t num_heads = 0;                  // attention heads; head_dim = hidden_size / num_heads
  int64_t in_channels = 3;
  int64_t patch_size = 16;                // pixels a patch side
  int64_t temporal_patch_size = 2;        // frames a patch (an image repeats its one frame)
  int64_t spatial_merge_size = 2;         // patches a merged token side
  int64_t out_hidden_size = 0;            // the merger's output: the text model's hidden size
  int64_t num_position_embeddings = 0;    // learned positions, a square grid
  int64_t image_token_id = -1;            // <|image_pad|>
  int64_t vision_start_token_id = -1;     // <|vision_start|>
  int64_t vision_end_token_id = -1;       // <|vision_end|>

  int64_t head_dim() const { return hidden_size / num_heads; }
  int64_t patch_values() const { return in_channels * temporal_patch_size * patch_size * patch_size; }
  int64_t grid_per_side() const;          // sqrt(num_position_embeddings)
  int64_t merged_width() const { return hidden_size * spatial_merge_size * spatial_merge_size; }
  int64_t pixel_factor() const { return patch_size * spatial_merge_size; }  // image sides are multiples of this
  nlohmann::json ToJson() const;
};

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
  std::vector<int64_t> mrope_section{11, 11, 10};  // rotary frequencies per position axis (t, h, w), interleaved
  std::optional<VisionConfig> vision;   // set when config.json has a vision_config
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
