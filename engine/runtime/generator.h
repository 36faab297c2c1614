// Generation: prefill the prompt, then sample and decode token by token until a stop, the length
// limit, or cancellation.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/text/tokenizer.h"
#include "engine/runtime/compute_backend.h"
#include "engine/runtime/forward.h"
#include "engine/runtime/sampler.h"
#include "engine/runtime/sequence_state.h"
#include "engine/runtime/suffix_store.h"

namespace anchorage {

enum class FinishReason { kStop, kLength, kCancelled };
const char* FinishReasonName(FinishReason reason);  // "stop", "length", "cancelled"

struct GeneratedToken {
  SampledToken sampled;
  std::string text;  // the new text this token releases (may be empty while held back)
};

struct GenerationResult {
  std::vector<int32_t> tokens;  // generated ids, including a stop token id if one ended it
  std::string text;             // decoded text, cut before a matched stop string
  FinishReason finish = FinishReason::kLength;
  int64_t prompt_tokens = 0;
  int64_t drafted_tokens = 0;   // ids the drafter proposed
  int64_t accepted_tokens = 0;  // of those, the ones the model picked too
};

// Speculative decoding: lookup or MTP drafts verified in one draft window a round; the tokens and
// the state are the same bits as plain decoding, greedy or sampled (the same draws in the same order).
struct SpeculativeOptions {
  int max_draft = 0;                  // most drafts a window; 0: off
  bool lookup = true;                 // n-gram copies of the sequence (and the store)
  bool mtp = false;                   // the checkpoint's MTP head, where lookup finds nothing
  std::span<const int32_t> history;   // the ids the state holds before the prompt (the drafter reads them too)
  const SuffixStore* store = nullptr; // earlier requests' ids, asked when the sequence itself has no match
};

// Called once per generated token; returning false cancels before the next token.
using TokenCallback = std::function<bool(const GeneratedToken&)>;

// One generation as steps, so an engine loop can run the plain decode steps of several in one
// forward: Prefill forwards the prompt, Step samples and releases the next token and runs what it
// needs on its own (a draft window, a decode with the MTP head), leaving a plain decode (and, with
// windows deferred, a draft window) to the caller (pending_rows, then Forwarded). Runs on the calling
// (engine) thread. The tokens and the state are the same bits however the pending rows are run.
class GenerationTask {
 public:
  // tokenizer may be null: then no text is produced and stop strings are ignored. The prompt continues
  // what state holds; speculative.history and store must outlive the task. cancel (optional) is polled
  // before each pick.
  GenerationTask(ComputeBackend& forward, const Tokenizer* tokenizer, SequenceState& state, std::vector<int32_t> prompt_ids,
                 const SamplingParams& params, TokenCallback on_token, const std::atomic<bool>* cancel = nullptr,
                 const SpeculativeOptions& speculative = {});

  // Forwards the prompt; its last row's logits are the first pick's. A failure ends the task (Finish returns it).
  // riders (optional): other tasks' decodes its forward may carry (ComputeBackend::PrefillCarrying).
  Status Prefill(DecodeRiders* riders = nullptr);
  // Picks and releases one token; false when the generation ended (or failed: Finish says).
  // Afterwards pending_rows() may name ids the caller forwards.
  bool Step();
  // What to forward before the next Step, when the caller runs it (alone or in a batch): one id, a
  // plain decode; more, a deferred draft window (the token, then its drafts: DecodeWindowsBatch opens
  // it); none, nothing.
  const std::vector<int32_t>& pending_rows() const { return pending_; }
  // The pending rows' logits [rows, vocab] (or the forward's error).
  void Forwarded(Result<std::vector<float>> logits);
  // Runs the pending rows on their own.
  void DecodeAlone();
  // Whether the task may open draft windows (a backend without window batches keeps one open window
  // at a time: an engine running several tasks lets none draft). Closing the open window keeps the
  // tokens the same.
  void set_may_draft(bool may);
  // Whether lookup drafts' windows wait in pending_rows for the caller (a task with the MTP head opens its own).
  void set_defer_windows(bool defer) { defer_windows_ = defer; }
  // After the last Step: closes an open draft window and returns the generation. On return the state
  // holds the prompt and every generated token except the last (sampled, never forwarded).
  Result<GenerationResult> Finish();

