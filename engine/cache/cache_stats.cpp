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
  return {
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
                  {"slack_bytes", m.slack_bytes}, {"sheds", m.sheds}, {"refused", m.refused}}},
  };
}

}  // namespace anchorage
