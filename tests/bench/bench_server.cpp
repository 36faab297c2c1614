// Endpoint benchmark on a generated model (default `small`): TTFT (p50, p99) and decode tokens/s
// (per stream and aggregate) of 1, 4 and 16 concurrent streaming clients on --parallel slots, and
// the server's overhead per token against the engine's own generate loop on the same prompt; then
// the same stream through a second server that forwards it (--backend) to this one.
// With --soak S it runs instead a soak: 16 clients in multi-turn conversations for S seconds on a
// server with every cache on and small budgets (so they fill and shed), counting errors and
// sampling the process's RSS; it prints whether the RSS of the last half stayed within 5 %.
// --prompt-words N pads each prompt with N words, so later clients prefill long prompts while earlier
// ones decode; "longest pause in a stream" is the most a stream's next token waited meanwhile.
// --drafts lookup turns lookup drafts on (the suffix store off) and forces every answer to a recital
// that repeats itself every 61 words (the forward still runs on every token), so each stream drafts:
// its windows go in one forward with the other streams' rows.
// --port P runs the same rounds against another server already listening on 127.0.0.1:P (llama-server on
// the GGUF of the same weights: tests/bench/compare-llama-server.sh), its prompt cache off per request.
// usage: anchorage-bench-server [--size small|tiny] [--tokens N] [--threads N] [--parallel N] [--clients 1,4,16] [--prompt-words N]
//                               [--drafts off|lookup] [--precision exact|fast] [--soak S] [--port P]
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "engine/compute/cpu/matmul.h"
#include "engine/core/file_util.h"
#include "engine/model/model_config.h"
#include "engine/server/service.h"
#include "engine/settings/settings.h"
#include "engine/text/tokenizer.h"

using namespace anchorage;
using json = nlohmann::json;

namespace {

struct ClientRun {
  double ttft_ms = 0;
  double total_ms = 0;
  int tokens = 0;
  double longest_pause_ms = 0;  // between two of its tokens: how long another request's prefill held it back
};

ClientRun Stream(int port, const json& body) {
  ClientRun run;
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(600, 0);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/chat/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  const double start = bench::NowMs();
  double last_token = 0;
  std::string buffer;
  req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
    buffer.append(d, n);
    size_t sep;
    while ((sep = buffer.find("\n\n")) != std::string::npos) {
      std::string ev = buffer.substr(0, sep);
      buffer.erase(0, sep + 2);
      if (ev.find("\"reasoning_content\"") != std::string::npos || ev.find("\"content\":\"") != std::string::npos) {
        if (ev.find("\"content\":\"\"") != std::string::npos && ev.find("reasoning_content") == std::string::npos) continue;
        const double now = bench::NowMs() - start;
        if (run.tokens == 0) run.ttft_ms = now;
        else run.longest_pause_ms = std::max(run.longest_pause_ms, now - last_token);
        last_token = now;
        ++run.tokens;
      }
    }
    return true;
  };
  httplib::Response res;
  httplib::Error err;
  c.send(req, res, err);
  run.total_ms = bench::NowMs() - start;
  return run;
}

int64_t RssBytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;
  return 0;
}

