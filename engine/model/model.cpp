#include "engine/model/model.h"

#include <filesystem>

#include "engine/core/file_util.h"
#include "engine/model/fingerprint.h"

namespace anchorage {

Result<std::unique_ptr<Model>> LoadModel(const std::string& dir, ModelParts parts) {
  namespace fs = std::filesystem;
  if (!IsDirectory(dir)) return NotFound("model folder " + dir + " does not exist or is not a folder");
  auto model = std::make_unique<Model>();
  model->dir = dir;
  ASSIGN_OR_RETURN(model->config, LoadModelConfig((fs::path(dir) / "config.json").string()));
  ASSIGN_OR_RETURN(SafetensorsSet set, SafetensorsSet::OpenDirectory(dir));
  model->tensors = std::make_unique<SafetensorsSet>(std::move(set));
  ASSIGN_OR_RETURN(model->weights, MapWeights(model->config, *model->tensors));
  if (parts == ModelParts::kWeightsOnly) return model;
  ASSIGN_OR_RETURN(model->tokenizer, Tokenizer::Load((fs::path(dir) / "tokenizer.json").string()));
  if (model->tokenizer.vocab_size() > model->config.vocab_size)
    return InvalidArgument(dir + ": tokenizer.json defines ids up to " + std::to_string(model->tokenizer.vocab_size() - 1) +
                           " but config.json's vocab_size is " + std::to_string(model->config.vocab_size));
  ASSIGN_OR_RETURN(model->chat_template, ChatTemplate::Load(dir));
  ASSIGN_OR_RETURN(model->fingerprint, ComputeModelFingerprint(dir, model->tensors->files()));
  return model;
}

Status CheckModelFolder(const std::string& dir) {
  ASSIGN_OR_RETURN(std::unique_ptr<Model> weights_only, LoadModel(dir, ModelParts::kWeightsOnly));
  const std::string tokenizer = dir + "/tokenizer.json";
  if (!std::filesystem::exists(tokenizer)) return NotFound(tokenizer + ": missing (the model's tokenizer)");
  return Status::Ok();
}

}  // namespace anchorage
