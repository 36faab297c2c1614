#include "engine/cache/disk_format.h"

#include <cstring>

#include <nlohmann/json.hpp>

#include "engine/core/crc32c.h"

namespace anchorage {
namespace {

// Fixed prefix: magic, version, header JSON length, crc32c of everything before it and the JSON.
constexpr size_t kPrefixBytes = 8 + 4 + 4;

int64_t DTypeSize(SectionDType d) { return d == SectionDType::kBf16 ? 2 : d == SectionDType::kFp8Rows ? 1 : 4; }

int64_t Elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || (d > 0 && n > INT64_MAX / d)) return -1;
    n *= d;
  }
  return n;
}

int64_t AlignUp(int64_t v) { return (v + kCacheSectionAlign - 1) / kCacheSectionAlign * kCacheSectionAlign; }

void PutU32(std::string& out, uint32_t v) {
  char b[4];
  std::memcpy(b, &v, 4);
  out.append(b, 4);
}

uint32_t GetU32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

}  // namespace

const char* SectionDTypeName(SectionDType d) {
  switch (d) {
    case SectionDType::kF32: return "f32";
    case SectionDType::kI32: return "i32";
    case SectionDType::kBf16: return "bf16";
    case SectionDType::kFp8Rows: return "fp8-rows";
  }
  return "?";
}

const DecodedSection* DecodedCacheFile::Find(std::string_view name) const {
  for (const DecodedSection& s : sections)
    if (s.name == name) return &s;
  return nullptr;
}

Result<EncodedCacheFile> EncodeCacheFile(const CacheFileHeader& header, const std::vector<SectionSpec>& sections) {
  // Offsets depend on the header's own size: size it with placeholder offsets first, then for real.
  auto header_json = [&](int64_t first_offset) {
    nlohmann::json t = nlohmann::json::array();
    int64_t offset = first_offset;
    for (const SectionSpec& s : sections) {
      t.push_back({{"name", s.name}, {"dtype", SectionDTypeName(s.dtype)}, {"shape", s.shape}, {"offset", offset},
                   {"bytes", static_cast<int64_t>(s.bytes.size())}, {"crc32c", Crc32c(s.bytes)}});
      offset = AlignUp(offset + static_cast<int64_t>(s.bytes.size()));
    }
    return nlohmann::json{{"kind", header.kind}, {"fingerprint", header.fingerprint}, {"tokens", header.tokens},
                          {"links", header.links}, {"sections", t}}.dump();
  };
  for (const SectionSpec& s : sections) {
    const int64_t n = Elements(s.shape);
    if (n < 0 || n * DTypeSize(s.dtype) != static_cast<int64_t>(s.bytes.size()))
      return InvalidArgument("cache file section " + s.name + ": " + std::to_string(s.bytes.size()) +
                             " bytes do not match its shape");
  }
  std::string json = header_json(0);
  int64_t first = AlignUp(static_cast<int64_t>(kPrefixBytes + json.size() + 4));
  for (int round = 0; round < 4; ++round) {  // the offsets' digits can change the header's length
    json = header_json(first);
    const int64_t need = AlignUp(static_cast<int64_t>(kPrefixBytes + json.size() + 4));
    if (need == first) break;
    first = need;
  }
  EncodedCacheFile out;
  std::string head(kCacheFileMagic, sizeof(kCacheFileMagic));
  PutU32(head, kCacheFileVersion);
  PutU32(head, static_cast<uint32_t>(json.size()));
  head += json;
  PutU32(head, Crc32c(head));
  if (static_cast<int64_t>(head.size()) > first) return Internal("cache file header outgrew its offset");
  head.resize(static_cast<size_t>(first), '\0');
  out.storage.reserve(2);
  out.storage.push_back(std::move(head));
  out.storage.push_back(std::string(static_cast<size_t>(kCacheSectionAlign), '\0'));  // padding source
  out.pieces.push_back(out.storage[0]);
  out.size = first;
  for (const SectionSpec& s : sections) {
    out.pieces.push_back(s.bytes);
    const int64_t end = out.size + static_cast<int64_t>(s.bytes.size());
    const int64_t pad = AlignUp(end) - end;
    if (pad > 0) out.pieces.push_back(std::string_view(out.storage[1]).substr(0, static_cast<size_t>(pad)));
    out.size = end + pad;
  }
  return out;
}

Result<CacheFileHeader> PeekCacheFileHeader(std::string_view d) {
  if (d.size() < kPrefixBytes + 4 || std::memcmp(d.data(), kCacheFileMagic, sizeof(kCacheFileMagic)) != 0)
    return Corrupt("cache file: not an Anchorage cache file (magic)");
  const size_t json_size = GetU32(d.data() + 12);
  if (GetU32(d.data() + 8) != kCacheFileVersion || json_size > d.size() - kPrefixBytes - 4 ||
      Crc32c(d.data(), kPrefixBytes + json_size) != GetU32(d.data() + kPrefixBytes + json_size))
    return Corrupt("cache file: unreadable header");
  const nlohmann::json h = nlohmann::json::parse(d.substr(kPrefixBytes, json_size), nullptr, false);
  if (!h.is_object()) return Corrupt("cache file: malformed header");
  CacheFileHeader out;
  out.kind = h.value("kind", "");
  out.fingerprint = h.value("fingerprint", "");
  out.tokens = h.value("tokens", int64_t(0));
  if (h.contains("links") && h["links"].is_array())
    for (const nlohmann::json& l : h["links"])
      if (l.is_string()) out.links.push_back(l.get<std::string>());
  return out;
}

