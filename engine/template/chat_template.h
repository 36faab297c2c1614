// A checkpoint's own chat template, run by the Jinja interpreter as transformers renders it.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "engine/core/status.h"
#include "engine/template/jinja.h"

namespace anchorage {

class ChatTemplate {
 public:
  // Reads dir/chat_template.jinja, else chat_template from dir/tokenizer_config.json.
  static Result<ChatTemplate> Load(const std::string& model_dir);
  // `name` names the template in errors (unsupported syntax names its line).
  static Result<ChatTemplate> Parse(const std::string& source, const std::string& name);

  // Renders an OpenAI chat body (messages, tools, chat_template_kwargs) with add_generation_prompt.
  // Tool-call arguments given as JSON text of an object are parsed first, as vLLM and SGLang do.
  Result<std::string> RenderChatBody(const nlohmann::ordered_json& body) const;

  // Renders with `context` as the template's top-level variables (bos_token/eos_token are not added).
  Result<std::string> Render(const nlohmann::ordered_json& context) const;

  // Special tokens from tokenizer_config.json ("" when absent); the template sees them when non-empty.
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }
  void set_special_tokens(std::string bos_token, std::string eos_token);
  const std::string& name() const { return template_.name(); }

 private:
  jinja::Template template_;
  std::string bos_token_;
  std::string eos_token_;
};

}  // namespace anchorage
