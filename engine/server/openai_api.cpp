#include "engine/server/openai_api.h"

#include "engine/core/text_split.h"
#include "engine/text/unicode_text.h"

#include <algorithm>
#include <cmath>

namespace anchorage {

namespace {

using ojson = nlohmann::ordered_json;

struct Invalid {
  ApiError error;
};

[[noreturn]] void Reject(const std::string& param, const std::string& message, const std::string& code = "") {
  ApiError e;
  e.status = 400;
  e.message = message;
  e.param = param;
  e.code = code;
  throw Invalid{e};
}

double NumberIn(const ojson& body, const char* key, double lo, double hi, double fallback) {
  if (!body.contains(key) || body[key].is_null()) return fallback;
  const ojson& v = body[key];
  if (!v.is_number()) Reject(key, std::string("'") + key + "' must be a number, got " + v.dump());
  double x = v.get<double>();
  if (!(x >= lo && x <= hi)) Reject(key, std::string("'") + key + "' must be between " + ojson(lo).dump() + " and " + ojson(hi).dump() + ", got " + v.dump());
  return x;
}

std::optional<int64_t> IntegerIn(const ojson& body, const char* key, int64_t lo, int64_t hi) {
  if (!body.contains(key) || body[key].is_null()) return std::nullopt;
  const ojson& v = body[key];
  if (!v.is_number_integer()) Reject(key, std::string("'") + key + "' must be an integer, got " + v.dump());
  int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) Reject(key, std::string("'") + key + "' must be between " + std::to_string(lo) + " and " + std::to_string(hi) + ", got " + v.dump());
  return x;
}

bool BoolOf(const ojson& body, const char* key, bool fallback) {
  if (!body.contains(key) || body[key].is_null()) return fallback;
  if (!body[key].is_boolean()) Reject(key, std::string("'") + key + "' must be true or false, got " + body[key].dump());
  return body[key].get<bool>();
}

// Content as the template expects it: a string (text parts joined), or with images text and image parts in
// order, each image's URL appended to image_urls (images_off: why image parts are refused; empty: they are not).
ojson NormaliseContent(const ojson& content, const std::string& param, const std::string& images_off, std::vector<std::string>* image_urls) {
  if (content.is_null() || content.is_string()) return content;
  if (!content.is_array()) Reject(param, "'" + param + "' must be a string or an array of content parts");
  ojson parts = ojson::array();
  std::string text;
  bool has_image = false;
  for (size_t i = 0; i < content.size(); ++i) {
    const ojson& part = content[i];
    const std::string p = param + "[" + std::to_string(i) + "]";
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) Reject(p, "'" + p + "' must be an object with a 'type'");
    const std::string type = part["type"].get<std::string>();
    if (type == "image_url") {
      if (!images_off.empty()) Reject(p + ".type", "content part type 'image_url' is not supported: " + images_off);
      const ojson& image = part.value("image_url", ojson());
      const ojson url = image.is_object() ? image.value("url", ojson()) : image;
      if (!url.is_string() || url.get<std::string>().empty()) Reject(p + ".image_url.url", "'" + p + ".image_url.url' must be a non-empty string");
      if (!text.empty()) parts.push_back({{"type", "text"}, {"text", std::move(text)}});
      text.clear();
      parts.push_back({{"type", "image_url"}, {"image_url", {{"url", "#" + std::to_string(image_urls->size())}}}});
      image_urls->push_back(url.get<std::string>());
      has_image = true;
      continue;
    }
    if (type != "text") Reject(p + ".type", "content part type '" + type + "' is not supported (text and image_url)");
    if (!part.contains("text") || !part["text"].is_string()) Reject(p + ".text", "'" + p + ".text' must be a string");
    text += part["text"].get<std::string>();
  }
  if (!has_image) return text;
  if (!text.empty()) parts.push_back({{"type", "text"}, {"text", std::move(text)}});
  return parts;
}

