#include "engine/server/reply_script.h"

namespace anchorage {

Result<ReplyScript> ReplyScript::FromJson(const nlohmann::json& entries, const Tokenizer& tokenizer) {
  if (!entries.is_array()) return InvalidArgument("test replies must be a JSON array of {match, reply}");
  ReplyScript script;
  script.tokenizer_ = &tokenizer;
  const std::optional<int32_t> end = tokenizer.TokenId("<|im_end|>");
  for (size_t i = 0; i < entries.size(); ++i) {
    const nlohmann::json& e = entries[i];
    if (!e.is_object() || !e.contains("match") || !e["match"].is_string() || !e.contains("reply") || !e["reply"].is_string())
      return InvalidArgument("test reply " + std::to_string(i) + " must be {\"match\": TEXT, \"reply\": TEXT}");
    ASSIGN_OR_RETURN(std::vector<int32_t> reply, tokenizer.Encode(e["reply"].get<std::string>(), /*parse_special=*/true));
    if (end) reply.push_back(*end);
    script.entries_.push_back({e["match"].get<std::string>(), std::move(reply)});
  }
  return script;
}

std::optional<std::vector<int32_t>> ReplyScript::ReplyFor(const std::vector<int32_t>& prompt) const {
  if (entries_.empty()) return std::nullopt;
  const std::string text = tokenizer_->Decode(prompt);
  const size_t turn = text.rfind("<|im_start|>user");
  if (turn == std::string::npos) return std::nullopt;
  const std::string_view newest = std::string_view(text).substr(turn);
  for (const Entry& e : entries_)
    if (newest.find(e.match) != std::string_view::npos) return e.reply;
  return std::nullopt;
}

}  // namespace anchorage
