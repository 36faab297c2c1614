// The session spill's store: whole conversations on disk, under the disk tier's folder
// (sessions/). An entry is one conversation: the K/V rows [0, valid) in blocks of 1,024 rows, the
// end anchor, the newest grid anchors, the token ids, the taint, the generation regions and the
// session key. Blocks are encoded with the byte-plane codec (or raw) and carry two 64-bit sums
// per buffer (plain and position-weighted); a save writes only the blocks whose tokens or sums
// changed, a restore reads only the blocks not already in place and sums every block it read
// again before the state is used. Crash safety: a save removes the manifest first and writes it
// last, so an entry without one is an unfinished write, deleted at the next open.
#pragma once

#include <climits>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/cache/cache_tier.h"
#include "engine/cache/disk_env.h"
#include "engine/cache/end_anchor.h"
#include "engine/core/thread_pool.h"
#include "engine/model/model_config.h"
#include "engine/runtime/sequence_state.h"

namespace anchorage {

inline constexpr int64_t kSpillBlockRows = 1024;

struct SessionSpillOptions {
  std::string dir;                              // <disk tier>/sessions
  int64_t budget_bytes = 64ll << 30;
  int64_t ttl_ms = 48ll * 3600 * 1000;          // an entry unused this long goes
  int64_t min_free_bytes = 0;                   // a save that would leave less free on the file system is refused (the tier's floor)
  bool compress = true;                         // the byte-plane codec; raw blocks stay readable either way
  int level = 1;                                // zstd's
  int threads = 2;                              // the codec's pool
  std::function<int64_t()> now_ms;              // tests; default: the wall clock
};

// What a save takes and a restore gives back, besides the rows.
struct SpillEntry {
  std::string session;
  std::vector<int32_t> tokens;   // rows [0, tokens.size()) of the state are valid
  int64_t taint_row = kNoTaintRow;
  std::vector<TokenRegion> regions;
  std::optional<EndAnchor> end;
  std::vector<Anchor> anchors;   // the newest grid anchors, ascending
};

struct SpillSaveReport {
  int64_t blocks_written = 0, blocks_kept = 0, anchors_written = 0, anchors_kept = 0;
  int64_t bytes_written = 0;     // as stored (encoded)
  int64_t raw_bytes = 0;         // what the written blocks hold before the codec
  double seconds = 0;
};

struct SpillRestoreReport {
  int64_t blocks_read = 0, blocks_in_place = 0, bytes_read = 0;
  double seconds = 0;
};

struct SpillEntryInfo {
  std::string id, session;
  int64_t tokens = 0, bytes = 0, raw_bytes = 0, used_ms = 0, end_length = 0;
};

// What the spill would serve a prompt: the entry, where the request resumes (its end anchor or a
// saved grid anchor), and the bytes a restore would read (blocks not already in place, anchors).
struct SpillOffer {
  std::string id;
  int64_t resume_length = 0;
  bool from_end = false;
  int64_t read_bytes = 0;
};

// An entry whose end the prompt does not reach token for token, for end alignment to try: its
// tokens up to the end, and the end's length, taint and generation regions.
struct SpillEndCandidate {
  std::string id;
  std::vector<int32_t> tokens;
  int64_t end_length = 0, end_taint_row = 0;
  std::vector<TokenRegion> end_regions;
  int64_t read_bytes = 0;
};

struct SessionSpillStats {
  int64_t entries = 0, bytes = 0, raw_bytes = 0, saves = 0, restores = 0, failed_restores = 0, evictions = 0, expired = 0;
  int64_t bytes_written = 0, bytes_read = 0, swept = 0;
  double save_seconds = 0, restore_seconds = 0;
};

class SessionSpill {
 public:
  // Creates the folder; deletes leftover .tmp files, entries without a manifest, entries of another
  // fingerprint or layout, and expired ones; indexes the rest.
  static Result<std::unique_ptr<SessionSpill>> Open(DiskEnv& env, const ModelConfig& config, std::string fingerprint,
                                                    SessionSpillOptions options);

  // The entry's id: from the session key, or from the first block's tokens without one.
  static std::string EntryId(const std::string& session, std::span<const int32_t> tokens);

  // Writes rows [0, entry.tokens.size()) of state and the entry's anchors, replacing the entry of
  // the same id; unchanged blocks and anchors are kept. Then evicts to the budget.
  Result<SpillSaveReport> Save(const SpillEntry& entry, const SequenceState& state);
  // Reads the entry's rows below upto (whole blocks; all of them by default) into state: blocks
  // whose tokens equal in_place (rows the caller vouches for) are kept, the others read and summed;
  // the length becomes min(upto, the entry's). What it returns holds the tokens, anchors and end
  // up to there. On failure the entry is deleted and rows above the kept blocks are not valid.
  Result<SpillEntry> Restore(const std::string& id, SequenceState& state, std::span<const int32_t> in_place, SpillRestoreReport* report,
                             int64_t upto = INT64_MAX);

