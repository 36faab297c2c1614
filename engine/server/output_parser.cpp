#include "engine/server/output_parser.h"

#include <algorithm>

namespace anchorage {

namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kToolOpen = "<tool_call>";
constexpr std::string_view kToolClose = "</tool_call>";

// Length of the longest suffix of text that is a proper prefix of tag (text that may become the tag).
size_t PartialTagSuffix(const std::string& text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n)
    if (text.compare(text.size() - n, n, tag.data(), n) == 0) return n;
  return 0;
}

std::string TrimNewlines(std::string s) {
  size_t b = s.find_first_not_of('\n');
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of('\n');
  return s.substr(b, e - b + 1);
}

}  // namespace

OutputParser::OutputParser(bool starts_in_reasoning, nlohmann::ordered_json tools, bool parse_tool_calls)
    : mode_(starts_in_reasoning ? Mode::kReasoning : Mode::kStart), parse_tool_calls_(parse_tool_calls), tools_(std::move(tools)) {}

OutputDelta OutputParser::Push(const std::string& text) {
  OutputDelta out;
  pending_ += text;
  Step(out, false);
  return out;
}

OutputDelta OutputParser::Finish() {
  OutputDelta out;
  Step(out, true);
  if (!pending_.empty()) {
    if (mode_ == Mode::kReasoning) { reasoning_ += pending_; out.reasoning += pending_; }
    else { content_ += pending_; out.content += pending_; }
    pending_.clear();
  }
  return out;
}

void OutputParser::Step(OutputDelta& out, bool final) {
  while (true) {
    if (strip_leading_newlines_) {
      size_t n = pending_.find_first_not_of('\n');
      if (n == std::string::npos) { if (!final) return; pending_.clear(); }
      else { pending_.erase(0, n); strip_leading_newlines_ = false; }
    }
    switch (mode_) {
      case Mode::kStart: {
        // An answer may open its own <think> block.
        std::string_view p(pending_);
        size_t ws = p.find_first_not_of(" \n");
        if (ws == std::string::npos) { if (!final) return; mode_ = Mode::kContent; continue; }
        std::string_view rest = p.substr(ws);
        if (rest.size() < kThinkOpen.size() && kThinkOpen.substr(0, rest.size()) == rest && !final) return;
        if (rest.substr(0, kThinkOpen.size()) == kThinkOpen) {
          pending_.erase(0, ws + kThinkOpen.size());
          mode_ = Mode::kReasoning;
          strip_leading_newlines_ = true;
        } else {
          mode_ = Mode::kContent;
        }
        continue;
      }
      case Mode::kReasoning: {
        size_t at = pending_.find(kThinkClose);
        if (at != std::string::npos) {
          std::string r = pending_.substr(0, at);
          while (!r.empty() && r.back() == '\n') r.pop_back();
          reasoning_ += r;
          out.reasoning += r;
          pending_.erase(0, at + kThinkClose.size());
          mode_ = Mode::kContent;
          strip_leading_newlines_ = true;
          continue;
        }
        size_t keep = final ? 0 : PartialTagSuffix(pending_, kThinkClose);
        // Newlines before </think> are the template's, not the reasoning's: hold them until more text comes.
        while (!final && keep < pending_.size() && pending_[pending_.size() - keep - 1] == '\n') ++keep;
        std::string r = pending_.substr(0, pending_.size() - keep);
        reasoning_ += r;
        out.reasoning += r;
        pending_.erase(0, pending_.size() - keep);
        return;
      }
      case Mode::kContent: {
        size_t at = parse_tool_calls_ ? pending_.find(kToolOpen) : std::string::npos;
        if (at != std::string::npos) {
          std::string c = pending_.substr(0, at);
          if (!tool_calls_.empty()) c = TrimNewlines(c);  // glue between calls
          content_ += c;
          out.content += c;
          pending_.erase(0, at + kToolOpen.size());
          mode_ = Mode::kToolCall;
          continue;
        }
        size_t keep = final || !parse_tool_calls_ ? 0 : PartialTagSuffix(pending_, kToolOpen);
        std::string c = pending_.substr(0, pending_.size() - keep);
        // After a call only another call is expected; whitespace between calls is not content.
        if (!tool_calls_.empty() && c.find_first_not_of(" \n") == std::string::npos) {
          pending_.erase(0, c.size());
          return;
        }
        content_ += c;
        out.content += c;
        pending_.erase(0, c.size());
        return;
      }
      case Mode::kToolCall: {
        size_t at = pending_.find(kToolClose);
        if (at == std::string::npos) {
          if (final) {  // unclosed: give the text back as content
            std::string c = std::string(kToolOpen) + pending_;
            content_ += c;
            out.content += c;
            pending_.clear();
          }
          return;
        }
        ParsedToolCall call = ParseToolCall(pending_.substr(0, at));
        pending_.erase(0, at + kToolClose.size());
        mode_ = Mode::kContent;
        if (call.name.empty()) continue;
        tool_calls_.push_back(call);
        out.tool_calls.push_back(std::move(call));
        continue;
      }
    }
  }
}

ParsedToolCall OutputParser::ParseToolCall(const std::string& block) const {
  ParsedToolCall call;
  size_t f = block.find("<function=");
  if (f == std::string::npos) return call;
  size_t name_end = block.find('>', f);
  if (name_end == std::string::npos) return call;
  call.name = block.substr(f + 10, name_end - f - 10);
  size_t pos = name_end + 1;
  while (true) {
    size_t p = block.find("<parameter=", pos);
    if (p == std::string::npos) break;
    size_t pn_end = block.find('>', p);
    if (pn_end == std::string::npos) break;
    std::string param = block.substr(p + 11, pn_end - p - 11);
    size_t close = block.find("</parameter>", pn_end);
    size_t next = block.find("<parameter=", pn_end);
    size_t value_end = close;
    if (value_end == std::string::npos || (next != std::string::npos && next < value_end)) value_end = next;
    if (value_end == std::string::npos) value_end = block.find("</function>", pn_end);
    if (value_end == std::string::npos) value_end = block.size();
    std::string raw = block.substr(pn_end + 1, value_end - pn_end - 1);
    if (!raw.empty() && raw.front() == '\n') raw.erase(0, 1);
    if (!raw.empty() && raw.back() == '\n') raw.pop_back();
    call.arguments[param] = TypedValue(call.name, param, raw);
    pos = value_end == close ? close + 12 : value_end;
  }
  return call;
}

nlohmann::ordered_json OutputParser::TypedValue(const std::string& function, const std::string& parameter, const std::string& raw) const {
  std::string type;
  if (tools_.is_array()) {
    for (const auto& tool : tools_) {
      const auto& fn = tool.contains("function") ? tool["function"] : tool;
      if (!fn.is_object() || fn.value("name", "") != function) continue;
      if (fn.contains("parameters") && fn["parameters"].is_object() && fn["parameters"].contains("properties")) {
        const auto& props = fn["parameters"]["properties"];
        if (props.is_object() && props.contains(parameter) && props[parameter].is_object() && props[parameter].contains("type") &&
            props[parameter]["type"].is_string())
          type = props[parameter]["type"].get<std::string>();
      }
    }
  }
  if (type == "string") return raw;
  auto parsed = nlohmann::ordered_json::parse(raw, nullptr, false);
  if (!parsed.is_discarded()) {
    if (type.empty() || type == "object" || type == "array" || type == "number" || type == "integer" || type == "boolean" || type == "null")
      return parsed;
  }
  if (type == "boolean") {
    if (raw == "True") return true;
    if (raw == "False") return false;
  }
  return raw;
}

}  // namespace anchorage
