// Speculative decoding on the model. Verify cost: a draft window of k = 1..8 rows (and its keep)
// against one decode step, median of 5. A copy-heavy turn: a reply that repeats a file of N tokens
// from the prompt (forced through the real forward, so the lookup drafter's acceptance is real),
// decoded with drafts off and on: tokens a second after the first, drafted and accepted tokens, and
// whether both runs left the same tokens and state bits. Where the checkpoint has an MTP head: the
// cost of its k = 1..4 drafts against a decode step, and a free greedy turn with drafts off, from the
// head, and from lookup then the head (what the head's acceptance gains or costs on this checkpoint).
// anchorage-bench-speculative [--model-dir DIR] [--size small] [--file 400] [--max-draft 8] [--threads 2]
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_util.h"
#include "engine/compute/cpu/cpu_features.h"
#include "engine/compute/cpu/matmul.h"
#include "engine/model/model.h"
#include "engine/runtime/forward.h"
#include "engine/runtime/generator.h"

using namespace anchorage;

SpeculativeOptions Drafts(int max_draft, bool lookup, bool mtp) {
  SpeculativeOptions spec;
  spec.max_draft = max_draft;
  spec.lookup = lookup;
  spec.mtp = mtp;
  return spec;
}

// Prefills all of prompt but its last id, generates from it and returns tokens a second after the first.
double TimedTurn(Forward& f, Generator& generator, const std::vector<int32_t>& prompt, const SamplingParams& params,
                 SpeculativeOptions spec, SequenceState& s, GenerationResult* out) {
  (void)f.Prefill(s, std::span(prompt).first(prompt.size() - 1));
  spec.history = std::span(prompt).first(prompt.size() - 1);
  double first = 0;
  auto r = generator.Generate(s, std::span(prompt).last(1), params, [&](const GeneratedToken&) {
    if (first == 0) first = bench::NowMs();
    return true;
  }, nullptr, spec);
  const double end = bench::NowMs();
  if (!r.ok()) return 0;
  *out = *r;
  return static_cast<double>(r->tokens.size() - 1) / ((end - first) / 1000.0);
}

