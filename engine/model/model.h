// A loaded model folder: config, mapped weights, tokenizer, chat template and fingerprint.
#pragma once

#include <memory>
#include <string>

#include "engine/core/status.h"
#include "engine/template/chat_template.h"
#include "engine/model/model_config.h"
#include "engine/model/safetensors.h"
#include "engine/text/tokenizer.h"
#include "engine/model/weights.h"

namespace anchorage {

struct Model {
  std::string dir;
  ModelConfig config;
  std::unique_ptr<SafetensorsSet> tensors;  // owns the maps ModelWeights points into
  ModelWeights weights;
  Tokenizer tokenizer;
  ChatTemplate chat_template;
  std::string fingerprint;        // hex sha256 over weights, config and tokenizer
  std::string state_fingerprint;  // the fingerprint and the kernels' arithmetic: what caches match (set by the service)
  std::string weights_format;     // how the engine holds the matrices, e.g. "fp8-e4m3 + bf16" (set by the service)
  bool generated = false;         // the random tiny model made when no folder was given (set by the service)
};

enum class ModelParts { kAll, kWeightsOnly };

// Loads dir (config.json, *.safetensors, tokenizer.json, the chat template); errors name the file.
// kWeightsOnly reads config.json and the weights alone (no tokenizer, template or fingerprint).
Result<std::unique_ptr<Model>> LoadModel(const std::string& dir, ModelParts parts = ModelParts::kAll);
// Whether dir is a model folder this engine can serve (config, every weight's shape, a tokenizer),
// without hashing its weights; the error names the file and what is wrong.
Status CheckModelFolder(const std::string& dir);

}  // namespace anchorage
