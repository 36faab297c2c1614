#include "engine/text/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <queue>
#include <unordered_map>

#include "engine/core/file_util.h"
#include "engine/core/sha256.h"
#include "engine/text/pretokenizer.h"
#include "engine/text/unicode_tables.h"
#include "engine/text/unicode_text.h"

namespace anchorage {

namespace {

using Json = nlohmann::json;

constexpr int32_t kNoId = -1;

// One merge rule: (left, right) -> merged, applied in ascending rank.
struct MergeRule {
  int32_t rank;
  int32_t merged_id;
};

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// GPT-2 byte <-> printable code point mapping used by byte-level BPE.
struct ByteLevelMap {
  std::array<char32_t, 256> byte_to_cp;
  std::unordered_map<char32_t, uint8_t> cp_to_byte;
  ByteLevelMap() {
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      byte_to_cp[b] = printable ? static_cast<char32_t>(b) : next++;
      cp_to_byte[byte_to_cp[b]] = static_cast<uint8_t>(b);
    }
  }
};

const ByteLevelMap& ByteLevel() {
  static const ByteLevelMap map;
  return map;
}

// Converts a byte-level token string ("Ġthe") to raw bytes (" the"); false if not byte-level.
bool ByteLevelToBytes(std::string_view token, std::string* bytes) {
  bytes->clear();
  if (unicode::FindInvalidUtf8(token) != token.size()) return false;
  const ByteLevelMap& map = ByteLevel();
  size_t pos = 0;
  while (pos < token.size()) {
    const auto it = map.cp_to_byte.find(unicode::DecodeUtf8(token, &pos));
    if (it == map.cp_to_byte.end()) return false;
    bytes->push_back(static_cast<char>(it->second));
  }
  return true;
}

struct AddedToken {
  std::string content;
  int32_t id = kNoId;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
};

// A piece of input: either plain text or a matched added token.
struct Section {
  std::string_view text;
  int32_t added_index = -1;  // index into Impl::added, or -1 for text
};

size_t TrimEndWhitespace(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80) --start;
    size_t pos = start;
    if (!(unicode::Properties(unicode::DecodeUtf8(s, &pos)) & unicode::kWhiteSpace)) break;
    end = start;
  }
  return end;
}

size_t TrimStartWhitespace(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    size_t next = pos;
    if (!(unicode::Properties(unicode::DecodeUtf8(s, &next)) & unicode::kWhiteSpace)) break;
    pos = next;
  }
  return pos;
}

// Symbol of the BPE working list: a token id over a byte range, doubly linked.
struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
  int32_t length;  // 0 once merged into its left neighbour
};

struct Candidate {
  int32_t rank;
  int32_t left;  // index of the left symbol
  int32_t left_id;
  int32_t right_id;
  bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
};

}  // namespace

struct Tokenizer::Impl {
  std::string sha256;
  bool nfc = false;
  bool has_split = false;
  SplitPattern pattern = SplitPattern::kQwen2;
  bool ignore_merges = false;
  int32_t vocab_size = 0;
  std::vector<std::string> id_bytes;                     // raw bytes of regular tokens, content of added ones
  std::vector<uint8_t> id_kind;                          // 0 unused id, 1 regular, 2 added, 3 added special
  std::unordered_map<std::string, int32_t> token_to_id;  // as spelled in tokenizer.json
  std::unordered_map<std::string, int32_t> bytes_to_id;  // regular vocabulary by raw bytes
  std::array<int32_t, 256> byte_ids;
  std::unordered_map<uint64_t, MergeRule> merges;
  std::vector<AddedToken> added;
  // Candidate added tokens by first byte, longest first; raw and normalized matching stages.
  std::array<std::vector<int32_t>, 256> raw_by_first;
  std::array<std::vector<int32_t>, 256> normalized_by_first;

  void SplitAdded(std::string_view text, const std::array<std::vector<int32_t>, 256>& by_first,
                  bool parse_special, std::vector<Section>* out) const;
  void Bpe(std::string_view piece, std::vector<int32_t>* out) const;
  void EncodeText(std::string_view text, bool parse_special,
                  std::unordered_map<std::string, std::vector<int32_t>>* cache,
                  std::vector<int32_t>* out) const;
};

