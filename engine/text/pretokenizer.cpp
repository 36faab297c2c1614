#include "engine/text/pretokenizer.h"

#include <cstdint>

#include "engine/text/unicode_tables.h"
#include "engine/text/unicode_text.h"

namespace anchorage {

Result<SplitPattern> SplitPatternFromRegex(std::string_view regex) {
  if (regex == kQwen2SplitRegex) return SplitPattern::kQwen2;
  if (regex == kQwen35SplitRegex) return SplitPattern::kQwen35;
  if (regex == kGpt2SplitRegex) return SplitPattern::kGpt2;
  return InvalidArgument("unsupported Split pre-tokenizer pattern: " + std::string(regex) +
                         " (known: the Qwen2/Qwen3, Qwen3.5 and GPT-2 patterns)");
}

namespace {

// Text decoded once: code points, their property bits and byte offsets.
struct DecodedText {
  std::vector<char32_t> cps;
  std::vector<uint8_t> props;
  std::vector<size_t> offsets;  // byte offset of each code point, plus the text size at the end
};

DecodedText Decode(std::string_view text) {
  DecodedText d;
  d.cps.reserve(text.size());
  d.props.reserve(text.size());
  d.offsets.reserve(text.size() + 1);
  size_t pos = 0;
  while (pos < text.size()) {
    d.offsets.push_back(pos);
    const char32_t c = unicode::DecodeUtf8(text, &pos);
    d.cps.push_back(c);
    d.props.push_back(unicode::Properties(c));
  }
  d.offsets.push_back(text.size());
  return d;
}

char32_t AsciiLower(char32_t c) { return (c >= 'A' && c <= 'Z') ? c + ('a' - 'A') : c; }

bool IsCrLf(char32_t c) { return c == '\r' || c == '\n'; }

// The length of a whitespace run's match at i: \s+(?!\S), else \s+ (the run less its last
// character unless the run ends the text or is one character long).
size_t WhitespaceRun(const DecodedText& d, size_t i) {
  const size_t n = d.cps.size();
  size_t end = i;
  while (end < n && (d.props[end] & unicode::kWhiteSpace)) ++end;
  if (end == n || end - i == 1) return end - i;
  return end - 1 - i;
}

// GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
size_t MatchGpt2(const DecodedText& d, size_t i) {
  using namespace unicode;
  const size_t n = d.cps.size();
  const char32_t c = d.cps[i];
  if (c == '\'' && i + 1 < n) {
    const char32_t c1 = d.cps[i + 1];
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
    if (i + 2 < n) {
      const char32_t c2 = d.cps[i + 2];
      if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
    }
  }
  auto run = [&](auto in_class) -> size_t {
    size_t k = i;
    if (c == ' ' && k + 1 < n && in_class(k + 1)) ++k;
    if (!in_class(k)) return 0;
    while (k < n && in_class(k)) ++k;
    return k - i;
  };
  if (size_t m = run([&](size_t k) { return (d.props[k] & kLetter) != 0; })) return m;
  if (size_t m = run([&](size_t k) { return (d.props[k] & kNumber) != 0; })) return m;
  if (size_t m = run([&](size_t k) { return (d.props[k] & (kWhiteSpace | kLetter | kNumber)) == 0; })) return m;
  return WhitespaceRun(d, i);
}

// Length in code points of the match starting at i (always >= 1).
size_t MatchAt(const DecodedText& d, size_t i, SplitPattern pattern) {
  using namespace unicode;
  if (pattern == SplitPattern::kGpt2) return MatchGpt2(d, i);
  const size_t n = d.cps.size();
  const uint8_t word_bits = pattern == SplitPattern::kQwen35 ? (kLetter | kMark) : kLetter;
  const uint8_t non_punct_bits =
      kWhiteSpace | kLetter | kNumber | (pattern == SplitPattern::kQwen35 ? kMark : 0);
  auto is_word = [&](size_t k) { return (d.props[k] & word_bits) != 0; };
  auto is_punct = [&](size_t k) { return (d.props[k] & non_punct_bits) == 0; };
  auto is_space = [&](size_t k) { return (d.props[k] & kWhiteSpace) != 0; };
  const char32_t c = d.cps[i];

  // (?i:'s|'t|'re|'ve|'m|'ll|'d)
  if (c == '\'' && i + 1 < n) {
    const char32_t c1 = AsciiLower(d.cps[i + 1]);
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
    if (i + 2 < n) {
      const char32_t c2 = AsciiLower(d.cps[i + 2]);
      if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
    }
  }
  // [^\r\n\p{L}\p{N}]?\p{L}+  (Qwen3.5: [^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+)
  {
    size_t k = i;
    if (!is_word(k) && !IsCrLf(c) && (d.props[k] & (kLetter | kNumber)) == 0 && k + 1 < n && is_word(k + 1)) {
      ++k;
    }
    if (is_word(k)) {
      while (k < n && is_word(k)) ++k;
      return k - i;
    }
  }
  // \p{N}
  if (d.props[i] & kNumber) return 1;
  // ` ?[^\s\p{L}\p{N}]+[\r\n]*`  (Qwen3.5 also excludes \p{M})
  {
    size_t k = i;
    if (c == ' ' && k + 1 < n && is_punct(k + 1)) ++k;
    if (is_punct(k)) {
      while (k < n && is_punct(k)) ++k;
      while (k < n && IsCrLf(d.cps[k])) ++k;
      return k - i;
    }
  }
  if (is_space(i)) {
    size_t end = i;
    while (end < n && is_space(end)) ++end;
    // \s*[\r\n]+ : ends after the last \r or \n of the whitespace run.
    for (size_t k = end; k > i; --k) {
      if (IsCrLf(d.cps[k - 1])) return k - i;
    }
    // \s+(?!\S) : the whole run at the end of text, else the run less its last character.
    if (end == n) return end - i;
    if (end - i > 1) return end - 1 - i;
    // \s+
    return end - i;
  }
  return 1;  // unreachable: every code point is a letter, number, space or punctuation
}

}  // namespace

std::vector<PreTokenSpan> SplitPreTokens(std::string_view text, SplitPattern pattern) {
  std::vector<PreTokenSpan> spans;
  if (text.empty()) return spans;
  const DecodedText d = Decode(text);
  size_t i = 0;
  while (i < d.cps.size()) {
    const size_t len = MatchAt(d, i, pattern);
    spans.push_back({d.offsets[i], d.offsets[i + len]});
    i += len;
  }
  return spans;
}

}  // namespace anchorage
