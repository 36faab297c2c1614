// Generates a random Qwen3.5-structured model folder, deterministic from a seed.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "engine/core/status.h"
#include "engine/model/model_config.h"

namespace anchorage {

// kShadow is smaller than kTiny and shares its tokenizer: the shadow reader's model in tests.
enum class TinyModelSize { kTiny, kSmall, kShadow };

Result<TinyModelSize> ParseTinyModelSize(const std::string& name);
const char* TinyModelSizeName(TinyModelSize size);  // "tiny", "small", "shadow"

// The config a generated model of this size has (vocab_size filled from the tokenizer).
ModelConfig TinyModelConfig(TinyModelSize size, int64_t vocab_size);

// Writes config.json, model.safetensors (BF16, A_log F32), tokenizer.json, tokenizer_config.json
// and chat_template.jinja into dir. The same size and seed always write the same bytes.
// tokenizer_of: whose tokenizer and vocabulary (default the size's own; the shadow's is the tiny one).
Status GenerateTinyModel(TinyModelSize size, uint64_t seed, const std::string& dir, std::optional<TinyModelSize> tokenizer_of = std::nullopt);

}  // namespace anchorage
