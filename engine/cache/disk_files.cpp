#include "engine/cache/disk_files.h"

#include <cstring>

#include "engine/core/sha256.h"

namespace anchorage {
namespace {

int64_t KvWidth(const ModelConfig& c) { return KvSectionWidth(c.kv_dtype, c.num_key_value_heads * c.head_dim); }


std::string_view BytesOf(const void* p, size_t bytes) { return {static_cast<const char*>(p), bytes}; }

template <typename T>
std::vector<T> Copy(std::string_view bytes) {
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

Result<const DecodedSection*> Section(const DecodedCacheFile& f, const char* name, SectionDType dtype,
                                      const std::vector<int64_t>& shape) {
  const DecodedSection* s = f.Find(name);
  if (s == nullptr) return Corrupt(std::string("cache file: no section ") + name);
  if (s->dtype != dtype || s->shape != shape) return Corrupt(std::string("cache file: section ") + name + " has another model's layout");
  return s;
}

}  // namespace

std::vector<std::string> PrefixHashes(std::span<const int32_t> tokens, int64_t line_tokens) {
  std::vector<std::string> out;
  std::string previous = "anchorage-prefix-v1";
  for (int64_t end = line_tokens; end <= static_cast<int64_t>(tokens.size()); end += line_tokens) {
    Sha256 h;
    h.Update(previous);
    h.Update(tokens.data() + (end - line_tokens), static_cast<size_t>(line_tokens) * sizeof(int32_t));
    previous = h.FinishHex().substr(0, 32);
    out.push_back(previous);
  }
  return out;
}

std::string ChunkFileName(const std::string& prefix_hash) { return prefix_hash + ".chunk"; }
std::string AnchorFileName(const std::string& prefix_hash) { return prefix_hash + ".anchor"; }

Result<EncodedCacheFile> EncodeChunk(const ModelConfig& c, const std::string& fingerprint, const ChunkFile& chunk) {
  const int64_t rows = chunk.rows.end - chunk.rows.begin;
  if (rows <= 0 || static_cast<int64_t>(chunk.tokens.size()) != rows)
    return InvalidArgument("chunk: " + std::to_string(chunk.tokens.size()) + " token ids for " + std::to_string(rows) + " rows");
  CacheFileHeader header{"chunk", fingerprint, chunk.rows.end, {}};
  const std::vector<SectionSpec> sections = {
      {"tokens", SectionDType::kI32, {rows}, BytesOf(chunk.tokens.data(), chunk.tokens.size() * 4)},
      {"kv", KvSectionDType(chunk.rows.dtype), {c.num_full_attention_layers(), 2, rows, KvWidth(c)},
       BytesOf(chunk.rows.data.data(), chunk.rows.data.size())}};
  return EncodeCacheFile(header, sections);
}

Result<EncodedCacheFile> EncodeAnchor(const ModelConfig& c, const std::string& fingerprint, const AnchorFile& a) {
  CacheFileHeader header{"anchor", fingerprint, a.anchor.length, a.chunks};
  const std::vector<SectionSpec> sections = {
      {"state", SectionDType::kF32, {static_cast<int64_t>(a.anchor.data.size())}, BytesOf(a.anchor.data.data(), a.anchor.data.size() * 4)}};
  return EncodeCacheFile(header, sections);
}

Result<ChunkFile> DecodeChunk(const ModelConfig& c, const std::string& fingerprint, std::string data) {
  ASSIGN_OR_RETURN(DecodedCacheFile f, DecodeCacheFile(std::move(data), "chunk", fingerprint));
  const DecodedSection* tokens = f.Find("tokens");
  if (tokens == nullptr || tokens->shape.size() != 1) return Corrupt("cache file: chunk without its token ids");
  const int64_t rows = tokens->shape[0];
  if (rows <= 0 || rows > f.header.tokens) return Corrupt("cache file: chunk of " + std::to_string(rows) + " rows ending at " + std::to_string(f.header.tokens));
  ASSIGN_OR_RETURN(const DecodedSection* ids, Section(f, "tokens", SectionDType::kI32, {rows}));
  ASSIGN_OR_RETURN(const DecodedSection* kv, Section(f, "kv", KvSectionDType(c.kv_dtype), {c.num_full_attention_layers(), 2, rows, KvWidth(c)}));
  ChunkFile out;
  out.tokens = Copy<int32_t>(ids->bytes);
  out.rows.begin = f.header.tokens - rows;
  out.rows.end = f.header.tokens;
  out.rows.dtype = c.kv_dtype;
  out.rows.data = Copy<uint8_t>(kv->bytes);
  return out;
}

Result<AnchorFile> DecodeAnchor(const ModelConfig& c, const std::string& fingerprint, std::string data) {
  ASSIGN_OR_RETURN(DecodedCacheFile f, DecodeCacheFile(std::move(data), "anchor", fingerprint));
  ASSIGN_OR_RETURN(const DecodedSection* state, Section(f, "state", SectionDType::kF32, {SequenceState::AnchorBytes(c) / 4}));
  AnchorFile out;
  out.anchor.length = f.header.tokens;
  out.anchor.data = Copy<float>(state->bytes);
  out.chunks = f.header.links;
  return out;
}

}  // namespace anchorage
