#include "engine/text/unicode_text.h"

#include <algorithm>
#include <vector>

#include "engine/text/unicode_tables.h"

namespace anchorage::unicode {
namespace {

constexpr char32_t kHangulSBase = 0xAC00;
constexpr char32_t kHangulLBase = 0x1100;
constexpr char32_t kHangulVBase = 0x1161;
constexpr char32_t kHangulTBase = 0x11A7;
constexpr char32_t kHangulLCount = 19;
constexpr char32_t kHangulVCount = 21;
constexpr char32_t kHangulTCount = 28;
constexpr char32_t kHangulNCount = kHangulVCount * kHangulTCount;
constexpr char32_t kHangulSCount = kHangulLCount * kHangulNCount;

uint8_t LookupRange(const UnicodeRange* ranges, size_t count, char32_t cp) {
  size_t lo = 0;
  size_t hi = count;
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (ranges[mid].last < cp) {
      lo = mid + 1;
    } else if (ranges[mid].first > cp) {
      hi = mid;
    } else {
      return ranges[mid].value;
    }
  }
  return 0;
}

// Table of properties for ASCII, built from the generated ranges.
struct AsciiTable {
  uint8_t props[128];
  AsciiTable() {
    for (char32_t c = 0; c < 128; ++c) props[c] = LookupRange(kPropertyRanges, kPropertyRangeCount, c);
  }
};

const AsciiTable& Ascii() {
  static const AsciiTable table;
  return table;
}

const Decomposition* FindDecomposition(char32_t cp) {
  const Decomposition* end = kDecompositions + kDecompositionCount;
  const Decomposition* it = std::lower_bound(
      kDecompositions, end, cp, [](const Decomposition& d, char32_t c) { return d.code_point < c; });
  return (it != end && it->code_point == cp) ? it : nullptr;
}

void DecomposeInto(char32_t cp, std::vector<char32_t>* out) {
  if (cp >= kHangulSBase && cp < kHangulSBase + kHangulSCount) {
    const char32_t s = cp - kHangulSBase;
    out->push_back(kHangulLBase + s / kHangulNCount);
    out->push_back(kHangulVBase + (s % kHangulNCount) / kHangulTCount);
    if (s % kHangulTCount != 0) out->push_back(kHangulTBase + s % kHangulTCount);
    return;
  }
  const Decomposition* d = FindDecomposition(cp);
  if (d == nullptr) {
    out->push_back(cp);
    return;
  }
  DecomposeInto(d->first, out);
  if (d->second != 0) DecomposeInto(d->second, out);
}

// Returns the primary composite of a + b, or 0 when they do not compose.
char32_t Compose(char32_t a, char32_t b) {
  if (a >= kHangulLBase && a < kHangulLBase + kHangulLCount && b >= kHangulVBase &&
      b < kHangulVBase + kHangulVCount) {
    return kHangulSBase + ((a - kHangulLBase) * kHangulVCount + (b - kHangulVBase)) * kHangulTCount;
  }
  if (a >= kHangulSBase && a < kHangulSBase + kHangulSCount && (a - kHangulSBase) % kHangulTCount == 0 &&
      b > kHangulTBase && b < kHangulTBase + kHangulTCount) {
    return a + (b - kHangulTBase);
  }
  const Composition* end = kCompositions + kCompositionCount;
  const Composition* it = std::lower_bound(
      kCompositions, end, Composition{a, b, 0}, [](const Composition& x, const Composition& y) {
        return x.first != y.first ? x.first < y.first : x.second < y.second;
      });
  return (it != end && it->first == a && it->second == b) ? it->composite : 0;
}

}  // namespace

uint8_t Properties(char32_t code_point) {
  if (code_point < 128) return Ascii().props[code_point];
  return LookupRange(kPropertyRanges, kPropertyRangeCount, code_point);
}

uint8_t CombiningClass(char32_t code_point) {
  if (code_point < 0x300) return 0;
  return LookupRange(kCombiningClassRanges, kCombiningClassRangeCount, code_point);
}

int Utf8SequenceLength(uint8_t b) {
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return 2;
  if (b >= 0xE0 && b <= 0xEF) return 3;
  if (b >= 0xF0 && b <= 0xF4) return 4;
  return 0;
}

