// Compaction served as a continuation: an agent's compaction request (its system text and one user
// message holding the whole history as text, then the summary instructions) shares no token with
// what the engine read. When the engine holds that conversation, the request is served as its
// continuation: the tokens up to the end anchor, then one user turn with the system text and the
// instructions, thinking off; the prefill resumes at the end anchor.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/template/chat_template.h"
#include "engine/text/tokenizer.h"

namespace anchorage {

// How one client wraps the history: the marker before it, its tags, and how a user line starts.
struct CompactionShape {
  const char* client;
  const char* lead;      // text before the opening tag ("Here is the conversation so far:")
  const char* open;      // "<conversation>"
  const char* close;     // "</conversation>"
  const char* user_tag;  // "[User]:"
};

// The shapes recognised; add a client's here.
std::span<const CompactionShape> CompactionShapes();

struct CompactionRequest {
  std::string client;
  std::string system_text;   // the system messages' text, joined by blank lines
  std::string instructions;  // the user message's text outside the history
  std::string first_user_line, last_user_line;  // of the history, for the guard
};

// A chat body's messages as a compaction request: system messages, then exactly one user message
// whose text holds a shape's lead and tags; nullopt otherwise.
std::optional<CompactionRequest> RecognizeCompaction(const nlohmann::ordered_json& messages);

// The guard: the record (the text of the tokens up to the end anchor) is this conversation when the
// history's first and last user lines are in it, and it does not already hold these instructions.
bool RecordIsThisConversation(const std::string& record_text, const CompactionRequest& request);

// The continuation's ids: record, then the end of its last turn and one user turn with the system
// text and the instructions, rendered by the chat template with thinking off.
Result<std::vector<int32_t>> ContinuationIds(std::span<const int32_t> record, const CompactionRequest& request,
                                             const ChatTemplate& chat_template, const Tokenizer& tokenizer);

}  // namespace anchorage
