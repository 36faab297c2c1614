// Helpers for runtime tests: a generated model folder loaded without the tokenizer or template.
#pragma once

#include <memory>
#include <random>
#include <vector>
#include <string>

#include "engine/core/status.h"
#include "engine/model/model_config.h"
#include "engine/model/safetensors.h"
#include "engine/model/tiny_model.h"
#include "engine/model/weights.h"

namespace anchorage::testing {

struct LoadedWeights {
  ModelConfig config;
  std::unique_ptr<SafetensorsSet> set;
  ModelWeights weights;
};

// Maps the config and weights of the model folder dir.
inline Result<std::unique_ptr<LoadedWeights>> OpenModel(const std::string& dir) {
  auto out = std::make_unique<LoadedWeights>();
  ASSIGN_OR_RETURN(out->config, LoadModelConfig(dir + "/config.json"));
  ASSIGN_OR_RETURN(SafetensorsSet set, SafetensorsSet::OpenDirectory(dir));
  out->set = std::make_unique<SafetensorsSet>(std::move(set));
  ASSIGN_OR_RETURN(out->weights, MapWeights(out->config, *out->set));
  return out;
}

// Generates a model of `size` from `seed` into dir and maps its config and weights.
inline Result<std::unique_ptr<LoadedWeights>> MakeModel(TinyModelSize size, uint64_t seed, const std::string& dir,
                                                        GeneratedDtype dtype = GeneratedDtype::kBf16) {
  RETURN_IF_ERROR(GenerateTinyModel(size, seed, dir, std::nullopt, dtype));
  return OpenModel(dir);
}

// n ids drawn uniformly from [0, vocab), the same for the same seed.
inline std::vector<int32_t> RandomIds(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& id : ids) id = d(rng);
  return ids;
}

}  // namespace anchorage::testing
