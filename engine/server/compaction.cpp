#include "engine/server/compaction.h"

#include <array>
#include <cstring>

#include "engine/core/text_split.h"

namespace anchorage {

namespace {

constexpr std::array<CompactionShape, 1> kShapes = {{
    {"opencode", "Here is the conversation so far:", "<conversation>", "</conversation>", "[User]:"},
}};

// A message's content as text: a string, or the text parts of an array; nullopt for anything else.
std::optional<std::string> ContentText(const nlohmann::ordered_json& message) {
  if (!message.is_object() || !message.contains("content")) return std::nullopt;
  const auto& c = message["content"];
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) return std::nullopt;
  std::string text;
  for (const auto& part : c) {
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string()) return std::nullopt;
    text += part["text"].get<std::string>();
  }
  return text;
}

// The guard compares at most this many bytes of a user line (the record may wrap what follows).
constexpr size_t kGuardLineBytes = 160;

}  // namespace

std::span<const CompactionShape> CompactionShapes() { return kShapes; }

std::optional<CompactionRequest> RecognizeCompaction(const nlohmann::ordered_json& messages) {
  if (!messages.is_array() || messages.empty()) return std::nullopt;
  CompactionRequest r;
  for (size_t i = 0; i + 1 < messages.size(); ++i) {
    if (!messages[i].is_object() || messages[i].value("role", "") != "system") return std::nullopt;
    auto text = ContentText(messages[i]);
    if (!text) return std::nullopt;
    r.system_text += (r.system_text.empty() ? "" : "\n\n") + *text;
  }
  const auto& last = messages.back();
  if (!last.is_object() || last.value("role", "") != "user") return std::nullopt;
  auto text = ContentText(last);
  if (!text) return std::nullopt;
  for (const CompactionShape& shape : kShapes) {
    const size_t lead = text->find(shape.lead);
    if (lead == std::string::npos) continue;
    const size_t open = text->find(shape.open, lead);
    const size_t close = open == std::string::npos ? std::string::npos : text->rfind(shape.close);
    if (close == std::string::npos || close < open) continue;
    const std::string_view history = std::string_view(*text).substr(open + std::strlen(shape.open), close - open - std::strlen(shape.open));
    for (size_t at = 0; at < history.size();) {
      const size_t end = std::min(history.find('\n', at), history.size());
      const std::string_view line = history.substr(at, end - at);
      if (line.rfind(shape.user_tag, 0) == 0) {
        std::string said(TrimWhitespace(line.substr(std::strlen(shape.user_tag))));
        if (said.size() > kGuardLineBytes) said.resize(kGuardLineBytes);
        if (!said.empty()) {
          if (r.first_user_line.empty()) r.first_user_line = said;
          r.last_user_line = said;
        }
      }
      at = end + 1;
    }
    if (r.first_user_line.empty()) return std::nullopt;
    r.client = shape.client;
    const std::string before(TrimWhitespace(std::string_view(*text).substr(0, lead)));
    const std::string after(TrimWhitespace(std::string_view(*text).substr(close + std::strlen(shape.close))));
    r.instructions = before.empty() ? after : after.empty() ? before : before + "\n\n" + after;
    return r;
  }
  return std::nullopt;
}

bool RecordIsThisConversation(const std::string& record_text, const CompactionRequest& request) {
  if (request.first_user_line.empty() || record_text.find(request.first_user_line) == std::string::npos) return false;
  if (record_text.find(request.last_user_line) == std::string::npos) return false;
  return request.instructions.empty() || record_text.find(request.instructions) == std::string::npos;
}

Result<std::vector<int32_t>> ContinuationIds(std::span<const int32_t> record, const CompactionRequest& request,
                                             const ChatTemplate& chat_template, const Tokenizer& tokenizer) {
  std::string turn = request.system_text;
  if (!request.instructions.empty()) turn += (turn.empty() ? "" : "\n\n") + request.instructions;
  const nlohmann::ordered_json body = {{"messages", {{{"role", "user"}, {"content", turn}}}}, {"chat_template_kwargs", {{"enable_thinking", false}}}};
  ASSIGN_OR_RETURN(std::string rendered, chat_template.RenderChatBody(body));
  // The record stops before its last turn's end: the template's close of that turn comes first.
  ASSIGN_OR_RETURN(std::vector<int32_t> tail, tokenizer.Encode("<|im_end|>\n" + rendered, /*parse_special=*/true));
  std::vector<int32_t> ids(record.begin(), record.end());
  ids.insert(ids.end(), tail.begin(), tail.end());
  return ids;
}

}  // namespace anchorage
