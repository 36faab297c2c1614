#include "engine/runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>

namespace anchorage {

Sampler::Sampler(const SamplingParams& params, int64_t vocab_limit)
    : params_(params), vocab_limit_(vocab_limit), rng_state_(params.seed ^ 0x9e3779b97f4a7c15ull) {}

double Sampler::NextUniform() {
  // splitmix64
  uint64_t z = (rng_state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * (1.0 / 9007199254740992.0);
}

void Sampler::ApplyPenalties(const SamplingParams& p, std::span<const int32_t> history, std::span<float> logits) {
  if (history.empty()) return;
  if (p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f && p.repetition_penalty == 1.0f) return;
  std::unordered_map<int32_t, int> counts;
  for (int32_t id : history)
    if (id >= 0 && static_cast<size_t>(id) < logits.size()) ++counts[id];
  for (const auto& [id, count] : counts) {
    float& l = logits[static_cast<size_t>(id)];
    if (p.repetition_penalty != 1.0f) l = l > 0.0f ? l / p.repetition_penalty : l * p.repetition_penalty;
    l -= p.presence_penalty + p.frequency_penalty * static_cast<float>(count);
  }
}

SampledToken Sampler::Sample(std::span<const float> logits, std::span<const int32_t> history) {
  const int64_t n = std::min<int64_t>(vocab_limit_, static_cast<int64_t>(logits.size()));
  work_.assign(logits.begin(), logits.begin() + n);
  ApplyPenalties(params_, history, work_);
  for (const auto& [id, bias] : params_.logit_bias)
    if (id >= 0 && id < n) work_[static_cast<size_t>(id)] += bias;
  // Log-softmax at temperature 1 for the reported logprobs.
  int32_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (work_[i] > work_[best]) best = static_cast<int32_t>(i);
  const float mx = work_[best];
  double sum = 0.0;
  for (float v : work_) sum += std::exp(static_cast<double>(v - mx));
  const float log_z = mx + static_cast<float>(std::log(sum));
  auto logprob = [&](int32_t id) { return work_[static_cast<size_t>(id)] - log_z; };
  // Sorting by logit, ties to the lower id; only as much of the order as a knob needs.
  auto better = [&](int32_t x, int32_t y) { return work_[x] > work_[y] || (work_[x] == work_[y] && x < y); };
  order_.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order_[i] = static_cast<int32_t>(i);

  SampledToken out;
  if (params_.logprobs > 0) {
    const int64_t k = std::min<int64_t>(n, params_.logprobs);
    std::vector<int32_t> top(order_);
    std::partial_sort(top.begin(), top.begin() + k, top.end(), better);
    for (int64_t i = 0; i < k; ++i) out.top.emplace_back(top[i], logprob(top[i]));
  }
  if (history.size() < params_.forced_ids.size()) {  // forced picks: the i-th pick after i generated tokens
    out.id = params_.forced_ids[history.size()];
    out.logprob = out.id >= 0 && out.id < n ? logprob(out.id) : -std::numeric_limits<float>::infinity();
    return out;
  }
  if (params_.temperature <= 0.0f || params_.top_k == 1) {
    out.id = best;
    out.logprob = logprob(best);
    return out;
  }
  // Candidates: the top_k best (sorted), or every id (in id order, sorted later only if top_p needs it).
  int64_t keep = n;
  bool sorted = false;
  if (params_.top_k > 0 && params_.top_k < n) {
    keep = params_.top_k;
    std::partial_sort(order_.begin(), order_.begin() + keep, order_.end(), better);
    sorted = true;
  }
  const double inv_t = 1.0 / params_.temperature;
  std::vector<double> prob(static_cast<size_t>(keep));
  for (int64_t i = 0; i < keep; ++i) prob[i] = std::exp((static_cast<double>(work_[order_[i]]) - mx) * inv_t);
  if (params_.min_p > 0.0f) {  // the best candidate has prob 1 here
    int64_t w = 0;
    for (int64_t i = 0; i < keep; ++i)
      if (prob[i] >= params_.min_p) {
        order_[w] = order_[i];
        prob[w++] = prob[i];
      }
    keep = w;
  }
  if (params_.top_p < 1.0f) {
    double total = 0.0;
    for (int64_t i = 0; i < keep; ++i) total += prob[i];
    if (!sorted) {
      std::sort(order_.begin(), order_.begin() + keep, better);
      for (int64_t i = 0; i < keep; ++i) prob[i] = std::exp((static_cast<double>(work_[order_[i]]) - mx) * inv_t);
    }
    double cum = 0.0;
    int64_t k = 0;
    while (k < keep) {
      cum += prob[k] / total;
      ++k;
      if (cum >= params_.top_p) break;
    }
    keep = k;
  }
  double total = 0.0;
  for (int64_t i = 0; i < keep; ++i) total += prob[i];
  const double u = NextUniform() * total;
  double cum = 0.0;
  int64_t pick = keep - 1;
  for (int64_t i = 0; i < keep; ++i) {
    cum += prob[i];
    if (u < cum) {
      pick = i;
      break;
    }
  }
  out.id = order_[pick];
  out.logprob = logprob(out.id);
  return out;
}

}  // namespace anchorage
