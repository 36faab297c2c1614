// UTF-8 decoding, Unicode property lookup and NFC normalisation for the tokenizer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace anchorage::unicode {

// Property bits (kLetter | kMark | kNumber | kWhiteSpace | kNfcCheck) of one code point.
uint8_t Properties(char32_t code_point);

// Canonical combining class (0 for starters and unassigned code points).
uint8_t CombiningClass(char32_t code_point);

// Returns the byte offset of the first invalid UTF-8 sequence, or text.size() when valid.
// Overlong forms, surrogates and code points above U+10FFFF are invalid.
size_t FindInvalidUtf8(std::string_view text);

// Decodes the code point at text[*pos] and advances *pos; text must be valid UTF-8.
char32_t DecodeUtf8(std::string_view text, size_t* pos);

// Appends the UTF-8 encoding of code_point to out.
void AppendUtf8(char32_t code_point, std::string* out);

// Length of the UTF-8 sequence announced by lead byte b (1..4), or 0 for a non-lead byte.
int Utf8SequenceLength(uint8_t b);

// Length of bytes without a trailing sequence that is a valid but unfinished UTF-8 prefix.
size_t CompleteUtf8Prefix(std::string_view bytes);

// Replaces invalid UTF-8 with U+FFFD, one per maximal invalid subpart (WHATWG decoding).
std::string SanitizeUtf8(std::string_view bytes);

// Returns the NFC form of text; text must be valid UTF-8.
std::string NormalizeNfc(std::string_view text);

// True when NormalizeNfc(text) == text is guaranteed without computing it (quick check).
bool IsQuickNfc(std::string_view text);

}  // namespace anchorage::unicode
