// Helpers of the cache tests: deterministic token lists and list surgery, a tiny engine.
#pragma once

#include <QTemporaryDir>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/model/model.h"
#include "engine/model/tiny_model.h"
#include "engine/runtime/forward.h"
#include "engine/runtime/sampler.h"
#include "engine/text/tokenizer.h"

namespace anchorage::testing {

// n pseudo-random ids in [3, vocab - 13), the same for the same seed.
inline std::vector<int32_t> Tokens(uint64_t seed, size_t n, int32_t vocab) {
  std::vector<int32_t> out;
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    out.push_back(static_cast<int32_t>(s % static_cast<uint64_t>(vocab - 16)) + 3);
  }
  return out;
}

inline std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Greedy sampling of at most n tokens, with the top-2 logprobs the greedy gate reads.
inline SamplingParams Greedy(int64_t n) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = n;
  p.logprobs = 2;
  return p;
}

// Greedy sampling that picks exactly reply's ids (a scripted answer through the real forward), ending at <|im_end|>.
inline SamplingParams ForcedReply(const Tokenizer& tokenizer, const std::vector<int32_t>& reply) {
  SamplingParams p;
  p.temperature = 0;
  p.forced_ids = reply;
  p.max_tokens = static_cast<int64_t>(reply.size());
  p.stop_token_ids = {*tokenizer.TokenId("<|im_end|>")};
  return p;
}

// A generated tiny model, loaded, with a Forward on the given grid and its state fingerprint.
struct TinyEngine {
  QTemporaryDir dir;
  std::unique_ptr<Model> model;
  std::unique_ptr<Forward> forward;
  std::string fingerprint;

  bool Make(uint64_t seed, int64_t grid, int threads) {
    if (!dir.isValid() || !GenerateTinyModel(TinyModelSize::kTiny, seed, dir.path().toStdString()).ok()) return false;
    auto m = LoadModel(dir.path().toStdString());
    if (!m.ok()) return false;
    model = std::move(m).value();
    auto f = Forward::Create(model->config, model->weights, ForwardOptions{grid, threads});
    if (!f.ok()) return false;
    forward = std::move(f).value();
    fingerprint = Forward::StateFingerprint(model->fingerprint);
    return true;
  }
};

template <typename T>
bool SameBits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// A device copy holding nothing, for what a state tells its mirror (mirror_rows) without a GPU.
struct NullMirror final : StateMirror {
  const void* owner() const override { return this; }
  Status PullRecurrent(SequenceState&) override { return Status::Ok(); }
};

inline std::vector<int32_t> Head(const std::vector<int32_t>& a, size_t n) { return {a.begin(), a.begin() + static_cast<long>(n)}; }

// The greedy gate: "" when warm picks cold's tokens, or first parts from them where cold's top-2
// margin is under tie_margin (a near tie, then described in *note); else what differs.
inline std::string GreedyGate(const std::vector<SampledToken>& warm, const std::vector<SampledToken>& cold, float tie_margin,
                              std::string* note) {
  if (warm.size() != cold.size() && warm.size() < cold.size()) return "the warm run stopped early";
  for (size_t i = 0; i < cold.size(); ++i) {
    if (warm[i].id == cold[i].id) continue;
    const float margin = cold[i].top.size() >= 2 ? cold[i].top[0].second - cold[i].top[1].second : 0.0f;
    const std::string at = "tokens part at " + std::to_string(i) + " where the cold run's top-2 margin is " + std::to_string(margin);
    if (margin < tie_margin) {
      *note = at;
      return "";
    }
    return at;
  }
  return "";
}

}  // namespace anchorage::testing