// Splits text at literal added tokens (leftmost, longest), applying lstrip/rstrip.
void Tokenizer::Impl::SplitAdded(std::string_view text, const std::array<std::vector<int32_t>, 256>& by_first,
                                 bool parse_special, std::vector<Section>* out) const {
  const size_t first_out = out->size();
  size_t start = 0;
  size_t i = 0;
  while (i < text.size()) {
    int32_t match = -1;
    for (int32_t index : by_first[static_cast<uint8_t>(text[i])]) {
      const AddedToken& t = added[index];
      if (t.special && !parse_special) continue;
      if (text.compare(i, t.content.size(), t.content) == 0) {
        match = index;
        break;
      }
    }
    if (match < 0) {
      ++i;
      continue;
    }
    if (i > start) out->push_back({text.substr(start, i - start), -1});
    out->push_back({text.substr(i, added[match].content.size()), match});
    i += added[match].content.size();
    start = i;
  }
  if (start < text.size()) out->push_back({text.substr(start), -1});
  for (size_t k = first_out; k < out->size(); ++k) {
    const Section s = (*out)[k];
    if (s.added_index < 0) continue;
    if (added[s.added_index].lstrip && k > first_out && (*out)[k - 1].added_index < 0) {
      std::string_view& prev = (*out)[k - 1].text;
      prev = prev.substr(0, TrimEndWhitespace(prev));
    }
    if (added[s.added_index].rstrip && k + 1 < out->size() && (*out)[k + 1].added_index < 0) {
      std::string_view& next = (*out)[k + 1].text;
      next = next.substr(TrimStartWhitespace(next));
    }
  }
}

// Byte-level BPE of one pre-token: lowest rank first, leftmost on ties.
void Tokenizer::Impl::Bpe(std::string_view piece, std::vector<int32_t>* out) const {
  std::vector<Symbol> symbols;
  symbols.reserve(piece.size());
  for (char ch : piece) {
    const int32_t id = byte_ids[static_cast<uint8_t>(ch)];
    if (id == kNoId) continue;  // no token for this byte and no unk token: dropped
    const int32_t index = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, index - 1, index + 1, 1});
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto push_pair = [&](int32_t left) {
    const int32_t right = symbols[left].next;
    if (right < 0) return;
    const auto it = merges.find(PairKey(symbols[left].id, symbols[right].id));
    if (it != merges.end()) queue.push({it->second.rank, left, symbols[left].id, symbols[right].id});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) push_pair(i);
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& left = symbols[c.left];
    if (left.length == 0 || left.id != c.left_id || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    if (right.id != c.right_id) continue;
    left.id = merges.at(PairKey(c.left_id, c.right_id)).merged_id;
    left.length += right.length;
    right.length = 0;
    left.next = right.next;
    if (left.next >= 0) symbols[left.next].prev = c.left;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(c.left);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) out->push_back(symbols[i].id);
}

void Tokenizer::Impl::EncodeText(std::string_view text, bool parse_special,
                                 std::unordered_map<std::string, std::vector<int32_t>>* cache,
                                 std::vector<int32_t>* out) const {
  std::string normalized;
  if (nfc) {
    normalized = unicode::NormalizeNfc(text);
    text = normalized;
  }
  std::vector<Section> sections;
  SplitAdded(text, normalized_by_first, parse_special, &sections);
  for (const Section& section : sections) {
    if (section.added_index >= 0) {
      out->push_back(added[section.added_index].id);
      continue;
    }
    std::vector<PreTokenSpan> spans;
    if (has_split) {
      spans = SplitPreTokens(section.text, pattern);
    } else if (!section.text.empty()) {
      spans.push_back({0, section.text.size()});
    }
    for (const PreTokenSpan& span : spans) {
      const std::string_view piece = section.text.substr(span.begin, span.end - span.begin);
      if (ignore_merges) {
        const auto it = bytes_to_id.find(std::string(piece));
        if (it != bytes_to_id.end()) {
          out->push_back(it->second);
          continue;
        }
      }
      std::string key(piece);
      const auto cached = cache->find(key);
      if (cached != cache->end()) {
        out->insert(out->end(), cached->second.begin(), cached->second.end());
        continue;
      }
      std::vector<int32_t> ids;
      Bpe(piece, &ids);
      out->insert(out->end(), ids.begin(), ids.end());
      cache->emplace(std::move(key), std::move(ids));
    }
  }
}

