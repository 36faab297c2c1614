// The end anchor: the state at the last position a generation forwarded, and the end alignment that
// lets a client's re-rendered copy of the conversation resume there.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/runtime/sequence_state.h"

namespace anchorage {

// A span of rows a generation wrote: token positions [begin, end).
using TokenRegion = std::pair<int64_t, int64_t>;

struct EndAnchor {
  Anchor anchor;                     // recurrent part at anchor.length
  int64_t taint_row = 0;             // lowest row a decode wrote; rows from here are not a cold prefill's
  std::vector<TokenRegion> regions;  // the generation regions below anchor.length, ascending
};

struct AlignOptions {
  // Generation regions as byte offsets [begin, end) of rows_text; empty: the whole text is one.
  std::vector<std::pair<size_t, size_t>> regions;
  // Second pass: a region's reasoning (a <think> block, whole or its inside, closed or cut at the
  // region's end) may be left out by the copy.
  bool reasoning_pass = true;
};

// Aligns client_text (the client's copy) with rows_text (what the rows hold up to the end anchor).
// Runs of whitespace may differ only next to a template tag (<think>, </think>, <|im_end|>, ...),
// a region's boundary or the end; an incomplete UTF-8 character at a region's end may be missing
// from the copy or be U+FFFD there. Every other byte must match. Returns the offset in client_text
// where the copy goes past the rows' end, or nullopt when they part.
std::optional<size_t> AlignCopyWithRows(std::string_view rows_text, std::string_view client_text, const AlignOptions& options = {});

// The same rules, for a copy that parts from the rows before their end (an edited reply): of the rows'
// offsets in checkpoints (ascending), those the alignment stood on before the two parted, each with
// the client offset there. The second pass is used when options allow it and it reaches further.
std::vector<std::pair<size_t, size_t>> AlignedCheckpoints(std::string_view rows_text, std::string_view client_text,
                                                          const AlignOptions& options, const std::vector<size_t>& checkpoints);

}  // namespace anchorage
