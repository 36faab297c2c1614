// The end anchor: the state at the last position a generation forwarded, and the end alignment that
// lets a client's re-rendered copy of the conversation resume there.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "engine/runtime/sequence_state.h"

namespace anchorage {

struct EndAnchor {
  Anchor anchor;             // recurrent part at anchor.length
  int64_t taint_row = 0;     // lowest row a decode wrote; rows from here are not a cold prefill's
};

// Aligns client_text (the client's copy) with rows_text (what the rows hold up to the end anchor).
// Runs of whitespace that touch a tag (<think>, </think>, <|im_end|>, ...) or the rows' end may differ; a <think>...</think> block of the rows may be left out by the copy,
// whole (the Qwen3.5 template drops earlier reasoning) or its inside only (an empty block rendered
// for a client that sent no reasoning). Every other byte must match. Returns the offset in
// client_text where the copy goes past the rows' end, or nullopt when they part.
std::optional<size_t> AlignCopyWithRows(std::string_view rows_text, std::string_view client_text);

}  // namespace anchorage
