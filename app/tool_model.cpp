// anchorage-tool commands over model folders: make-model, tokenize, detokenize, render, inspect.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "app/tool_args.h"
#include "engine/core/file_util.h"
#include "engine/template/chat_template.h"
#include "engine/model/fingerprint.h"
#include "engine/model/model_config.h"
#include "engine/model/safetensors.h"
#include "engine/model/tiny_model.h"
#include "engine/text/tokenizer.h"
#include "engine/model/weights.h"

namespace anchorage::tool {

ParsedArgs ParseArgs(const Args& args, const std::set<std::string>& value_flags, const std::set<std::string>& switch_flags) {
  ParsedArgs p;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0) {
      p.positional.push_back(a);
    } else if (value_flags.count(a)) {
      if (i + 1 >= args.size()) {
        p.error = "flag " + a + " needs a value";
        return p;
      }
      p.values[a] = args[++i];
    } else if (switch_flags.count(a)) {
      p.switches.insert(a);
    } else {
      p.error = "unknown flag " + a;
      return p;
    }
  }
  return p;
}

std::string ReadStdin() { return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>()); }

namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "anchorage-tool: %s\n", message.c_str());
  return 1;
}

int Usage(const std::string& message) {
  std::fprintf(stderr, "anchorage-tool: %s\n", message.c_str());
  return 2;
}

Result<Tokenizer> LoadTokenizerFrom(const std::string& dir) {
  return Tokenizer::Load((std::filesystem::path(dir) / "tokenizer.json").string());
}

}  // namespace

int MakeModel(const Args& args) {
  ParsedArgs p = ParseArgs(args, {"--size", "--seed", "--tokenizer-of", "--dtype"}, {});
  if (!p.error.empty()) return Usage(p.error);
  if (p.positional.size() != 1) return Usage("make-model needs one output folder");
  auto size = ParseTinyModelSize(p.Get("--size").value_or("tiny"));
  if (!size.ok()) return Usage(size.status().message());
  uint64_t seed = 0;
  try {
    seed = std::stoull(p.Get("--seed").value_or("0"));
  } catch (...) {
    return Usage("--seed must be a non-negative integer");
  }
  std::optional<TinyModelSize> tokenizer_of;
  if (auto name = p.Get("--tokenizer-of")) {
    auto parsed = ParseTinyModelSize(*name);
    if (!parsed.ok()) return Usage("--tokenizer-of: " + parsed.status().message());
    tokenizer_of = *parsed;
  }
  auto dtype = ParseGeneratedDtype(p.Get("--dtype").value_or("bf16"));
  if (!dtype.ok()) return Usage("--dtype: " + dtype.status().message());
  Status s = GenerateTinyModel(*size, seed, p.positional[0], tokenizer_of, *dtype);
  if (!s.ok()) return Fail(s.ToString());
  std::printf("wrote %s\n", p.positional[0].c_str());
  return 0;
}

int Tokenize(const Args& args) {
  ParsedArgs p = ParseArgs(args, {"--model"}, {"--no-special"});
  if (!p.error.empty()) return Usage(p.error);
  if (!p.Get("--model")) return Usage("tokenize needs --model DIR");
  auto tok = LoadTokenizerFrom(*p.Get("--model"));
  if (!tok.ok()) return Fail(tok.status().ToString());
  auto ids = tok->Encode(ReadStdin(), !p.Has("--no-special"));
  if (!ids.ok()) return Fail(ids.status().ToString());
  std::printf("%s\n", nlohmann::json(*ids).dump().c_str());
  return 0;
}

int Detokenize(const Args& args) {
  ParsedArgs p = ParseArgs(args, {"--model"}, {"--skip-special"});
  if (!p.error.empty()) return Usage(p.error);
  if (!p.Get("--model")) return Usage("detokenize needs --model DIR");
  auto tok = LoadTokenizerFrom(*p.Get("--model"));
  if (!tok.ok()) return Fail(tok.status().ToString());
  nlohmann::json ids = nlohmann::json::parse(ReadStdin(), nullptr, false);
  if (ids.is_discarded() || !ids.is_array()) return Fail("stdin must hold a JSON array of token ids");
  std::vector<int32_t> v;
  for (const auto& id : ids) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= tok->vocab_size())
      return Fail("token id " + id.dump() + " is not in the vocabulary (0.." + std::to_string(tok->vocab_size() - 1) + ")");
    v.push_back(id.get<int32_t>());
  }
  std::fputs(tok->Decode(v, p.Has("--skip-special")).c_str(), stdout);
  return 0;
}