// Over the cap, the oldest images are left out in steps of half the cap, each as kLeftOutImage, so the
// prompt before the first left-out image stays the same from turn to turn until the next step.
void CapImages(ojson& messages, std::vector<std::string>& image_urls, int64_t cap) {
  const int64_t count = static_cast<int64_t>(image_urls.size());
  if (cap <= 0 || count <= cap) return;
  const int64_t step = std::max<int64_t>(1, cap / 2);
  const int64_t left_out = (count - cap + step - 1) / step * step;
  int64_t seen = 0;
  for (ojson& m : messages) {
    if (!m["content"].is_array()) continue;
    for (ojson& part : m["content"])
      if (part.value("type", "") == "image_url" && seen++ < left_out) part = {{"type", "text"}, {"text", kLeftOutImage}};
  }
  image_urls.erase(image_urls.begin(), image_urls.begin() + left_out);
}

// The JSON Schema subset a tool's parameters may use, checked for shape (as OpenAI checks it).
void CheckSchema(const ojson& schema, const std::string& p) {
  if (schema.is_boolean()) return;
  if (!schema.is_object()) Reject(p, "'" + p + "' must be a JSON schema (an object), got " + std::string(schema.type_name()));
  static const char* kTypes[] = {"object", "array", "string", "number", "integer", "boolean", "null"};
  auto known_type = [](const ojson& t) {
    return t.is_string() && std::any_of(std::begin(kTypes), std::end(kTypes), [&](const char* k) { return t.get<std::string>() == k; });
  };
  if (schema.contains("type")) {
    const ojson& t = schema["type"];
    const bool ok = known_type(t) || (t.is_array() && !t.empty() && std::all_of(t.begin(), t.end(), known_type));
    if (!ok) Reject(p + ".type", "'" + p + ".type' must be one of object, array, string, number, integer, boolean, null (or an array of them), got " + t.dump());
  }
  for (const char* key : {"properties", "$defs", "definitions", "patternProperties"}) {
    if (!schema.contains(key)) continue;
    if (!schema[key].is_object()) Reject(p + "." + key, "'" + p + "." + key + "' must be an object of schemas");
    for (const auto& [name, sub] : schema[key].items()) CheckSchema(sub, p + "." + key + "." + name);
  }
  for (const char* key : {"anyOf", "oneOf", "allOf", "prefixItems"}) {
    if (!schema.contains(key)) continue;
    if (!schema[key].is_array() || schema[key].empty()) Reject(p + "." + key, "'" + p + "." + key + "' must be a non-empty array of schemas");
    for (size_t i = 0; i < schema[key].size(); ++i) CheckSchema(schema[key][i], p + "." + key + "[" + std::to_string(i) + "]");
  }
  for (const char* key : {"items", "not", "additionalProperties", "contains"}) {
    if (!schema.contains(key)) continue;
    if (std::string(key) == "items" && schema[key].is_array()) {
      for (size_t i = 0; i < schema[key].size(); ++i) CheckSchema(schema[key][i], p + ".items[" + std::to_string(i) + "]");
    } else {
      CheckSchema(schema[key], p + "." + key);
    }
  }
  if (schema.contains("required")) {
    const ojson& r = schema["required"];
    if (!r.is_array() || !std::all_of(r.begin(), r.end(), [](const ojson& x) { return x.is_string(); }))
      Reject(p + ".required", "'" + p + ".required' must be an array of property names");
  }
  if (schema.contains("enum") && !schema["enum"].is_array()) Reject(p + ".enum", "'" + p + ".enum' must be an array");
  if (schema.contains("description") && !schema["description"].is_string()) Reject(p + ".description", "'" + p + ".description' must be a string");
  for (const char* key : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})
    if (schema.contains(key) && !schema[key].is_number()) Reject(p + "." + key, "'" + p + "." + key + "' must be a number");
  for (const char* key : {"minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties"})
    if (schema.contains(key) && !(schema[key].is_number_unsigned() || (schema[key].is_number_integer() && schema[key].get<int64_t>() >= 0)))
      Reject(p + "." + key, "'" + p + "." + key + "' must be a non-negative integer");
  if (schema.contains("pattern") && !schema["pattern"].is_string()) Reject(p + ".pattern", "'" + p + ".pattern' must be a string");
}

