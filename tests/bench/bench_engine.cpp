// Engine benchmark on the generated `small` model: prefill and decode throughput at 1 and 2 threads,
// state sizes, peak RSS and accuracy against the double-precision reference. Prints figures only.
#include <cblas.h>
#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "engine/compute/cpu/matmul.h"
#include "engine/model/safetensors.h"
#include "engine/model/tiny_model.h"
#include "engine/model/weights.h"
#include "engine/runtime/forward.h"
#include "reference_forward.h"

using namespace anchorage;

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double PeakRssMiB() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}

std::vector<int32_t> Ids(int64_t n, int64_t vocab) {
  std::mt19937 rng(1);
  std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& id : ids) id = d(rng);
  return ids;
}

int Fail(const Status& s) {
  std::fprintf(stderr, "bench: %s\n", s.ToString().c_str());
  return 1;
}

}  // namespace

// Usage: anchorage-bench-engine [--no-accuracy] [--no-decode] [--max-tokens N] [--threads 1,2] [--model-dir DIR]
int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  int64_t max_tokens = 8192;
  std::vector<int> thread_counts = {1, 2};
  std::string dir;
  bool accuracy = true, decode = true;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--no-accuracy") accuracy = false;
    if (std::string(argv[i]) == "--no-decode") decode = false;
  }
  for (int i = 1; i + 1 < argc; ++i) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--max-tokens") max_tokens = std::atoll(v.c_str());
    else if (a == "--model-dir") dir = v;
    else if (a == "--threads") {
      thread_counts.clear();
      for (size_t p = 0; p < v.size();) {
        thread_counts.push_back(std::atoi(v.c_str() + p));
        p = v.find(',', p);
        if (p == std::string::npos) break;
        ++p;
      }
    }
  }
  bool made_dir = false;
  if (dir.empty()) {
    char tmpl[] = "/tmp/anchorage-bench-XXXXXX";
    if (!mkdtemp(tmpl)) return 1;
    dir = tmpl;
    made_dir = true;
    const double t0 = Now();
    Status s = GenerateTinyModel(TinyModelSize::kSmall, 1, dir);
    if (!s.ok()) return Fail(s);
    std::printf("generated small model in %.1f s\n", Now() - t0);
  }
  auto config = LoadModelConfig(dir + "/config.json");
  if (!config.ok()) return Fail(config.status());
  auto set = SafetensorsSet::OpenDirectory(dir);
  if (!set.ok()) return Fail(set.status());
  auto weights = MapWeights(*config, *set);
  if (!weights.ok()) return Fail(weights.status());
  const ModelConfig& c = *config;
  std::printf("openblas core: %s, config: %s; mat-vec path: %s\n", openblas_get_corename(), openblas_get_config(),
              cpu::MatVecPath());
  std::printf("model: H %lld, layers %lld, I %lld, vocab %lld, weights %.1f MiB\n",
              static_cast<long long>(c.hidden_size), static_cast<long long>(c.num_hidden_layers),
              static_cast<long long>(c.intermediate_size), static_cast<long long>(c.vocab_size),
              static_cast<double>(set->total_bytes()) / (1 << 20));
  {
    SequenceState s(c);
    std::printf("anchor: %lld bytes; K/V per token: %lld bytes (fp32)\n", static_cast<long long>(s.anchor_bytes()),
                static_cast<long long>(s.kv_bytes_per_token()));
  }
  const auto ids = Ids(std::max<int64_t>(max_tokens, 64) + 64, c.vocab_size);

  for (int threads : thread_counts) {
    auto f = Forward::Create(c, *weights, ForwardOptions{1024, threads});
    if (!f.ok()) return Fail(f.status());
    Forward& fw = **f;
    std::printf("--- threads %d, grid %lld\n", fw.threads(), static_cast<long long>(fw.grid_tokens()));
    {  // warm-up: touch the weights once
      SequenceState s(c);
      (void)fw.Prefill(s, std::span(ids.data(), 16));
    }
    for (int64_t n : {int64_t(512), int64_t(2048), int64_t(8192)}) {
      if (n > max_tokens) continue;
      SequenceState s(c);
      (void)s.Reserve(n + 64);
      std::vector<double> chunk_ms;
      const double t0 = Now();
      for (int64_t b = 0; b < n; b += fw.grid_tokens()) {
        const int64_t e = std::min(n, b + fw.grid_tokens());
        const double c0 = Now();
        auto r = fw.Prefill(s, std::span(ids.data() + b, static_cast<size_t>(e - b)));
        if (!r.ok()) return Fail(r.status());
        chunk_ms.push_back((Now() - c0) * 1e3);
      }
      const double secs = Now() - t0;
      std::printf("prefill %5lld tokens: %8.1f tok/s (%.2f s); ms per chunk:", static_cast<long long>(n), n / secs,
                  secs);
      for (double ms : chunk_ms) std::printf(" %.0f", ms);
      std::printf("\n");
      if (!decode) continue;
      // Decode after this context.
      const int steps = n >= 8192 ? 16 : 32;
      const double d0 = Now();
      for (int i = 0; i < steps; ++i) {
        auto r = fw.Decode(s, ids[static_cast<size_t>(i)]);
        if (!r.ok()) return Fail(r.status());
      }
      const double dsecs = Now() - d0;
      std::printf("decode at %5lld context: %7.1f tok/s (%.1f ms/token)\n", static_cast<long long>(n), steps / dsecs,
                  dsecs / steps * 1e3);
    }
    if (decode) {
      SequenceState s(c);
      const int steps = 32;
      const double d0 = Now();
      for (int i = 0; i < steps; ++i) {
        auto r = fw.Decode(s, ids[static_cast<size_t>(i)]);
        if (!r.ok()) return Fail(r.status());
      }
      const double dsecs = Now() - d0;
      std::printf("decode at     0 context: %7.1f tok/s (%.1f ms/token)\n", steps / dsecs, dsecs / steps * 1e3);
    }
  }
  if (accuracy) {  // Accuracy against the double reference at a short length, prefill and decode.
    const int64_t n = 8;
    std::vector<int32_t> short_ids(ids.begin(), ids.begin() + n);
    const double t0 = Now();
    const auto ref = reference::Logits(c, *weights, short_ids);
    auto f = Forward::Create(c, *weights, ForwardOptions{1024, 2});
    if (!f.ok()) return Fail(f.status());
    SequenceState s(c);
    auto all = (*f)->Prefill(s, short_ids, LogitsRows::kAll);
    if (!all.ok()) return Fail(all.status());
    const int64_t V = c.vocab_size;
    double worst = 0.0, max_ref = 0.0;
    for (int64_t i = 0; i < n * V; ++i) {
      worst = std::max(worst, std::abs(double((*all)[i]) - ref[i]));
      max_ref = std::max(max_ref, std::abs(ref[i]));
    }
    SequenceState d(c);
    double worst_dec = 0.0;
    (void)(*f)->Prefill(d, std::span(short_ids.data(), 1));
    for (int64_t t = 1; t < n; ++t) {
      auto r = (*f)->Decode(d, short_ids[t]);
      if (!r.ok()) return Fail(r.status());
      for (int64_t i = 0; i < V; ++i) worst_dec = std::max(worst_dec, std::abs(double((*r)[i]) - ref[t * V + i]));
    }
    std::printf("accuracy (%lld tokens): max |logit - fp64 reference| prefill %.3g, decode %.3g (max |logit| %.3g; "
                "reference took %.1f s)\n",
                static_cast<long long>(n), worst, worst_dec, max_ref, Now() - t0);
  }
  std::printf("peak RSS: %.0f MiB\n", PeakRssMiB());
  if (made_dir) std::filesystem::remove_all(dir);
  return 0;
}