namespace {

// Length of the valid sequence at bytes[pos], or -(bytes of its maximal invalid subpart).
int ValidSequenceAt(std::string_view bytes, size_t pos) {
  const uint8_t b0 = static_cast<uint8_t>(bytes[pos]);
  const int len = Utf8SequenceLength(b0);
  if (len == 0) return -1;
  if (len == 1) return 1;
  uint8_t lo = 0x80;
  uint8_t hi = 0xBF;
  if (b0 == 0xE0) lo = 0xA0;
  if (b0 == 0xED) hi = 0x9F;
  if (b0 == 0xF0) lo = 0x90;
  if (b0 == 0xF4) hi = 0x8F;
  for (int i = 1; i < len; ++i) {
    if (pos + i >= bytes.size()) return -i;
    const uint8_t b = static_cast<uint8_t>(bytes[pos + i]);
    if (b < lo || b > hi) return -i;
    lo = 0x80;
    hi = 0xBF;
  }
  return len;
}

}  // namespace

size_t FindInvalidUtf8(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    if (static_cast<uint8_t>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const int n = ValidSequenceAt(text, pos);
    if (n < 0) return pos;
    pos += n;
  }
  return text.size();
}

char32_t DecodeUtf8(std::string_view text, size_t* pos) {
  const uint8_t b0 = static_cast<uint8_t>(text[*pos]);
  if (b0 < 0x80) {
    *pos += 1;
    return b0;
  }
  const int len = Utf8SequenceLength(b0);
  char32_t cp = b0 & (0x7F >> len);
  for (int i = 1; i < len; ++i) cp = (cp << 6) | (static_cast<uint8_t>(text[*pos + i]) & 0x3F);
  *pos += len;
  return cp;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t CompleteUtf8Prefix(std::string_view bytes) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    if (static_cast<uint8_t>(bytes[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const int n = ValidSequenceAt(bytes, pos);
    if (n < 0 && Utf8SequenceLength(static_cast<uint8_t>(bytes[pos])) > 1 &&
        pos + static_cast<size_t>(-n) == bytes.size()) {
      return pos;
    }
    pos += n > 0 ? n : -n;
  }
  return bytes.size();
}

std::string SanitizeUtf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    if (static_cast<uint8_t>(bytes[pos]) < 0x80) {
      out.push_back(bytes[pos++]);
      continue;
    }
    const int n = ValidSequenceAt(bytes, pos);
    if (n > 0) {
      out.append(bytes.substr(pos, n));
      pos += n;
    } else {
      out.append("\xEF\xBF\xBD");
      pos += -n;
    }
  }
  return out;
}

bool IsQuickNfc(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    const uint8_t b = static_cast<uint8_t>(text[pos]);
    if (b < 0x80) {
      ++pos;
      continue;
    }
    if (Properties(DecodeUtf8(text, &pos)) & kNfcCheck) return false;
  }
  return true;
}

std::string NormalizeNfc(std::string_view text) {
  if (IsQuickNfc(text)) return std::string(text);
  // Decompose fully.
  std::vector<char32_t> cps;
  cps.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) DecomposeInto(DecodeUtf8(text, &pos), &cps);
  // Canonical ordering: stable sort each run of non-starters by combining class.
  std::vector<uint8_t> ccc(cps.size());
  for (size_t i = 0; i < cps.size(); ++i) ccc[i] = CombiningClass(cps[i]);
  for (size_t i = 0; i < cps.size();) {
    if (ccc[i] == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < cps.size() && ccc[j] != 0) ++j;
    if (j - i > 1) {
      std::vector<std::pair<uint8_t, char32_t>> run;
      for (size_t k = i; k < j; ++k) run.emplace_back(ccc[k], cps[k]);
      std::stable_sort(run.begin(), run.end(),
                       [](const auto& x, const auto& y) { return x.first < y.first; });
      for (size_t k = i; k < j; ++k) {
        ccc[k] = run[k - i].first;
        cps[k] = run[k - i].second;
      }
    }
    i = j;
  }
  // Canonical composition.
  std::vector<char32_t> out;
  out.reserve(cps.size());
  std::ptrdiff_t starter = -1;
  uint8_t last_ccc = 0;
  for (size_t i = 0; i < cps.size(); ++i) {
    const char32_t c = cps[i];
    const uint8_t cc = ccc[i];
    if (starter >= 0) {
      const bool adjacent = static_cast<std::ptrdiff_t>(out.size()) - 1 == starter;
      if (adjacent || (last_ccc != 0 && last_ccc < cc)) {
        const char32_t composite = Compose(out[starter], c);
        if (composite != 0) {
          out[starter] = composite;
          continue;
        }
      }
    }
    if (cc == 0) {
      starter = static_cast<std::ptrdiff_t>(out.size());
      last_ccc = 0;
    } else {
      last_ccc = cc;
    }
    out.push_back(c);
  }
  std::string result;
  result.reserve(text.size());
  for (char32_t c : out) AppendUtf8(c, &result);
  return result;
}

}  // namespace anchorage::unicode