int Render(const Args& args) {
  ParsedArgs p = ParseArgs(args, {"--model"}, {});
  if (!p.error.empty()) return Usage(p.error);
  if (!p.Get("--model")) return Usage("render needs --model DIR");
  auto tmpl = ChatTemplate::Load(*p.Get("--model"));
  if (!tmpl.ok()) return Fail(tmpl.status().ToString());
  nlohmann::ordered_json body = nlohmann::ordered_json::parse(ReadStdin(), nullptr, false);
  if (body.is_discarded() || !body.is_object()) return Fail("stdin must hold a JSON object (an OpenAI chat body)");
  auto text = tmpl->RenderChatBody(body);
  if (!text.ok()) return Fail(text.status().ToString());
  std::fputs(text->c_str(), stdout);
  return 0;
}

int Inspect(const Args& args) {
  namespace fs = std::filesystem;
  ParsedArgs p = ParseArgs(args, {}, {});
  if (!p.error.empty()) return Usage(p.error);
  if (p.positional.size() != 1) return Usage("inspect needs one model folder");
  const std::string dir = p.positional[0];
  if (!IsDirectory(dir)) return Fail("model folder " + dir + " does not exist");
  auto config = LoadModelConfig((fs::path(dir) / "config.json").string());
  if (!config.ok()) return Fail(config.status().ToString());
  auto set = SafetensorsSet::OpenDirectory(dir);
  if (!set.ok()) return Fail(set.status().ToString());
  auto weights = MapWeights(*config, *set);
  if (!weights.ok()) return Fail(weights.status().ToString());

  nlohmann::ordered_json out;
  out["folder"] = dir;
  out["config"] = config->ToJson();
  out["derived"] = {{"linear_attention_layers", config->num_linear_attention_layers()},
                    {"full_attention_layers", config->num_full_attention_layers()},
                    {"conv_dim", config->conv_dim()},
                    {"rotary_dim", config->rotary_dim()},
                    {"anchor_bytes", config->anchor_bytes()},
                    {"kv_bytes_per_token", config->kv_bytes_per_token()}};
  nlohmann::ordered_json tensors = nlohmann::ordered_json::array();
  uint64_t text_params = 0, vision_params = 0, vision_tensors = 0, mtp_tensors = 0;
  for (const auto& [name, t] : set->tensors()) {
    tensors.push_back({{"name", name}, {"dtype", DTypeName(t.dtype)}, {"shape", t.shape}, {"bytes", t.bytes}, {"file", t.file}});
    if (name.rfind("model.visual.", 0) == 0) vision_params += static_cast<uint64_t>(t.numel()), ++vision_tensors;
    else if (name.rfind("mtp.", 0) == 0) ++mtp_tensors;
    else text_params += static_cast<uint64_t>(t.numel());
  }
  out["tensors"] = tensors;
  out["tensor_count"] = set->tensors().size();
  out["text_parameters"] = text_params;
  out["mtp_tensors"] = mtp_tensors;
  if (weights->vision) {
    const VisionConfig& v = *config->vision;
    out["vision"] = {{"tower", "ready"},
                     {"config", v.ToJson()},
                     {"tensors", vision_tensors},
                     {"parameters", vision_params},
                     {"head_dim", v.head_dim()},
                     {"pixels_a_row", v.pixel_factor() * v.pixel_factor()},
                     {"image_token_id", v.image_token_id}};
  } else {
    out["vision"] = {{"tower", "none"}, {"why", weights->vision_note}, {"tensors", vision_tensors}};
  }
  out["bytes"] = set->total_bytes();
  out["files"] = set->files();
  auto tok = LoadTokenizerFrom(dir);
  if (tok.ok()) out["tokenizer"] = {{"vocab_size", tok->vocab_size()}, {"sha256", tok->sha256()}};
  else out["tokenizer"] = {{"error", tok.status().ToString()}};
  auto tmpl = ChatTemplate::Load(dir);
  out["chat_template"] = tmpl.ok() ? nlohmann::ordered_json("ok") : nlohmann::ordered_json(tmpl.status().ToString());
  auto fp = ComputeModelFingerprint(dir, set->files());
  if (!fp.ok()) return Fail(fp.status().ToString());
  out["fingerprint"] = *fp;
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

}  // namespace anchorage::tool
