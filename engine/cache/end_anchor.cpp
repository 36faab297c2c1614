#include "engine/cache/end_anchor.h"

#include <string>

namespace anchorage {

namespace {

constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";

bool IsSpace(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

// Whitespace at s[k] may differ when its run touches a tag: the run follows a '>' or precedes a '<' or the end.
bool RunTouchesTag(std::string_view s, size_t k) {
  size_t before = k;
  while (before > 0 && IsSpace(s[before - 1])) --before;
  size_t after = k;
  while (after < s.size() && IsSpace(s[after])) ++after;
  return (before > 0 && s[before - 1] == '>') || after == s.size() || s[after] == '<';
}

// The think block of rows_text around offset i: [open, close_end), with close the offset of </think>.
struct Block {
  size_t open, close, close_end;
};
std::optional<Block> BlockAround(std::string_view rows, size_t i) {
  size_t open = rows.rfind(kOpen, i);
  if (open == std::string_view::npos) return std::nullopt;
  size_t close = rows.find(kClose, open);
  if (close == std::string_view::npos) return std::nullopt;
  if (i >= close + kClose.size()) return std::nullopt;
  return Block{open, close, close + kClose.size()};
}

}  // namespace

std::optional<size_t> AlignCopyWithRows(std::string_view rows, std::string_view client) {
  size_t i = 0, j = 0;
  size_t skips = 0;
  while (i < rows.size()) {
    // A think block of the rows that the copy does not open at the same place was left out whole.
    if (rows.compare(i, kOpen.size(), kOpen) == 0 && client.compare(j, kOpen.size(), kOpen) != 0) {
      if (auto block = BlockAround(rows, i); block && block->open == i) {
        if (++skips > 4096) return std::nullopt;
        i = block->close_end;
        continue;
      }
    }
    if (j < client.size() && rows[i] == client[j]) {
      ++i;
      ++j;
      continue;
    }
    if (IsSpace(rows[i]) && RunTouchesTag(rows, i)) { ++i; continue; }
    if (j < client.size() && IsSpace(client[j]) && RunTouchesTag(client, j)) { ++j; continue; }
    // A real mismatch: the copy may leave out a think block, or the reasoning inside one.
    auto block = BlockAround(rows, i);
    if (!block || ++skips > 4096) return std::nullopt;
    if (i == block->open) i = block->close_end;
    else if (i < block->close) i = block->close;
    else return std::nullopt;  // inside the closing tag itself
  }
  return j;
}

}  // namespace anchorage
