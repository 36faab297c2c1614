// OpenAI request parsing and validation (chat and text completions) and the error shape.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/runtime/sampler.h"

namespace anchorage {

// An error in OpenAI's shape: {"error": {"message", "type", "param", "code"}} with its HTTP status.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // empty means null
  std::string code;   // empty means null
  nlohmann::json ToJson() const;
};

enum class RequestKind { kChat, kCompletion };

struct CompletionRequest {
  RequestKind kind = RequestKind::kChat;
  std::string model;
  nlohmann::ordered_json template_body;  // chat: messages, tools, chat_template_kwargs as the template sees them
  std::string prompt_text;               // completion with a text prompt
  std::vector<int32_t> prompt_ids;       // completion with token ids
  bool prompt_is_ids = false;
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();  // for typing parsed tool calls
  bool parse_tool_calls = false;
  SamplingParams sampling;
  bool max_tokens_given = false;
  bool stream = false;
  bool include_usage = false;
  bool logprobs = false;
  int top_logprobs = 0;
  std::string session;  // the body's conversation_id / session_id / session, else x-session-id
  std::vector<std::string> image_urls;  // the images the prompt holds, in order (the template_body's parts name them #0, #1, ..)
};

// What an image over the request's cap becomes in the prompt.
inline constexpr const char* kLeftOutImage = "[an earlier image, left out]";

// Request bodies nest at most this deep (the body's own object is level 1).
inline constexpr size_t kMaxJsonDepth = 128;

// The deepest nesting of arrays and objects in JSON text (strings skipped); stops counting past limit,
// naming in field (where given) the keys and indices leading to where it passed it ("messages[0].extra").
size_t JsonNestingDepth(std::string_view text, size_t limit, std::string* field = nullptr);

// A request body as a JSON object: valid UTF-8, nested at most kMaxJsonDepth deep, an object.
bool ParseJsonBody(std::string_view body, nlohmann::ordered_json* out, ApiError* error);

// The body's conversation_id, session_id or session (the first non-empty string), else "".
std::string SessionOfBody(const nlohmann::ordered_json& body);

struct ParseOptions {
  std::string model_id;                // the one model served
  int64_t vocab_size = 0;              // token ids in a completion prompt must be below this
  std::vector<std::string> aliases;    // other names of the model (--served-model-name a,b)
  bool strict_model_names = false;     // refuse a "model" that is neither the id nor an alias
  int64_t max_images = 0;              // images a prompt keeps (older ones left out in steps); 0: no cap
  std::string images_off = "this model has no vision tower";  // why image parts are refused; empty: they are served
};

// Parses and validates a body; returns the request or the error to send. Never throws.
std::optional<CompletionRequest> ParseCompletionRequest(RequestKind kind, std::string_view body, const ParseOptions& options,
                                                        ApiError* error);

}  // namespace anchorage