int main(int argc, char** argv) {
  std::string model_dir, size = "small";
  int64_t file_tokens = 400;
  int max_draft = 8, threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--model-dir") model_dir = value;
    else if (flag == "--size") size = value;
    else if (flag == "--file") file_tokens = std::atoll(value.c_str());
    else if (flag == "--max-draft") max_draft = std::atoi(value.c_str());
    else if (flag == "--threads") threads = std::atoi(value.c_str());
    else return std::fprintf(stderr, "unknown flag %s\n", flag.c_str()), 2;
  }
  if (model_dir.empty()) model_dir = bench::ModelFolder(size);
  auto model = LoadModel(model_dir, ModelParts::kWeightsOnly);
  if (!model.ok()) return bench::Fail(model.status());
  const ModelConfig& c = (*model)->config;
  auto forward = Forward::Create(c, (*model)->weights, ForwardOptions{1024, threads});
  if (!forward.ok()) return bench::Fail(forward.status());
  Forward& f = **forward;
  std::printf("machine: %s; kernel path %s; %d threads; model %s (H %lld, %lld layers)\n", cpu::DetectCpu().brand.c_str(), cpu::PathName(cpu::ActivePath()), f.threads(),
              model_dir.c_str(), static_cast<long long>(c.hidden_size), static_cast<long long>(c.num_hidden_layers));

  // Verify cost against a decode step, at a 1,024-token context.
  const std::vector<int32_t> context = bench::PromptIds(c, 1024, 1);
  SequenceState state(c);
  if (Status s = f.Prefill(state, context).status(); !s.ok()) return bench::Fail(s);
  std::vector<double> decode_ms;
  SequenceState stepping(c);
  (void)f.Prefill(stepping, context);
  for (int i = 0; i < 5; ++i) {
    const double t0 = bench::NowMs();
    (void)f.Decode(stepping, context[static_cast<size_t>(i)]);
    decode_ms.push_back(bench::NowMs() - t0);
  }
  const double decode = bench::Percentile(decode_ms, 0.5);
  std::printf("decode step: %.1f ms\n", decode);
  for (int k = 1; k <= 8; ++k) {
    std::vector<double> ms;
    const std::vector<int32_t> ids(context.begin(), context.begin() + k);
    for (int i = 0; i < 5; ++i) {
      const double t0 = bench::NowMs();
      if (Status s = f.DraftWindow(state, ids).status(); !s.ok()) return bench::Fail(s);
      if (Status s = f.KeepDraft(state, 0); !s.ok()) return bench::Fail(s);
      ms.push_back(bench::NowMs() - t0);
    }
    const double window = bench::Percentile(ms, 0.5);
    std::printf("window of %d rows: %.1f ms (%.2f decode steps; %.2f ms a row)\n", k, window, window / decode, window / k);
  }

  // A copy-heavy turn: the prompt holds a file, the reply repeats it.
  std::vector<int32_t> prompt = bench::PromptIds(c, 300, 2);
  const std::vector<int32_t> file = bench::PromptIds(c, file_tokens, 3);
  prompt.insert(prompt.end(), file.begin(), file.end());
  const std::vector<int32_t> ask = bench::PromptIds(c, 20, 4);
  prompt.insert(prompt.end(), ask.begin(), ask.end());
  SamplingParams params;
  params.temperature = 0;
  params.max_tokens = file_tokens;
  params.forced_ids = file;
  Generator generator(f, nullptr);
  SequenceState plain_state(c), draft_state(c);
  GenerationResult plain, drafted;
  const double off = TimedTurn(f, generator, prompt, params, SpeculativeOptions{}, plain_state, &plain);
  const double on = TimedTurn(f, generator, prompt, params, Drafts(max_draft, true, false), draft_state, &drafted);
  const bool same = plain.tokens == drafted.tokens && plain_state.BitEqual(draft_state);
  std::printf("copy-heavy turn (a %lld-token file repeated): drafts off %.2f tok/s, on %.2f tok/s (%.2fx); drafted %lld, accepted %lld (%.1f %%); same tokens and state bits: %s\n",
              static_cast<long long>(file_tokens), off, on, on / off, static_cast<long long>(drafted.drafted_tokens),
              static_cast<long long>(drafted.accepted_tokens), 100.0 * static_cast<double>(drafted.accepted_tokens) / std::max<int64_t>(1, drafted.drafted_tokens),
              same ? "yes" : "NO");
  if (!same) return 1;
  if (!f.has_mtp()) {
    std::printf("MTP head: none (%s)\n", (*model)->weights.mtp_note.c_str());
    return 0;
  }
  // The head's draft cost after a 1,024-token prompt: a commit of the waiting row, then k drafts.
  for (int k = 1; k <= 4; ++k) {
    std::vector<double> ms;
    for (int i = 0; i < 5; ++i) {
      SequenceState s(c);
      MtpState mtp;
      (void)f.Prefill(s, context, LogitsRows::kLast, &mtp);
      const int32_t next = context[static_cast<size_t>(i)];
      const double t0 = bench::NowMs();
      if (Status st = f.MtpDraft(mtp, std::span(&next, 1), k, c.vocab_size).status(); !st.ok()) return bench::Fail(st);
      ms.push_back(bench::NowMs() - t0);
    }
    const double draft = bench::Percentile(ms, 0.5);
    std::printf("MTP head, %d drafts: %.1f ms (%.2f decode steps)\n", k, draft, draft / decode);
  }
  // A free greedy turn: the model's own reply to a prompt without copies.
  SamplingParams free_params;
  free_params.temperature = 0;
  free_params.max_tokens = 128;
  const std::vector<int32_t> question = bench::PromptIds(c, 600, 5);
  SequenceState free_plain_state(c);
  GenerationResult free_plain;
  const double free_off = TimedTurn(f, generator, question, free_params, SpeculativeOptions{}, free_plain_state, &free_plain);
  std::printf("free greedy turn (%lld tokens): drafts off %.2f tok/s\n", static_cast<long long>(free_plain.tokens.size()), free_off);
  bool all_same = true;
  for (auto [name, lookup] : {std::pair{"mtp", false}, std::pair{"both", true}}) {
    SequenceState s(c);
    GenerationResult r;
    const double rate = TimedTurn(f, generator, question, free_params, Drafts(max_draft, lookup, true), s, &r);
    const bool same_bits = r.tokens == free_plain.tokens && s.BitEqual(free_plain_state);
    all_same = all_same && same_bits;
    std::printf("  mode %s: %.2f tok/s (%.2fx); drafted %lld, accepted %lld; same tokens and state bits: %s\n", name, rate, rate / free_off,
                static_cast<long long>(r.drafted_tokens), static_cast<long long>(r.accepted_tokens), same_bits ? "yes" : "NO");
  }
  return all_same ? 0 : 1;
}
