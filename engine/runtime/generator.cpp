#include "engine/runtime/generator.h"

#include "engine/text/unicode_text.h"

#include <algorithm>

namespace anchorage {
const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
  }
  return "unknown";
}

Generator::Generator(Forward& forward, const Tokenizer* tokenizer) : forward_(forward), tokenizer_(tokenizer) {}

Result<GenerationResult> Generator::Generate(SequenceState& state, std::span<const int32_t> prompt_ids,
                                             const SamplingParams& params, const TokenCallback& on_token,
                                             const std::atomic<bool>* cancel) {
  GenerationResult result;
  result.prompt_tokens = static_cast<int64_t>(prompt_ids.size());
  std::vector<float> logits;
  ASSIGN_OR_RETURN(logits, forward_.Prefill(state, prompt_ids, LogitsRows::kLast));
  const int64_t vocab_limit =
      tokenizer_ ? std::min<int64_t>(tokenizer_->vocab_size(), forward_.vocab_size()) : forward_.vocab_size();
  Sampler sampler(params, vocab_limit);
  size_t hold = 0;  // stop strings may straddle tokens: hold back their length minus one
  for (const auto& s : params.stop_strings) hold = std::max(hold, s.empty() ? 0 : s.size() - 1);
  std::string raw;             // bytes of all generated tokens (byte-level BPE decodes token by token)
  size_t sanitized_bytes = 0;  // bytes of `raw` already in `full`; always a whole-character boundary
  std::string full;            // valid UTF-8 text of raw[0, sanitized_bytes): invalid bytes become U+FFFD
  size_t emitted = 0;          // bytes of `full` already released
  result.finish = FinishReason::kLength;
  while (static_cast<int64_t>(result.tokens.size()) < params.max_tokens) {
    if (cancel && cancel->load()) {
      result.finish = FinishReason::kCancelled;
      break;
    }
    GeneratedToken token;
    token.sampled = sampler.Sample(logits, result.tokens);
    const int32_t id = token.sampled.id;
    result.tokens.push_back(id);
    const bool stop_id = std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(), id) !=
                         params.stop_token_ids.end();
    const bool at_limit = static_cast<int64_t>(result.tokens.size()) >= params.max_tokens;
    bool stop_text = false;
    if (tokenizer_ && !stop_id) {
      raw += tokenizer_->Decode({id});
      // A finished generation flushes an unfinished character as U+FFFD; else it waits for more bytes.
      const size_t complete = at_limit ? raw.size() : unicode::CompleteUtf8Prefix(raw);
      if (complete > sanitized_bytes) {
        full += unicode::SanitizeUtf8(std::string_view(raw).substr(sanitized_bytes, complete - sanitized_bytes));
        sanitized_bytes = complete;
      }
      size_t cut = std::string::npos;
      for (const auto& s : params.stop_strings) {
        if (s.empty()) continue;
        const size_t at = full.find(s, emitted > s.size() ? emitted - s.size() : 0);
        if (at != std::string::npos) cut = std::min(cut, at);
      }
      size_t release;
      if (cut != std::string::npos) {
        stop_text = true;
        full.resize(cut);
        release = cut;
      } else {
        release = at_limit ? full.size() : (full.size() > hold ? full.size() - hold : 0);
      }
      if (release > emitted) {
        token.text = full.substr(emitted, release - emitted);
        emitted = release;
      }
    }
    const bool finished_now = stop_id || stop_text;
    if (stop_id && tokenizer_) {
      full += unicode::SanitizeUtf8(std::string_view(raw).substr(sanitized_bytes));  // flush what was held back
      sanitized_bytes = raw.size();
      token.text = full.substr(emitted);
      emitted = full.size();
    }
    const bool keep_going = on_token ? on_token(token) : true;
    if (finished_now) {
      result.finish = FinishReason::kStop;
      break;
    }
    if (at_limit) break;
    if (!keep_going) {
      result.finish = FinishReason::kCancelled;
      break;
    }
    ASSIGN_OR_RETURN(logits, forward_.Decode(state, id));
  }
  if (result.finish == FinishReason::kCancelled && tokenizer_) {
    full += unicode::SanitizeUtf8(std::string_view(raw).substr(sanitized_bytes));
  }
  result.text = full;
  return result;
}

}  // namespace anchorage
