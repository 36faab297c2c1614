// The vision tower of a Qwen3.5 checkpoint on the CPU: one image's patches in, its prompt rows out.
// Patch embedding, learned positions interpolated to the grid, blocks of bidirectional attention with
// 2-D rotary positions and a GELU MLP, then the merger of each merge x merge patches into one row.
// Deterministic: the same patches give the same bits for every thread count.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/compute/cpu/packed_bf16.h"
#include "engine/core/status.h"
#include "engine/core/thread_pool.h"
#include "engine/image/image_patches.h"
#include "engine/model/model_config.h"
#include "engine/model/weights.h"

namespace anchorage {

// What every tower shares, whichever device runs it.
// That grid is whole merged patches and patches holds its values (VisionTower::Encode's input).
Status CheckTowerInput(const VisionConfig& config, const ImageGrid& grid, std::span<const float> patches);
// The preprocessing a tower of config expects (patch and merge sizes; the pixel limits are the caller's).
ImageProcessing VisionProcessing(const VisionConfig& config);
// Learned positions of the grid's patches (bilinear over the square table pos_embed [num_position_embeddings,
// hidden_size]), in merge order: [grid.patches(), hidden_size].
std::vector<float> VisionPatchPositions(const VisionConfig& config, std::span<const float> pos_embed, const ImageGrid& grid);
// cos and sin [patches, head_dim / 2] of the 2-D rotary angles (row, then column frequencies), in merge order.
void VisionRotaryTable(const VisionConfig& config, const ImageGrid& grid, std::vector<float>* cos, std::vector<float>* sin);

class VisionTower {
 public:
  // Packs the matrices (BF16 as they are, F16 and F32 rounded to BF16; FP8 is refused) and widens the
  // vectors. Keeps no pointer into the weights; runs its products on pool, which must outlive it.
  static Result<std::unique_ptr<VisionTower>> Create(const VisionConfig& config, const VisionWeights& weights, ThreadPool& pool);
  ~VisionTower();

  // patches: fp32 [grid.patches(), config.patch_values()] in merge order (PreprocessImage). Returns fp32
  // [grid.tokens(merge), out_hidden_size]: the image's rows in the prompt, in raster order of merged patches.
  Result<std::vector<float>> Encode(const ImageGrid& grid, std::span<const float> patches);

  const VisionConfig& config() const { return config_; }
  int64_t weight_bytes() const;

 private:
  struct Block;
  VisionTower(const VisionConfig& config, ThreadPool& pool);
  void LayerNorm(const float* x, int64_t rows, const std::vector<float>& weight, const std::vector<float>& bias, float* y);
  void Linear(const float* x, int64_t rows, const cpu::PackedBf16& w, const std::vector<float>& bias, float* y);

  VisionConfig config_;
  ThreadPool& pool_;
  cpu::PackedBf16 patch_embed_;
  std::vector<float> patch_bias_;
  std::vector<float> pos_embed_;  // [num_position_embeddings, D]
  std::vector<Block> blocks_;
  std::vector<float> merger_norm_w_, merger_norm_b_, merger_fc1_b_, merger_fc2_b_;
  cpu::PackedBf16 merger_fc1_, merger_fc2_;
};

}  // namespace anchorage
