// The disk caches' file format: a header (magic, version, kind, fingerprint, token count, and a table
// of sections with name, dtype, shape, offset, size and crc32c), then 4 KiB-aligned sections.
// Decoding checks everything before a byte is used; any mismatch is a Corrupt status naming it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/status.h"
#include "engine/model/model_config.h"

namespace anchorage {

inline constexpr char kCacheFileMagic[8] = {'A', 'N', 'C', 'H', 'C', 'A', 'C', 'H'};
inline constexpr uint32_t kCacheFileVersion = 1;
inline constexpr int64_t kCacheSectionAlign = 4096;

// kFp8Rows: the bytes of fp8 K/V rows as a state holds them (a row's codes, then its scales).
enum class SectionDType { kF32, kI32, kBf16, kFp8Rows };
const char* SectionDTypeName(SectionDType dtype);
// The section dtype of a state's K/V rows.
inline SectionDType KvSectionDType(KvDtype dtype) {
  return dtype == KvDtype::kBf16 ? SectionDType::kBf16 : dtype == KvDtype::kFp8 ? SectionDType::kFp8Rows : SectionDType::kF32;
}
// The last dimension of a K/V section of rows of width values: the values, or the bytes of fp8 rows.
inline int64_t KvSectionWidth(KvDtype dtype, int64_t width) { return dtype == KvDtype::kFp8 ? KvRowBytes(dtype, width) : width; }

struct SectionSpec {
  std::string name;
  SectionDType dtype = SectionDType::kF32;
  std::vector<int64_t> shape;
  std::string_view bytes;  // shape's element count times the dtype's size
};

struct CacheFileHeader {
  std::string kind;         // "chunk", "anchor", ...
  std::string fingerprint;  // the state fingerprint the rows were computed under
  int64_t tokens = 0;       // the prefix length the file ends at
  std::vector<std::string> links;  // names of other files this one needs (an anchor's chunks)
};

// The file as pieces to write in order (header, then each section and its padding); the views
// point into `storage` and into the sections' bytes, which must outlive the write.
struct EncodedCacheFile {
  std::vector<std::string> storage;
  std::vector<std::string_view> pieces;
  int64_t size = 0;
};
Result<EncodedCacheFile> EncodeCacheFile(const CacheFileHeader& header, const std::vector<SectionSpec>& sections);

struct DecodedSection {
  std::string name;
  SectionDType dtype;
  std::vector<int64_t> shape;
  std::string_view bytes;  // into DecodedCacheFile::data
};

struct DecodedCacheFile {
  CacheFileHeader header;
  std::shared_ptr<const std::string> data;  // the whole file (shared, so the views survive a move)
  std::vector<DecodedSection> sections;
  const DecodedSection* Find(std::string_view name) const;
};

// A section as the header describes it, not yet read or checked.
struct SectionLayout {
  std::string name;
  SectionDType dtype = SectionDType::kF32;
  std::vector<int64_t> shape;
  int64_t offset = 0, bytes = 0;
  uint32_t crc32c = 0;
};
struct CacheFileLayout {
  CacheFileHeader header;
  std::vector<SectionLayout> sections;
  const SectionLayout* Find(std::string_view name) const;
};
// The header and its section table from the file's first bytes: magic, version, header crc, kind,
// fingerprint, each size against its shape; the sections themselves are the caller's to read and check.
Result<CacheFileLayout> DecodeCacheFileHeader(std::string_view head, std::string_view expect_kind, std::string_view expect_fingerprint);

// The header alone from the file's first bytes (no section is read or checked): for sweeps.
Result<CacheFileHeader> PeekCacheFileHeader(std::string_view head);

// Parses and verifies a whole file: magic, version, header crc, kind and fingerprint as expected,
// every section inside the file, its size matching dtype and shape, and its crc32c.
Result<DecodedCacheFile> DecodeCacheFile(std::string data, std::string_view expect_kind, std::string_view expect_fingerprint);
// The same over bytes the caller keeps alive (data stays empty; the sections point into `data`).
Result<DecodedCacheFile> DecodeCacheFileView(std::string_view data, std::string_view expect_kind, std::string_view expect_fingerprint);

}  // namespace anchorage
