#include "engine/text/conversation_title.h"

#include <algorithm>
#include <vector>

#include "engine/text/unicode_text.h"

namespace anchorage {

std::string ConversationTitle(const Tokenizer& tokenizer, std::span<const int32_t> ids, size_t max_chars) {
  constexpr size_t kLookedAt = 2048;  // a title lies near the start; a long system prompt may come first
  const std::vector<int32_t> head(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(std::min(ids.size(), kLookedAt)));
  const std::string text = tokenizer.Decode(head);
  const std::string open = "<|im_start|>user\n";
  const size_t begin = text.find(open);
  if (begin == std::string::npos) return "";
  const size_t from = begin + open.size();
  const std::string message = text.substr(from, text.find("<|im_end|>", from) - from);
  std::string title;
  size_t chars = 0, pos = 0;
  const std::string_view valid(message.data(), unicode::FindInvalidUtf8(message));  // up to the first byte that is not UTF-8
  bool space = false;
  while (pos < valid.size() && chars < max_chars) {
    const size_t at = pos;
    const char32_t c = unicode::DecodeUtf8(valid, &pos);
    if (pos == at) break;
    if (c == U' ' || c == U'\n' || c == U'\t' || c == U'\r') {
      space = !title.empty();
      continue;
    }
    if (space) {
      if (chars + 1 >= max_chars) {  // the space and c would pass the limit: cut at the word's end
        pos = at;
        break;
      }
      title += ' ';
      ++chars;
      space = false;
    }
    unicode::AppendUtf8(c, &title);
    ++chars;
  }
  while (pos < valid.size() && (valid[pos] == ' ' || valid[pos] == '\n' || valid[pos] == '\t' || valid[pos] == '\r')) ++pos;
  if (pos < valid.size()) title += "…";
  return title;
}

}  // namespace anchorage
