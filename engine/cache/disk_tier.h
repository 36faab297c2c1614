// The disk tier's store: chunk and anchor files on the grid in one folder, indexed by their names
// and headers (the files are the index). It keeps and restores exact prefill states and evicts the
// least valuable; what to admit, when to write and where it sits among the RAM tiers is its
// callers' (engine/cache/disk_cache.h). Thread-safe: the index is locked, file I/O is not.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "engine/cache/disk_env.h"
#include "engine/model/model_config.h"
#include "engine/runtime/sequence_state.h"

namespace anchorage {

struct DiskTierOptions {
  std::string dir;
  int64_t line_tokens = 1024;             // the grid: chunks cover one line's rows, anchors sit on lines
  int64_t budget_bytes = 16ll << 30;
  int64_t ttl_days = 7;                   // an anchor unused this long goes; 0: kept until evicted
  int64_t min_free_bytes = 20ll << 30;    // the file system keeps this much free: writes evict, then stop
  std::function<int64_t()> now_ms;        // the wall clock (tests move it); empty: the system's
};

struct DiskTierStats {
  int64_t files = 0, bytes = 0, anchors = 0, chunks = 0;
  int64_t chunks_written = 0, anchors_written = 0, bytes_written = 0, refused_writes = 0;
  int64_t restores = 0, failed_restores = 0, evicted_files = 0, expired_files = 0, evicted_bytes = 0;
  int64_t bytes_read = 0;
  double read_seconds = 0;
  int64_t swept_temporaries = 0, swept_foreign = 0;  // at open: cut-short writes, other fingerprints
  int64_t swept_corrupt = 0;                          // at open: files whose header does not read
  double read_bytes_per_s() const { return read_seconds > 0 ? static_cast<double>(bytes_read) / read_seconds : 0.0; }
};

// One anchor as the console lists it: its prefix length, never its text.
struct DiskPrefix {
  int64_t tokens = 0, bytes = 0, hits = 0, last_used_ms = 0;
};

class DiskTier {
 public:
  // Opens (creating) the folder, mode 0700; removes .tmp files and files of another fingerprint.
  static Result<std::unique_ptr<DiskTier>> Open(DiskEnv& env, const ModelConfig& config, std::string fingerprint,
                                                DiskTierOptions options);

  // The longest line <= max_length of this prompt with an anchor and every chunk below it on disk; 0 if none.
  int64_t Find(std::span<const int32_t> prompt, int64_t max_length) const;
  // The bytes a restore of line reads when rows below keep_rows are in place already.
  int64_t RestoreBytes(std::span<const int32_t> prompt, int64_t line, int64_t keep_rows) const;
  bool HasFile(const std::string& name) const;
  // The files Open removed because their header did not read, each as "NAME: why".
  const std::vector<std::string>& corrupt_at_open() const { return corrupt_at_open_; }

  // Writes one chunk (rows.begin, rows.end on a line; the prompt's ids there) unless it is on disk.
  Status PutChunk(std::span<const int32_t> prompt, const KvRows& rows);
  // Writes the anchor at anchor.length, naming the chunks below it, which must be on disk already.
  Status PutAnchor(std::span<const int32_t> prompt, const Anchor& anchor);
  // Both: what the tier lacks of state's rows [0, length) and its anchor; length = state.length()
  // must be a line, and the state a cold prefill's of prompt[0, length).
  Status Put(std::span<const int32_t> prompt, const SequenceState& state);

  // Loads the anchor at `line` and the rows [keep_rows, line) into state; rows below keep_rows (a
  // line) must be this prompt's already. Every chunk's token ids are compared with the prompt and
  // every section's crc checked before its rows are written; a file that fails is deleted with
  // every longer line's files of this prompt, state is reset (rows below keep_rows stay), and the
  // status says why.
  Status Restore(std::span<const int32_t> prompt, int64_t line, SequenceState& state, int64_t keep_rows = 0);
  Status Clear();

  DiskTierStats stats() const;
  DiskTierOptions options() const;
  // The anchors, most hit first (ties: longest first), at most `limit`.
  std::vector<DiskPrefix> TopPrefixes(size_t limit) const;
  void set_budget_bytes(int64_t bytes);
  void set_limits(int64_t budget_bytes, int64_t ttl_days, int64_t min_free_bytes);
  // Free bytes of the file system the folder is on (-1 when unknown).
  int64_t FreeBytes() const;
  // Expired anchors and chunks no anchor reads go; then the least valuable until under the budget.
  void Evict();

 private:
  struct Entry {
    int64_t bytes = 0;
    int64_t tokens = 0;               // where the file's prefix ends
    int64_t used_ms = 0;              // last write or read (the file's mtime across restarts)
    int64_t hits = 0;                 // restores that read it, this process
    std::vector<std::string> links;   // an anchor's chunks
    bool anchor = false;
  };
  DiskTier(DiskEnv& env, const ModelConfig& config, std::string fingerprint, DiskTierOptions options);
  std::string PathOf(const std::string& name) const { return options_.dir + "/" + name; }
  int64_t Now() const;
  // Makes room for `size` bytes under the budget and the free-space floor; false when it cannot.
  bool MakeRoomLocked(int64_t size);
  Status WriteFile(const std::string& name, const std::vector<std::string_view>& pieces, int64_t size, Entry entry);
  void DropLocked(const std::string& name);
  void DropFromLocked(std::span<const std::string> hashes, size_t first_line);
  void TouchLocked(const std::string& name);
  // TTL first, then the least valuable until the tier holds at most limit_bytes.
  void EvictLocked(int64_t limit_bytes);
  // (hits + 1) x tokens saved per byte it holds alone, halved per day unused.
  double ValueLocked(const std::string& anchor_name, const Entry& e, const std::map<std::string, int>& readers) const;
  void RecountLocked();

  DiskEnv& env_;
  ModelConfig config_;
  std::string fingerprint_;
  std::vector<std::string> corrupt_at_open_;  // written by Open only
  mutable std::mutex mu_;  // guards everything below
  DiskTierOptions options_;
  std::map<std::string, Entry> files_;
  DiskTierStats stats_;
};

}  // namespace anchorage