ojson CheckTools(const ojson& tools) {
  if (!tools.is_array()) Reject("tools", "'tools' must be an array");
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& t = tools[i];
    const std::string p = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) Reject(p, "'" + p + "' must be an object");
    if (t.value("type", "function") != "function") Reject(p + ".type", "'" + p + ".type' must be 'function'");
    if (!t.contains("function") || !t["function"].is_object()) Reject(p + ".function", "'" + p + ".function' must be an object");
    const ojson& f = t["function"];
    if (!f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>().empty())
      Reject(p + ".function.name", "'" + p + ".function.name' must be a non-empty string");
    const std::string name = f["name"].get<std::string>();
    for (char c : name)
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.'))
        Reject(p + ".function.name", "tool name '" + name + "' may hold only letters, digits, '_', '-' and '.'");
    if (f.contains("parameters") && !f["parameters"].is_null()) {
      const ojson& params = f["parameters"];
      if (!params.is_object()) Reject(p + ".function.parameters", "'" + p + ".function.parameters' must be a JSON schema object");
      if (params.contains("type") && params["type"] != "object")
        Reject(p + ".function.parameters.type", "invalid schema for function '" + name + "': the parameters must be a schema of type \"object\", got " + params["type"].dump());
      CheckSchema(params, p + ".function.parameters");
    }
    if (f.contains("description") && !f["description"].is_null() && !f["description"].is_string())
      Reject(p + ".function.description", "'" + p + ".function.description' must be a string");
  }
  return tools;
}

ojson CheckMessages(const ojson& messages, const std::string& images_off, std::vector<std::string>* image_urls) {
  if (!messages.is_array()) Reject("messages", "'messages' must be an array");
  if (messages.empty()) Reject("messages", "'messages' must hold at least one message");
  ojson out = ojson::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const ojson& m = messages[i];
    const std::string p = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) Reject(p, "'" + p + "' must be an object");
    if (!m.contains("role") || !m["role"].is_string()) Reject(p + ".role", "'" + p + ".role' must be a string");
    std::string role = m["role"].get<std::string>();
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant" && role != "tool")
      Reject(p + ".role", "unknown role '" + role + "' (system, developer, user, assistant or tool)");
    ojson msg = m;
    msg["role"] = role;
    if (!m.contains("content") && !(role == "assistant" && m.contains("tool_calls")))
      Reject(p + ".content", "'" + p + ".content' is required");
    msg["content"] = NormaliseContent(m.value("content", ojson()), p + ".content", images_off, image_urls);
    if (msg["content"].is_null()) msg["content"] = "";
    if (role == "tool" && (!m.contains("tool_call_id") || !m["tool_call_id"].is_string() || m["tool_call_id"].get<std::string>().empty()))
      Reject(p + ".tool_call_id", "'" + p + ".tool_call_id' is required: a tool message answers the tool call with that id");
    if (m.contains("reasoning_content") && !m["reasoning_content"].is_null() && !m["reasoning_content"].is_string())
      Reject(p + ".reasoning_content", "'" + p + ".reasoning_content' must be a string");
    if (m.contains("reasoning") && m["reasoning"].is_string() && !m.contains("reasoning_content"))
      msg["reasoning_content"] = m["reasoning"];
    if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      if (role != "assistant") Reject(p + ".tool_calls", "only assistant messages carry tool_calls");
      if (!m["tool_calls"].is_array()) Reject(p + ".tool_calls", "'" + p + ".tool_calls' must be an array");
      ojson calls = ojson::array();
      for (size_t j = 0; j < m["tool_calls"].size(); ++j) {
        const std::string q = p + ".tool_calls[" + std::to_string(j) + "]";
        ojson call = m["tool_calls"][j];
        if (!call.is_object() || !call.contains("function") || !call["function"].is_object()) Reject(q, "'" + q + ".function' must be an object");
        ojson& fn = call["function"];
        if (!fn.contains("name") || !fn["name"].is_string()) Reject(q + ".function.name", "'" + q + ".function.name' must be a string");
        if (fn.contains("arguments") && fn["arguments"].is_string()) {
          // The template iterates arguments as a mapping; OpenAI sends them as a JSON string.
          ojson args = ojson::parse(fn["arguments"].get<std::string>(), nullptr, false);
          if (args.is_discarded() || !args.is_object())
            Reject(q + ".function.arguments", "'" + q + ".function.arguments' must be a JSON object encoded as a string");
          fn["arguments"] = args;
        } else if (fn.contains("arguments") && !fn["arguments"].is_object() && !fn["arguments"].is_null()) {
          Reject(q + ".function.arguments", "'" + q + ".function.arguments' must be a JSON object encoded as a string");
        }
        calls.push_back(call);
      }
      msg["tool_calls"] = calls;
    }
    out.push_back(std::move(msg));
  }
  return out;
}

