#include "engine/cache/end_anchor.h"

#include <algorithm>
#include <array>

namespace anchorage {

namespace {

constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
constexpr std::array<std::string_view, 9> kTags = {"<think>", "</think>", "<|im_start|>", "<|im_end|>", "<tool_call>",
                                                   "</tool_call>", "<tool_response>", "</tool_response>", "<|endoftext|>"};

bool IsSpace(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

bool EndsWithTag(std::string_view s, size_t at) {
  return std::any_of(kTags.begin(), kTags.end(), [&](std::string_view t) { return at >= t.size() && s.compare(at - t.size(), t.size(), t) == 0; });
}

bool StartsWithTag(std::string_view s, size_t at) {
  return std::any_of(kTags.begin(), kTags.end(), [&](std::string_view t) { return s.compare(at, t.size(), t) == 0; });
}

class Aligner {
 public:
  Aligner(std::string_view rows, std::string_view client, const AlignOptions& options, bool reasoning_pass)
      : rows_(rows), client_(client), reasoning_pass_(reasoning_pass) {
    regions_ = options.regions;
    if (regions_.empty()) regions_.emplace_back(0, rows.size());
    for (auto& [b, e] : regions_) {
      boundaries_.push_back(b);
      boundaries_.push_back(e);
      // A region that starts inside a think block the prompt opened (the generation prompt's
      // "<think>\n") owns that block: its reasoning is the region's.
      size_t k = b;
      while (k > 0 && IsSpace(rows[k - 1])) --k;
      if (k >= kOpen.size() && rows.compare(k - kOpen.size(), kOpen.size(), kOpen) == 0) b = k - kOpen.size();
      // So does the empty block a prompt with thinking off closed ("<think>\n\n</think>\n\n").
      if (k >= kClose.size() && rows.compare(k - kClose.size(), kClose.size(), kClose) == 0) {
        size_t m = k - kClose.size();
        while (m > 0 && IsSpace(rows[m - 1])) --m;
        if (m >= kOpen.size() && rows.compare(m - kOpen.size(), kOpen.size(), kOpen) == 0) b = m - kOpen.size();
      }
    }
  }

  // With checkpoints, the first client offset at which i stood on each of them is kept in reached.
  std::optional<size_t> Run(const std::vector<size_t>* checkpoints = nullptr, std::vector<std::pair<size_t, size_t>>* reached = nullptr) {
    size_t i = 0, j = 0;
    size_t skips = 0, next = 0;
    auto note = [&] {
      if (checkpoints == nullptr) return;
      while (next < checkpoints->size() && (*checkpoints)[next] < i) ++next;  // stepped over (a left-out block)
      if (next < checkpoints->size() && (*checkpoints)[next] == i) reached->emplace_back((*checkpoints)[next++], j);
    };
    while (i < rows_.size()) {
      note();
      if (++skips > 4 * (rows_.size() + client_.size()) + 16) return std::nullopt;
      if (reasoning_pass_ && rows_.compare(i, kOpen.size(), kOpen) == 0 && client_.compare(j, kOpen.size(), kOpen) != 0) {
        // A region's think block that the copy does not open here was left out whole.
        if (auto block = BlockAt(i); block && block->open == i) {
          i = block->end;
          continue;
        }
      }
      if (j < client_.size() && rows_[i] == client_[j]) {
        ++i;
        ++j;
        continue;
      }
      if (const size_t cut = IncompleteCharEnd(i); cut != 0) {  // U+FFFD in the copy, or held back before a tag or the end
        size_t after = j;
        while (after < client_.size() && IsSpace(client_[after])) ++after;
        if (client_.compare(j, kReplacement.size(), kReplacement) == 0) {
          i = cut;
          j += kReplacement.size();
          continue;
        }
        if (after == client_.size() || StartsWithTag(client_, after)) {
          i = cut;
          continue;
        }
      }
      if (IsSpace(rows_[i]) && GlueRun(rows_, i, true)) {
        ++i;
        continue;
      }
      if (j < client_.size() && IsSpace(client_[j]) && (GlueRun(client_, j, false) || RowsRunTouchesBoundary(i))) {
        ++j;
        continue;
      }
      if (!reasoning_pass_) return std::nullopt;
      // The copy may leave out a region's reasoning: the block, or what is inside it.
      auto block = BlockAt(i);
      if (!block) return std::nullopt;
      if (i == block->open) i = block->end;
      else if (i < block->inside_end) i = block->inside_end;
      else return std::nullopt;  // inside the closing tag itself
    }
    note();
    return j;
  }

 private:
  struct Block {
    size_t open, inside_end, end;  // <think> at open; </think> (or the region's end) at inside_end
  };

  // The closed think block of a generation region around offset i. One cut at the region's end (by
  // max_tokens) does not count: rows holding an unclosed block inside an earlier turn are a context
  // no template renders, so a copy that left it out is not served them.
  std::optional<Block> BlockAt(size_t i) const {
    for (const auto& [b, e] : regions_) {
      if (i < b || i >= e) continue;
      const size_t open = rows_.rfind(kOpen, i);
      if (open == std::string_view::npos || open < b) return std::nullopt;
      const size_t close = rows_.find(kClose, open);
      if (close == std::string_view::npos || close + kClose.size() > e) return std::nullopt;
      if (i >= close + kClose.size()) return std::nullopt;
      return Block{open, close, close + kClose.size()};
    }
    return std::nullopt;
  }

  // When rows[i..] is an unfinished UTF-8 character (or its U+FFFD) that runs to a region's end, that end; else 0.
  size_t IncompleteCharEnd(size_t i) const {
    // Decoding may already have made the cut character U+FFFD.
    if (rows_.compare(i, kReplacement.size(), kReplacement) == 0)
      for (size_t boundary : boundaries_)
        if (boundary == i + kReplacement.size()) return boundary;
    const unsigned char lead = static_cast<unsigned char>(rows_[i]);
    const size_t want = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 0;
    if (want == 0) return 0;
    for (size_t boundary : boundaries_) {
      if (boundary <= i || boundary - i >= want) continue;
      bool continuation = true;
      for (size_t k = i + 1; k < boundary; ++k) continuation &= (static_cast<unsigned char>(rows_[k]) & 0xC0) == 0x80;
      if (continuation) return boundary;
    }
    return 0;
  }

  // Whether the whitespace run around s[k] may differ: it touches a tag, a region boundary (rows) or the end.
  bool GlueRun(std::string_view s, size_t k, bool is_rows) const {
    size_t before = k;
    while (before > 0 && IsSpace(s[before - 1])) --before;
    size_t after = k;
    while (after < s.size() && IsSpace(s[after])) ++after;
    if (after == s.size() || EndsWithTag(s, before) || StartsWithTag(s, after)) return true;
    if (!is_rows) return false;
    return std::any_of(boundaries_.begin(), boundaries_.end(), [&](size_t b) { return b >= before && b <= after; });
  }

  // Whether the (possibly empty) whitespace run of the rows around offset i touches a region boundary.
  bool RowsRunTouchesBoundary(size_t i) const {
    size_t before = i;
    while (before > 0 && IsSpace(rows_[before - 1])) --before;
    size_t after = i;
    while (after < rows_.size() && IsSpace(rows_[after])) ++after;
    return std::any_of(boundaries_.begin(), boundaries_.end(), [&](size_t b) { return b >= before && b <= after; });
  }

  std::string_view rows_;
  std::string_view client_;
  bool reasoning_pass_;
  std::vector<std::pair<size_t, size_t>> regions_;
  std::vector<size_t> boundaries_;
};

}  // namespace

std::optional<size_t> AlignCopyWithRows(std::string_view rows, std::string_view client, const AlignOptions& options) {
  if (auto first = Aligner(rows, client, options, false).Run()) return first;
  if (!options.reasoning_pass) return std::nullopt;
  return Aligner(rows, client, options, true).Run();
}

std::vector<std::pair<size_t, size_t>> AlignedCheckpoints(std::string_view rows, std::string_view client, const AlignOptions& options,
                                                          const std::vector<size_t>& checkpoints) {
  std::vector<std::pair<size_t, size_t>> plain, reasoning;
  Aligner(rows, client, options, false).Run(&checkpoints, &plain);
  if (!options.reasoning_pass) return plain;
  Aligner(rows, client, options, true).Run(&checkpoints, &reasoning);
  return reasoning.size() > plain.size() ? reasoning : plain;
}

}  // namespace anchorage
