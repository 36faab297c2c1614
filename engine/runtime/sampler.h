// Token sampling from fp32 logits: penalties, temperature, top-k, top-p, min-p, seeded RNG, logprobs.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace anchorage {

struct SamplingParams {
  float temperature = 1.0f;         // <= 0 means greedy (argmax, lowest id on ties)
  int top_k = 0;                    // keep the k most likely; 0 = all
  float top_p = 1.0f;               // keep the smallest set with cumulative probability >= top_p
  float min_p = 0.0f;               // drop tokens below min_p * p(most likely)
  uint64_t seed = 0;                // the RNG seed; the same seed and inputs give the same tokens
  float presence_penalty = 0.0f;    // subtracted once from tokens seen in the history
  float frequency_penalty = 0.0f;   // subtracted per occurrence in the history
  float repetition_penalty = 1.0f;  // seen tokens: positive logits divided, negative multiplied
  std::vector<std::pair<int32_t, float>> logit_bias;  // added to those ids' logits after the penalties
  std::vector<int32_t> stop_token_ids;
  std::vector<std::string> stop_strings;
  int64_t max_tokens = 256;
  int logprobs = 0;                 // alternatives reported per token (0 = logprob of the pick only)
  std::vector<int32_t> forced_ids;  // testing aid: the first picks are these ids, whatever the logits say

  bool operator==(const SamplingParams&) const = default;
};

struct SampledToken {
  int32_t id = -1;
  float logprob = 0.0f;                          // log-softmax of the penalised logits at temperature 1
  std::vector<std::pair<int32_t, float>> top;    // the `logprobs` best ids with their logprobs
};

class Sampler {
 public:
  // Ids at or above vocab_limit (padding rows of the vocabulary) are never sampled.
  Sampler(const SamplingParams& params, int64_t vocab_limit);

  // Picks the next token from logits fp32 [vocab] given the tokens generated so far.
  SampledToken Sample(std::span<const float> logits, std::span<const int32_t> history);

  // Applies the presence, frequency and repetition penalties of `history` to logits in place.
  static void ApplyPenalties(const SamplingParams& params, std::span<const int32_t> history, std::span<float> logits);

 private:
  double NextUniform();  // [0, 1)

  SamplingParams params_;
  int64_t vocab_limit_;
  uint64_t rng_state_;
  std::vector<float> work_;
  std::vector<int32_t> order_;
};

}  // namespace anchorage
