// The lookup drafter: copies are common in agent traffic (files, tool output, code repeated), so
// the ids that followed the most recent earlier occurrence of the sequence's last few ids are a
// good guess of what comes next.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace anchorage {

// Up to max_draft ids that followed the newest earlier match of ids' last n ids, for n from
// max_ngram down to min_ngram; empty when none matches.
std::vector<int32_t> LookupDraft(std::span<const int32_t> ids, int max_draft, int min_ngram = 2, int max_ngram = 4);

}  // namespace anchorage
