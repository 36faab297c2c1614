// What making the weights 8-bit at load costs: bytes, and the logits' distance from the stored weights'.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/model/model_config.h"
#include "engine/model/weights.h"
#include "engine/runtime/forward.h"

namespace anchorage {

struct WeightsReport {
  std::string format;            // WeightsDescription() of the quantized backend
  int64_t bytes = 0;             // its matrices in memory
  int64_t stored_bytes = 0;      // the same matrices as the checkpoint stores them, packed
  int64_t prompt_tokens = 0;     // rows compared
  double max_logit_error = 0.0;  // max |quantized - stored| over every row's logits
  double logit_rms = 0.0;        // the stored forward's logits' root mean square, for scale
  std::string Describe() const;
};

// The fixed prompt the report runs: ids spread over the vocabulary, the same for every run.
std::vector<int32_t> WeightsReportPromptIds(int64_t vocab_size, int64_t tokens = 64);

// Logits of every row of the fixed prompt on forward, from an empty state.
Result<std::vector<float>> WeightsReportLogits(ComputeBackend& forward, int64_t tokens = 64);

// The stored weights' side: their forward (options without int8_weights) built, run on the prompt and
// dropped, so a caller that builds the quantized forward after it never holds both.
struct WeightsBaseline {
  std::vector<float> logits;
  int64_t bytes = 0;
};
Result<WeightsBaseline> MeasureStoredWeights(const ModelConfig& config, const ModelWeights& weights, ForwardOptions options);
// quantized's logits on the same prompt against the baseline (the CPU's stored weights: on a GPU
// backend the distance holds the two backends' small difference too).
Result<WeightsReport> CompareWithStoredWeights(const WeightsBaseline& baseline, ComputeBackend& quantized);

}  // namespace anchorage
