// Cache benchmarks on a generated model (default `small`):
//   replay: an agent-shaped session (a shared head of tools and system text, then turns of user
//           message, reasoning + answer or tool call, tool result), rendered by the model's own
//           Qwen3.5 template (earlier reasoning dropped), caches on and off: tokens re-read per
//           turn and TTFT per turn.
//   store:  TTFT of a request that shares a long system prompt with an earlier one after an
//           unrelated request replaced the rows, state store on and off.
// usage: anchorage-bench-caches replay|store [--size small|tiny] [--turns N] [--off-turns N] [--grid G] [--prefixes 2048,8192]
// (--off-turns limits the caches-off replay, which re-reads the whole prompt every request.)
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "engine/cache/resident_prefix.h"
#include "engine/model/model.h"

using namespace anchorage;
using ojson = nlohmann::ordered_json;

namespace {

std::string Words(int n, int seed) {
  static const char* kWords[] = {"anchor", "grid", "state", "prefill", "session", "token", "buffer", "cache", "rows",
                                 "engine", "turn", "agent", "tool", "result", "file", "read", "write", "line"};
  std::string s;
  uint64_t x = static_cast<uint64_t>(seed) * 2654435761u + 1;
  for (int i = 0; i < n; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    s += kWords[(x >> 33) % 18];
    s += (i % 12 == 11) ? ".\n" : " ";
  }
  return s;
}

struct Turn {
  double ttft_ms;
  int64_t reread;
  int64_t cached;
  std::string source;
  int64_t prompt;  // the client's prompt
};

Result<std::vector<int32_t>> Render(const Model& model, const ojson& body) {
  ASSIGN_OR_RETURN(std::string text, model.chat_template.RenderChatBody(body));
  return model.tokenizer.Encode(text);
}

std::vector<Turn> Replay(Model& model, Forward& forward, bool caches, int turns) {
  ResidentOptions o;
  o.enabled = caches;
  ResidentPrefix rp(forward, &model.tokenizer, o);
  ojson tools = ojson::array();
  for (int t = 0; t < 6; ++t)
    tools.push_back({{"type", "function"},
                     {"function", {{"name", "tool_" + std::to_string(t)}, {"description", Words(40, 100 + t)},
                                   {"parameters", {{"type", "object"}, {"properties", {{"path", {{"type", "string"}}}}}}}}}});
  ojson messages = ojson::array({{{"role", "system"}, {"content", Words(300, 1)}}});
  std::vector<Turn> out;
  const int32_t im_end = *model.tokenizer.TokenId("<|im_end|>");
  for (int turn = 0; turn < turns; ++turn) {
    messages.push_back({{"role", "user"}, {"content", Words(30, 200 + turn)}});
    for (int step = 0; step < 2; ++step) {  // a tool call, its result, then an answer
      ojson body = {{"messages", messages}, {"tools", tools}};
      auto prompt = Render(model, body);
      if (!prompt.ok()) { std::fprintf(stderr, "render: %s\n", prompt.status().ToString().c_str()); std::exit(1); }
      const bool call = step == 0;
      const std::string reasoning = Words(25, 300 + turn * 2 + step);
      const std::string visible = call ? "<tool_call>\n<function=tool_" + std::to_string(turn % 6) + ">\n<parameter=path>\nsrc/file_" +
                                             std::to_string(turn) + ".cpp\n</parameter>\n</function>\n</tool_call>"
                                       : Words(20, 400 + turn);
      auto reply = model.tokenizer.Encode(reasoning + "\n</think>\n\n" + visible);
      SamplingParams p;
      p.temperature = 0;
      p.forced_ids = *reply;
      p.forced_ids.push_back(im_end);
      p.max_tokens = static_cast<int64_t>(p.forced_ids.size());
      p.stop_token_ids = {im_end};
      const double start = bench::NowMs();
      double first = 0;
      auto r = rp.Generate({*prompt, "agent", p.max_tokens}, p, [&](const GeneratedToken&) {
        if (first == 0) first = bench::NowMs();
        return true;
      });
      if (!r.ok()) { std::fprintf(stderr, "generate: %s\n", r.status().ToString().c_str()); std::exit(1); }
      out.push_back({first - start, r->resume.reread_tokens, r->resume.cached_tokens, CacheSourceName(r->resume.source), static_cast<int64_t>(prompt->size())});
      std::fprintf(stderr, "  caches %s turn %d.%d: prompt %zu, source %s, cached %lld, re-read %lld, TTFT %.0f ms\n", caches ? "on" : "off",
                   turn + 1, step + 1, prompt->size(), CacheSourceName(r->resume.source), (long long)r->resume.cached_tokens,
                   (long long)r->resume.reread_tokens, first - start);
      if (call) {
        ojson call_json = {{"id", "call_" + std::to_string(turn)}, {"type", "function"},
                           {"function", {{"name", "tool_" + std::to_string(turn % 6)}, {"arguments", ojson{{"path", "src/file_" + std::to_string(turn) + ".cpp"}}}}}};
        messages.push_back({{"role", "assistant"}, {"content", ""}, {"reasoning_content", reasoning}, {"tool_calls", ojson::array({call_json})}});
        messages.push_back({{"role", "tool"}, {"tool_call_id", "call_" + std::to_string(turn)}, {"content", Words(60, 500 + turn)}});
      } else {
        messages.push_back({{"role", "assistant"}, {"content", visible}, {"reasoning_content", reasoning}});
      }
    }
  }
  return out;
}

void Summarise(const char* label, const std::vector<Turn>& turns) {
  std::vector<double> reread, ttft, beyond;
  int64_t total = 0;
  for (size_t i = 0; i < turns.size(); ++i) {
    const Turn& t = turns[i];
    reread.push_back(static_cast<double>(t.reread));
    ttft.push_back(t.ttft_ms);
    total += t.reread;
    // What a follow-up re-reads beyond what the client's prompt grew since the request before.
    if (i > 0) beyond.push_back(static_cast<double>(t.reread - (t.prompt - turns[i - 1].prompt)));
  }
  std::printf("%-12s requests %zu  re-read per request: median %.0f p90 %.0f total %lld  beyond the growth: median %.0f p90 %.0f  TTFT ms: median %.0f p90 %.0f max %.0f\n",
              label, turns.size(), bench::Percentile(reread, 0.5), bench::Percentile(reread, 0.9), (long long)total,
              beyond.empty() ? 0.0 : bench::Percentile(beyond, 0.5), beyond.empty() ? 0.0 : bench::Percentile(beyond, 0.9),
              bench::Percentile(ttft, 0.5), bench::Percentile(ttft, 0.9), bench::Percentile(ttft, 1.0));
}

double StoreTtft(Model& model, Forward& forward, bool store, int64_t prefix_tokens) {
  ResidentOptions o;
  o.store_enabled = store;
  o.pin_budget_bytes = 0;  // the park and the pin would keep the head too; this measures the store alone
  o.park_budget_bytes = 0;
  ResidentPrefix rp(forward, &model.tokenizer, o);
  auto head = model.tokenizer.Encode(Words(static_cast<int>(prefix_tokens), 7));
  std::vector<int32_t> system(head->begin(), head->begin() + std::min<int64_t>(prefix_tokens, static_cast<int64_t>(head->size())));
  while (static_cast<int64_t>(system.size()) < prefix_tokens) system.push_back(system[system.size() % 100]);
  auto q1 = *model.tokenizer.Encode(" First question about the grid?");
  auto q2 = *model.tokenizer.Encode(" Second question about anchors?");
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 1;
  std::vector<int32_t> r1 = system;
  r1.insert(r1.end(), q1.begin(), q1.end());
  if (!rp.Generate({r1, "a", 1}, p, nullptr).ok()) std::exit(1);
  auto other = *model.tokenizer.Encode(Words(static_cast<int>(prefix_tokens / 3), 9));  // too long for a guest
  if (!rp.Generate({other, "b", 1}, p, nullptr).ok()) std::exit(1);
  std::vector<int32_t> r2 = system;
  r2.insert(r2.end(), q2.begin(), q2.end());
  const double start = bench::NowMs();
  auto r = rp.Generate({r2, "a", 1}, p, nullptr);
  const double ms = bench::NowMs() - start;
  std::printf("  shared prefix %6lld tokens, store %-3s: source %-8s cached %6lld re-read %6lld TTFT %8.0f ms\n", (long long)prefix_tokens,
              store ? "on" : "off", CacheSourceName(r->resume.source), (long long)r->resume.cached_tokens, (long long)r->resume.reread_tokens, ms);
  return ms;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: anchorage-bench-caches replay|store [--size small|tiny] [--turns N] [--grid G] [--prefixes 2048,8192] [--threads N]\n");
    return 2;
  }
  const std::string mode = argv[1];
  std::string size = "small", prefixes = "2048,8192";
  int turns = 20, threads = 0, off_turns = -1;
  int64_t grid = 1024;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--size") size = v;
    else if (k == "--turns") turns = std::atoi(v.c_str());
    else if (k == "--off-turns") off_turns = std::atoi(v.c_str());
    else if (k == "--grid") grid = std::atoll(v.c_str());
    else if (k == "--prefixes") prefixes = v;
    else if (k == "--threads") threads = std::atoi(v.c_str());
  }
  auto model = LoadModel(bench::ModelFolder(size));
  if (!model.ok()) { std::fprintf(stderr, "%s\n", model.status().ToString().c_str()); return 1; }
  ForwardOptions fo;
  fo.grid_tokens = grid;
  fo.threads = threads;
  auto forward = Forward::Create((*model)->config, (*model)->weights, fo);
  if (!forward.ok()) { std::fprintf(stderr, "%s\n", forward.status().ToString().c_str()); return 1; }
  std::printf("model %s, grid %lld, %d threads\n", size.c_str(), (long long)grid, (*forward)->threads());
  if (mode == "replay") {
    auto on = Replay(**model, **forward, true, turns);
    auto off = Replay(**model, **forward, false, off_turns < 0 ? turns : off_turns);
    Summarise("caches on", on);
    if (off_turns >= 0 && off_turns < turns) {
      std::vector<Turn> on_head(on.begin(), on.begin() + 2 * off_turns);
      Summarise("on (head)", on_head);
    }
    Summarise("caches off", off);
  } else if (mode == "store") {
    std::stringstream ss(prefixes);
    std::string item;
    while (std::getline(ss, item, ',')) {
      const int64_t n = std::atoll(item.c_str());
      StoreTtft(**model, **forward, true, n);
      StoreTtft(**model, **forward, false, n);
    }
  } else {
    std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
    return 2;
  }
  return 0;
}