Result<DecodedCacheFile> DecodeCacheFile(std::string data, std::string_view expect_kind, std::string_view expect_fingerprint) {
  auto owned = std::make_shared<const std::string>(std::move(data));
  ASSIGN_OR_RETURN(DecodedCacheFile f, DecodeCacheFileView(*owned, expect_kind, expect_fingerprint));
  f.data = std::move(owned);
  return f;
}

Result<CacheFileLayout> DecodeCacheFileHeader(std::string_view d, std::string_view expect_kind, std::string_view expect_fingerprint) {
  CacheFileLayout f;
  if (d.size() < kPrefixBytes + 4) return Corrupt("cache file: " + std::to_string(d.size()) + " bytes, shorter than a header");
  if (std::memcmp(d.data(), kCacheFileMagic, sizeof(kCacheFileMagic)) != 0) return Corrupt("cache file: not an Anchorage cache file (magic)");
  if (const uint32_t v = GetU32(d.data() + 8); v != kCacheFileVersion)
    return Corrupt("cache file: format version " + std::to_string(v) + ", this build reads " + std::to_string(kCacheFileVersion));
  const size_t json_size = GetU32(d.data() + 12);
  if (json_size > d.size() - kPrefixBytes - 4) return Corrupt("cache file: the header runs past the end (truncated?)");
  if (Crc32c(d.data(), kPrefixBytes + json_size) != GetU32(d.data() + kPrefixBytes + json_size))
    return Corrupt("cache file: header checksum mismatch");
  const nlohmann::json h = nlohmann::json::parse(d.begin() + kPrefixBytes, d.begin() + static_cast<long>(kPrefixBytes + json_size), nullptr, false);
  if (!h.is_object() || !h.contains("sections") || !h["sections"].is_array()) return Corrupt("cache file: malformed header");
  try {
    f.header.kind = h.at("kind").get<std::string>();
    f.header.fingerprint = h.at("fingerprint").get<std::string>();
    f.header.tokens = h.at("tokens").get<int64_t>();
    f.header.links = h.at("links").get<std::vector<std::string>>();
    if (f.header.kind != expect_kind) return Corrupt("cache file: a " + f.header.kind + " file where a " + std::string(expect_kind) + " was expected");
    if (f.header.fingerprint != expect_fingerprint)
      return Corrupt("cache file: written under fingerprint " + f.header.fingerprint.substr(0, 12) + ", this engine's is " +
                     std::string(expect_fingerprint.substr(0, 12)));
    for (const nlohmann::json& s : h["sections"]) {
      SectionLayout sec;
      sec.name = s.at("name").get<std::string>();
      const std::string dtype = s.at("dtype").get<std::string>();
      if (dtype == "f32") sec.dtype = SectionDType::kF32;
      else if (dtype == "i32") sec.dtype = SectionDType::kI32;
      else if (dtype == "bf16") sec.dtype = SectionDType::kBf16;
      else if (dtype == "fp8-rows") sec.dtype = SectionDType::kFp8Rows;
      else return Corrupt("cache file: section " + sec.name + " has dtype " + dtype);
      sec.shape = s.at("shape").get<std::vector<int64_t>>();
      sec.offset = s.at("offset").get<int64_t>();
      sec.bytes = s.at("bytes").get<int64_t>();
      sec.crc32c = s.at("crc32c").get<uint32_t>();
      const int64_t elements = Elements(sec.shape);
      if (elements < 0 || elements * DTypeSize(sec.dtype) != sec.bytes) return Corrupt("cache file: section " + sec.name + " size does not match its shape");
      if (sec.offset < 0 || sec.bytes < 0) return Corrupt("cache file: section " + sec.name + " has a negative offset or size");
      f.sections.push_back(std::move(sec));
    }
  } catch (const nlohmann::json::exception& e) {
    return Corrupt(std::string("cache file: malformed header: ") + e.what());
  }
  return f;
}

const SectionLayout* CacheFileLayout::Find(std::string_view name) const {
  for (const SectionLayout& s : sections)
    if (s.name == name) return &s;
  return nullptr;
}

Result<DecodedCacheFile> DecodeCacheFileView(std::string_view d, std::string_view expect_kind, std::string_view expect_fingerprint) {
  ASSIGN_OR_RETURN(CacheFileLayout layout, DecodeCacheFileHeader(d, expect_kind, expect_fingerprint));
  DecodedCacheFile f;
  f.header = std::move(layout.header);
  for (SectionLayout& s : layout.sections) {
    if (s.offset > static_cast<int64_t>(d.size()) || s.bytes > static_cast<int64_t>(d.size()) - s.offset)
      return Corrupt("cache file: section " + s.name + " runs past the end of the file (truncated?)");
    const std::string_view bytes = d.substr(static_cast<size_t>(s.offset), static_cast<size_t>(s.bytes));
    if (Crc32c(bytes) != s.crc32c) return Corrupt("cache file: section " + s.name + " checksum mismatch");
    f.sections.push_back(DecodedSection{std::move(s.name), s.dtype, std::move(s.shape), bytes});
  }
  return f;
}

}  // namespace anchorage
