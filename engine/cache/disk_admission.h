// What the disk tier writes, decided before a prefill runs: every grid line a prefill reads cold is
// counted by its prefix hash, and a line read cold admit_after times gets an anchor; so does a
// session's head and the branch where an earlier prompt went on differently. The counts are
// traffic, not rows: they persist beside the files and outlive a fingerprint change.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/cache/disk_env.h"

namespace anchorage {

struct AdmissionOptions {
  int64_t line_tokens = 1024;
  int admit_after = 2;          // cold reads of a line before it gets an anchor
  int64_t min_tokens = 4096;    // shorter prompts are not written
  int head_anchors = 4;         // a session's first long request: lines below its last user message
  int branch_max = 4;           // the longest branch lines kept
  int64_t max_counted_lines = 200000;  // the count file's bound; the least read lines go first
};

struct AdmissionRequest {
  std::span<const int32_t> prompt;
  int64_t resume_at = 0;           // rows in place before the prefill (not read cold)
  int64_t exact_upto = 0;          // lines above this are not a cold prefill's (taint): never written
  int64_t user_start = -1;         // where the last user message starts, if known
  int64_t first_answer_start = -1; // where the conversation's first answer starts: branches lie below
  bool first_of_session = false;
};

class DiskAdmission {
 public:
  // Reads path if it exists (a missing or unreadable file starts empty; counts are only advice).
  static DiskAdmission Open(DiskEnv& env, std::string path, AdmissionOptions options);

  // Counts the request's cold lines, then returns the lines to anchor, ascending (empty if none).
  std::vector<int64_t> Plan(const AdmissionRequest& request);
  int64_t Count(const std::string& line_hash) const;
  Status Save();
  // The count file's text (Save writes it; a caller may write it elsewhere, off a lock).
  std::string Serialize() const;
  const std::string& path() const { return path_; }
  void Clear() { counts_.clear(); }
  const AdmissionOptions& options() const { return options_; }
  void set_limits(int admit_after, int64_t min_tokens) {
    options_.admit_after = admit_after;
    options_.min_tokens = min_tokens;
  }

 private:
  DiskAdmission(DiskEnv& env, std::string path, AdmissionOptions options)
      : env_(&env), path_(std::move(path)), options_(options) {}
  void Trim();

  DiskEnv* env_;
  std::string path_;
  AdmissionOptions options_;
  std::unordered_map<std::string, int64_t> counts_;
};

}  // namespace anchorage