Tokenizer::Tokenizer() = default;

Result<Tokenizer> Tokenizer::Load(const std::string& tokenizer_json_path) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(tokenizer_json_path));
  return Parse(text, tokenizer_json_path);
}

namespace {

Status ParseNormalizer(const Json& j, const std::string& source, bool* nfc) {
  *nfc = false;
  if (j.is_null()) return Status::Ok();
  const std::string type = j.value("type", "");
  if (type == "NFC") {
    *nfc = true;
    return Status::Ok();
  }
  if (type == "Sequence") {
    for (const Json& n : j.at("normalizers")) {
      bool inner = false;
      RETURN_IF_ERROR(ParseNormalizer(n, source, &inner));
      *nfc = *nfc || inner;
    }
    return Status::Ok();
  }
  return Unsupported(source + ": unsupported normalizer type '" + type + "' (supported: NFC)");
}

// A ByteLevel pre-tokenizer with use_regex splits with GPT-2's pattern itself.
Status CheckByteLevel(const Json& j, const std::string& source, Tokenizer::Impl* impl) {
  if (j.value("add_prefix_space", false)) {
    return Unsupported(source + ": ByteLevel pre-tokenizer with add_prefix_space=true is not supported");
  }
  if (j.value("use_regex", true)) {
    if (impl->has_split)
      return Unsupported(source + ": a Split pre-tokenizer and a ByteLevel one with use_regex=true (two splits) are not supported");
    impl->pattern = SplitPattern::kGpt2;
    impl->has_split = true;
  }
  return Status::Ok();
}

Status ParsePreTokenizer(const Json& j, const std::string& source, Tokenizer::Impl* impl, bool* byte_level) {
  const std::string type = j.value("type", "");
  if (type == "Sequence") {
    for (const Json& p : j.at("pretokenizers"))
      RETURN_IF_ERROR(ParsePreTokenizer(p, source, impl, byte_level));
    return Status::Ok();
  }
  if (type == "ByteLevel") {
    RETURN_IF_ERROR(CheckByteLevel(j, source, impl));
    *byte_level = true;
    return Status::Ok();
  }
  if (type == "Split") {
    if (impl->has_split) return Unsupported(source + ": more than one Split pre-tokenizer");
    const Json& pattern = j.at("pattern");
    if (!pattern.contains("Regex"))
      return Unsupported(source + ": Split pre-tokenizer without a Regex pattern");
    const std::string behavior = j.value("behavior", "");
    if (behavior != "Isolated" || j.value("invert", false)) {
      return Unsupported(source + ": Split behavior '" + behavior + "' (invert " +
                         (j.value("invert", false) ? "true" : "false") + ") is not supported; need Isolated");
    }
    Result<SplitPattern> p = SplitPatternFromRegex(pattern.at("Regex").get<std::string>());
    if (!p.ok()) return InvalidArgument(source + ": " + p.status().message());
    impl->pattern = *p;
    impl->has_split = true;
    return Status::Ok();
  }
  return Unsupported(source + ": unsupported pre-tokenizer type '" + type + "'");
}

}  // namespace

