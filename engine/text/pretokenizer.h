// Native split of text into pre-tokens with the Qwen2/Qwen3 and Qwen3.5 regexes (no regex engine).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/status.h"

namespace anchorage {

enum class SplitPattern {
  kQwen2,   // Qwen2/Qwen3: letters \p{L} only
  kQwen35,  // Qwen3.5: combining marks \p{M} join letters and leave punctuation runs
  kGpt2,    // GPT-2's, which a ByteLevel pre-tokenizer with use_regex applies
};

// The exact regex strings as they appear in tokenizer.json.
inline constexpr std::string_view kQwen2SplitRegex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view kQwen35SplitRegex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

inline constexpr std::string_view kGpt2SplitRegex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Recognises a Split pre-tokenizer regex by exact comparison; an unknown one is an error naming it.
Result<SplitPattern> SplitPatternFromRegex(std::string_view regex);

// Byte range [begin, end) of one pre-token within the split text.
struct PreTokenSpan {
  size_t begin;
  size_t end;
};

// Splits valid UTF-8 text into contiguous pre-tokens exactly as the regex (leftmost alternative,
// greedy, backtracking) with behaviour Isolated would; the spans cover the whole text in order.
std::vector<PreTokenSpan> SplitPreTokens(std::string_view text, SplitPattern pattern);

}  // namespace anchorage
