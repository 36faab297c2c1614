// Many candidates over one observation: an observation of N tokens, a question of 20 and C
// candidates of 38, scored from every candidate row's logits. Reuse on runs the observation and the
// question once and each candidate from the last 64-line below its first scored row; reuse off runs
// every branch alone (timed on --off-sample branches and scaled to C, since each costs the same),
// and those branches' logits are compared with reuse on's, bit for bit. Reuse with batching runs up
// to --max-batch candidates in one forward; every branch's logits are compared with reuse on's.
// anchorage-bench-decide [--model-dir DIR] [--size small] [--observation 3072] [--candidates 255]
//                        [--off-sample 4] [--max-batch 16] [--threads 2]; the layout given, then 1,024 x 32
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_util.h"
#include "engine/compute/cpu/cpu_features.h"
#include "engine/compute/cpu/matmul.h"
#include "engine/decide/decide.h"
#include "engine/model/model.h"

using namespace anchorage;

namespace {

constexpr int64_t kQuestionTokens = 20, kCandidateTokens = 38;

std::vector<DecideBranch> Branches(const ModelConfig& c, int64_t observation, int64_t candidates) {
  std::vector<int32_t> prompt = bench::PromptIds(c, observation, 1);
  const std::vector<int32_t> question = bench::PromptIds(c, kQuestionTokens, 2);
  prompt.insert(prompt.end(), question.begin(), question.end());
  std::vector<DecideBranch> branches;
  for (int64_t i = 0; i < candidates; ++i) {
    DecideBranch b;
    b.ids = prompt;
    const std::vector<int32_t> own = bench::PromptIds(c, kCandidateTokens, static_cast<uint32_t>(10 + i));
    b.ids.insert(b.ids.end(), own.begin(), own.end());
    b.logits_from = static_cast<int64_t>(prompt.size()) - 1;
    branches.push_back(std::move(b));
  }
  return branches;
}

// FNV-1a over the logits' bytes: equal hashes for equal bits.
uint64_t HashOf(std::span<const float> logits) {
  uint64_t h = 1469598103934665603ull;
  const auto* p = reinterpret_cast<const unsigned char*>(logits.data());
  for (size_t i = 0; i < logits.size_bytes(); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

int Run(Forward& f, const ModelConfig& c, int64_t observation, int64_t candidates, int64_t off_sample, int64_t max_batch) {
  const std::vector<DecideBranch> branches = Branches(c, observation, candidates);
  const int64_t sample = std::min(off_sample, candidates);
  std::vector<std::vector<float>> kept(static_cast<size_t>(sample));
  std::vector<uint64_t> hashes(branches.size());
  const DecideLayout on = PlanDecide(branches, 1, true);
  double t0 = bench::NowMs();
  Status s = RunDecide(f, branches, on, [&](size_t i, std::span<const float> logits) {
    if (static_cast<int64_t>(i) < sample) kept[i].assign(logits.begin(), logits.end());
    hashes[i] = HashOf(logits);
    return true;
  });
  const double on_ms = bench::NowMs() - t0;
  if (!s.ok()) return bench::Fail(s);
  const std::vector<DecideBranch> sampled(branches.begin(), branches.begin() + sample);
  const DecideLayout off = PlanDecide(sampled, 1, false);
  bool same = true;
  t0 = bench::NowMs();
  s = RunDecide(f, sampled, off, [&](size_t i, std::span<const float> logits) {
    same = same && logits.size() == kept[i].size() && std::memcmp(logits.data(), kept[i].data(), logits.size() * sizeof(float)) == 0;
    return true;
  });
  const double off_ms = (bench::NowMs() - t0) * static_cast<double>(candidates) / static_cast<double>(sample);
  if (!s.ok()) return bench::Fail(s);
  const DecideLayout batched = PlanDecide(branches, 1, true, DecideBatching::For(f, max_batch));
  bool batched_same = true;
  t0 = bench::NowMs();
  s = RunDecide(f, branches, batched, [&](size_t i, std::span<const float> logits) {
    batched_same = batched_same && HashOf(logits) == hashes[i];
    return true;
  });
  const double batched_ms = bench::NowMs() - t0;
  if (!s.ok()) return bench::Fail(s);
  std::printf("%lld-token observation x %lld candidates: logical %lld tokens, processed %lld with reuse (shared %lld)\n",
              static_cast<long long>(observation), static_cast<long long>(candidates), static_cast<long long>(on.logical_tokens),
              static_cast<long long>(on.processed_tokens), static_cast<long long>(on.shared));
  std::printf("  reuse off %.1f s (%lld of %lld branches timed, scaled), reuse on %.1f s: %.1fx; peak %.1f MiB; sampled answers the same bits: %s\n",
              off_ms / 1000.0, static_cast<long long>(sample), static_cast<long long>(candidates), on_ms / 1000.0, off_ms / on_ms,
              static_cast<double>(DecidePeakBytes(c, f, on)) / (1 << 20), same ? "yes" : "NO");
  int64_t batch_rows = 0;
  for (const DecideBatch& b : batched.batches) batch_rows = std::max(batch_rows, b.rows);
  std::printf("  reuse + batching (up to %lld a forward, %zu batches of up to %lld rows) %.1f s: %.1fx over reuse off, %.2fx over reuse on; peak %.1f MiB; "
              "every answer the same bits as reuse on: %s\n",
              static_cast<long long>(max_batch), batched.batches.size(), static_cast<long long>(batch_rows), batched_ms / 1000.0,
              off_ms / batched_ms, on_ms / batched_ms, static_cast<double>(DecidePeakBytes(c, f, batched)) / (1 << 20), batched_same ? "yes" : "NO");
  return same && batched_same ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_dir, size = "small";
  int64_t observation = 3072, candidates = 255, off_sample = 4, max_batch = 16;
  int threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--model-dir") model_dir = value;
    else if (flag == "--size") size = value;
    else if (flag == "--observation") observation = std::atoll(value.c_str());
    else if (flag == "--candidates") candidates = std::atoll(value.c_str());
    else if (flag == "--off-sample") off_sample = std::max<int64_t>(1, std::atoll(value.c_str()));
    else if (flag == "--threads") threads = std::atoi(value.c_str());
    else if (flag == "--max-batch") max_batch = std::max<int64_t>(1, std::atoll(value.c_str()));
    else return std::fprintf(stderr, "unknown flag %s\n", flag.c_str()), 2;
  }
  if (model_dir.empty()) model_dir = bench::ModelFolder(size);
  auto model = LoadModel(model_dir, ModelParts::kWeightsOnly);
  if (!model.ok()) return bench::Fail(model.status());
  const ModelConfig& c = (*model)->config;
  auto forward = Forward::Create(c, (*model)->weights, ForwardOptions{1024, threads});
  if (!forward.ok()) return bench::Fail(forward.status());
  std::printf("machine: %s; kernel path %s; %d threads; model %s (H %lld, %lld layers)\n", cpu::DetectCpu().brand.c_str(),
              cpu::PathName(cpu::ActivePath()), (*forward)->threads(), model_dir.c_str(), static_cast<long long>(c.hidden_size),
              static_cast<long long>(c.num_hidden_layers));
  int rc = Run(**forward, c, observation, candidates, off_sample, max_batch);
  if (rc == 0 && (observation != 1024 || candidates != 32)) rc = Run(**forward, c, 1024, 32, off_sample, max_batch);
  return rc;
}
