// Splitting a list written as text ("a, b,c" or lines of a file), and whitespace at a text's ends.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace anchorage {

inline constexpr const char* kAsciiWhitespace = " \t\r\n";

// text without the spaces, tabs, carriage returns and newlines at its ends.
inline std::string_view TrimWhitespace(std::string_view text) {
  const size_t begin = text.find_first_not_of(kAsciiWhitespace);
  if (begin == std::string_view::npos) return {};
  return text.substr(begin, text.find_last_not_of(kAsciiWhitespace) - begin + 1);
}

// True when text holds nothing but spaces, tabs, carriage returns and newlines.
inline bool IsBlank(std::string_view text) { return text.find_first_not_of(kAsciiWhitespace) == std::string_view::npos; }

// The items of text between separators, spaces, tabs and carriage returns trimmed; empty items dropped.
inline std::vector<std::string> SplitList(std::string_view text, char separator) {
  std::vector<std::string> items;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(separator, start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view item = text.substr(start, end - start);
    start = end + 1;
    while (!item.empty() && (item.front() == ' ' || item.front() == '\t' || item.front() == '\r')) item.remove_prefix(1);
    while (!item.empty() && (item.back() == ' ' || item.back() == '\t' || item.back() == '\r')) item.remove_suffix(1);
    if (!item.empty()) items.emplace_back(item);
  }
  return items;
}

}  // namespace anchorage
