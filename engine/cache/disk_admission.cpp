#include "engine/cache/disk_admission.h"

#include <algorithm>
#include <set>

#include <nlohmann/json.hpp>

#include "engine/cache/disk_files.h"

namespace anchorage {

DiskAdmission DiskAdmission::Open(DiskEnv& env, std::string path, AdmissionOptions options) {
  DiskAdmission a(env, std::move(path), options);
  auto text = env.ReadFile(a.path_);
  if (!text.ok()) return a;
  const nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
  if (!j.is_object() || j.value("version", 0) != 1 || j.value("line_tokens", int64_t(0)) != options.line_tokens ||
      !j.contains("counts") || !j["counts"].is_object())
    return a;
  for (const auto& [hash, n] : j["counts"].items())
    if (n.is_number_integer()) a.counts_[hash] = n.get<int64_t>();
  return a;
}

int64_t DiskAdmission::Count(const std::string& line_hash) const {
  const auto it = counts_.find(line_hash);
  return it == counts_.end() ? 0 : it->second;
}

std::vector<int64_t> DiskAdmission::Plan(const AdmissionRequest& r) {
  const int64_t G = options_.line_tokens;
  const std::vector<std::string> hashes = PrefixHashes(r.prompt, G);
  const int64_t lines = static_cast<int64_t>(hashes.size());
  for (int64_t l = r.resume_at / G; l < lines; ++l) ++counts_[hashes[l]];  // line l ends at (l + 1) * G
  Trim();
  if (static_cast<int64_t>(r.prompt.size()) < options_.min_tokens) return {};
  const int64_t writable = std::min(lines, r.exact_upto / G);  // lines 1..writable may be written
  std::set<int64_t> out;
  // The longest line read cold admit_after times.
  for (int64_t l = writable; l >= 1; --l)
    if (Count(hashes[l - 1]) >= options_.admit_after) {
      out.insert(l * G);
      break;
    }
  // A branch: a line read often enough whose count falls at the next line, in the shared head.
  const int64_t head_limit = r.first_answer_start >= 0 ? std::min(writable, r.first_answer_start / G) : writable;
  int branches = 0;
  for (int64_t l = head_limit; l >= 1 && branches < options_.branch_max; --l) {
    const int64_t here = Count(hashes[l - 1]), next = l < lines ? Count(hashes[l]) : 0;
    if (here >= options_.admit_after && next < here) {
      out.insert(l * G);
      ++branches;
    }
  }
  // A session's first long request: the lines below where its last user message starts.
  if (r.first_of_session && r.user_start >= 0) {
    const int64_t below = std::min(writable, r.user_start / G);
    for (int64_t l = below; l >= 1 && l > below - options_.head_anchors; --l) out.insert(l * G);
  }
  return {out.begin(), out.end()};
}

void DiskAdmission::Trim() {
  if (static_cast<int64_t>(counts_.size()) <= options_.max_counted_lines) return;
  std::vector<std::pair<int64_t, std::string>> by_count;
  for (const auto& [hash, n] : counts_) by_count.emplace_back(n, hash);
  std::sort(by_count.begin(), by_count.end());
  for (size_t i = 0; i < by_count.size() - static_cast<size_t>(options_.max_counted_lines / 2); ++i) counts_.erase(by_count[i].second);
}

std::string DiskAdmission::Serialize() const {
  nlohmann::json counts = nlohmann::json::object();
  for (const auto& [hash, n] : counts_) counts[hash] = n;
  return nlohmann::json{{"version", 1}, {"line_tokens", options_.line_tokens}, {"counts", counts}}.dump() + "\n";
}

Status DiskAdmission::Save() {
  return WriteFileCrashSafe(*env_, path_, Serialize());
}

}  // namespace anchorage
