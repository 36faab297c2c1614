#include "engine/text/bpe_trainer.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <queue>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "engine/text/pretokenizer.h"
#include "engine/text/unicode_text.h"

namespace anchorage {
namespace {

using OrderedJson = nlohmann::ordered_json;

struct Word {
  std::vector<int32_t> symbols;
  int64_t count = 0;
};

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// Heap entry ordered by count (high first), then left id, then right id (low first).
struct PairEntry {
  int64_t count;
  int32_t left;
  int32_t right;
  bool operator<(const PairEntry& o) const {
    if (count != o.count) return count < o.count;
    return std::tie(left, right) > std::tie(o.left, o.right);
  }
};

// The printable code point that byte-level BPE uses for byte b (GPT-2 mapping).
std::string ByteLevelString(std::string_view bytes) {
  static const std::vector<char32_t> map = [] {
    std::vector<char32_t> m(256);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      m[b] = printable ? static_cast<char32_t>(b) : next++;
    }
    return m;
  }();
  std::string out;
  for (char c : bytes) unicode::AppendUtf8(map[static_cast<uint8_t>(c)], &out);
  return out;
}

OrderedJson ByteLevelConfig() {
  return OrderedJson{
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
}

}  // namespace

std::string BuildTinyTokenizerJson(std::string_view corpus, int num_merges) {
  const std::string text = unicode::NormalizeNfc(unicode::SanitizeUtf8(corpus));

  // Unique pre-tokens with their counts, in first-seen order.
  std::vector<Word> words;
  {
    std::unordered_map<std::string_view, size_t> index;
    for (const PreTokenSpan& span : SplitPreTokens(text, SplitPattern::kQwen35)) {
      const std::string_view piece = std::string_view(text).substr(span.begin, span.end - span.begin);
      auto [it, inserted] = index.emplace(piece, words.size());
      if (inserted) {
        Word w;
        for (char c : piece) w.symbols.push_back(static_cast<uint8_t>(c));
        words.push_back(std::move(w));
      }
      words[it->second].count += 1;
    }
  }

  std::vector<std::string> token_bytes(256);
  for (int b = 0; b < 256; ++b) token_bytes[b] = std::string(1, static_cast<char>(b));
  std::map<std::string, int32_t> id_of_bytes;
  for (int b = 0; b < 256; ++b) id_of_bytes[token_bytes[b]] = b;

  std::unordered_map<uint64_t, int64_t> pair_counts;
  std::unordered_map<uint64_t, std::vector<size_t>> pair_words;  // may list stale or repeated words
  std::priority_queue<PairEntry> heap;
  auto add_word_pairs = [&](size_t w, int64_t sign) {
    const Word& word = words[w];
    for (size_t i = 0; i + 1 < word.symbols.size(); ++i) {
      const uint64_t key = PairKey(word.symbols[i], word.symbols[i + 1]);
      int64_t& c = pair_counts[key];
      c += sign * word.count;
      if (sign > 0) {
        pair_words[key].push_back(w);
        heap.push({c, word.symbols[i], word.symbols[i + 1]});
      }
    }
  };
  for (size_t w = 0; w < words.size(); ++w) add_word_pairs(w, 1);

  std::vector<std::pair<int32_t, int32_t>> merges;
  while (static_cast<int>(merges.size()) < num_merges && !heap.empty()) {
    const PairEntry top = heap.top();
    heap.pop();
    const uint64_t key = PairKey(top.left, top.right);
    const auto current = pair_counts.find(key);
    if (current == pair_counts.end() || current->second != top.count) continue;  // stale entry
    if (top.count < 2) break;
    const std::string merged_bytes = token_bytes[top.left] + token_bytes[top.right];
    int32_t merged_id;
    const auto existing = id_of_bytes.find(merged_bytes);
    if (existing != id_of_bytes.end()) {
      merged_id = existing->second;
    } else {
      merged_id = static_cast<int32_t>(token_bytes.size());
      token_bytes.push_back(merged_bytes);
      id_of_bytes.emplace(merged_bytes, merged_id);
    }
    merges.emplace_back(top.left, top.right);
    std::vector<size_t> affected = std::move(pair_words[key]);
    pair_words.erase(key);
    std::sort(affected.begin(), affected.end());
    affected.erase(std::unique(affected.begin(), affected.end()), affected.end());
    for (size_t w : affected) {
      std::vector<int32_t>& s = words[w].symbols;
      bool has_pair = false;
      for (size_t i = 0; i + 1 < s.size() && !has_pair; ++i)
        has_pair = s[i] == top.left && s[i + 1] == top.right;
      if (!has_pair) continue;
      add_word_pairs(w, -1);
      std::vector<int32_t> next;
      next.reserve(s.size());
      for (size_t i = 0; i < s.size(); ++i) {
        if (i + 1 < s.size() && s[i] == top.left && s[i + 1] == top.right) {
          next.push_back(merged_id);
          ++i;
        } else {
          next.push_back(s[i]);
        }
      }
      s = std::move(next);
      add_word_pairs(w, 1);
    }
    pair_counts.erase(key);
  }

  OrderedJson vocab = OrderedJson::object();
  for (size_t id = 0; id < token_bytes.size(); ++id) vocab[ByteLevelString(token_bytes[id])] = id;
  OrderedJson merge_list = OrderedJson::array();
  for (const auto& [l, r] : merges) {
    merge_list.push_back(ByteLevelString(token_bytes[l]) + " " + ByteLevelString(token_bytes[r]));
  }

  struct AddedSpec {
    const char* content;
    bool special;
  };
  const AddedSpec kAdded[] = {
      {"<|endoftext|>", true},     {"<|im_start|>", true},    {"<|im_end|>", true},
      {"<tool_call>", false},      {"</tool_call>", false},   {"<tool_response>", false},
      {"</tool_response>", false}, {"<think>", false},        {"</think>", false},
      {"<|fim_prefix|>", false},   {"<|fim_middle|>", false}, {"<|fim_suffix|>", false},
      {"<|vision_start|>", true},  {"<|vision_end|>", true},  {"<|vision_pad|>", true},
      {"<|image_pad|>", true},     {"<|video_pad|>", true},
  };
  OrderedJson added = OrderedJson::array();
  int32_t next_id = static_cast<int32_t>(token_bytes.size());
  for (const AddedSpec& a : kAdded) {
    added.push_back(OrderedJson{{"id", next_id++},
                                {"content", a.content},
                                {"single_word", false},
                                {"lstrip", false},
                                {"rstrip", false},
                                {"normalized", false},
                                {"special", a.special}});
  }

  OrderedJson root;
  root["version"] = "1.0";
  root["truncation"] = nullptr;
  root["padding"] = nullptr;
  root["added_tokens"] = added;
  root["normalizer"] = OrderedJson{{"type", "NFC"}};
  root["pre_tokenizer"] = OrderedJson{
      {"type", "Sequence"},
      {"pretokenizers",
       OrderedJson::array({OrderedJson{{"type", "Split"},
                                       {"pattern", OrderedJson{{"Regex", std::string(kQwen35SplitRegex)}}},
                                       {"behavior", "Isolated"},
                                       {"invert", false}},
                           ByteLevelConfig()})}};
  root["post_processor"] = ByteLevelConfig();
  root["decoder"] = ByteLevelConfig();
  root["model"] = OrderedJson{{"type", "BPE"},
                              {"dropout", nullptr},
                              {"unk_token", nullptr},
                              {"continuing_subword_prefix", ""},
                              {"end_of_word_suffix", ""},
                              {"fuse_unk", false},
                              {"byte_fallback", false},
                              {"ignore_merges", false},
                              {"vocab", vocab},
                              {"merges", merge_list}};
  return root.dump(2) + "\n";
}

}  // namespace anchorage