  std::optional<SpillEntryInfo> Info(const std::string& id) const;
  std::vector<SpillEntryInfo> Entries() const;  // newest use first
  // An entry's title from its tokens by the function SetTitler gave (once an entry; "" without one
  // or for an entry gone). Text: the stats route sends titles to admin callers only.
  void SetTitler(std::function<std::string(std::span<const int32_t>)> titler);
  std::string Title(const std::string& id) const;
  // The entry that resumes prompt furthest (at most at limit), given the rows in place; nullopt if none.
  std::optional<SpillOffer> Offer(std::span<const int32_t> prompt, std::span<const int32_t> in_place, int64_t limit) const;
  // The most tokens any entry shares with prompt.
  int64_t LongestCommon(std::span<const int32_t> prompt) const;
  // The entry sharing the most tokens (at least min_common) with prompt whose end lies past them.
  std::optional<SpillEndCandidate> EndCandidate(std::span<const int32_t> prompt, std::span<const int32_t> in_place, int64_t min_common) const;
  // The tokens up to the end anchor of session's most recently used entry that has one; nullopt when none.
  std::optional<std::vector<int32_t>> EndRecord(const std::string& session) const;
  // Bytes a second the restores of this process read (decoding included); a default before the first.
  double RestoreBytesPerSecond() const;
  // The entry a planned stop left resident, for the next start to read back first (crash-safe file).
  Status SetResident(const std::string& id);
  std::optional<std::string> TakeResident();
  Status Remove(const std::string& id);
  Status Clear();
  // Keeps an event of the spill's for the console (the newest 32), stamped now.
  void Record(CacheEvent event);
  std::vector<CacheEvent> RecentEvents() const;  // newest last
  // New budget and TTL (the settings document's), applied now.
  void set_limits(int64_t budget_bytes, int64_t ttl_ms, int64_t min_free_bytes);
  SessionSpillStats stats() const;

 private:
  struct BlockRecord {
    int64_t rows = 0;
    bool encoded = false;
    std::vector<int64_t> lengths;               // each buffer's bytes in the file
    std::vector<std::pair<uint64_t, uint64_t>> sums;  // each buffer's (plain, weighted)
    int64_t bytes = 0, raw_bytes = 0;
  };
  struct AnchorRecord {
    int64_t length = 0;
    std::pair<uint64_t, uint64_t> sums;
    std::string file;
  };
  struct Manifest {
    std::string session;
    std::vector<int32_t> tokens;
    int64_t taint_row = kNoTaintRow;
    std::vector<TokenRegion> regions;
    std::optional<AnchorRecord> end;
    int64_t end_taint_row = 0;
    std::vector<TokenRegion> end_regions;
    std::vector<AnchorRecord> anchors;
    std::vector<BlockRecord> blocks;
    int64_t used_ms = 0;
    int64_t bytes() const;
    int64_t raw_bytes() const;
  };

  SessionSpill(DiskEnv& env, const ModelConfig& config, std::string fingerprint, SessionSpillOptions options);
  int64_t Now() const;
  std::string PathOf(const std::string& name) const { return options_.dir + "/" + name; }
  std::string EncodeManifest(const Manifest& m) const;
  Result<Manifest> DecodeManifest(const std::string& data) const;
  Result<std::string> EncodeBlock(const SequenceState& state, int64_t begin, const BlockRecord& sums, BlockRecord* record);
  Status RemoveFilesLocked(const std::string& id, const Manifest* keep);
  // What Restore(upto) reads of m (the end's anchor too when with_end), given the rows in place.
  int64_t RestoreBytes(const Manifest& m, std::span<const int32_t> in_place, int64_t upto, bool with_end) const;
  static SpillEntryInfo InfoOf(const std::string& id, const Manifest& m);
  void EvictLocked(const std::string& keep_id);

  DiskEnv& env_;
  const ModelConfig config_;
  const std::string fingerprint_;
  SessionSpillOptions options_;  // budget_bytes and ttl_ms change under mu_
  ThreadPool pool_;
  mutable std::mutex mu_;  // guards the index and stats
  std::map<std::string, Manifest> index_;
  std::function<std::string(std::span<const int32_t>)> titler_;
  mutable std::map<std::string, std::string> titles_;  // by entry id, pruned to the index's
  SessionSpillStats stats_;
  std::deque<CacheEvent> recent_;
};

// Two sums of a buffer's 32-bit words: plain, and weighted by position (1-based); both wrap.
std::pair<uint64_t, uint64_t> WordSums(const void* data, int64_t bytes);

}  // namespace anchorage
