#include "engine/cache/disk_tier.h"

#include <algorithm>

#include "engine/cache/disk_files.h"
#include "engine/core/file_util.h"

namespace anchorage {
namespace {

constexpr int64_t kHeaderPeekBytes = 64 << 10;

bool IsTierFile(const std::string& name) { return name.ends_with(".chunk") || name.ends_with(".anchor"); }

}  // namespace

DiskTier::DiskTier(DiskEnv& env, const ModelConfig& config, std::string fingerprint, DiskTierOptions options)
    : env_(env), config_(config), fingerprint_(std::move(fingerprint)), options_(std::move(options)) {}

Result<std::unique_ptr<DiskTier>> DiskTier::Open(DiskEnv& env, const ModelConfig& config, std::string fingerprint,
                                                 DiskTierOptions options) {
  if (options.line_tokens <= 0) return InvalidArgument("disk tier: line_tokens must be positive");
  RETURN_IF_ERROR(MakeDirectories(options.dir, 0700));
  std::unique_ptr<DiskTier> t(new DiskTier(env, config, std::move(fingerprint), std::move(options)));
  ASSIGN_OR_RETURN(t->stats_.swept_temporaries, SweepTemporaries(env, t->options_.dir));
  ASSIGN_OR_RETURN(std::vector<std::string> names, env.ListFiles(t->options_.dir));
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    if (!IsTierFile(name)) continue;
    ASSIGN_OR_RETURN(std::string head, env.ReadFilePrefix(t->PathOf(name), kHeaderPeekBytes));
    auto header = PeekCacheFileHeader(head);
    if (!header.ok() || header->fingerprint != t->fingerprint_) {
      RETURN_IF_ERROR(env.Remove(t->PathOf(name)));
      ++t->stats_.swept_foreign;
      continue;
    }
    ASSIGN_OR_RETURN(int64_t size, env.FileSize(t->PathOf(name)));
    t->files_[name] = Entry{size, 0};
  }
  for (const auto& [name, e] : t->files_) t->stats_.bytes += e.bytes;
  t->stats_.files = static_cast<int64_t>(t->files_.size());
  t->Evict();
  return t;
}

int64_t DiskTier::Find(std::span<const int32_t> prompt, int64_t max_length) const {
  const int64_t G = options_.line_tokens;
  const std::vector<std::string> hashes = PrefixHashes(prompt.subspan(0, std::min<size_t>(prompt.size(), static_cast<size_t>(std::max<int64_t>(max_length, 0)))), G);
  int64_t chunks_present = 0;  // lines [0, chunks_present) have their chunk on disk
  while (chunks_present < static_cast<int64_t>(hashes.size()) && files_.contains(ChunkFileName(hashes[chunks_present]))) ++chunks_present;
  for (int64_t line = chunks_present; line >= 1; --line)
    if (files_.contains(AnchorFileName(hashes[line - 1]))) return line * G;
  return 0;
}

Status DiskTier::WriteFile(const std::string& name, const std::vector<std::string_view>& pieces, int64_t size) {
  Status s = WriteFileCrashSafe(env_, PathOf(name), pieces);
  if (!s.ok()) {
    // An indexed name keeps its file (the old one or the new, both whole); a new name leaves none.
    if (!files_.contains(name)) (void)env_.Remove(PathOf(name));
    return s;
  }
  auto [it, added] = files_.try_emplace(name);
  if (!added) stats_.bytes -= it->second.bytes;
  it->second.bytes = size;
  stats_.bytes += size;
  stats_.bytes_written += size;
  Touch(name);
  stats_.files = static_cast<int64_t>(files_.size());
  return Status::Ok();
}

Status DiskTier::Put(std::span<const int32_t> prompt, const SequenceState& state) {
  const int64_t G = options_.line_tokens, length = state.length();
  if (length <= 0 || length % G != 0 || length > static_cast<int64_t>(prompt.size()))
    return InvalidArgument("disk tier: a state of " + std::to_string(length) + " rows is not on a line of " + std::to_string(G));
  const std::vector<std::string> hashes = PrefixHashes(prompt.subspan(0, static_cast<size_t>(length)), G);
  std::vector<std::string> chunk_names;
  for (size_t c = 0; c < hashes.size(); ++c) {
    chunk_names.push_back(ChunkFileName(hashes[c]));
    if (files_.contains(chunk_names.back())) {
      Touch(chunk_names.back());
      continue;
    }
    const int64_t begin = static_cast<int64_t>(c) * G;
    ASSIGN_OR_RETURN(KvRows rows, state.CopyRows(begin, begin + G));
    const ChunkFile chunk{std::vector<int32_t>(prompt.begin() + begin, prompt.begin() + begin + G), std::move(rows)};
    ASSIGN_OR_RETURN(EncodedCacheFile file, EncodeChunk(config_, fingerprint_, chunk));
    RETURN_IF_ERROR(WriteFile(chunk_names.back(), file.pieces, file.size));
    ++stats_.chunks_written;
  }
  const AnchorFile anchor{state.SaveAnchor(), chunk_names};
  ASSIGN_OR_RETURN(EncodedCacheFile file, EncodeAnchor(config_, fingerprint_, anchor));
  RETURN_IF_ERROR(WriteFile(AnchorFileName(hashes.back()), file.pieces, file.size));
  ++stats_.anchors_written;
  Evict();
  return Status::Ok();
}