// 16 clients, each a conversation of up to 8 turns (then a new session), for seconds; errors and RSS.
int Soak(const std::string& size, int threads, int parallel, int tokens, int seconds) {
  ServerConfig config;
  config.model_dir = bench::ModelFolder(size);
  config.data_dir = "/tmp/anchorage-bench/soak-data";
  std::filesystem::remove_all(config.data_dir);
  nlohmann::json settings = DefaultSettingsDocument(MachineTotalRamBytes());
  const double ceiling_gb = size == "tiny" ? 0.02 : 0.25;  // small budgets: the tiers fill and shed within minutes
  settings["memory"]["ceiling_gb"] = ceiling_gb;
  settings["memory"]["prefill_peak_gb"] = 2 * ceiling_gb;
  settings["memory"]["allocator_slack_gb"] = 0;
  settings["disk_cache"]["min_free_gb"] = 0;
  settings["disk_cache"]["budget_gb"] = 0.5;
  settings["speculative"]["suffix_store_mb"] = 1;  // full within the first minute, like the other budgets
  if (!MakeDirectories(config.data_dir, 0700).ok() || !WriteFileAtomic(config.data_dir + "/settings.json", settings.dump()).ok()) return 1;
  config.port = 0;
  config.threads = threads;
  config.parallel = parallel;
  auto service = Service::Start(config);
  if (!service.ok()) { std::fprintf(stderr, "%s\n", service.status().ToString().c_str()); return 1; }
  Service& s = **service;
  s.ServeInBackground();
  const int port = s.http().port();
  std::printf("soak: model %s, %d threads, %s, %d slots, 16 clients, %d tokens an answer, %d s, caches on (ceiling %.2f GiB)\n", size.c_str(),
              s.scheduler().forward().threads(), cpu::PathName(cpu::ActivePath()), parallel, tokens, seconds, ceiling_gb);
  std::atomic<bool> stop = false;
  std::atomic<int64_t> requests = 0, errors = 0, tokens_out = 0;
  std::vector<std::thread> clients;
  for (int c = 0; c < 16; ++c)
    clients.emplace_back([&, c] {
      for (int conversation = 0; !stop.load(); ++conversation) {
        json messages = json::array();
        const std::string session = "soak-" + std::to_string(c) + "-" + std::to_string(conversation);
        for (int turn = 0; turn < 8 && !stop.load(); ++turn) {
          messages.push_back({{"role", "user"}, {"content", "Client " + std::to_string(c) + " turn " + std::to_string(turn) +
                                                                 ": say how anchors on grid lines keep a long conversation cheap, in other words than before."}});
          httplib::Client client("127.0.0.1", port);
          client.set_read_timeout(600, 0);
          const json body = {{"messages", messages}, {"max_tokens", tokens}, {"temperature", 0.7}, {"seed", c}, {"session_id", session},
                             {"chat_template_kwargs", {{"enable_thinking", false}}}};
          auto r = client.Post("/v1/chat/completions", body.dump(), "application/json");
          ++requests;
          if (!r || r->status != 200) {
            ++errors;
            std::fprintf(stderr, "soak: client %d: %s\n", c, r ? (std::to_string(r->status) + " " + r->body.substr(0, 200)).c_str() : "no response");
            break;
          }
          const json reply = json::parse(r->body, nullptr, false);
          tokens_out += reply["usage"]["completion_tokens"].get<int64_t>();
          messages.push_back(reply["choices"][0]["message"]);
        }
      }
    });
  std::vector<std::pair<double, int64_t>> rss;  // seconds, bytes
  const double start = bench::NowMs();
  while (bench::NowMs() - start < seconds * 1000.0) {
    std::this_thread::sleep_for(std::chrono::seconds(5));
    rss.emplace_back((bench::NowMs() - start) / 1000.0, RssBytes());
  }
  stop = true;
  for (auto& t : clients) t.join();
  const double wall = (bench::NowMs() - start) / 1000.0;
  int64_t low = INT64_MAX, high = 0;
  for (const auto& [t, bytes] : rss)
    if (t >= seconds / 2.0) {
      low = std::min(low, bytes);
      high = std::max(high, bytes);
    }
  for (size_t i = 0; i < rss.size(); i += std::max<size_t>(1, rss.size() / 8))
    std::printf("  %5.0f s: RSS %.1f MiB\n", rss[i].first, rss[i].second / 1048576.0);
  const CacheStats stats = s.scheduler().CacheStats();
  std::printf("soak: %lld requests, %lld errors, %lld tokens (%.1f tokens/s) in %.0f s; %lld sheds; RSS over the last half %.1f to %.1f MiB (%.1f %%: %s)\n",
              static_cast<long long>(requests.load()), static_cast<long long>(errors.load()), static_cast<long long>(tokens_out.load()),
              tokens_out.load() / wall, wall, static_cast<long long>(stats.memory.shed_total()), low / 1048576.0, high / 1048576.0,
              low > 0 ? 100.0 * (high - low) / low : 0.0, low > 0 && high <= low * 1.05 ? "flat within 5 %" : "NOT flat");
  s.Drain();
  return errors.load() == 0 ? 0 : 1;
}

}  // namespace

// A counter of the server's /metrics (0 where it is not there).
double Metric(int port, const std::string& name) {
  httplib::Client c("127.0.0.1", port);
  auto r = c.Get("/metrics");
  if (!r) return 0;
  const size_t at = r->body.find("\n" + name + " ");
  return at == std::string::npos ? 0 : std::atof(r->body.c_str() + at + name.size() + 2);
}

