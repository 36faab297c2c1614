// Engine benchmark on the generated `small` model: prefill and decode throughput at 1 and 2 threads,
// state sizes, peak RSS and accuracy against the double-precision reference. Prints figures only.
#include <sys/resource.h>

#include <nlohmann/json.hpp>
#include <thread>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "engine/compute/cpu/bf16_split.h"
#include "engine/compute/cpu/cpu_features.h"
#include "engine/compute/cpu/matmul.h"
#include "engine/core/page_buffer.h"
#include "engine/model/safetensors.h"
#include "engine/model/tiny_model.h"
#include "engine/model/weights.h"
#include "engine/runtime/forward.h"
#include "engine/runtime/weights_report.h"
#include "bench_util.h"
#include "machine_limits.h"
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

}  // namespace

// Usage: anchorage-bench-engine [--json] [--no-accuracy] [--no-decode] [--max-tokens N] [--threads 1,2] [--model-dir DIR]
//                               [--weights as-stored|int8] [--decode-steps N] [--kv-dtype f32|bf16|fp8] [--precision exact|fast] [--batches 1,2,4,8,16]
// Prefill and decode run at 512, 2,048, 8,192 and 32,768 tokens of context, those up to --max-tokens (default 8,192).
int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  int64_t max_tokens = 8192;
  std::vector<int> thread_counts = {1, 2};
  std::string dir;
  bool accuracy = true, decode = true, as_json = false, int8_weights = false;
  int decode_steps = 32;  // tokens a decode figure times (16 after 8,192 tokens of context)
  KvDtype kv_dtype = KvDtype::kF32;
  std::vector<int64_t> batch_sizes = {1, 2, 4, 8, 16};
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--json") as_json = true;
    if (std::string(argv[i]) == "--no-accuracy") accuracy = false;
    if (std::string(argv[i]) == "--no-decode") decode = false;
  }
  for (int i = 1; i + 1 < argc; ++i) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--max-tokens") max_tokens = std::atoll(v.c_str());
    else if (a == "--model-dir") dir = v;
    else if (a == "--weights") int8_weights = v == "int8";
    else if (a == "--decode-steps") decode_steps = std::max(1, std::atoi(v.c_str()));
    else if (a == "--batches") {
      batch_sizes = bench::NumberList<int64_t>(v);
      for (int64_t& b : batch_sizes) b = std::max<int64_t>(1, b);
    }
    else if (a == "--precision") {
      auto parsed = cpu::PrecisionFromName(v);
      if (!parsed.ok()) return bench::Fail(parsed.status());
      cpu::SetPrecision(*parsed);
    }
    else if (a == "--kv-dtype") {
      auto parsed = ParseKvDtype(v);
      if (!parsed.ok()) return bench::Fail(parsed.status());
      kv_dtype = *parsed;
    }
    else if (a == "--threads") thread_counts = bench::NumberList(v);
  }
  bool made_dir = false;
  if (dir.empty()) {
    char tmpl[] = "/tmp/anchorage-bench-XXXXXX";
    if (!mkdtemp(tmpl)) return 1;
    dir = tmpl;
    made_dir = true;
    const double t0 = Now();
    Status s = GenerateTinyModel(TinyModelSize::kSmall, 1, dir);
    if (!s.ok()) return bench::Fail(s);
    std::printf("generated small model in %.1f s\n", Now() - t0);
  }
  auto config = LoadModelConfig(dir + "/config.json");
  if (!config.ok()) return bench::Fail(config.status());
  config->kv_dtype = kv_dtype;
  auto set = SafetensorsSet::OpenDirectory(dir);
  if (!set.ok()) return bench::Fail(set.status());
  auto weights = MapWeights(*config, *set);
  if (!weights.ok()) return bench::Fail(weights.status());
  const ModelConfig& c = *config;
  std::printf("kernel path: %s (%s), precision %s%s\n", cpu::PathName(cpu::ActivePath()), cpu::ArithmeticName(), cpu::PrecisionName(cpu::ActivePrecision()),
              cpu::ActivePrecision() == cpu::Precision::kFast && !cpu::RunsFast(cpu::ActivePath(), cpu::Precision::kFast)
                  ? " (runs exact: this path multiplies in fp32)" : "");
  std::printf("model: H %lld, layers %lld, I %lld, vocab %lld, weights %.1f MiB\n",
              static_cast<long long>(c.hidden_size), static_cast<long long>(c.num_hidden_layers),
              static_cast<long long>(c.intermediate_size), static_cast<long long>(c.vocab_size),
              static_cast<double>(set->total_bytes()) / (1 << 20));
  {
    SequenceState s(c);
    std::printf("anchor: %lld bytes; K/V per token: %lld bytes (%s rows)\n", static_cast<long long>(s.anchor_bytes()),
                static_cast<long long>(s.kv_bytes_per_token()), KvDtypeName(kv_dtype));
  }
  // The machine's measured limits, so figures from two machines compare as fractions of them.
  nlohmann::json report;
  const cpu::CpuFeatures& cpu_features = cpu::DetectCpu();
  const bool avx512 = cpu_features.avx512f;
  const bench::Peaks peaks = bench::MeasurePeaks(cpu_features);
  const double fma_peak = peaks.fma, bf16_peak = peaks.bf16_dot, amx_peak = peaks.amx;
  const double path_peak = peaks.Of(cpu::ActivePath());
  // GEMM work and weight bytes of one token: every matrix of the text model once (the embedding is a row read; the
  // vision tower and the MTP head take no part in a text prefill).
  double matrix_elements = 0;
  const auto in_text_model = [](const std::string& name) {
    return name.find("embed_tokens") == std::string::npos && name.find("visual") == std::string::npos && !name.starts_with("mtp.");
  };
  for (const auto& [name, t] : set->tensors())
    if (t.shape.size() == 2 && in_text_model(name)) matrix_elements += static_cast<double>(t.numel());
  if (c.tie_word_embeddings) matrix_elements += static_cast<double>(c.vocab_size * c.hidden_size);
  const double lm_head_elements = static_cast<double>(c.vocab_size * c.hidden_size);
  const double prefill_flops_per_token = 2.0 * (matrix_elements - lm_head_elements);
  double decode_bytes_per_token = 2.0 * matrix_elements;
  // Streaming reads over 1.5 GiB (past any cache) and over a buffer of the bf16 weights' size, the rate decode's
  // figures are fractions of (where the last-level cache holds part of the weights, it counts that too). The
  // buffers are mapped as the packed weights are (huge pages), so the rate is the one decode can reach.
  std::map<int, double> stream, weights_stream;
  const auto ones = [](size_t n) {
    PageArray<float> buffer(n);
    std::fill(buffer.begin(), buffer.end(), 1.0f);
    return buffer;
  };
  {
    const PageArray<float> past_caches = ones(size_t(384) << 20);
    for (int t : thread_counts) stream[t] = bench::StreamGBs(past_caches, t);
  }
  {
    const PageArray<float> weights_sized = ones(static_cast<size_t>(decode_bytes_per_token / sizeof(float)));
    for (int t : thread_counts) weights_stream[t] = bench::StreamGBs(weights_sized, t);
  }
  const auto fraction_of_stream = [&](int threads, double bytes_per_s) {
    const double gbs = weights_stream.count(threads) ? weights_stream[threads] : 0;
    return gbs > 0 ? bytes_per_s / (gbs * 1e9) : 0.0;
  };
  std::printf("machine: %s (%s family %d model %d); kernel families: %s; GEMM path %s\n", cpu_features.brand.c_str(),
              cpu_features.vendor.c_str(), cpu_features.family, cpu_features.model, cpu::DescribeKernelFamilies(cpu_features).c_str(),
              cpu::PathName(cpu::ActivePath()));
  std::printf("limits: fp32 FMA %.1f GFLOP/s a core (%s)", fma_peak, avx512 ? "avx512" : "avx2");
  if (bf16_peak > 0) std::printf("; bf16 dot %.1f GFLOP/s a core (%.1f fp32-equivalent with %d parts)", bf16_peak, bf16_peak / cpu::kBf16Parts, cpu::kBf16Parts);
  if (amx_peak > 0) std::printf("; AMX bf16 %.1f GFLOP/s a core (%.1f fp32-equivalent)", amx_peak, amx_peak / cpu::kBf16Parts);
  for (const auto& [t, gbs] : stream) std::printf("; stream read %.1f GB/s with %d thread%s", gbs, t, t == 1 ? "" : "s");
  for (const auto& [t, gbs] : weights_stream)
    std::printf("; stream read over the weights' %.0f MiB %.1f GB/s with %d thread%s", decode_bytes_per_token / (1 << 20), gbs, t,
                t == 1 ? "" : "s");
  std::printf("\nper token: %.1f MFLOP in prefill GEMMs, %.1f MiB of bf16 weights read in decode\n", prefill_flops_per_token / 1e6,
              decode_bytes_per_token / (1 << 20));
  report["machine"] = {{"brand", cpu_features.brand}, {"vendor", cpu_features.vendor}, {"family", cpu_features.family}, {"model", cpu_features.model},
                       {"kernel_families", cpu::DescribeKernelFamilies(cpu_features)}, {"gemm_path", cpu::PathName(cpu::ActivePath())},
                       {"arithmetic", cpu::ArithmeticName()}};
  report["limits"] = {{"fma_gflops_per_core", fma_peak}, {"fma_width", avx512 ? "avx512" : "avx2"}, {"bf16_dot_gflops_per_core", bf16_peak},
                      {"amx_bf16_gflops_per_core", amx_peak},
                      {"path_peak_gflops_per_core", path_peak}};
  for (const auto& [t, gbs] : stream) report["limits"]["stream_gbs"][std::to_string(t)] = gbs;
  for (const auto& [t, gbs] : weights_stream) report["limits"]["weights_stream_gbs"][std::to_string(t)] = gbs;
  report["per_token"] = {{"prefill_gemm_flops", prefill_flops_per_token}, {"decode_weight_bytes", decode_bytes_per_token}};
  const int64_t widest = *std::max_element(batch_sizes.begin(), batch_sizes.end());
  const auto ids = Ids(std::max<int64_t>(max_tokens, 64 * widest) + std::max<int64_t>(64, decode_steps * widest), c.vocab_size);

  std::optional<WeightsBaseline> stored_weights;
  if (int8_weights) {
    auto baseline = MeasureStoredWeights(c, *weights, ForwardOptions{1024, thread_counts.back()});
    if (!baseline.ok()) return bench::Fail(baseline.status());
    stored_weights = std::move(*baseline);
  }
  for (int threads : thread_counts) {
    ForwardOptions options{1024, threads};
    options.int8_weights = int8_weights;
    auto f = Forward::Create(c, *weights, options);
    if (!f.ok()) return bench::Fail(f.status());
    Forward& fw = **f;
    decode_bytes_per_token = static_cast<double>(fw.decode_weight_bytes());
    std::printf("--- threads %d, grid %lld, weights %s (%.1f MiB read a decoded token)\n", fw.threads(),
                static_cast<long long>(fw.grid_tokens()), fw.WeightsDescription().c_str(), decode_bytes_per_token / (1 << 20));
    report["weights"] = {{"format", fw.WeightsDescription()}, {"decode_bytes", decode_bytes_per_token}};
    if (stored_weights) {
      auto r = CompareWithStoredWeights(*stored_weights, fw);
      if (!r.ok()) return bench::Fail(r.status());
      std::printf("%s\n", r->Describe().c_str());
      report["weights"]["max_logit_error"] = r->max_logit_error;
      report["weights"]["logit_rms"] = r->logit_rms;
      stored_weights.reset();
    }
    {  // warm-up: touch the weights once
      SequenceState s(c);
      (void)fw.Prefill(s, std::span(ids.data(), 16));
    }
    for (int64_t n : {int64_t(512), int64_t(2048), int64_t(8192), int64_t(32768)}) {
      if (n > max_tokens) continue;
      SequenceState s(c);
      (void)s.Reserve(n + 64);
      std::vector<double> chunk_ms;
      const double t0 = Now();
      for (int64_t b = 0; b < n; b += fw.grid_tokens()) {
        const int64_t e = std::min(n, b + fw.grid_tokens());
        const double c0 = Now();
        auto r = fw.Prefill(s, std::span(ids.data() + b, static_cast<size_t>(e - b)));
        if (!r.ok()) return bench::Fail(r.status());
        chunk_ms.push_back((Now() - c0) * 1e3);
      }
      const double secs = Now() - t0;
      const double prefill_fraction = path_peak > 0 ? n / secs * prefill_flops_per_token / (path_peak * 1e9 * fw.threads()) : 0;
      std::printf("prefill %5lld tokens: %8.1f tok/s (%.2f s, %.0f%% of the path's peak); ms per chunk:", static_cast<long long>(n), n / secs,
                  secs, 100 * prefill_fraction);
      for (double ms : chunk_ms) std::printf(" %.0f", ms);
      std::printf("\n");
      report["prefill"][std::to_string(fw.threads())][std::to_string(n)] = {{"tokens_per_s", n / secs}, {"fraction_of_path_peak", prefill_fraction}};
      if (!decode) continue;
      // Decode after this context.
      const int steps = n >= 8192 ? std::max(1, decode_steps / 2) : decode_steps;
      const double d0 = Now();
      for (int i = 0; i < steps; ++i) {
        auto r = fw.Decode(s, ids[static_cast<size_t>(i)]);
        if (!r.ok()) return bench::Fail(r.status());
      }
      const double dsecs = Now() - d0;
      const double decode_fraction = fraction_of_stream(fw.threads(), steps / dsecs * decode_bytes_per_token);
      std::printf("decode at %5lld context: %7.1f tok/s (%.1f ms/token, %.0f%% of the stream rate)\n", static_cast<long long>(n), steps / dsecs,
                  dsecs / steps * 1e3, 100 * decode_fraction);
      report["decode"][std::to_string(fw.threads())][std::to_string(n)] = {{"tokens_per_s", steps / dsecs}, {"fraction_of_stream", decode_fraction}};
    }
    if (decode) {
      SequenceState s(c);
      const int steps = decode_steps;
      const double d0 = Now();
      for (int i = 0; i < steps; ++i) {
        auto r = fw.Decode(s, ids[static_cast<size_t>(i)]);
        if (!r.ok()) return bench::Fail(r.status());
      }
      const double dsecs = Now() - d0;
      const double decode_fraction = fraction_of_stream(fw.threads(), steps / dsecs * decode_bytes_per_token);
      std::printf("decode at     0 context: %7.1f tok/s (%.1f ms/token, %.0f%% of the stream rate)\n", steps / dsecs, dsecs / steps * 1e3,
                  100 * decode_fraction);
      report["decode"][std::to_string(fw.threads())]["0"] = {{"tokens_per_s", steps / dsecs}, {"fraction_of_stream", decode_fraction}};
    }
    // Several sequences decoded as one forward (DecodeBatch), each after its own 64-token prompt.
    double one_stream = 0;
    for (int64_t batch : decode ? batch_sizes : std::vector<int64_t>{}) {
      std::vector<std::unique_ptr<SequenceState>> states;
      std::vector<SequenceState*> pointers;
      for (int64_t b = 0; b < batch; ++b) {
        states.push_back(std::make_unique<SequenceState>(c));
        auto r = fw.Prefill(*states.back(), std::span(ids.data() + b * 64, 64));
        if (!r.ok()) return bench::Fail(r.status());
        pointers.push_back(states.back().get());
      }
      const int steps = decode_steps;
      const double d0 = Now();
      for (int i = 0; i < steps; ++i) {
        auto r = fw.DecodeBatch(pointers, std::span(ids.data() + i * batch, static_cast<size_t>(batch)));
        if (!r.ok()) return bench::Fail(r.status());
      }
      const double dsecs = Now() - d0;
      const double aggregate = static_cast<double>(steps * batch) / dsecs;
      if (batch == 1) one_stream = aggregate;
      std::printf("decode batch %2lld at 64 context: %7.1f tok/s in all, %6.1f a sequence (%.1f ms a step%s)\n", static_cast<long long>(batch),
                  aggregate, aggregate / static_cast<double>(batch), dsecs / steps * 1e3,
                  one_stream > 0 && batch > 1 ? (", " + std::to_string(aggregate / one_stream).substr(0, 4) + "x one sequence's").c_str() : "");
      report["decode_batch"][std::to_string(fw.threads())][std::to_string(batch)] = {{"tokens_per_s", aggregate}};
    }
  }
  if (accuracy) {  // Accuracy against the double reference at a short length, prefill and decode.
    const int64_t n = 8;
    std::vector<int32_t> short_ids(ids.begin(), ids.begin() + n);
    const double t0 = Now();
    const auto ref = reference::Logits(c, *weights, short_ids);
    ForwardOptions options{1024, 2};
    options.int8_weights = int8_weights;
    auto f = Forward::Create(c, *weights, options);
    if (!f.ok()) return bench::Fail(f.status());
    SequenceState s(c);
    auto all = (*f)->Prefill(s, short_ids, LogitsRows::kAll);
    if (!all.ok()) return bench::Fail(all.status());
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
      if (!r.ok()) return bench::Fail(r.status());
      for (int64_t i = 0; i < V; ++i) worst_dec = std::max(worst_dec, std::abs(double((*r)[i]) - ref[t * V + i]));
    }
    std::printf("accuracy (%lld tokens): max |logit - fp64 reference| prefill %.3g, decode %.3g (max |logit| %.3g; "
                "reference took %.1f s)\n",
                static_cast<long long>(n), worst, worst_dec, max_ref, Now() - t0);
  }
  std::printf("peak RSS: %.0f MiB\n", PeakRssMiB());
  report["peak_rss_mib"] = PeakRssMiB();
  if (as_json) std::printf("%s\n", report.dump().c_str());
  if (made_dir) std::filesystem::remove_all(dir);
  return 0;
}