void ParseSampling(const ojson& body, CompletionRequest& r) {
  SamplingParams& s = r.sampling;
  s.temperature = static_cast<float>(NumberIn(body, "temperature", 0.0, 2.0, 1.0));
  s.top_p = static_cast<float>(NumberIn(body, "top_p", 0.0, 1.0, 1.0));
  if (body.contains("top_p") && body["top_p"].is_number() && body["top_p"].get<double>() <= 0.0) Reject("top_p", "'top_p' must be greater than 0");
  s.min_p = static_cast<float>(NumberIn(body, "min_p", 0.0, 1.0, 0.0));
  s.presence_penalty = static_cast<float>(NumberIn(body, "presence_penalty", -2.0, 2.0, 0.0));
  s.frequency_penalty = static_cast<float>(NumberIn(body, "frequency_penalty", -2.0, 2.0, 0.0));
  s.repetition_penalty = static_cast<float>(NumberIn(body, "repetition_penalty", 0.01, 10.0, 1.0));
  if (auto k = IntegerIn(body, "top_k", -1, 1 << 30)) s.top_k = *k < 0 ? 0 : static_cast<int>(*k);
  if (auto seed = IntegerIn(body, "seed", INT64_MIN, INT64_MAX)) s.seed = static_cast<uint64_t>(*seed);
  std::optional<int64_t> max_tokens = IntegerIn(body, "max_completion_tokens", 1, INT32_MAX);
  if (!max_tokens) max_tokens = IntegerIn(body, "max_tokens", 1, INT32_MAX);
  if (max_tokens) { s.max_tokens = *max_tokens; r.max_tokens_given = true; }
  if (auto n = IntegerIn(body, "n", 1, 1)) (void)n;
  if (body.contains("stop") && !body["stop"].is_null()) {
    const ojson& stop = body["stop"];
    if (stop.is_string()) {
      if (!stop.get<std::string>().empty()) s.stop_strings.push_back(stop.get<std::string>());
    } else if (stop.is_array()) {
      if (stop.size() > 16) Reject("stop", "'stop' may hold at most 16 strings");
      for (const ojson& x : stop) {
        if (!x.is_string()) Reject("stop", "'stop' must be a string or an array of strings");
        if (!x.get<std::string>().empty()) s.stop_strings.push_back(x.get<std::string>());
      }
    } else {
      Reject("stop", "'stop' must be a string or an array of strings");
    }
  }
  if (body.contains("logprobs") && body["logprobs"].is_number_integer() && r.kind == RequestKind::kCompletion) {
    int64_t n = body["logprobs"].get<int64_t>();
    if (n < 0 || n > 20) Reject("logprobs", "'logprobs' must be between 0 and 20");
    r.logprobs = true;
    r.top_logprobs = static_cast<int>(n);
  } else {
    r.logprobs = BoolOf(body, "logprobs", false);
    if (auto n = IntegerIn(body, "top_logprobs", 0, 20)) {
      if (!r.logprobs) Reject("top_logprobs", "'top_logprobs' needs 'logprobs': true");
      r.top_logprobs = static_cast<int>(*n);
    }
  }
  s.logprobs = r.top_logprobs;
  r.stream = BoolOf(body, "stream", false);
  if (body.contains("stream_options") && !body["stream_options"].is_null()) {
    if (!body["stream_options"].is_object()) Reject("stream_options", "'stream_options' must be an object");
    r.include_usage = BoolOf(body["stream_options"], "include_usage", false);
  }
}