// The prompt of request i (padded with prompt_words words), greedy, every end-of-text id in no_end biased away.
json RequestBody(int i, int tokens, int prompt_words, const json& no_end, bool external) {
  std::string notes;  // --prompt-words: a long prompt, so a later client's prefill runs while earlier ones decode
  for (int w = 0; w < prompt_words; ++w) notes += " note" + std::to_string((w * 7919 + i) % 1000);
  json body = {{"messages", {{{"role", "user"}, {"content", "Request " + std::to_string(i) + ": explain how a resident prefix keeps the rows of a long conversation so each turn forwards only what is new, and why anchors sit on grid lines." + notes}}}},
               {"max_tokens", tokens}, {"temperature", 0}, {"stream", true}, {"logit_bias", no_end}, {"chat_template_kwargs", {{"enable_thinking", false}}}};
  if (external) body["cache_prompt"] = false;  // llama-server: every request prefills its prompt, as Anchorage's with caches off
  return body;
}

// Rounds of n concurrent streaming clients; returns the 1-client round's decode rate (0 without one).
double Rounds(int port, const std::vector<int>& client_counts, const std::function<json(int)>& body, bool count_drafts) {
  double one_decode = 0, one_ttft = 0, one_aggregate = 0;
  int request = 0;
  for (const int n : client_counts) {
    std::vector<ClientRun> runs(static_cast<size_t>(n));
    std::vector<std::thread> clients;
    const double accepted_before = count_drafts ? Metric(port, "anchorage_accepted_tokens_total") : 0;
    const double start = bench::NowMs();
    for (int i = 0; i < n; ++i) clients.emplace_back([&, i, first = request] { runs[static_cast<size_t>(i)] = Stream(port, body(first + i)); });
    for (auto& t : clients) t.join();
    request += n;
    const double wall = bench::NowMs() - start;
    std::vector<double> ttfts, rates;
    int total_tokens = 0;
    double longest_pause = 0;
    for (const auto& r : runs) {
      longest_pause = std::max(longest_pause, r.longest_pause_ms);
      ttfts.push_back(r.ttft_ms);
      rates.push_back(r.tokens > 1 ? (r.tokens - 1) / ((r.total_ms - r.ttft_ms) / 1000.0) : 0);
      total_tokens += r.tokens;
    }
    const double aggregate = total_tokens / (wall / 1000.0);
    if (n == 1) {
      one_decode = rates[0];
      one_ttft = ttfts[0];
      one_aggregate = aggregate;
    }
    std::printf("%2d clients: TTFT p50 %.0f ms, p99 %.0f ms; decode per stream p50 %.1f tokens/s; aggregate %.1f tokens/s over %.0f ms (%d tokens)",
                n, bench::Percentile(ttfts, 0.5), bench::Percentile(ttfts, 0.99), bench::Percentile(rates, 0.5), aggregate, wall, total_tokens);
    if (n > 1 && one_aggregate > 0) std::printf(" (%.2fx one client's aggregate, TTFT p50 %.2fx)", aggregate / one_aggregate, bench::Percentile(ttfts, 0.5) / one_ttft);
    std::printf("; longest pause in a stream %.0f ms", longest_pause);
    if (count_drafts) std::printf("; %.0f drafts accepted", Metric(port, "anchorage_accepted_tokens_total") - accepted_before);
    std::printf("\n");
  }
  return one_decode;
}

// --port P: the same rounds against another OpenAI-compatible server on 127.0.0.1:P serving the same weights
// (llama-server on the GGUF that anchorage-bench-gguf writes); the end-of-text ids come from --size's tokenizer.
int External(int port, const std::string& size, int tokens, int prompt_words, const std::vector<int>& client_counts) {
  const std::string dir = bench::ModelFolder(size);
  auto config = LoadModelConfig(dir + "/config.json");
  auto tokenizer = Tokenizer::Load(dir + "/tokenizer.json");
  if (!config.ok() || !tokenizer.ok()) return bench::Fail(config.ok() ? tokenizer.status() : config.status());
  json no_end = json::object();
  for (const int64_t id : config->eos_token_ids) no_end[std::to_string(id)] = -100;
  for (const char* end : {"<|im_end|>", "<|endoftext|>"})
    if (const auto id = tokenizer->TokenId(end)) no_end[std::to_string(*id)] = -100;
  auto body = [&](int i) { return RequestBody(i, tokens, prompt_words, no_end, true); };
  const ClientRun warm = Stream(port, body(99));
  if (warm.tokens == 0) {
    std::fprintf(stderr, "no tokens streamed from 127.0.0.1:%d\n", port);
    return 1;
  }
  std::printf("server on 127.0.0.1:%d, model %s's weights, %d tokens per request (no early end), prompt cache off\n", port, size.c_str(), tokens);
  Rounds(port, client_counts, body, false);
  return 0;
}

