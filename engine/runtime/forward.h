// The CPU forward pass of a Qwen3.5 text model: grid prefill, decode and verify over a SequenceState.
// Deterministic: the same inputs give the same bits for every run and every thread count.
// One call at a time (it owns a workspace and a thread pool); the engine thread drives it.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "engine/core/status.h"
#include "engine/core/thread_pool.h"
#include "engine/model/model_config.h"
#include "engine/model/weights.h"
#include "engine/runtime/sequence_state.h"

namespace anchorage {

struct ForwardOptions {
  int64_t grid_tokens = 1024;  // prefill chunk G; a positive multiple of 64
  int threads = 0;             // worker threads including the caller; 0 means the machine's cores
};

enum class LogitsRows { kLast, kAll };

class Forward {
 public:
  // Checks shapes, rounds F16/F32 matrices to BF16 once (the kernels multiply bf16 weights) and
  // expands the small tensors to fp32. The weights must outlive the Forward.
  static Result<std::unique_ptr<Forward>> Create(const ModelConfig& config, const ModelWeights& weights,
                                                 const ForwardOptions& options);
  ~Forward();

  // Appends ids at positions state.length().. in chunks that end on multiples of grid_tokens; returns
  // fp32 logits [1, vocab] (kLast) or [ids.size(), vocab] (kAll). On error the state is unchanged.
  Result<std::vector<float>> Prefill(SequenceState& state, std::span<const int32_t> ids,
                                     LogitsRows rows = LogitsRows::kLast);
  // Appends one token with the one-token recurrence; returns fp32 logits [vocab].
  Result<std::vector<float>> Decode(SequenceState& state, int32_t id);
  // Appends ids in one forward (no grid split) and returns fp32 logits [ids.size(), vocab].
  Result<std::vector<float>> Verify(SequenceState& state, std::span<const int32_t> ids);

  const ModelConfig& config() const { return config_; }
  int64_t vocab_size() const { return config_.vocab_size; }
  int64_t grid_tokens() const { return options_.grid_tokens; }
  int threads() const { return pool_->size(); }
  ThreadPool& pool() { return *pool_; }
  // Bytes a prefill call of chunk_tokens allocates at its peak: activations, per-thread weight
  // tiles and one logits row (the state's K/V growth is the caller's).
  int64_t PrefillWorkspaceBytes(int64_t chunk_tokens) const;
  // Matrices the checkpoint stored as F16 or F32, held here rounded to BF16.
  int64_t converted_matrices() const { return converted_matrices_; }
  int64_t converted_bytes() const { return converted_bytes_; }

 private:
  struct Layer;
  struct Workspace;
  enum class Mode { kChunked, kRecurrent };

  Forward(const ModelConfig& config, const ForwardOptions& options);
  Status CheckIds(std::span<const int32_t> ids) const;
  // The bf16 data of a [rows, cols] matrix: the mapped tensor, or a BF16 copy of an F16/F32 one.
  Result<const uint16_t*> Matrix(const TensorView& t, int64_t rows, int64_t cols, const char* role);
  // Runs ids[0..n) at positions state.length()..; writes logits of the last row or all rows.
  void RunChunk(SequenceState& state, const int32_t* ids, int64_t n, Mode mode, bool all_rows, float* logits);
  void GdnMixer(const Layer& layer, SequenceState& state, int64_t gdn_index, int64_t n, Mode mode);
  void AttentionMixer(const Layer& layer, SequenceState& state, int64_t attn_index, int64_t n, Mode mode);
  void Mlp(const Layer& layer, int64_t n);
  void RmsNormRows(const float* x, const float* w1, int64_t n, int64_t width, float* y);

  ModelConfig config_;
  ForwardOptions options_;
  std::unique_ptr<ThreadPool> pool_;
  std::vector<Layer> layers_;
  const uint16_t* embed_ = nullptr;    // bf16 [V, H]
  const uint16_t* lm_head_ = nullptr;  // bf16 [V, H]
  std::vector<float> final_norm_;      // fp32 [H], 1 + w
  std::vector<double> inv_freq_;       // [rotary_dim / 2]
  std::unique_ptr<Workspace> ws_;
  std::deque<std::vector<uint16_t>> converted_;             // bf16 copies of F16/F32 matrices
  std::map<const void*, const uint16_t*> converted_index_;  // mapped data -> its copy (tied weights share one)
  int64_t converted_matrices_ = 0;
  int64_t converted_bytes_ = 0;
};

}  // namespace anchorage
