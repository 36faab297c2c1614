#include "engine/core/hex.h"
#include "engine/shadow/shadow_reader.h"

namespace anchorage {
namespace {

using ojson = nlohmann::ordered_json;

ojson AnswerJson(const std::optional<ShadowAnswer>& a, const std::vector<std::string>& choices) {
  if (!a) return nullptr;
  const std::string choice = static_cast<size_t>(a->choice) < choices.size() ? choices[static_cast<size_t>(a->choice)] : std::string(1, static_cast<char>('A' + a->choice));
  return {{"choice", choice}, {"probability", a->probabilities[static_cast<size_t>(a->choice)]}, {"probabilities", a->probabilities}, {"ms", a->ms}};
}

// A session id is a client's bytes: shown as text when it is printable ASCII, else as hex.
ojson SessionJson(const std::string& s) {
  for (unsigned char c : s)
    if (c < 0x20 || c > 0x7e) return {{"hex", Hex(s)}};
  return s;
}

}  // namespace

ojson ShadowStatusJson(const ShadowStatus& s) {
  ojson sessions = ojson::array();
  for (const ShadowSessionInfo& i : s.sessions)
    sessions.push_back({{"session", SessionJson(i.session)}, {"known_tokens", i.known}, {"read_tokens", i.read}, {"backlog_tokens", i.backlog},
                        {"bytes", i.bytes}, {"checkpoints", i.checkpoints}, {"on_disk", i.on_disk}, {"last_used_ms", i.last_used_ms}});
  ojson answers = ojson::array();
  for (const ShadowAgreement& a : s.last_agreements)
    answers.push_back({{"time_ms", a.time_ms}, {"session", SessionJson(a.session)}, {"question", a.question}, {"insertion_tokens", a.insertion}, {"behind_tokens", a.behind_tokens},
                       {"lag_ms", a.lag_ms}, {"shadow", AnswerJson(a.shadow, a.choices)}, {"main", AnswerJson(a.main, a.choices)},
                       {"agree", a.agree ? ojson(*a.agree) : ojson(nullptr)}, {"note", a.main_note}});
  return {{"loaded", true},
          {"enabled", s.enabled},
          {"model", s.model},
          {"grid_tokens", s.grid_tokens},
          {"ration", s.ration},
          {"resident_bytes", s.resident_bytes},
          {"budget_bytes", s.budget_bytes},
          {"disk_bytes", s.disk_bytes},
          {"disk_files", s.disk_files},
          {"chunks_read", s.chunks_read},
          {"tokens_read", s.tokens_read},
          {"ration_tokens", s.ration_tokens},
          {"ms_per_1000_tokens", s.ms_per_1000_tokens},
          {"rollbacks", s.rollbacks},
          {"reread_tokens", s.reread_tokens},
          {"evictions", s.evictions},
          {"disk_loads", s.disk_loads},
          {"drops", s.drops},
          {"asks", s.asks},
          {"agreement", {{"question", s.question}, {"choices", s.choices}, {"compared", s.compared}, {"agreed", s.agreed},
                         {"rate", s.compared > 0 ? ojson(static_cast<double>(s.agreed) / static_cast<double>(s.compared)) : ojson(nullptr)}}},
          {"sessions", sessions},
          {"last_answers", answers},
          {"last_error", s.last_error.empty() ? ojson(nullptr) : ojson(s.last_error)}};
}

}  // namespace anchorage
