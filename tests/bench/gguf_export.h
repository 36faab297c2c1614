// Writes a model folder's text model as a GGUF file of llama.cpp's `qwen35` architecture, so llama-server
// can serve the same weights beside Anchorage in a benchmark (shared/docs/qwen35-model.md §3.5): matrices
// stay BF16; norms (with their +1, but for ssm_norm), -exp(A_log), dt_bias and the conv taps are F32.
#pragma once

#include <string>

#include "engine/core/status.h"

namespace anchorage {

// visible_padding: the embedding's rows past the tokenizer become normal tokens "[PADn]" instead of unused
// ones, so a benchmark's stream shows every token llama.cpp samples there (Anchorage never samples them).
Status ExportGguf(const std::string& model_dir, const std::string& out_path, bool visible_padding = false);

}  // namespace anchorage