// logit_bias: {"token id": bias in [-100, 100]}, ids inside the vocabulary.
void ParseLogitBias(const ojson& body, int64_t vocab_size, SamplingParams& s) {
  if (!body.contains("logit_bias") || body["logit_bias"].is_null()) return;
  const ojson& bias = body["logit_bias"];
  if (!bias.is_object()) Reject("logit_bias", "'logit_bias' must be an object mapping token ids to numbers, got " + std::string(bias.type_name()));
  if (bias.size() > 1024) Reject("logit_bias", "'logit_bias' may hold at most 1024 entries");
  for (const auto& [key, value] : bias.items()) {
    const bool digits = !key.empty() && key.size() <= 10 && std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!digits) Reject("logit_bias", "'logit_bias' keys must be token ids (decimal integers), got '" + key + "'");
    const int64_t id = std::stoll(key);
    if (id >= vocab_size) Reject("logit_bias", "'logit_bias' token id " + key + " is outside the vocabulary (0.." + std::to_string(vocab_size - 1) + ")");
    if (!value.is_number()) Reject("logit_bias", "'logit_bias[" + key + "]' must be a number, got " + value.dump());
    const double b = value.get<double>();
    if (!(b >= -100.0 && b <= 100.0)) Reject("logit_bias", "'logit_bias[" + key + "]' must be between -100 and 100, got " + value.dump());
    s.logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(b));
  }
}

// response_format: {"type": "text" | "json_object" | "json_schema", "json_schema": {...}}.
void CheckResponseFormat(const ojson& body) {
  if (!body.contains("response_format") || body["response_format"].is_null()) return;
  const ojson& f = body["response_format"];
  if (!f.is_object()) Reject("response_format", "'response_format' must be an object such as {\"type\": \"text\"}, got " + std::string(f.type_name()));
  if (!f.contains("type") || !f["type"].is_string()) Reject("response_format.type", "'response_format.type' must be 'text', 'json_object' or 'json_schema'");
  const std::string type = f["type"].get<std::string>();
  if (type == "text" || type == "json_object") return;
  if (type != "json_schema") Reject("response_format.type", "'response_format.type' must be 'text', 'json_object' or 'json_schema', got '" + type + "'");
  if (!f.contains("json_schema") || !f["json_schema"].is_object()) Reject("response_format.json_schema", "'response_format.json_schema' must be an object with a 'name' and a 'schema'");
  const ojson& js = f["json_schema"];
  if (!js.contains("name") || !js["name"].is_string() || js["name"].get<std::string>().empty())
    Reject("response_format.json_schema.name", "'response_format.json_schema.name' must be a non-empty string");
  if (js.contains("schema")) CheckSchema(js["schema"], "response_format.json_schema.schema");
  if (js.contains("strict") && !js["strict"].is_null() && !js["strict"].is_boolean()) Reject("response_format.json_schema.strict", "'response_format.json_schema.strict' must be true or false");
}

}  // namespace

nlohmann::json ApiError::ToJson() const {
  nlohmann::json e = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) e["param"] = param;
  if (!code.empty()) e["code"] = code;
  return {{"error", e}};
}

std::string SessionOfBody(const nlohmann::ordered_json& body) {
  // OpenAI's "user" names an end user, not a conversation: it is not a session.
  for (const char* key : {"conversation_id", "session_id", "session"})
    if (body.contains(key) && body[key].is_string() && !body[key].get<std::string>().empty()) return body[key].get<std::string>();
  return "";
}

