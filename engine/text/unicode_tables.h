// Unicode property, combining-class and composition tables generated from the UCD.
#pragma once

#include <cstddef>
#include <cstdint>

namespace anchorage::unicode {

// Property bits stored in kPropertyRanges.
inline constexpr uint8_t kLetter = 1;      // General_Category L*
inline constexpr uint8_t kMark = 2;        // General_Category M*
inline constexpr uint8_t kNumber = 4;      // General_Category N*
inline constexpr uint8_t kWhiteSpace = 8;  // PropList White_Space (regex \s)
inline constexpr uint8_t kNfcCheck = 16;   // may change under NFC (decomposes, ccc != 0, composes)

// Inclusive code point range [first, last] with one value; tables are sorted and disjoint.
struct UnicodeRange {
  char32_t first;
  char32_t last;
  uint8_t value;
};

// Canonical decomposition of `code_point` into `first` and `second` (0 when a singleton).
struct Decomposition {
  char32_t code_point;
  char32_t first;
  char32_t second;
};

// Primary composite: `first` + `second` compose to `composite`; sorted by (first, second).
struct Composition {
  char32_t first;
  char32_t second;
  char32_t composite;
};

extern const UnicodeRange kPropertyRanges[];
extern const size_t kPropertyRangeCount;
extern const UnicodeRange kCombiningClassRanges[];
extern const size_t kCombiningClassRangeCount;
extern const Decomposition kDecompositions[];  // sorted by code_point
extern const size_t kDecompositionCount;
extern const Composition kCompositions[];
extern const size_t kCompositionCount;

}  // namespace anchorage::unicode