int main(int argc, char** argv) {
  std::string size = "small";
  int tokens = 64, threads = 0, parallel = 4, soak_s = 0, prompt_words = 0, external_port = 0;
  std::string drafts = "off";
  std::string precision = "exact";
  std::vector<int> client_counts = {1, 4, 16};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--size") size = v;
    else if (k == "--tokens") tokens = std::atoi(v.c_str());
    else if (k == "--threads") threads = std::atoi(v.c_str());
    else if (k == "--parallel") parallel = std::atoi(v.c_str());
    else if (k == "--soak") soak_s = std::atoi(v.c_str());
    else if (k == "--prompt-words") prompt_words = std::atoi(v.c_str());
    else if (k == "--drafts") drafts = v;
    else if (k == "--precision") precision = v;
    else if (k == "--port") external_port = std::atoi(v.c_str());
    else if (k == "--clients") client_counts = bench::NumberList(v);
  }
  if (soak_s > 0) return Soak(size, threads, parallel, tokens, soak_s);
  if (external_port > 0) return External(external_port, size, tokens, prompt_words, client_counts);
  ServerConfig config;
  config.model_dir = bench::ModelFolder(size);
  config.data_dir = "/tmp/anchorage-bench/server-data";
  // A fresh folder, drafting off unless asked (then from each stream's own ids): no earlier run's suffix
  // store, no request drafted from another's answer.
  std::filesystem::remove_all(config.data_dir);
  nlohmann::json settings = DefaultSettingsDocument(MachineTotalRamBytes());
  if (drafts != "off" && drafts != "lookup") {
    std::fprintf(stderr, "--drafts is off or lookup\n");
    return 2;
  }
  settings["speculative"]["mode"] = drafts;
  settings["speculative"]["suffix_store"] = "off";
  if (!cpu::PrecisionFromName(precision).ok()) {
    std::fprintf(stderr, "--precision is exact or fast\n");
    return 2;
  }
  settings["engine"]["precision"] = precision;
  if (!MakeDirectories(config.data_dir, 0700).ok() || !WriteFileAtomic(config.data_dir + "/settings.json", settings.dump()).ok()) return 1;
  if (drafts != "off") {  // answers that repeat themselves (a recital forced through the real forward), so lookup drafts hit
    std::string recital;
    for (int i = 0; i < 4 * tokens; ++i) recital += " row" + std::to_string(i % 61);
    const json replies = json::array({{{"match", "Request"}, {"reply", recital}}});
    config.test_replies_file = config.data_dir + "/replies.json";
    if (!WriteFileAtomic(config.test_replies_file, replies.dump()).ok()) return 1;
  }
  config.port = 0;
  config.threads = threads;
  config.parallel = parallel;
  config.run_time_knobs["caches"] = "off";  // every request prefills its prompt: the figures compare like with like
  auto service = Service::Start(config);
  if (!service.ok()) { std::fprintf(stderr, "%s\n", service.status().ToString().c_str()); return 1; }
  Service& s = **service;
  s.ServeInBackground();
  const int port = s.http().port();

  // Every stream decodes all its tokens (the end-of-text ids biased away): an early stop would leave
  // the others a smaller batch and the aggregate would compare unlike runs.
  json no_end = json::object();
  for (const int64_t id : s.model().config.eos_token_ids) no_end[std::to_string(id)] = -100;
  for (const char* end : {"<|im_end|>", "<|endoftext|>"})
    if (const auto id = s.model().tokenizer.TokenId(end)) no_end[std::to_string(*id)] = -100;
  auto body = [&](int i) { return RequestBody(i, tokens, prompt_words, no_end, false); };
  Stream(port, body(99));  // warm-up

  std::printf("model %s, %d threads, %s (precision %s), %d slots, %d tokens per request (no early end), caches off, drafts %s\n",
              size.c_str(), s.scheduler().forward().threads(), cpu::PathName(cpu::ActivePath()), cpu::PrecisionName(cpu::ActivePrecision()),
              parallel, tokens, drafts.c_str());
  const double one_decode = Rounds(port, client_counts, body, drafts != "off");

  if (drafts != "off") {  // what the scheduler measured of its steps, and the acceptance a window beside others must beat
    httplib::Client c("127.0.0.1", port);
    const auto stats = c.Get("/v1/cache/stats");
    if (stats) {
      const json costs = json::parse(stats->body)["drafts_beside_others"];
      std::printf("decode steps measured: %.2f ms + %.2f ms a row; a window beside others pays above an acceptance of %.2f at 2 rows, %.2f at 4\n",
                  costs["step_fixed_ms"].get<double>(), costs["step_row_ms"].get<double>(), costs["break_even_at_2_rows"].get<double>(),
                  costs["break_even_at_4_rows"].get<double>());
    }
  }

  // The engine's own loop on the same prompt, on the same engine thread's forward (the server is idle).
  auto text = s.model().chat_template.RenderChatBody(nlohmann::ordered_json::parse(body(0).dump()));
  auto ids = s.model().tokenizer.Encode(*text);
  SequenceState state(s.model().config);
  Generator generator(s.scheduler().forward(), &s.model().tokenizer);
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = tokens;
  for (const auto& [id, bias] : no_end.items()) p.logit_bias.emplace_back(std::stoi(id), bias.get<float>());
  double first = 0;
  const double g0 = bench::NowMs();
  auto g = generator.Generate(state, *ids, p, [&](const GeneratedToken&) {
    if (first == 0) first = bench::NowMs();
    return true;
  });
  const double g1 = bench::NowMs();
  const double engine_decode = g->tokens.size() > 1 ? (g->tokens.size() - 1) / ((g1 - first) / 1000.0) : 0;
  std::printf("engine loop: TTFT %.0f ms, decode %.1f tokens/s\n", first - g0, engine_decode);
  if (one_decode > 0 && engine_decode > 0)
    std::printf("server overhead per token: %.3f ms (1 client against the engine loop)\n", 1000.0 / one_decode - 1000.0 / engine_decode);

  // A front on the tiny model forwarding model "upstream" to this server.
  ServerConfig front_config;
  front_config.model_dir = bench::ModelFolder("tiny");
  front_config.data_dir = "/tmp/anchorage-bench/front-data";
  front_config.port = 0;
  front_config.threads = 1;
  front_config.backends = {BackendSpec{"upstream", "http://127.0.0.1:" + std::to_string(port), ""}};
  auto front = Service::Start(front_config);
  if (!front.ok()) { std::fprintf(stderr, "%s\n", front.status().ToString().c_str()); return 1; }
  (*front)->ServeInBackground();
  const int front_port = (*front)->http().port();
  std::vector<ClientRun> direct, forwarded;
  for (int i = 0; i < 3; ++i) {  // other prompts each: a repeated one would be drafted from the suffix store
    direct.push_back(Stream(port, body(10 + i)));
    json b = body(20 + i);
    b["model"] = "upstream";
    forwarded.push_back(Stream(front_port, b));
  }
  auto median = [](const std::vector<ClientRun>& runs, auto field) {
    std::vector<double> v;
    for (const ClientRun& r : runs) v.push_back(field(r));
    return bench::Percentile(v, 0.5);
  };
  auto ttft = [](const ClientRun& r) { return r.ttft_ms; };
  auto rate = [](const ClientRun& r) { return r.tokens > 1 ? (r.tokens - 1) / ((r.total_ms - r.ttft_ms) / 1000.0) : 0.0; };
  std::printf("through a front (--backend), 3 requests each: TTFT median %.1f ms direct, %.1f ms forwarded (%+.1f ms); decode %.1f vs %.1f tokens/s\n",
              median(direct, ttft), median(forwarded, ttft), median(forwarded, ttft) - median(direct, ttft), median(direct, rate), median(forwarded, rate));
  (*front)->Drain();
  s.Drain();
  return 0;
}
