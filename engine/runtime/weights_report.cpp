#include "engine/runtime/weights_report.h"

#include <cmath>
#include <cstdio>

#include "engine/runtime/sequence_state.h"

namespace anchorage {

std::string WeightsReport::Describe() const {
  char text[320];
  std::snprintf(text, sizeof text,
                "weights %s: %.1f MiB (%.1f MiB as stored); logits on a fixed %lld-token prompt within %.4g of the stored "
                "weights' (max |difference|; their rms %.4g)",
                format.c_str(), static_cast<double>(bytes) / (1 << 20), static_cast<double>(stored_bytes) / (1 << 20),
                static_cast<long long>(prompt_tokens), max_logit_error, logit_rms);
  return text;
}

std::vector<int32_t> WeightsReportPromptIds(int64_t vocab_size, int64_t tokens) {
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < tokens; ++i) ids.push_back(static_cast<int32_t>((i * 7919 + 13) % vocab_size));
  return ids;
}

Result<std::vector<float>> WeightsReportLogits(ComputeBackend& forward, int64_t tokens) {
  SequenceState state(forward.config());
  const std::vector<int32_t> ids = WeightsReportPromptIds(forward.vocab_size(), tokens);
  return forward.Prefill(state, ids, LogitsRows::kAll);
}

Result<WeightsBaseline> MeasureStoredWeights(const ModelConfig& config, const ModelWeights& weights, ForwardOptions options) {
  options.int8_weights = false;
  options.on_layer = nullptr;
  ASSIGN_OR_RETURN(std::unique_ptr<Forward> forward, Forward::Create(config, weights, options));
  WeightsBaseline baseline;
  ASSIGN_OR_RETURN(baseline.logits, WeightsReportLogits(*forward));
  baseline.bytes = forward->weight_bytes();
  return baseline;
}

Result<WeightsReport> CompareWithStoredWeights(const WeightsBaseline& baseline, ComputeBackend& quantized) {
  WeightsReport report;
  ASSIGN_OR_RETURN(std::vector<float> logits, WeightsReportLogits(quantized));
  if (logits.size() != baseline.logits.size()) return InvalidArgument("the baseline is of another model");
  report.prompt_tokens = static_cast<int64_t>(logits.size()) / quantized.vocab_size();
  double squares = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const double stored = baseline.logits[i];
    report.max_logit_error = std::max(report.max_logit_error, std::fabs(static_cast<double>(logits[i]) - stored));
    squares += stored * stored;
  }
  report.logit_rms = std::sqrt(squares / static_cast<double>(logits.size()));
  report.format = quantized.WeightsDescription();
  report.bytes = quantized.WeightBytes();
  report.stored_bytes = baseline.bytes;
  return report;
}

}  // namespace anchorage