size_t JsonNestingDepth(std::string_view text, size_t limit, std::string* field) {
  // Per open container: an object's current key, or an array's current index.
  struct Level {
    bool object = false;
    bool expects_key = false;
    std::string key;
    size_t index = 0;
  };
  std::vector<Level> open;
  size_t deepest = 0;
  // Where the nesting went too deep, from the root: keys and indices down to the first array of arrays.
  auto path = [&] {
    std::string out;
    for (size_t l = 0; l + 1 < open.size() && l < 12; ++l) {
      if (open[l].object) {
        out += (out.empty() ? "" : ".") + open[l].key;
      } else {
        if (!open[l + 1].object) break;
        out += "[" + std::to_string(open[l].index) + "]";
      }
    }
    return out;
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '"') {
      const size_t start = i + 1;
      for (++i; i < text.size() && text[i] != '"'; ++i)
        if (text[i] == '\\') ++i;
      if (!open.empty() && open.back().expects_key) open.back().key = std::string(text.substr(start, std::min<size_t>(i - start, 64)));
    } else if (c == ':') {
      if (!open.empty()) open.back().expects_key = false;
    } else if (c == ',') {
      if (!open.empty()) {
        open.back().expects_key = open.back().object;
        ++open.back().index;
      }
    } else if (c == '[' || c == '{') {
      open.push_back({c == '{', c == '{', "", 0});
      deepest = std::max(deepest, open.size());
      if (deepest > limit) {
        if (field != nullptr) *field = path();
        return deepest;
      }
    } else if ((c == ']' || c == '}') && !open.empty()) {
      open.pop_back();
    }
  }
  return deepest;
}

bool ParseJsonBody(std::string_view body_text, ojson* body, ApiError* error) {
  if (IsBlank(body_text)) {
    *error = {400, "the request body is empty; send a JSON object (Content-Type: application/json)", "invalid_request_error", "", "empty_body"};
    return false;
  }
  if (const size_t bad = unicode::FindInvalidUtf8(body_text); bad != body_text.size()) {
    *error = {400, "the request body is not valid UTF-8 (first bad byte at offset " + std::to_string(bad) + ")", "invalid_request_error", "", "invalid_utf8"};
    return false;
  }
  if (std::string field; JsonNestingDepth(body_text, kMaxJsonDepth, &field) > kMaxJsonDepth) {
    *error = {400, "the request body nests arrays and objects deeper than " + std::to_string(kMaxJsonDepth) + " levels" + (field.empty() ? "" : " in '" + field + "'"),
              "invalid_request_error", field, "json_too_deep"};
    return false;
  }
  *body = ojson::parse(body_text, nullptr, false);
  if (body->is_discarded()) {
    try {
      [[maybe_unused]] ojson unused = ojson::parse(body_text);
    } catch (const ojson::parse_error& e) {
      *error = {400, std::string("could not parse the JSON body of the request: ") + e.what(), "invalid_request_error", "", "invalid_json"};
      return false;
    }
    *error = {400, "could not parse the JSON body of the request", "invalid_request_error", "", "invalid_json"};
    return false;
  }
  if (!body->is_object()) {
    *error = {400, "the request body must be a JSON object, got " + std::string(body->type_name()), "invalid_request_error", "", "invalid_json"};
    return false;
  }
  return true;
}

