// Byte-level BPE tokenizer read from a Hugging Face tokenizer.json.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/status.h"

namespace anchorage {

// Immutable after Load/Parse; copies share the tables; every const method is thread-safe.
class Tokenizer {
 public:
  Tokenizer();  // empty: Encode fails, Decode returns "", vocab_size() is 0

  static Result<Tokenizer> Load(const std::string& tokenizer_json_path);
  // `source` names the file in errors.
  static Result<Tokenizer> Parse(const std::string& json_text, const std::string& source);

  // Added and special tokens that appear literally in text are matched first when parse_special.
  // Invalid UTF-8 is an error.
  // parse_special=false leaves special tokens as plain text; non-special added tokens (<think>,
  // <tool_call>, ...) are still matched, as in HF tokenizers and llama.cpp.
  Result<std::vector<int32_t>> Encode(std::string_view text, bool parse_special = true) const;
  // Unknown ids are skipped; byte runs that are not valid UTF-8 become U+FFFD.
  std::string Decode(const std::vector<int32_t>& ids, bool skip_special = false) const;

  int32_t vocab_size() const;  // highest id + 1
  // Looks up a token as tokenizer.json spells it (byte-level form, e.g. "Ġthe", or added content).
  std::optional<int32_t> TokenId(std::string_view token) const;
  bool IsSpecial(int32_t id) const;
  const std::string& sha256() const;  // of the tokenizer.json bytes

  // True for ids listed in added_tokens (special or not).
  bool IsAdded(int32_t id) const;
  // Raw bytes a regular token decodes to, or an added token's content; empty for unknown ids.
  std::string_view TokenBytes(int32_t id) const;

  struct Impl;

 private:
  std::shared_ptr<const Impl> impl_;
};

// Streams Decode: each Push returns only complete UTF-8 characters; never half a character.
// Shares the tokenizer's tables (no lifetime tie). Not thread-safe; one per stream.
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special = false);

  // Text completed by id; bytes of an unfinished character are held until a later Push or Flush.
  std::string Push(int32_t id);
  // Returns whatever is held (an unfinished character becomes U+FFFD) and resets.
  std::string Flush();

 private:
  Tokenizer tokenizer_;
  bool skip_special_;
  std::string pending_;  // bytes of an incomplete UTF-8 sequence
};

}  // namespace anchorage
