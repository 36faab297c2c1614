// A conversation's title for the operator's screens: the start of its first user message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "engine/text/tokenizer.h"

namespace anchorage {

// The first user message of a ChatML conversation (<|im_start|>user ... <|im_end|>) among its first
// tokens, white space collapsed, cut to max_chars characters with an ellipsis; "" when it has none.
std::string ConversationTitle(const Tokenizer& tokenizer, std::span<const int32_t> ids, size_t max_chars = 60);

}  // namespace anchorage