Result<Tokenizer> Tokenizer::Parse(const std::string& json_text, const std::string& source) {
  auto impl = std::make_shared<Impl>();
  try {
    const Json root = Json::parse(json_text);
    impl->sha256 = Sha256::HexOf(json_text);
    RETURN_IF_ERROR(ParseNormalizer(root.value("normalizer", Json()), source, &impl->nfc));
    bool byte_level = false;
    if (root.contains("pre_tokenizer") && !root.at("pre_tokenizer").is_null()) {
      RETURN_IF_ERROR(ParsePreTokenizer(root.at("pre_tokenizer"), source, impl.get(), &byte_level));
    }
    if (!byte_level)
      return Unsupported(source + ": no ByteLevel pre-tokenizer; only byte-level BPE is supported");

    const Json& model = root.at("model");
    if (model.value("type", "BPE") != "BPE") {
      return Unsupported(source + ": model type '" + model.value("type", "") + "' is not BPE");
    }
    if (model.value("byte_fallback", false))
      return Unsupported(source + ": BPE byte_fallback is not supported");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      if (model.contains(key) && model.at(key).is_string() && !model.at(key).get<std::string>().empty()) {
        return Unsupported(source + ": BPE " + key + " is not supported");
      }
    }
    impl->ignore_merges = model.value("ignore_merges", false);

    // Regular vocabulary.
    const Json& vocab = model.at("vocab");
    int32_t max_id = -1;
    for (auto it = vocab.begin(); it != vocab.end(); ++it)
      max_id = std::max(max_id, it.value().get<int32_t>());
    for (const Json& t : root.value("added_tokens", Json::array()))
      max_id = std::max(max_id, t.at("id").get<int32_t>());
    impl->vocab_size = max_id + 1;
    impl->id_bytes.assign(impl->vocab_size, std::string());
    impl->id_kind.assign(impl->vocab_size, 0);
    impl->byte_ids.fill(kNoId);
    std::string bytes;
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      const int32_t id = it.value().get<int32_t>();
      if (id < 0)
        return Corrupt(source + ": vocab token '" + it.key() + "' has negative id " + std::to_string(id));
      if (!ByteLevelToBytes(it.key(), &bytes)) {
        return Corrupt(source + ": vocab token '" + it.key() + "' (id " + std::to_string(id) +
                       ") is not in the byte-level alphabet");
      }
      impl->id_bytes[id] = bytes;
      impl->id_kind[id] = 1;
      impl->token_to_id[it.key()] = id;
      impl->bytes_to_id[bytes] = id;
      if (bytes.size() == 1) impl->byte_ids[static_cast<uint8_t>(bytes[0])] = id;
    }

    // Merges: "a b" strings or ["a", "b"] arrays; rank is the position.
    const Json& merges = model.value("merges", Json::array());
    impl->merges.reserve(merges.size() * 2);
    int32_t rank = 0;
    for (const Json& m : merges) {
      std::string left;
      std::string right;
      if (m.is_string()) {
        const std::string s = m.get<std::string>();
        const size_t space = s.find(' ');
        if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
          return Corrupt(source + ": merge " + std::to_string(rank) + " '" + s +
                         "' is not two tokens separated by one space");
        }
        left = s.substr(0, space);
        right = s.substr(space + 1);
      } else if (m.is_array() && m.size() == 2) {
        left = m[0].get<std::string>();
        right = m[1].get<std::string>();
      } else {
        return Corrupt(source + ": merge " + std::to_string(rank) + " is neither a string nor a pair");
      }
      const auto l = impl->token_to_id.find(left);
      const auto r = impl->token_to_id.find(right);
      const auto merged = impl->token_to_id.find(left + right);
      if (l == impl->token_to_id.end() || r == impl->token_to_id.end() || merged == impl->token_to_id.end()) {
        return Corrupt(source + ": merge " + std::to_string(rank) + " ('" + left + "', '" + right +
                       "') uses or produces a token missing from the vocab");
      }
      impl->merges[PairKey(l->second, r->second)] = {rank, merged->second};
      ++rank;
    }

    // Added tokens.
    for (const Json& t : root.value("added_tokens", Json::array())) {
      AddedToken a;
      a.content = t.at("content").get<std::string>();
      a.id = t.at("id").get<int32_t>();
      a.special = t.value("special", false);
      a.lstrip = t.value("lstrip", false);
      a.rstrip = t.value("rstrip", false);
      a.normalized = t.value("normalized", !a.special);
      if (a.id < 0) return Corrupt(source + ": added token '" + a.content + "' has negative id");
      if (a.content.empty())
        return Corrupt(source + ": added token id " + std::to_string(a.id) + " is empty");
      if (unicode::FindInvalidUtf8(a.content) != a.content.size()) {
        return Corrupt(source + ": added token id " + std::to_string(a.id) + " is not valid UTF-8");
      }
      if (t.value("single_word", false)) {
        return Unsupported(source + ": added token '" + a.content +
                           "' sets single_word, which is not supported");
      }
      if (a.normalized && impl->nfc) a.content = unicode::NormalizeNfc(a.content);
      impl->id_bytes[a.id] = a.content;
      impl->id_kind[a.id] = a.special ? 3 : 2;
      impl->token_to_id[t.at("content").get<std::string>()] = a.id;
      const int32_t index = static_cast<int32_t>(impl->added.size());
      auto& table = a.normalized ? impl->normalized_by_first : impl->raw_by_first;
      table[static_cast<uint8_t>(a.content[0])].push_back(index);
      impl->added.push_back(std::move(a));
    }
    for (auto* table : {&impl->raw_by_first, &impl->normalized_by_first}) {
      for (auto& list : *table) {
        std::stable_sort(list.begin(), list.end(), [&](int32_t x, int32_t y) {
          return impl->added[x].content.size() > impl->added[y].content.size();
        });
      }
    }
  } catch (const Json::exception& e) {
    return Corrupt(source + ": invalid tokenizer.json: " + e.what());
  }
  Tokenizer tokenizer;
  tokenizer.impl_ = std::move(impl);
  return tokenizer;
}

