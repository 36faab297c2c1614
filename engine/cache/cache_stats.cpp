#include "engine/cache/cache_stats.h"

namespace anchorage {

nlohmann::json ToJson(const CacheStats& s) {
  const auto& r = s.resident;
  const auto& a = s.anchors;
  const auto& e = s.end;
  const auto& st = s.stash;
  const auto& p = s.pin;
  const auto& k = s.park;
  const auto& so = s.store;
  const auto& m = s.memory;
  nlohmann::json doc = {
      {"resident", {{"rows", r.rows}, {"row_bytes", r.row_bytes}, {"taint_row", r.taint_row}, {"session", r.session}, {"requests", r.requests},
                    {"cold", r.cold}, {"cached_tokens", r.cached_tokens}, {"reread_tokens", r.reread_tokens}}},
      {"anchors", {{"entries", a.entries}, {"bytes", a.bytes}, {"budget_bytes", a.budget_bytes}, {"hits", a.hits}, {"evictions", a.evictions},
                   {"lengths", a.lengths}}},
      {"end", {{"entries", e.entries}, {"bytes", e.bytes}, {"length", e.length}, {"hits", e.hits}, {"aligned_hits", e.aligned_hits}}},
      {"stash", {{"entries", st.entries}, {"bytes", st.bytes}, {"budget_bytes", st.budget_bytes}, {"guests", st.guests}}},
      {"pin", {{"entries", p.entries}, {"tokens", p.tokens}, {"bytes", p.bytes}, {"budget_bytes", p.budget_bytes}, {"pins", p.pins}, {"hits", p.hits}}},
      {"park", {{"entries", k.entries}, {"session", k.session}, {"tokens", k.tokens}, {"bytes", k.bytes}, {"budget_bytes", k.budget_bytes},
                {"parks", k.parks}, {"hits", k.hits}}},
      {"store", {{"entries", so.entries}, {"bytes", so.bytes}, {"budget_bytes", so.budget_bytes}, {"entry_cap_bytes", so.entry_cap_bytes},
                 {"hits", so.hits}, {"misses", so.misses}, {"puts", so.puts}, {"evictions", so.evictions}, {"declined", so.declined}}},
      {"memory", {{"engine_bytes", m.engine_bytes}, {"state_bytes", m.state_bytes}, {"ceiling_bytes", m.ceiling_bytes}, {"peak_bytes", m.peak_bytes},
                  {"slack_bytes", m.slack_bytes}, {"sheds", m.sheds}, {"refused", m.refused}, {"shadow_bytes", m.shadow_bytes},
                  {"device", m.device}, {"device_bytes", m.device_bytes}}},
  };
  doc["disk"] = s.disk_enabled ? ToJson(s.disk) : nlohmann::json{{"mode", "off"}, {"open", false}};
  if (s.write_guard) doc["disk_writes"] = WriteGuardJson(*s.write_guard);
  const ResponseCacheStats& rc = s.response;
  doc["response"] = {{"enabled", rc.enabled}, {"entries", rc.entries}, {"bytes", rc.bytes}, {"max_bytes", rc.max_bytes}, {"hits", rc.hits},
                     {"misses", rc.misses}, {"puts", rc.puts}, {"evictions", rc.evictions}};
  const PreparedStats& pr = s.prepared;
  doc["prepared"] = {{"enabled", pr.enabled}, {"entries", pr.entries}, {"session", pr.session}, {"prompt_tokens", pr.prompt_tokens},
                     {"tokens", pr.tokens}, {"bytes", pr.bytes}, {"written", pr.written}, {"served", pr.served}, {"stopped", pr.stopped},
                     {"refused", pr.refused}};
  doc["suffix_store"] = {{"open", s.suffix.open}, {"bytes", s.suffix.bytes}, {"max_bytes", s.suffix.max_bytes}, {"ids", s.suffix.ids}, {"read_only", s.suffix.read_only}};
  doc["spill"] = s.spill_enabled ? SpillJson(s.spill, s.spill_entries, s.spill_events, s.spill_refused) : nlohmann::json{{"open", false}};
  return doc;
}

nlohmann::json WriteGuardJson(const WriteGuardStats& s) {
  nlohmann::json days = nlohmann::json::object();
  constexpr double kGib = 1024.0 * 1024.0 * 1024.0;  // as the settings count: GiB
  for (const auto& [day, bytes] : s.days) days[day] = static_cast<double>(bytes) / kGib;
  return {{"today", s.today}, {"today_gb", static_cast<double>(s.today_bytes) / kGib}, {"budget_gb", static_cast<double>(s.budget_bytes) / kGib},
          {"level", WriteLevelName(s.level)}, {"skips", s.skips}, {"days_gb", days}};
}

nlohmann::json SpillJson(const SessionSpillStats& s, const std::vector<SpillEntryInfo>& entries, const std::vector<CacheEvent>& events,
                         const std::map<std::string, int64_t>& refused) {
  nlohmann::json list = nlohmann::json::array();
  for (const SpillEntryInfo& e : entries)
    list.push_back({{"tokens", e.tokens}, {"bytes", e.bytes}, {"raw_bytes", e.raw_bytes}, {"end_length", e.end_length}, {"used_ms", e.used_ms},
                    {"has_session", !e.session.empty()}, {"session", e.session}});
  const double saved = s.raw_bytes > 0 ? 1.0 - static_cast<double>(s.bytes) / static_cast<double>(s.raw_bytes) : 0.0;
  nlohmann::json recent = nlohmann::json::array();
  for (const CacheEvent& e : events)
    recent.push_back({{"kind", e.kind}, {"tokens", e.tokens}, {"bytes", e.bytes}, {"reason", e.reason}, {"time_ms", e.time_ms}});
  return {{"open", true},          {"entries", s.entries},       {"bytes", s.bytes},
          {"raw_bytes", s.raw_bytes}, {"codec_saved_fraction", saved}, {"saves", s.saves},
          {"restores", s.restores}, {"failed_restores", s.failed_restores}, {"evictions", s.evictions},
          {"expired", s.expired},   {"swept", s.swept}, {"bytes_written", s.bytes_written}, {"bytes_read", s.bytes_read},
          {"save_seconds", s.save_seconds}, {"restore_seconds", s.restore_seconds}, {"list", list},
          {"recent_events", recent}, {"refused", refused}};
}

nlohmann::json ToJson(const DiskCacheStats& d) {
  const DiskTierStats& t = d.tier;
  nlohmann::json top = nlohmann::json::array();
  for (const DiskPrefix& p : d.top) top.push_back({{"tokens", p.tokens}, {"bytes", p.bytes}, {"hits", p.hits}, {"last_used_ms", p.last_used_ms}});
  nlohmann::json recent = nlohmann::json::array();
  for (const CacheEvent& e : d.recent)
    recent.push_back({{"time_ms", e.time_ms}, {"kind", e.kind}, {"tokens", e.tokens}, {"bytes", e.bytes}, {"reason", e.reason}});
  return {{"open", true},
          {"mode", d.mode},
          {"dir", d.dir},
          {"files", t.files},
          {"anchors", t.anchors},
          {"chunks", t.chunks},
          {"bytes", t.bytes},
          {"budget_bytes", d.budget_bytes},
          {"min_free_bytes", d.min_free_bytes},
          {"ttl_days", d.ttl_days},
          {"free_bytes", d.free_bytes},
          {"staged_bytes", d.staged_bytes},
          {"hits", d.hits},
          {"misses", d.misses},
          {"hit_rate", d.hit_rate()},
          {"declined_by_cost", d.declined_by_cost},
          {"restores", t.restores},
          {"failed_restores", t.failed_restores},
          {"read_bytes_per_s", t.read_bytes_per_s()},
          {"jobs", d.jobs},
          {"dropped_jobs", d.dropped_jobs}, {"skipped_by_write_budget", d.skipped_by_write_budget},
          {"chunks_written", t.chunks_written},
          {"anchors_written", t.anchors_written},
          {"bytes_written", t.bytes_written},
          {"refused_writes", t.refused_writes},
          {"evicted_files", t.evicted_files},
          {"expired_files", t.expired_files},
          {"swept_temporaries", t.swept_temporaries},
          {"swept_foreign", t.swept_foreign},
          {"swept_corrupt", t.swept_corrupt},
          {"top_prefixes", top},
          {"recent_events", recent}};
}

}  // namespace anchorage
