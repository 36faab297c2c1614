#include "engine/cache/write_guard.h"

#include <ctime>

#include <nlohmann/json.hpp>

namespace anchorage {

const char* WriteLevelName(WriteLevel level) {
  switch (level) {
    case WriteLevel::kOk: return "ok";
    case WriteLevel::kOver: return "over";
    case WriteLevel::kHard: return "hard";
  }
  return "ok";
}

WriteGuard::WriteGuard(DiskEnv& env, std::string path, int64_t budget_bytes, std::function<std::string()> today)
    : env_(env), path_(std::move(path)), today_(std::move(today)), budget_bytes_(budget_bytes) {}

std::unique_ptr<WriteGuard> WriteGuard::Open(DiskEnv& env, std::string path, int64_t budget_bytes, std::function<std::string()> today) {
  std::unique_ptr<WriteGuard> g(new WriteGuard(env, std::move(path), budget_bytes, std::move(today)));
  if (auto data = env.ReadFile(g->path_); data.ok()) {
    const nlohmann::json j = nlohmann::json::parse(*data, nullptr, false);
    if (j.is_object() && j.contains("days") && j["days"].is_object()) {
      for (const auto& [day, bytes] : j["days"].items())
        if (bytes.is_number_integer()) g->days_[day] = bytes.get<int64_t>();
      if (j.contains("skips") && j["skips"].is_number_integer()) g->skips_ = j["skips"].get<int64_t>();
    }
  }
  return g;
}

std::string WriteGuard::Today() const {
  if (today_) return today_();
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char day[16];
  std::strftime(day, sizeof(day), "%Y-%m-%d", &local);
  return day;
}

void WriteGuard::set_budget(int64_t budget_bytes) {
  std::lock_guard lock(mu_);
  budget_bytes_ = budget_bytes;
}

void WriteGuard::Add(int64_t bytes) {
  if (bytes <= 0) return;
  std::lock_guard lock(mu_);
  days_[Today()] += bytes;
  while (static_cast<int>(days_.size()) > kDaysKept) days_.erase(days_.begin());  // days sort as text
  SaveLocked();
}

void WriteGuard::SaveLocked() {
  // A count that could not be saved is still kept in memory.
  (void)WriteFileCrashSafe(env_, path_, nlohmann::json{{"days", days_}, {"skips", skips_}}.dump());
}

WriteLevel WriteGuard::LevelLocked() const {
  const auto it = days_.find(Today());
  const int64_t today = it == days_.end() ? 0 : it->second;
  if (today > budget_bytes_ + budget_bytes_ / 2) return WriteLevel::kHard;
  if (today > budget_bytes_) return WriteLevel::kOver;
  return WriteLevel::kOk;
}

WriteLevel WriteGuard::level() const {
  std::lock_guard lock(mu_);
  return LevelLocked();
}

bool WriteGuard::TierMayWrite() const { return level() == WriteLevel::kOk; }

bool WriteGuard::SpillMayWrite(bool drain, int64_t tokens) const {
  if (drain) return true;
  const WriteLevel l = level();
  return l == WriteLevel::kOk || (l == WriteLevel::kOver && tokens >= kEvictionTokensWhenOver);
}

std::string WriteGuard::NoteSkip() {
  std::lock_guard lock(mu_);
  ++skips_;
  SaveLocked();
  const auto it = days_.find(Today());
  const int64_t today = it == days_.end() ? 0 : it->second;
  return "the day's write budget is spent (" + std::to_string(today >> 20) + " of " + std::to_string(budget_bytes_ >> 20) + " MiB, level " +
         WriteLevelName(LevelLocked()) + ")";
}

WriteGuardStats WriteGuard::Stats() const {
  std::lock_guard lock(mu_);
  WriteGuardStats s;
  s.today = Today();
  const auto it = days_.find(s.today);
  s.today_bytes = it == days_.end() ? 0 : it->second;
  s.budget_bytes = budget_bytes_;
  s.skips = skips_;
  s.level = LevelLocked();
  s.days = days_;
  return s;
}

}  // namespace anchorage
