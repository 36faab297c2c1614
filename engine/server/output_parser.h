// Splits a Qwen3.5 model's streamed output into reasoning, content and XML tool calls.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace anchorage {

struct ParsedToolCall {
  std::string name;
  nlohmann::ordered_json arguments = nlohmann::ordered_json::object();
};

// What one Push releases: text safe to show now, and tool calls completed by it.
struct OutputDelta {
  std::string reasoning;
  std::string content;
  std::vector<ParsedToolCall> tool_calls;
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

class OutputParser {
 public:
  // starts_in_reasoning: the prompt ended inside an open <think> block.
  // tools: the request's tools (OpenAI shape), used to type parameter values by their JSON schema.
  // parse_tool_calls false (a request without tools): <tool_call> blocks stay content.
  OutputParser(bool starts_in_reasoning, nlohmann::ordered_json tools, bool parse_tool_calls = true);

  // Feeds newly generated text; holds back a possible partial tag.
  OutputDelta Push(const std::string& text);
  // Ends the stream: releases what was held back; an unclosed tool call is returned as content.
  OutputDelta Finish();

  const std::string& reasoning() const { return reasoning_; }
  const std::string& content() const { return content_; }
  const std::vector<ParsedToolCall>& tool_calls() const { return tool_calls_; }

 private:
  enum class Mode { kStart, kReasoning, kContent, kToolCall };
  void Step(OutputDelta& out, bool final);
  ParsedToolCall ParseToolCall(const std::string& block) const;
  nlohmann::ordered_json TypedValue(const std::string& function, const std::string& parameter, const std::string& raw) const;

  Mode mode_;
  std::string pending_;
  bool strip_leading_newlines_ = false;
  bool parse_tool_calls_;
  nlohmann::ordered_json tools_;
  std::string reasoning_;
  std::string content_;
  std::vector<ParsedToolCall> tool_calls_;
};

}  // namespace anchorage
