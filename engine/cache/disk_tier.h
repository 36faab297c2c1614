// The disk tier's store: chunk and anchor files on the grid in one folder, indexed by their names
// (the files are the index). It keeps and restores exact prefill states; what to admit, when to
// write and where it sits among the RAM tiers is its callers' (engine/cache/resident_prefix.cpp).
// One thread at a time.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>

#include "engine/cache/disk_env.h"
#include "engine/model/model_config.h"
#include "engine/runtime/sequence_state.h"

namespace anchorage {

struct DiskTierOptions {
  std::string dir;
  int64_t line_tokens = 1024;             // the grid: chunks cover one line's rows, anchors sit on lines
  int64_t budget_bytes = 16ll << 30;
};

struct DiskTierStats {
  int64_t files = 0, bytes = 0;
  int64_t chunks_written = 0, anchors_written = 0, bytes_written = 0;
  int64_t restores = 0, failed_restores = 0, evicted_files = 0;
  int64_t swept_temporaries = 0, swept_foreign = 0;  // at open: cut-short writes, other fingerprints
};

class DiskTier {
 public:
  // Opens (creating) the folder, mode 0700; removes .tmp files and files of another fingerprint.
  static Result<std::unique_ptr<DiskTier>> Open(DiskEnv& env, const ModelConfig& config, std::string fingerprint,
                                                DiskTierOptions options);

  // The longest line <= max_length of this prompt with an anchor and every chunk below it on disk; 0 if none.
  int64_t Find(std::span<const int32_t> prompt, int64_t max_length) const;
  // Writes what the tier lacks of state's rows [0, length) and its anchor; length = state.length()
  // must be a line, and the state a cold prefill's of prompt[0, length).
  Status Put(std::span<const int32_t> prompt, const SequenceState& state);
  // Loads the anchor at `line` and the rows below it into state. Every chunk's token ids are
  // compared with the prompt and every section's crc checked first; a file that fails is deleted
  // with every longer line's files of this prompt, state is reset, and the status says why.
  Status Restore(std::span<const int32_t> prompt, int64_t line, SequenceState& state);
  Status Clear();

  const DiskTierStats& stats() const { return stats_; }
  const DiskTierOptions& options() const { return options_; }
  void set_budget_bytes(int64_t bytes);

 private:
  struct Entry {
    int64_t bytes = 0;
    uint64_t used = 0;  // the serial of its last write or read
  };
  DiskTier(DiskEnv& env, const ModelConfig& config, std::string fingerprint, DiskTierOptions options);
  std::string PathOf(const std::string& name) const { return options_.dir + "/" + name; }
  Status WriteFile(const std::string& name, const std::vector<std::string_view>& pieces, int64_t size);
  void Drop(const std::string& name);
  void DropFrom(std::span<const std::string> hashes, size_t first_line);
  void Touch(const std::string& name);
  void Evict();

  DiskEnv& env_;
  ModelConfig config_;
  std::string fingerprint_;
  DiskTierOptions options_;
  std::map<std::string, Entry> files_;
  uint64_t serial_ = 0;
  DiskTierStats stats_;
};

}  // namespace anchorage