  SequenceState& state() { return state_; }
  int64_t generated() const { return static_cast<int64_t>(result_.tokens.size()); }
  // The share of its drafts the picks have kept so far, from a prior of one kept in two.
  double draft_acceptance() const {
    return (static_cast<double>(result_.accepted_tokens) + 1.0) / (static_cast<double>(result_.drafted_tokens) + 2.0);
  }

 private:
  // The logits after id: the open window's next row when id is its next draft, else a new window; a
  // plain decode is left pending.
  Status Advance(int32_t id);
  Status CloseWindow();
  // window_ids_'s window from its logits (or its error: no window then).
  Status OpenWindow(Result<std::vector<float>> logits);
  // A failed status ends the task (Finish returns it); returns status.
  Status Fail(Status status);

  ComputeBackend& forward_;
  const Tokenizer* tokenizer_;
  SequenceState& state_;
  std::vector<int32_t> prompt_ids_;
  SamplingParams params_;
  TokenCallback on_token_;
  const std::atomic<bool>* cancel_;
  SpeculativeOptions speculative_;
  GenerationResult result_;
  bool drafting_ = false;
  bool windows_refused_ = false;  // a window found no room: no more drafts (the tokens are the same)
  MtpState mtp_;
  MtpState* head_ = nullptr;      // the MTP head's rows start at this prompt
  int64_t sequence_start_ = 0;    // position of sequence_[0]
  int64_t vocab_limit_ = 0;
  Sampler sampler_;
  std::vector<float> logits_;
  size_t hold_ = 0;               // stop strings may straddle tokens: hold back their length minus one
  std::string raw_;               // bytes of all generated tokens (byte-level BPE decodes token by token)
  size_t sanitized_bytes_ = 0;    // bytes of raw_ already in full_; always a whole-character boundary
  std::string full_;              // valid UTF-8 text of raw_[0, sanitized_bytes_): invalid bytes become U+FFFD
  size_t emitted_ = 0;            // bytes of full_ already released
  std::vector<int32_t> sequence_; // every id the state holds or will, for the drafter
  std::vector<float> window_;     // logits [rows, vocab] of the open window
  std::vector<int32_t> window_ids_;  // its ids: the token that opened it, then the drafts
  int64_t window_used_ = 0;       // rows whose picks are made (their ids are kept)
  bool window_from_head_ = false; // the MTP head drafted the open window
  int draft_length_ = 0;
  bool may_draft_ = true;
  int head_backoff_ = 0, head_wait_ = 0;  // rounds the head sits out after a window it drafted all wrong
  std::vector<int32_t> pending_;  // pending_rows
  bool defer_windows_ = false;
  bool ended_ = false;
  Status failed_;
};

// Prefills and generates to the end on the calling thread, every decode on its own.
Result<GenerationResult> RunGeneration(GenerationTask& task);

// A whole generation in one call, for callers that run one sequence at a time.
class Generator {
 public:
  // tokenizer may be null: then no text is produced and stop strings are ignored.
  Generator(ComputeBackend& forward, const Tokenizer* tokenizer) : forward_(forward), tokenizer_(tokenizer) {}

  // Prefills prompt_ids onto state (which may already hold a prefix: the prompt continues it) and
  // generates; as GenerationTask.
  Result<GenerationResult> Generate(SequenceState& state, std::span<const int32_t> prompt_ids, const SamplingParams& params,
                                    const TokenCallback& on_token, const std::atomic<bool>* cancel = nullptr,
                                    const SpeculativeOptions& speculative = {}) {
    GenerationTask task(forward_, tokenizer_, state, std::vector<int32_t>(prompt_ids.begin(), prompt_ids.end()), params, on_token, cancel,
                        speculative);
    return RunGeneration(task);
  }

 private:
  ComputeBackend& forward_;
  const Tokenizer* tokenizer_;
};

}  // namespace anchorage
