// Generation: prefill the prompt, then sample and decode token by token until a stop, the length
// limit, or cancellation. Runs on the calling (engine) thread.
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

class Generator {
 public:
  // tokenizer may be null: then no text is produced and stop strings are ignored.
  Generator(ComputeBackend& forward, const Tokenizer* tokenizer);

  // Prefills prompt_ids onto state (which may already hold a prefix: the prompt continues it) and
  // generates. cancel (optional) is polled between tokens. Errors come from the forward. On return the
  // state holds the prompt and every generated token except the last (sampled, never forwarded).
  Result<GenerationResult> Generate(SequenceState& state, std::span<const int32_t> prompt_ids,
                                    const SamplingParams& params, const TokenCallback& on_token,
                                    const std::atomic<bool>* cancel = nullptr, const SpeculativeOptions& speculative = {});

 private:
  ComputeBackend& forward_;
  const Tokenizer* tokenizer_;
};

}  // namespace anchorage
