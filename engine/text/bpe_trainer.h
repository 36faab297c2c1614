// Learns a small byte-level BPE vocabulary and writes it as a Hugging Face tokenizer.json.
#pragma once

#include <string>
#include <string_view>

namespace anchorage {

// Learns up to num_merges merges on corpus (NFC, then split with the Qwen3.5 pattern), taking
// at each step the most frequent adjacent pair that occurs at least twice, ties to the lowest
// (left id, right id). Returns tokenizer.json text: ids 0..255 are the bytes in byte order, then
// one id per new merged token, then the Qwen3.5-style added tokens. Same input, same bytes.
// Invalid UTF-8 in corpus is replaced with U+FFFD before training.
std::string BuildTinyTokenizerJson(std::string_view corpus, int num_merges);

}  // namespace anchorage
