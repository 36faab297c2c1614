#include "engine/model/fingerprint.h"

#include <algorithm>
#include <filesystem>

#include "engine/core/file_util.h"
#include "engine/core/sha256.h"

namespace anchorage {

namespace {

constexpr size_t kWholeFileBytes = 64u << 20;
constexpr size_t kSampleBytes = 1u << 20;
constexpr size_t kInnerSamples = 16;

void HashSampled(Sha256& h, const MappedFile& map) {
  const size_t n = map.size();
  if (n <= kWholeFileBytes) {
    h.Update(map.data(), n);
    return;
  }
  h.Update(map.data(), kSampleBytes);
  for (size_t i = 1; i <= kInnerSamples; ++i) {
    size_t at = (n - kSampleBytes) / (kInnerSamples + 1) * i;
    h.Update(map.data() + at, kSampleBytes);
  }
  h.Update(map.data() + n - kSampleBytes, kSampleBytes);
}

}  // namespace

Result<std::string> ComputeModelFingerprint(const std::string& dir, const std::vector<std::string>& weight_files) {
  namespace fs = std::filesystem;
  Sha256 h;
  h.Update("anchorage-model-fingerprint-v1\n");
  std::vector<std::string> files = weight_files;
  std::sort(files.begin(), files.end());
  for (const std::string& f : files) {
    ASSIGN_OR_RETURN(MappedFile map, MappedFile::Open(f));
    std::string line = fs::path(f).filename().string() + " " + std::to_string(map.size()) + "\n";
    h.Update(line);
    HashSampled(h, map);
  }
  for (const char* name : {"config.json", "tokenizer.json"}) {
    const std::string path = (fs::path(dir) / name).string();
    if (!FileExists(path)) continue;
    ASSIGN_OR_RETURN(std::string text, ReadFile(path));
    h.Update(std::string(name) + " " + std::to_string(text.size()) + "\n");
    h.Update(text);
  }
  return h.FinishHex();
}

}  // namespace anchorage
