// anchorage-tool generate and logits: run the CPU engine on a model folder from the command line.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "app/tool_args.h"
#include "app/tool_commands.h"
#include "engine/model/model.h"
#include "engine/runtime/forward.h"
#include "engine/runtime/generator.h"

namespace anchorage::tool {
namespace {

struct RuntimeFlags {
  std::string model_dir;
  std::string ids_file;
  int64_t max_tokens = 128;
  float temperature = 0.0f;
  uint64_t seed = 0;
  int threads = 0;
  int64_t grid = 1024;
};

// Reads the flags through the shared parser; returns false (after printing why) on a bad flag or value.
bool ParseFlags(const Args& args, RuntimeFlags& f) {
  const ParsedArgs p = ParseArgs(
      args, {"--model", "--ids", "--max-tokens", "--temperature", "--seed", "--threads", "--grid"}, {});
  if (!p.error.empty()) {
    std::fprintf(stderr, "%s\n", p.error.c_str());
    return false;
  }
  f.model_dir = p.Get("--model").value_or("");
  f.ids_file = p.Get("--ids").value_or("");
  for (const char* name : {"--max-tokens", "--temperature", "--seed", "--threads", "--grid"}) {
    const auto v = p.Get(name);
    if (!v) continue;
    char* end = nullptr;
    const std::string flag = name;
    if (flag == "--max-tokens") f.max_tokens = std::strtoll(v->c_str(), &end, 10);
    else if (flag == "--temperature") f.temperature = std::strtof(v->c_str(), &end);
    else if (flag == "--seed") f.seed = std::strtoull(v->c_str(), &end, 10);
    else if (flag == "--threads") f.threads = static_cast<int>(std::strtol(v->c_str(), &end, 10));
    else f.grid = std::strtoll(v->c_str(), &end, 10);
    if (v->empty() || *end != '\0') {
      std::fprintf(stderr, "bad value for %s: %s\n", name, v->c_str());
      return false;
    }
  }
  if (f.model_dir.empty()) {
    std::fprintf(stderr, "--model DIR is required\n");
    return false;
  }
  return true;
}

int Fail(const Status& s) {
  std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
  return 1;
}

}  // namespace

// generate --model DIR [--max-tokens N] [--temperature T] [--seed S] [--threads N] [--grid G] < prompt
int Generate(const Args& args) {
  RuntimeFlags flags;
  if (!ParseFlags(args, flags)) return 2;
  auto model = LoadModel(flags.model_dir);
  if (!model.ok()) return Fail(model.status());
  const Model& m = **model;
  const std::string input = ReadStdin();
  std::string prompt = input;
  const auto body = nlohmann::ordered_json::parse(input, nullptr, /*allow_exceptions=*/false);
  if (body.is_object() && body.contains("messages")) {
    auto rendered = m.chat_template.RenderChatBody(body);
    if (!rendered.ok()) return Fail(rendered.status());
    prompt = *rendered;
  }
  auto ids = m.tokenizer.Encode(prompt, /*parse_special=*/true);
  if (!ids.ok()) return Fail(ids.status());
  if (ids->empty()) return Fail(InvalidArgument("generate: the prompt encodes to no tokens"));
  auto forward = Forward::Create(m.config, m.weights, ForwardOptions{flags.grid, flags.threads});
  if (!forward.ok()) return Fail(forward.status());
  SamplingParams params;
  params.temperature = flags.temperature;
  params.seed = flags.seed;
  params.max_tokens = flags.max_tokens;
  for (int64_t id : m.config.eos_token_ids) params.stop_token_ids.push_back(static_cast<int32_t>(id));
  SequenceState state(m.config);
  Generator generator(**forward, &m.tokenizer);
  auto result = generator.Generate(state, *ids, params, [](const GeneratedToken& t) {
    std::fwrite(t.text.data(), 1, t.text.size(), stdout);
    std::fflush(stdout);
    return true;
  });
  if (!result.ok()) return Fail(result.status());
  std::printf("\n");
  std::fprintf(stderr, "[%lld prompt tokens, %zu generated, finish: %s]\n",
               static_cast<long long>(result->prompt_tokens), result->tokens.size(),
               FinishReasonName(result->finish));
  return 0;
}

// logits --model DIR --ids FILE [--threads N] [--grid G]: the last position's logits as a JSON array.
int Logits(const Args& args) {
  RuntimeFlags flags;
  if (!ParseFlags(args, flags)) return 2;
  if (flags.ids_file.empty()) {
    std::fprintf(stderr, "--ids FILE is required\n");
    return 2;
  }
  std::ifstream in(flags.ids_file);
  if (!in) return Fail(IoError("logits: cannot read " + flags.ids_file));
  std::stringstream text;
  text << in.rdbuf();
  const auto parsed = nlohmann::json::parse(text.str(), nullptr, false);
  if (!parsed.is_array() || parsed.empty())
    return Fail(InvalidArgument("logits: " + flags.ids_file + " must hold a non-empty JSON array of token ids"));
  std::vector<int32_t> ids;
  for (const auto& v : parsed) {
    if (!v.is_number_integer()) return Fail(InvalidArgument("logits: " + flags.ids_file + " holds a non-integer"));
    ids.push_back(v.get<int32_t>());
  }
  auto model = LoadModel(flags.model_dir, ModelParts::kWeightsOnly);  // token ids need no tokenizer
  if (!model.ok()) return Fail(model.status());
  auto forward = Forward::Create((*model)->config, (*model)->weights, ForwardOptions{flags.grid, flags.threads});
  if (!forward.ok()) return Fail(forward.status());
  SequenceState state((*model)->config);
  auto logits = (*forward)->Prefill(state, ids, LogitsRows::kLast);
  if (!logits.ok()) return Fail(logits.status());
  std::string out = "[";
  char buf[32];
  for (size_t i = 0; i < logits->size(); ++i) {
    std::snprintf(buf, sizeof(buf), "%.9g", static_cast<double>((*logits)[i]));
    if (i) out += ",";
    out += buf;
  }
  out += "]\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace anchorage::tool