Status DiskTier::Restore(std::span<const int32_t> prompt, int64_t line, SequenceState& state) {
  const int64_t G = options_.line_tokens;
  if (line <= 0 || line % G != 0 || line > static_cast<int64_t>(prompt.size()))
    return InvalidArgument("disk tier: no line at " + std::to_string(line));
  const std::vector<std::string> hashes = PrefixHashes(prompt.subspan(0, static_cast<size_t>(line)), G);
  const auto fail = [&](size_t first_bad_line, Status why) {
    DropFrom(hashes, first_bad_line);
    state.Reset();
    ++stats_.failed_restores;
    return why;
  };
  const std::string anchor_name = AnchorFileName(hashes.back());
  auto anchor_bytes = env_.ReadFile(PathOf(anchor_name));
  if (!anchor_bytes.ok()) return fail(hashes.size() - 1, anchor_bytes.status());
  auto anchor = DecodeAnchor(config_, fingerprint_, std::move(anchor_bytes).value());
  if (!anchor.ok()) return fail(hashes.size() - 1, Corrupt(anchor_name + ": " + anchor.status().message()));
  if (anchor->anchor.length != line || anchor->chunks.size() != hashes.size())
    return fail(hashes.size() - 1, Corrupt(anchor_name + ": names " + std::to_string(anchor->chunks.size()) + " chunks for line " + std::to_string(line)));
  state.Reset();
  RETURN_IF_ERROR(state.Reserve(line));
  for (size_t c = 0; c < hashes.size(); ++c) {
    const std::string name = ChunkFileName(hashes[c]);
    if (anchor->chunks[c] != name) return fail(c, Corrupt(anchor_name + ": chunk " + std::to_string(c) + " is not this prompt's"));
    auto bytes = env_.ReadFile(PathOf(name));
    if (!bytes.ok()) return fail(c, bytes.status());
    auto chunk = DecodeChunk(config_, fingerprint_, std::move(bytes).value());
    if (!chunk.ok()) return fail(c, Corrupt(name + ": " + chunk.status().message()));
    const int64_t begin = static_cast<int64_t>(c) * G;
    if (chunk->rows.begin != begin || chunk->rows.end != begin + G ||
        !std::equal(chunk->tokens.begin(), chunk->tokens.end(), prompt.begin() + begin))
      return fail(c, Corrupt(name + ": its token ids are not the prompt's"));
    if (Status s = state.WriteRows(chunk->rows); !s.ok()) return fail(c, s);
    Touch(name);
  }
  if (Status s = state.RestoreAnchor(anchor->anchor); !s.ok()) return fail(hashes.size() - 1, s);
  Touch(anchor_name);
  ++stats_.restores;
  return Status::Ok();
}

void DiskTier::Drop(const std::string& name) {
  (void)env_.Remove(PathOf(name));
  if (auto it = files_.find(name); it != files_.end()) {
    stats_.bytes -= it->second.bytes;
    files_.erase(it);
  }
  stats_.files = static_cast<int64_t>(files_.size());
}

void DiskTier::DropFrom(std::span<const std::string> hashes, size_t first_line) {
  for (size_t c = first_line; c < hashes.size(); ++c) {
    Drop(ChunkFileName(hashes[c]));
    Drop(AnchorFileName(hashes[c]));
  }
}

void DiskTier::Touch(const std::string& name) {
  if (auto it = files_.find(name); it != files_.end()) it->second.used = ++serial_;
}

void DiskTier::Evict() {
  while (stats_.bytes > options_.budget_bytes && !files_.empty()) {
    auto oldest = std::min_element(files_.begin(), files_.end(), [](const auto& a, const auto& b) { return a.second.used < b.second.used; });
    const std::string name = oldest->first;
    Drop(name);
    ++stats_.evicted_files;
  }
}

void DiskTier::set_budget_bytes(int64_t bytes) {
  options_.budget_bytes = bytes;
  Evict();
}

Status DiskTier::Clear() {
  while (!files_.empty()) Drop(files_.begin()->first);
  return Status::Ok();
}

}  // namespace anchorage
