// The day's write budget of the disk tier and the session spill. Both add every byte they write to
// the local day's count (writes.json beside the tier, kept across restarts, 14 days). Past the
// budget the tier plans nothing and the spill writes only a planned stop's drain and evictions of
// conversations of 32,768 tokens or more; past 1.5 times the budget only the drain. A skip is a
// cache not written, never an answer changed: it is counted and journaled by the caller.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "engine/cache/disk_env.h"

namespace anchorage {

enum class WriteLevel { kOk, kOver, kHard };
const char* WriteLevelName(WriteLevel level);  // "ok", "over", "hard"

struct WriteGuardStats {
  std::string today;             // the local day, YYYY-MM-DD
  int64_t today_bytes = 0, budget_bytes = 0, skips = 0;
  WriteLevel level = WriteLevel::kOk;
  std::map<std::string, int64_t> days;  // the last 14 days' bytes, by day
};

class WriteGuard {
 public:
  static constexpr int64_t kEvictionTokensWhenOver = 32768;
  static constexpr int kDaysKept = 14;

  // Reads path's counts when it holds them (a damaged file starts the counts again).
  static std::unique_ptr<WriteGuard> Open(DiskEnv& env, std::string path, int64_t budget_bytes,
                                          std::function<std::string()> today = nullptr);

  void set_budget(int64_t budget_bytes);
  // Adds bytes written today and saves the counts (crash-safe).
  void Add(int64_t bytes);
  WriteLevel level() const;
  // Whether the disk tier may plan writes now.
  bool TierMayWrite() const;
  // Whether the spill may write a conversation of `tokens`: a planned stop's drain always may.
  bool SpillMayWrite(bool drain, int64_t tokens) const;
  // Counts a write skipped for the budget; returns why, for its journal row.
  std::string NoteSkip();
  WriteGuardStats Stats() const;

 private:
  WriteGuard(DiskEnv& env, std::string path, int64_t budget_bytes, std::function<std::string()> today);
  std::string Today() const;
  WriteLevel LevelLocked() const;
  void SaveLocked();

  DiskEnv& env_;
  const std::string path_;
  std::function<std::string()> today_;
  mutable std::mutex mu_;
  int64_t budget_bytes_;
  int64_t skips_ = 0;
  std::map<std::string, int64_t> days_;
};

}  // namespace anchorage
