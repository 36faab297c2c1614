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

// How the generator stores the projection matrices: BF16, or FP8 as Hugging Face's FP8 checkpoints do
// (F8_E4M3 with an F32 *_scale_inv a 128 x 128 block; the embeddings, lm_head and vectors stay BF16).
// Its FP8 scales are powers of two, so each weight code x scale is also a BF16 value.
enum class GeneratedDtype { kBf16, kFp8 };
Result<GeneratedDtype> ParseGeneratedDtype(const std::string& name);  // "bf16", "fp8"
inline constexpr int64_t kGeneratedFp8Block = 128;

// Writes config.json, model.safetensors (BF16, A_log F32), tokenizer.json, tokenizer_config.json
// and chat_template.jinja into dir. The same size, seed and dtype always write the same bytes; the FP8
// variant holds the BF16 one's matrices quantized.
// tokenizer_of: whose tokenizer and vocabulary (default the size's own; the shadow's is the tiny one).
Status GenerateTinyModel(TinyModelSize size, uint64_t seed, const std::string& dir, std::optional<TinyModelSize> tokenizer_of = std::nullopt,
                         GeneratedDtype dtype = GeneratedDtype::kBf16);

}  // namespace anchorage