Result<std::vector<int32_t>> Tokenizer::Encode(std::string_view text, bool parse_special) const {
  if (!impl_) return InvalidArgument("Tokenizer::Encode: no tokenizer loaded");
  const size_t bad = unicode::FindInvalidUtf8(text);
  if (bad != text.size()) {
    char hex[8];
    std::snprintf(hex, sizeof(hex), "0x%02X", static_cast<unsigned>(static_cast<uint8_t>(text[bad])));
    return InvalidArgument("Tokenizer::Encode: invalid UTF-8 at byte offset " + std::to_string(bad) +
                           " (byte " + hex + ")");
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  std::unordered_map<std::string, std::vector<int32_t>> cache;
  std::vector<Section> sections;
  impl_->SplitAdded(text, impl_->raw_by_first, parse_special, &sections);
  for (const Section& section : sections) {
    if (section.added_index >= 0) {
      ids.push_back(impl_->added[section.added_index].id);
    } else if (!section.text.empty()) {
      impl_->EncodeText(section.text, parse_special, &cache, &ids);
    }
  }
  return ids;
}

std::string Tokenizer::Decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string out;
  std::string run;  // bytes of consecutive regular tokens
  for (int32_t id : ids) {
    if (!impl_ || id < 0 || id >= impl_->vocab_size) continue;
    const uint8_t kind = impl_->id_kind[id];
    if (kind == 0 || (kind == 3 && skip_special)) continue;
    if (kind == 1) {
      run += impl_->id_bytes[id];
      continue;
    }
    out += unicode::SanitizeUtf8(run);
    run.clear();
    out += impl_->id_bytes[id];
  }
  out += unicode::SanitizeUtf8(run);
  return out;
}

int32_t Tokenizer::vocab_size() const { return impl_ ? impl_->vocab_size : 0; }

std::optional<int32_t> Tokenizer::TokenId(std::string_view token) const {
  if (!impl_) return std::nullopt;
  const auto it = impl_->token_to_id.find(std::string(token));
  if (it == impl_->token_to_id.end()) return std::nullopt;
  return it->second;
}

bool Tokenizer::IsSpecial(int32_t id) const {
  return impl_ && id >= 0 && id < impl_->vocab_size && impl_->id_kind[id] == 3;
}

bool Tokenizer::IsAdded(int32_t id) const {
  return impl_ && id >= 0 && id < impl_->vocab_size && impl_->id_kind[id] >= 2;
}

std::string_view Tokenizer::TokenBytes(int32_t id) const {
  if (!impl_ || id < 0 || id >= impl_->vocab_size) return {};
  return impl_->id_bytes[id];
}

const std::string& Tokenizer::sha256() const {
  static const std::string kEmpty;
  return impl_ ? impl_->sha256 : kEmpty;
}

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(tokenizer), skip_special_(skip_special) {}

std::string IncrementalDecoder::Push(int32_t id) {
  if (tokenizer_.vocab_size() <= id || id < 0) return {};
  if (tokenizer_.IsAdded(id)) {
    if (skip_special_ && tokenizer_.IsSpecial(id)) return {};
    std::string out = Flush();
    out += tokenizer_.TokenBytes(id);
    return out;
  }
  pending_ += tokenizer_.TokenBytes(id);
  // Emit everything up to a trailing sequence that is valid so far but unfinished.
  const size_t keep_from = unicode::CompleteUtf8Prefix(pending_);
  std::string out = unicode::SanitizeUtf8(std::string_view(pending_).substr(0, keep_from));
  pending_.erase(0, keep_from);
  return out;
}

std::string IncrementalDecoder::Flush() {
  std::string out = unicode::SanitizeUtf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace anchorage
