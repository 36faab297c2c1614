#include "engine/template/chat_template.h"

#include <utility>

#include "engine/core/file_util.h"

namespace anchorage {

namespace {

std::string JoinPath(const std::string& dir, const std::string& file) {
  if (dir.empty() || dir.back() == '/') return dir + file;
  return dir + "/" + file;
}

// A special token given as a string or as an AddedToken object {"content": ...}; "" otherwise.
std::string SpecialToken(const nlohmann::ordered_json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto content = it->find("content");
    if (content != it->end() && content->is_string()) return content->get<std::string>();
  }
  return "";
}

// The template from a tokenizer_config.json "chat_template" value: a string or a list of {name, template}.
Result<std::string> TemplateFromConfigValue(const nlohmann::ordered_json& value, const std::string& path) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_array()) {
    for (const auto& entry : value) {
      if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
          entry["template"].is_string()) {
        return entry["template"].get<std::string>();
      }
    }
    return NotFound("chat template: " + path + " lists named chat templates but none named \"default\"");
  }
  return InvalidArgument("chat template: " + path + ": chat_template must be a string or a list of {name, template}");
}

// OpenAI bodies carry tool-call arguments as JSON text; templates expect objects, so text holding a JSON
// object is parsed in place (as vLLM and SGLang do). Other values are left as given.
void ParseToolCallArguments(nlohmann::ordered_json& messages) {
  for (auto& message : messages) {
    if (!message.is_object()) continue;
    auto calls = message.find("tool_calls");
    if (calls == message.end() || !calls->is_array()) continue;
    for (auto& call : *calls) {
      if (!call.is_object()) continue;
      auto function = call.find("function");
      nlohmann::ordered_json& holder = (function != call.end() && function->is_object()) ? *function : call;
      auto arguments = holder.find("arguments");
      if (arguments == holder.end() || !arguments->is_string()) continue;
      auto parsed = nlohmann::ordered_json::parse(arguments->get<std::string>(), nullptr, /*allow_exceptions=*/false);
      if (!parsed.is_discarded() && parsed.is_object()) *arguments = std::move(parsed);
    }
  }
}

}  // namespace

Result<ChatTemplate> ChatTemplate::Parse(const std::string& source, const std::string& name) {
  ASSIGN_OR_RETURN(jinja::Template parsed, jinja::Template::Parse(source, name));
  ChatTemplate t;
  t.template_ = std::move(parsed);
  return t;
}

void ChatTemplate::set_special_tokens(std::string bos_token, std::string eos_token) {
  bos_token_ = std::move(bos_token);
  eos_token_ = std::move(eos_token);
}

Result<ChatTemplate> ChatTemplate::Load(const std::string& model_dir) {
  const std::string jinja_path = JoinPath(model_dir, "chat_template.jinja");
  const std::string config_path = JoinPath(model_dir, "tokenizer_config.json");
  nlohmann::ordered_json config = nlohmann::ordered_json::object();
  if (FileExists(config_path)) {
    ASSIGN_OR_RETURN(std::string text, ReadFile(config_path));
    config = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object()) {
      return Corrupt("chat template: " + config_path + " is not a JSON object");
    }
  }
  std::string source;
  std::string name;
  if (FileExists(jinja_path)) {
    ASSIGN_OR_RETURN(source, ReadFile(jinja_path));
    name = jinja_path;
  } else if (config.contains("chat_template")) {
    ASSIGN_OR_RETURN(source, TemplateFromConfigValue(config["chat_template"], config_path));
    name = config_path + " (chat_template)";
  } else {
    const std::string json_path = JoinPath(model_dir, "chat_template.json");
    if (!FileExists(json_path)) {
      return NotFound("chat template: neither " + jinja_path + " nor a chat_template in " + config_path);
    }
    ASSIGN_OR_RETURN(std::string text, ReadFile(json_path));
    auto json = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (json.is_discarded() || !json.is_object() || !json.contains("chat_template")) {
      return Corrupt("chat template: " + json_path + " has no chat_template");
    }
    ASSIGN_OR_RETURN(source, TemplateFromConfigValue(json["chat_template"], json_path));
    name = json_path;
  }
  ASSIGN_OR_RETURN(ChatTemplate t, Parse(source, name));
  t.set_special_tokens(SpecialToken(config, "bos_token"), SpecialToken(config, "eos_token"));
  return t;
}

Result<std::string> ChatTemplate::Render(const nlohmann::ordered_json& context) const {
  return template_.Render(context);
}

Result<std::string> ChatTemplate::RenderChatBody(const nlohmann::ordered_json& body) const {
  if (!body.is_object()) return InvalidArgument("chat template " + name() + ": request body must be a JSON object");
  auto messages = body.find("messages");
  if (messages == body.end() || !messages->is_array()) {
    return InvalidArgument("chat template " + name() + ": request body needs a \"messages\" array");
  }
  nlohmann::ordered_json context = nlohmann::ordered_json::object();
  context["messages"] = *messages;
  ParseToolCallArguments(context["messages"]);
  auto tools = body.find("tools");
  context["tools"] = (tools != body.end()) ? *tools : nlohmann::ordered_json(nullptr);
  context["documents"] = nullptr;
  context["add_generation_prompt"] = true;
  if (!bos_token_.empty()) context["bos_token"] = bos_token_;
  if (!eos_token_.empty()) context["eos_token"] = eos_token_;
  auto kwargs = body.find("chat_template_kwargs");
  if (kwargs != body.end() && !kwargs->is_null()) {
    if (!kwargs->is_object()) {
      return InvalidArgument("chat template " + name() + ": chat_template_kwargs must be a JSON object");
    }
    for (auto it = kwargs->begin(); it != kwargs->end(); ++it) {
      if (it.key() == "messages" || it.key() == "tools") {
        return InvalidArgument("chat template " + name() + ": chat_template_kwargs may not set \"" + it.key() + "\"");
      }
      context[it.key()] = it.value();
    }
  }
  return template_.Render(context);
}

}  // namespace anchorage
