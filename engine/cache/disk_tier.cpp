#include "engine/cache/disk_tier.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <future>

#include "engine/cache/disk_files.h"
#include "engine/core/crc32c.h"
#include "engine/core/file_util.h"

namespace anchorage {
namespace {

constexpr int64_t kHeaderPeekBytes = 64 << 10;
constexpr int64_t kMsPerDay = 24ll * 3600 * 1000;
constexpr int64_t kWriterMs = 10 * 60 * 1000;  // a chunk this young without its anchor may be a write in progress

bool IsTierFile(const std::string& name) { return name.ends_with(".chunk") || name.ends_with(".anchor"); }

// The crc32c of the ranges' destinations, in order: one section read in pieces.
uint32_t Crc32cOfRanges(const std::vector<ReadRange>& ranges) {
  uint32_t crc = 0;
  for (const ReadRange& r : ranges) crc = Crc32c(r.dest, static_cast<size_t>(r.size), crc);
  return crc;
}

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

DiskTier::DiskTier(DiskEnv& env, const ModelConfig& config, std::string fingerprint, DiskTierOptions options)
    : env_(env), config_(config), fingerprint_(std::move(fingerprint)), options_(std::move(options)) {}

int64_t DiskTier::Now() const {
  if (options_.now_ms) return options_.now_ms();
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

Result<std::unique_ptr<DiskTier>> DiskTier::Open(DiskEnv& env, const ModelConfig& config, std::string fingerprint,
                                                 DiskTierOptions options) {
  if (options.line_tokens <= 0) return InvalidArgument("disk tier: line_tokens must be positive");
  RETURN_IF_ERROR(MakeDirectories(options.dir, 0700));
  std::unique_ptr<DiskTier> t(new DiskTier(env, config, std::move(fingerprint), std::move(options)));
  ASSIGN_OR_RETURN(t->stats_.swept_temporaries, SweepTemporaries(env, t->options_.dir));
  ASSIGN_OR_RETURN(std::vector<std::string> names, env.ListFiles(t->options_.dir));
  for (const std::string& name : names) {
    if (!IsTierFile(name)) continue;
    ASSIGN_OR_RETURN(std::string head, env.ReadFilePrefix(t->PathOf(name), kHeaderPeekBytes));
    auto header = PeekCacheFileHeader(head);
    const bool is_anchor = name.ends_with(".anchor");
    if (!header.ok()) {
      RETURN_IF_ERROR(env.Remove(t->PathOf(name)));
      ++t->stats_.swept_corrupt;
      t->corrupt_at_open_.push_back(name + ": " + header.status().message());
      continue;
    }
    if (header->fingerprint != t->fingerprint_ || header->kind != (is_anchor ? "anchor" : "chunk")) {
      RETURN_IF_ERROR(env.Remove(t->PathOf(name)));
      ++t->stats_.swept_foreign;
      continue;
    }
    ASSIGN_OR_RETURN(int64_t size, env.FileSize(t->PathOf(name)));
    const auto mtime = env.ModifiedTimeMs(t->PathOf(name));
    const int64_t used = mtime.ok() ? *mtime : t->Now();
    t->files_[name] = Entry{size, header->tokens, used, 0, is_anchor ? header->links : std::vector<std::string>{}, is_anchor};
  }
  std::lock_guard lock(t->mu_);
  t->RecountLocked();
  t->EvictLocked(t->options_.budget_bytes);
  return t;
}

void DiskTier::RecountLocked() {
  stats_.files = static_cast<int64_t>(files_.size());
  stats_.bytes = stats_.anchors = stats_.chunks = 0;
  for (const auto& [name, e] : files_) {
    stats_.bytes += e.bytes;
    ++(e.anchor ? stats_.anchors : stats_.chunks);
  }
}

int64_t DiskTier::Find(std::span<const int32_t> prompt, int64_t max_length) const {
  const int64_t G = options_.line_tokens;
  const std::vector<std::string> hashes = PrefixHashes(prompt.subspan(0, std::min<size_t>(prompt.size(), static_cast<size_t>(std::max<int64_t>(max_length, 0)))), G);
  std::lock_guard lock(mu_);
  int64_t chunks_present = 0;  // lines [0, chunks_present) have their chunk on disk
  while (chunks_present < static_cast<int64_t>(hashes.size()) && files_.contains(ChunkFileName(hashes[chunks_present]))) ++chunks_present;
  for (int64_t line = chunks_present; line >= 1; --line)
    if (files_.contains(AnchorFileName(hashes[line - 1]))) return line * G;
  return 0;
}

int64_t DiskTier::RestoreBytes(std::span<const int32_t> prompt, int64_t line, int64_t keep_rows) const {
  const int64_t G = options_.line_tokens;
  const std::vector<std::string> hashes = PrefixHashes(prompt.subspan(0, std::min<size_t>(prompt.size(), static_cast<size_t>(std::max<int64_t>(line, 0)))), G);
  std::lock_guard lock(mu_);
  int64_t bytes = 0;
  if (hashes.empty()) return 0;
  if (auto it = files_.find(AnchorFileName(hashes.back())); it != files_.end()) bytes += it->second.bytes;
  for (size_t c = static_cast<size_t>(keep_rows / G); c < hashes.size(); ++c)
    if (auto it = files_.find(ChunkFileName(hashes[c])); it != files_.end()) bytes += it->second.bytes;
  return bytes;
}

bool DiskTier::HasFile(const std::string& name) const {
  std::lock_guard lock(mu_);
  return files_.contains(name);
}

bool DiskTier::MakeRoomLocked(int64_t size) {
  int64_t limit = options_.budget_bytes - size;
  if (options_.min_free_bytes > 0)
    if (auto free = env_.FreeBytes(options_.dir); free.ok())  // unknown: the write itself will say
      if (const int64_t deficit = options_.min_free_bytes - (*free - size); deficit > 0) limit = std::min(limit, stats_.bytes - deficit);
  if (limit < 0) return false;
  EvictLocked(limit);
  return stats_.bytes <= limit;
}

Status DiskTier::WriteFile(const std::string& name, const std::vector<std::string_view>& pieces, int64_t size, Entry entry) {
  {
    std::lock_guard lock(mu_);
    if (!MakeRoomLocked(size)) {
      ++stats_.refused_writes;
      return ResourceExhausted("disk tier: no room for " + std::to_string(size) + " bytes under the budget of " +
                               std::to_string(options_.budget_bytes) + " bytes and the file system's " +
                               std::to_string(options_.min_free_bytes) + " bytes kept free");
    }
  }
  Status s = WriteFileCrashSafe(env_, PathOf(name), pieces);
  std::lock_guard lock(mu_);
  if (!s.ok()) {
    ++stats_.refused_writes;
    // An indexed name keeps its file (the old one or the new, both whole); a new name leaves none.
    if (!files_.contains(name)) (void)env_.Remove(PathOf(name));
    return s;
  }
  entry.bytes = size;
  entry.used_ms = Now();
  (void)env_.SetModifiedTimeMs(PathOf(name), entry.used_ms);  // the file's age across restarts
  files_[name] = std::move(entry);
  stats_.bytes_written += size;
  RecountLocked();
  return Status::Ok();
}

Status DiskTier::PutChunk(std::span<const int32_t> prompt, const KvRows& rows) {
  const int64_t G = options_.line_tokens;
  if (rows.end % G != 0 || rows.end - rows.begin != G || rows.end > static_cast<int64_t>(prompt.size()))
    return InvalidArgument("disk tier: rows [" + std::to_string(rows.begin) + ", " + std::to_string(rows.end) + ") are not one line of " + std::to_string(G));
  const std::string name = ChunkFileName(PrefixHashes(prompt.subspan(0, static_cast<size_t>(rows.end)), G).back());
  {
    std::lock_guard lock(mu_);
    if (files_.contains(name)) {
      TouchLocked(name);
      return Status::Ok();
    }
  }
  const ChunkFile chunk{std::vector<int32_t>(prompt.begin() + rows.begin, prompt.begin() + rows.end), rows};
  ASSIGN_OR_RETURN(EncodedCacheFile file, EncodeChunk(config_, fingerprint_, chunk));
  RETURN_IF_ERROR(WriteFile(name, file.pieces, file.size, Entry{0, rows.end, 0, 0, {}, false}));
  std::lock_guard lock(mu_);
  ++stats_.chunks_written;
  return Status::Ok();
}

Status DiskTier::PutAnchor(std::span<const int32_t> prompt, const Anchor& anchor) {
  const int64_t G = options_.line_tokens, length = anchor.length;
  if (length <= 0 || length % G != 0 || length > static_cast<int64_t>(prompt.size()))
    return InvalidArgument("disk tier: an anchor at " + std::to_string(length) + " is not on a line of " + std::to_string(G));
  const std::vector<std::string> hashes = PrefixHashes(prompt.subspan(0, static_cast<size_t>(length)), G);
  std::vector<std::string> chunk_names;
  for (const std::string& h : hashes) chunk_names.push_back(ChunkFileName(h));
  const std::string name = AnchorFileName(hashes.back());
  {
    std::lock_guard lock(mu_);
    for (const std::string& c : chunk_names)
      if (!files_.contains(c)) return NotFound("disk tier: the chunk " + c + " below the anchor at " + std::to_string(length) + " is not on disk");
    if (files_.contains(name)) {
      TouchLocked(name);
      return Status::Ok();
    }
  }
  const AnchorFile file_data{anchor, chunk_names};
  ASSIGN_OR_RETURN(EncodedCacheFile file, EncodeAnchor(config_, fingerprint_, file_data));
  RETURN_IF_ERROR(WriteFile(name, file.pieces, file.size, Entry{0, length, 0, 0, chunk_names, true}));
  std::lock_guard lock(mu_);
  ++stats_.anchors_written;
  EvictLocked(options_.budget_bytes);
  return Status::Ok();
}

Status DiskTier::Put(std::span<const int32_t> prompt, const SequenceState& state) {
  const int64_t G = options_.line_tokens, length = state.length();
  if (length <= 0 || length % G != 0 || length > static_cast<int64_t>(prompt.size()))
    return InvalidArgument("disk tier: a state of " + std::to_string(length) + " rows is not on a line of " + std::to_string(G));
  for (int64_t begin = 0; begin < length; begin += G) {
    ASSIGN_OR_RETURN(KvRows rows, state.CopyRows(begin, begin + G));
    RETURN_IF_ERROR(PutChunk(prompt, rows));
  }
  return PutAnchor(prompt, state.SaveAnchor());
}

Status DiskTier::Restore(std::span<const int32_t> prompt, int64_t line, SequenceState& state, int64_t keep_rows) {
  const int64_t G = options_.line_tokens;
  if (line <= 0 || line % G != 0 || line > static_cast<int64_t>(prompt.size()))
    return InvalidArgument("disk tier: no line at " + std::to_string(line));
  if (keep_rows < 0 || keep_rows % G != 0 || keep_rows > line || keep_rows > state.length())
    return InvalidArgument("disk tier: cannot keep " + std::to_string(keep_rows) + " rows of a state of " + std::to_string(state.length()));
  const auto start = std::chrono::steady_clock::now();
  const std::vector<std::string> hashes = PrefixHashes(prompt.subspan(0, static_cast<size_t>(line)), G);
  const auto fail = [&](size_t first_bad_line, Status why) {
    std::lock_guard lock(mu_);
    DropFromLocked(hashes, first_bad_line);
    state.Reset();
    ++stats_.failed_restores;
    return why;
  };
  const std::string anchor_name = AnchorFileName(hashes.back());
  int64_t bytes_read = 0;
  // The anchor's header first; its recurrent state then goes straight into the state, checked there.
  auto anchor_head = env_.ReadFilePrefix(PathOf(anchor_name), kHeaderPeekBytes);
  if (!anchor_head.ok()) return fail(hashes.size() - 1, anchor_head.status());
  auto anchor = DecodeCacheFileHeader(*anchor_head, "anchor", fingerprint_);
  if (!anchor.ok()) return fail(hashes.size() - 1, Corrupt(anchor_name + ": " + anchor.status().message()));
  const SectionLayout* recurrent = anchor->Find("state");
  if (recurrent == nullptr || recurrent->shape != std::vector<int64_t>{SequenceState::AnchorBytes(config_) / 4})
    return fail(hashes.size() - 1, Corrupt(anchor_name + ": not an anchor of this model's layout"));
  const std::vector<std::string>& chunk_names = anchor->header.links;
  if (anchor->header.tokens != line || chunk_names.size() != hashes.size())
    return fail(hashes.size() - 1, Corrupt(anchor_name + ": names " + std::to_string(chunk_names.size()) + " chunks for line " + std::to_string(line)));
  if (keep_rows == 0) state.SetLength(0);  // the recurrent part is overwritten below
  if (Status s = state.Reserve(line); !s.ok()) {
    state.Reset();
    return s;
  }
  // One read of the restore: the anchor's recurrent state, or one chunk's K/V rows, straight into
  // the state; their crc is the caller's to check, before the state is used.
  struct Read {
    Status status;
    std::vector<ReadRange> ranges;
    uint32_t crc = 0;
    int64_t bytes = 0;
  };
  auto read_anchor = [&] {
    Read out;
    int64_t offset = recurrent->offset;
    const int64_t state_bytes = state.recurrent_floats() * static_cast<int64_t>(sizeof(float));
    const int64_t tail_bytes = state.tail_floats() * static_cast<int64_t>(sizeof(float));
    for (int64_t g = 0; g < state.num_gdn_layers(); ++g) {
      out.ranges.push_back({offset, state_bytes, reinterpret_cast<char*>(state.recurrent_to_fill(g))});
      out.ranges.push_back({offset + state_bytes, tail_bytes, reinterpret_cast<char*>(state.conv_tail_to_fill(g))});
      offset += state_bytes + tail_bytes;
    }
    out.status = env_.ReadRanges(PathOf(anchor_name), out.ranges);
    out.crc = recurrent->crc32c;
    out.bytes = static_cast<int64_t>(anchor_head->size()) + recurrent->bytes;
    return out;
  };
  const int64_t layers = state.num_attention_layers(), width = state.kv_width(), row_bytes = state.kv_row_bytes();
  const SectionDType kv_dtype = KvSectionDType(state.kv_dtype());
  const int64_t block = G * row_bytes;  // one layer's K (or V) rows of a chunk
  // A chunk's header and token ids are read and checked before its rows are.
  auto read_chunk = [&](size_t c) {
    Read out;
    const std::string name = ChunkFileName(hashes[c]);
    const int64_t begin = static_cast<int64_t>(c) * G;
    auto bad = [&](std::string why) {
      out.status = Corrupt(name + ": " + why);
      return std::move(out);
    };
    if (chunk_names[c] != name) return bad("the anchor " + anchor_name + " names another chunk here");
    auto head = env_.ReadFilePrefix(PathOf(name), kHeaderPeekBytes);
    if (!head.ok()) {
      out.status = head.status();
      return out;
    }
    auto layout = DecodeCacheFileHeader(*head, "chunk", fingerprint_);
    if (!layout.ok()) return bad(layout.status().message());
    const SectionLayout* ids = layout->Find("tokens");
    const SectionLayout* kv = layout->Find("kv");
    if (ids == nullptr || kv == nullptr || layout->header.tokens != begin + G || ids->shape != std::vector<int64_t>{G} ||
        kv->dtype != kv_dtype || kv->shape != std::vector<int64_t>{layers, 2, G, KvSectionWidth(state.kv_dtype(), width)})
      return bad("not a chunk of this model's rows " + std::to_string(begin) + " to " + std::to_string(begin + G));
    if (ids->offset + ids->bytes > static_cast<int64_t>(head->size())) return bad("its token ids lie past the header's read (truncated?)");
    const std::string_view id_bytes = std::string_view(*head).substr(static_cast<size_t>(ids->offset), static_cast<size_t>(ids->bytes));
    if (Crc32c(id_bytes) != ids->crc32c) return bad("section tokens checksum mismatch");
    if (std::memcmp(id_bytes.data(), prompt.data() + begin, id_bytes.size()) != 0) return bad("its token ids are not the prompt's");
    out.ranges.resize(static_cast<size_t>(2 * layers));
    for (int64_t a = 0; a < layers; ++a) {
      out.ranges[static_cast<size_t>(2 * a)] = {kv->offset + 2 * a * block, block, reinterpret_cast<char*>(state.k_bytes_to_fill(a) + begin * row_bytes)};
      out.ranges[static_cast<size_t>(2 * a + 1)] = {kv->offset + (2 * a + 1) * block, block, reinterpret_cast<char*>(state.v_bytes_to_fill(a) + begin * row_bytes)};
    }
    out.status = env_.ReadRanges(PathOf(name), out.ranges);
    out.crc = kv->crc32c;
    out.bytes = static_cast<int64_t>(head->size()) + 2 * layers * block;
    return out;
  };
  // Read j is the anchor (j == 0) or chunk first + j - 1; a few run at once, each into its own part
  // of the state, so the drive always has the next one queued while the last one's crc is checked.
  const size_t first = static_cast<size_t>(keep_rows / G), reads = 1 + hashes.size() - first;
  constexpr size_t kReadsInFlight = 3;
  std::vector<std::future<Read>> pending(reads);
  auto launch = [&](size_t j) {
    if (j >= reads) return;
    pending[j] = j == 0 ? std::async(std::launch::async, read_anchor) : std::async(std::launch::async, read_chunk, first + j - 1);
  };
  state.PrepareHostWrites(true, keep_rows);  // the reads below write rows from keep_rows and the recurrent part from other threads
  for (size_t j = 0; j < kReadsInFlight; ++j) launch(j);
  for (size_t j = 0; j < reads; ++j) {
    Read done = pending[j].get();
    launch(j + kReadsInFlight);
    const std::string name = j == 0 ? anchor_name : ChunkFileName(hashes[first + j - 1]);
    Status checked = done.status;
    if (checked.ok() && Crc32cOfRanges(done.ranges) != done.crc)
      checked = Corrupt(name + (j == 0 ? ": section state checksum mismatch" : ": section kv checksum mismatch"));
    if (!checked.ok()) {
      for (auto& f : pending)
        if (f.valid()) f.wait();  // their reads into the state end before the state is reset
      return fail(j == 0 ? hashes.size() - 1 : first + j - 1, checked);
    }
    bytes_read += done.bytes;
  }
  state.SetLength(line);
  {
    std::lock_guard lock(mu_);
    for (const std::string& h : hashes) TouchLocked(ChunkFileName(h));
    TouchLocked(anchor_name);
    if (auto it = files_.find(anchor_name); it != files_.end()) ++it->second.hits;
    ++stats_.restores;
    stats_.bytes_read += bytes_read;
    stats_.read_seconds += SecondsSince(start);
  }
  return Status::Ok();
}

void DiskTier::DropLocked(const std::string& name) {
  (void)env_.Remove(PathOf(name));
  files_.erase(name);
  RecountLocked();
}

void DiskTier::DropFromLocked(std::span<const std::string> hashes, size_t first_line) {
  for (size_t c = first_line; c < hashes.size(); ++c) {
    DropLocked(ChunkFileName(hashes[c]));
    DropLocked(AnchorFileName(hashes[c]));
  }
}

void DiskTier::TouchLocked(const std::string& name) {
  auto it = files_.find(name);
  if (it == files_.end()) return;
  it->second.used_ms = Now();
  (void)env_.SetModifiedTimeMs(PathOf(name), it->second.used_ms);
}

double DiskTier::ValueLocked(const std::string&, const Entry& e, const std::map<std::string, int>& readers) const {
  double alone = static_cast<double>(e.bytes);
  for (const std::string& c : e.links)
    if (auto it = files_.find(c); it != files_.end()) alone += static_cast<double>(it->second.bytes) / std::max(1, readers.at(c));
  const double days = static_cast<double>(std::max<int64_t>(0, Now() - e.used_ms)) / kMsPerDay;
  return static_cast<double>(e.hits + 1) * static_cast<double>(e.tokens) / std::max(1.0, alone) * std::exp2(-days);
}

void DiskTier::EvictLocked(int64_t limit_bytes) {
  const int64_t now = Now();
  const int64_t bytes_before = stats_.bytes;
  auto readers_of = [&] {
    std::map<std::string, int> readers;
    for (const auto& [name, e] : files_)
      if (!e.anchor) readers[name];
    for (const auto& [name, e] : files_)
      for (const std::string& c : e.links)
        if (auto it = readers.find(c); it != readers.end()) ++it->second;
    return readers;
  };
  // Expired anchors go, then chunks no anchor reads that are as old.
  if (options_.ttl_days > 0) {
    const int64_t oldest = now - options_.ttl_days * kMsPerDay;
    std::vector<std::string> expired;
    for (const auto& [name, e] : files_)
      if (e.anchor && e.used_ms < oldest) expired.push_back(name);
    for (const std::string& name : expired) DropLocked(name);
    const auto readers = readers_of();
    for (const auto& [name, n] : readers)
      if (n == 0 && files_.at(name).used_ms < oldest) {
        DropLocked(name);
        expired.push_back(name);
      }
    stats_.expired_files += static_cast<int64_t>(expired.size());
  }
  while (stats_.bytes > limit_bytes && !files_.empty()) {
    const auto readers = readers_of();
    // Chunks no anchor reads go first, oldest first (a writer's young ones only when no anchor is left);
    // then the least valuable anchor and the chunks only it read.
    const bool anchors_left = stats_.anchors > 0;
    std::string victim;
    int64_t victim_used = INT64_MAX;
    for (const auto& [name, n] : readers) {
      const int64_t used = files_.at(name).used_ms;
      if (n == 0 && used < victim_used && (!anchors_left || now - used > kWriterMs)) {
        victim = name;
        victim_used = used;
      }
    }
    if (victim.empty()) {
      double least = 0;
      for (const auto& [name, e] : files_) {
        if (!e.anchor) continue;
        const double v = ValueLocked(name, e, readers);
        if (victim.empty() || v < least) {
          victim = name;
          least = v;
        }
      }
    }
    if (victim.empty()) break;
    const std::vector<std::string> links = files_.at(victim).links;
    DropLocked(victim);
    ++stats_.evicted_files;
    for (const std::string& c : links)
      if (readers.contains(c) && readers.at(c) == 1 && files_.contains(c)) {
        DropLocked(c);
        ++stats_.evicted_files;
      }
  }
  stats_.evicted_bytes += bytes_before - stats_.bytes;
}

void DiskTier::Evict() {
  std::lock_guard lock(mu_);
  EvictLocked(options_.budget_bytes);
}

void DiskTier::set_budget_bytes(int64_t bytes) {
  std::lock_guard lock(mu_);
  options_.budget_bytes = bytes;
  EvictLocked(options_.budget_bytes);
}

void DiskTier::set_limits(int64_t budget_bytes, int64_t ttl_days, int64_t min_free_bytes) {
  std::lock_guard lock(mu_);
  options_.budget_bytes = budget_bytes;
  options_.ttl_days = ttl_days;
  options_.min_free_bytes = min_free_bytes;
  EvictLocked(options_.budget_bytes);
}

Status DiskTier::Clear() {
  std::lock_guard lock(mu_);
  while (!files_.empty()) DropLocked(files_.begin()->first);
  return Status::Ok();
}

DiskTierStats DiskTier::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

DiskTierOptions DiskTier::options() const {
  std::lock_guard lock(mu_);
  return options_;
}

int64_t DiskTier::FreeBytes() const {
  auto free = env_.FreeBytes(options_.dir);
  return free.ok() ? *free : -1;
}

std::vector<DiskPrefix> DiskTier::TopPrefixes(size_t limit) const {
  std::lock_guard lock(mu_);
  std::vector<DiskPrefix> out;
  for (const auto& [name, e] : files_) {
    if (!e.anchor) continue;
    int64_t bytes = e.bytes;
    for (const std::string& c : e.links)
      if (auto it = files_.find(c); it != files_.end()) bytes += it->second.bytes;
    out.push_back({e.tokens, bytes, e.hits, e.used_ms});
  }
  std::sort(out.begin(), out.end(), [](const DiskPrefix& a, const DiskPrefix& b) {
    return a.hits != b.hits ? a.hits > b.hits : a.tokens > b.tokens;
  });
  if (out.size() > limit) out.resize(limit);
  return out;
}

}  // namespace anchorage