std::optional<CompletionRequest> ParseCompletionRequest(RequestKind kind, std::string_view body_text, const ParseOptions& options,
                                                        ApiError* error) {
  ojson body;
  if (!ParseJsonBody(body_text, &body, error)) return std::nullopt;
  try {
    CompletionRequest r;
    r.kind = kind;
    if (body.contains("model") && !body["model"].is_null()) {
      if (!body["model"].is_string()) Reject("model", "'model' must be a string");
      r.model = body["model"].get<std::string>();
      const bool known = r.model == options.model_id || std::find(options.aliases.begin(), options.aliases.end(), r.model) != options.aliases.end();
      if (!r.model.empty() && !known && options.strict_model_names) {
        ApiError e{404, "the model '" + r.model + "' does not exist; this server serves '" + options.model_id + "'", "invalid_request_error", "model", "model_not_found"};
        throw Invalid{e};
      }
    }
    r.model = options.model_id;  // one model is loaded: any name (unless strict) is served by it
    ParseSampling(body, r);
    ParseLogitBias(body, options.vocab_size, r.sampling);
    CheckResponseFormat(body);
    r.session = SessionOfBody(body);
    if (kind == RequestKind::kChat) {
      if (!body.contains("messages")) Reject("messages", "'messages' is required");
      r.template_body["messages"] = CheckMessages(body["messages"], options.images_off, &r.image_urls);
      CapImages(r.template_body["messages"], r.image_urls, options.max_images);
      std::string tool_choice = "auto";
      std::string named_function;
      if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
        const ojson& tc = body["tool_choice"];
        if (tc.is_string()) {
          tool_choice = tc.get<std::string>();
          if (tool_choice != "none" && tool_choice != "auto" && tool_choice != "required")
            Reject("tool_choice", "'tool_choice' must be 'none', 'auto', 'required' or a function, got '" + tool_choice + "'");
        } else if (!tc.is_object() || tc.value("type", "function") != "function" || !tc.contains("function") || !tc["function"].is_object() ||
                   !tc["function"].contains("name") || !tc["function"]["name"].is_string()) {
          Reject("tool_choice", "'tool_choice' must be 'none', 'auto', 'required' or {\"type\": \"function\", \"function\": {\"name\": ...}}");
        } else {
          tool_choice = "function";
          named_function = tc["function"]["name"].get<std::string>();
        }
      }
      if (body.contains("tools") && !body["tools"].is_null()) r.tools = CheckTools(body["tools"]);
      if (tool_choice == "required" && r.tools.empty()) Reject("tool_choice", "'tool_choice' is 'required' but the request sends no tools");
      if (tool_choice == "function") {
        const bool listed = std::any_of(r.tools.begin(), r.tools.end(), [&](const ojson& t) { return t["function"]["name"] == named_function; });
        if (!listed) Reject("tool_choice", "'tool_choice' names the function '" + named_function + "', which is not in 'tools'");
      }
      if (tool_choice != "none" && !r.tools.empty()) {
        r.template_body["tools"] = r.tools;
        r.parse_tool_calls = true;
      }
      if (body.contains("parallel_tool_calls") && !body["parallel_tool_calls"].is_null() && !body["parallel_tool_calls"].is_boolean())
        Reject("parallel_tool_calls", "'parallel_tool_calls' must be true or false");
      if (body.contains("chat_template_kwargs") && !body["chat_template_kwargs"].is_null()) {
        if (!body["chat_template_kwargs"].is_object()) Reject("chat_template_kwargs", "'chat_template_kwargs' must be an object");
        r.template_body["chat_template_kwargs"] = body["chat_template_kwargs"];
      }
    } else {
      if (!body.contains("prompt") || body["prompt"].is_null()) Reject("prompt", "'prompt' is required");
      const ojson& p = body["prompt"];
      if (p.is_string()) {
        r.prompt_text = p.get<std::string>();
        if (r.prompt_text.empty()) Reject("prompt", "'prompt' must not be empty");
      } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
        r.prompt_text = p[0].get<std::string>();
        if (r.prompt_text.empty()) Reject("prompt", "'prompt' must not be empty");
      } else if (p.is_array()) {
        if (p.empty()) Reject("prompt", "'prompt' must not be empty");
        r.prompt_is_ids = true;
        for (const ojson& id : p) {
          if (!id.is_number_integer()) Reject("prompt", "'prompt' must be a string, or an array of token ids (one prompt per request)");
          int64_t v = id.get<int64_t>();
          if (v < 0 || v >= options.vocab_size) Reject("prompt", "token id " + std::to_string(v) + " is outside the vocabulary (0.." + std::to_string(options.vocab_size - 1) + ")");
          r.prompt_ids.push_back(static_cast<int32_t>(v));
        }
      } else {
        Reject("prompt", "'prompt' must be a string or an array of token ids");
      }
    }
    return r;
  } catch (const Invalid& invalid) {
    *error = invalid.error;
    return std::nullopt;
  }
}

}  // namespace anchorage
