// The shadow reader beside a main model. Read rate: sessions of N tokens read in whole 512-token
// chunks (ms per 1,000 tokens); ask latency: a 3-choice question over each session with a pending
// tail of 300 ids (median of 5); the main model's decode rate with the shadow off and on, the arms
// alternating, each run a new session so the shadow reads its whole prompt (in the turn's ration
// and in the idle window before the next run).
// anchorage-bench-shadow [--main small] [--tokens 8192,32768] [--runs 3] [--prompt 1024] [--decode 64] [--gap-ms 1500] [--threads 2]
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "engine/compute/cpu/cpu_features.h"
#include "engine/compute/cpu/matmul.h"
#include "engine/core/text_split.h"
#include "engine/server/scheduler.h"
#include "engine/shadow/shadow_reader.h"

using namespace anchorage;

namespace {

Result<std::unique_ptr<ShadowReader>> MakeReader(const std::string& shadow_dir, const Model& main, int threads) {
  ASSIGN_OR_RETURN(std::unique_ptr<Model> shadow, LoadModel(shadow_dir));
  return ShadowReader::Create(std::move(shadow), main, ForwardOptions{kShadowGridTokens, threads}, "", ShadowOptions{});
}

// One turn's decode rate (tokens a second after the first).
double DecodeRate(Scheduler& s, const std::vector<int32_t>& prompt, const std::string& session, int64_t decode) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = decode;
  auto job = std::make_shared<Job>(prompt, p, session);
  if (!s.Submit(job).ok()) return 0;
  bool done = false;
  while (!done) job->WaitTokens(&done);
  return job->stats().decode_tokens_per_s;
}

}  // namespace

int main(int argc, char** argv) {
  std::string main_size = "small", token_list = "8192,32768";
  int runs = 3, threads = 2;
  int64_t prompt_tokens = 1024, decode = 64, gap_ms = 1500;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--main") main_size = value;
    else if (flag == "--tokens") token_list = value;
    else if (flag == "--runs") runs = std::atoi(value.c_str());
    else if (flag == "--prompt") prompt_tokens = std::atoll(value.c_str());
    else if (flag == "--decode") decode = std::atoll(value.c_str());
    else if (flag == "--gap-ms") gap_ms = std::atoll(value.c_str());
    else if (flag == "--threads") threads = std::atoi(value.c_str());
    else return std::fprintf(stderr, "unknown flag %s\n", flag.c_str()), 2;
  }
  const std::string main_dir = bench::ModelFolder(main_size);
  auto main_size_parsed = ParseTinyModelSize(main_size);
  if (!main_size_parsed.ok()) return bench::Fail(main_size_parsed.status());
  const std::string shadow_dir = "/tmp/anchorage-bench/shadow-for-" + main_size + "-seed1";
  if (!std::filesystem::exists(shadow_dir + "/model.safetensors"))
    if (Status s = GenerateTinyModel(TinyModelSize::kShadow, 1, shadow_dir, *main_size_parsed); !s.ok()) return bench::Fail(s);
  auto main = LoadModel(main_dir);
  if (!main.ok()) return bench::Fail(main.status());
  const ModelConfig& c = (*main)->config;
  std::printf("machine: %s; kernel path %s; %d threads\n", cpu::DetectCpu().brand.c_str(), cpu::PathName(cpu::ActivePath()), threads);

  // Read rate and ask latency.
  {
    auto reader = MakeReader(shadow_dir, **main, threads);
    if (!reader.ok()) return bench::Fail(reader.status());
    ShadowReader& r = **reader;
    std::printf("shadow model: H %lld, %lld layers; main %s: H %lld, %lld layers\n", static_cast<long long>(r.model().config.hidden_size),
                static_cast<long long>(r.model().config.num_hidden_layers), main_size.c_str(), static_cast<long long>(c.hidden_size),
                static_cast<long long>(c.num_hidden_layers));
    auto question = r.PrepareQuestion("What does the user ask for in the last message?", {"a code edit", "an explanation", "something else"});
    if (!question.ok()) return bench::Fail(question.status());
    uint32_t salt = 1;
    for (const std::string& item : SplitList(token_list, ',')) {
      const int64_t n = std::atoll(item.c_str());
      const std::string session = "read-" + item;
      const double t0 = bench::NowMs();
      r.BeginTurn(session, bench::PromptIds(c, n + 300, salt++));
      while (r.HasIdleWork()) r.IdleWork([] { return false; }, nullptr);
      const double read_ms = bench::NowMs() - t0;
      std::vector<double> ask_ms;
      for (int k = 0; k < 5; ++k) {
        const double a0 = bench::NowMs();
        auto answer = r.Ask(session, *question);
        if (!answer.ok()) return bench::Fail(answer.status());
        ask_ms.push_back(bench::NowMs() - a0);
      }
      const ShadowSession* s = r.Find(session);
      std::printf("session of %lld tokens: read %lld in %.0f ms (%.1f ms per 1,000 tokens at grid 512); ask with a %lld-id tail and a %zu-id question: median %.1f ms\n",
                  static_cast<long long>(n + 300), static_cast<long long>(s->committed()), read_ms, 1000.0 * read_ms / static_cast<double>(s->committed()),
                  static_cast<long long>(s->backlog()), question->ids.size(), bench::Percentile(ask_ms, 0.5));
    }
  }

  // The main model's decode with the shadow off and on, alternating.
  auto make_engine = [&](ShadowReader* shadow) -> Result<std::unique_ptr<Scheduler>> {
    ASSIGN_OR_RETURN(std::unique_ptr<Forward> f, Forward::Create(c, (*main)->weights, ForwardOptions{1024, threads}));
    SchedulerOptions o;
    o.shadow = shadow;
    o.resident.enabled = false;
    return std::make_unique<Scheduler>(**main, std::move(f), o);
  };
  auto reader = MakeReader(shadow_dir, **main, threads);
  if (!reader.ok()) return bench::Fail(reader.status());
  auto off = make_engine(nullptr);
  auto on = make_engine(reader->get());
  if (!off.ok() || !on.ok()) return bench::Fail(off.ok() ? on.status() : off.status());
  std::vector<double> rate_off, rate_on;
  for (int run = 0; run < runs; ++run) {
    for (bool shadow : {false, true}) {
      const std::vector<int32_t> prompt = bench::PromptIds(c, prompt_tokens, 100 + static_cast<uint32_t>(run * 2 + shadow));
      const double rate = DecodeRate(shadow ? **on : **off, prompt, "decode-" + std::to_string(run) + (shadow ? "-on" : "-off"), decode);
      (shadow ? rate_on : rate_off).push_back(rate);
      std::printf("run %d shadow %-3s: decode %.2f tok/s\n", run, shadow ? "on" : "off", rate);
      std::fflush(stdout);
      std::this_thread::sleep_for(std::chrono::milliseconds(gap_ms));
    }
  }
  const double m_off = bench::Percentile(rate_off, 0.5), m_on = bench::Percentile(rate_on, 0.5);
  const ShadowStatus st = (*reader)->Snapshot();
  std::printf("decode %lld tokens after a %lld-token prompt, median of %d: shadow off %.2f tok/s, on %.2f tok/s (%+.2f %%); the shadow read %lld tokens, %lld of them inside turns\n",
              static_cast<long long>(decode), static_cast<long long>(prompt_tokens), runs, m_off, m_on, 100.0 * (m_on - m_off) / m_off,
              static_cast<long long>(st.tokens_read), static_cast<long long>(st.ration_tokens));
  return 0;
}
