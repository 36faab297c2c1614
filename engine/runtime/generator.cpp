#include "engine/runtime/generator.h"

#include "engine/runtime/lookup_drafter.h"
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

Generator::Generator(ComputeBackend& forward, const Tokenizer* tokenizer) : forward_(forward), tokenizer_(tokenizer) {}

Result<GenerationResult> Generator::Generate(SequenceState& state, std::span<const int32_t> prompt_ids,
                                             const SamplingParams& params, const TokenCallback& on_token,
                                             const std::atomic<bool>* cancel, const SpeculativeOptions& speculative) {
  GenerationResult result;
  result.prompt_tokens = static_cast<int64_t>(prompt_ids.size());
  const bool drafting = speculative.max_draft > 0 && (speculative.lookup || speculative.mtp) && forward_.has_draft_windows();
  // The MTP head's rows start at this prompt: the prefix the state already holds has no hidden rows here.
  MtpState mtp;
  MtpState* head = drafting && speculative.mtp && forward_.has_mtp() ? &mtp : nullptr;
  const int64_t sequence_start = state.length() - static_cast<int64_t>(speculative.history.size());  // position of sequence[0]
  std::vector<float> logits;
  ASSIGN_OR_RETURN(logits, forward_.Prefill(state, prompt_ids, LogitsRows::kLast, head));
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
  // Speculation: every id the state holds or will, for the drafter; the open window's rows.
  // Every pick is the sampler's on the same logits, history and draw as without drafts: a draft only
  // decides which rows are forwarded ahead, so sampled requests keep their tokens too.
  std::vector<int32_t> sequence;
  if (drafting) {
    sequence.assign(speculative.history.begin(), speculative.history.end());
    sequence.insert(sequence.end(), prompt_ids.begin(), prompt_ids.end());
  }
  std::vector<float> window;          // logits [rows, vocab] of the open window
  std::vector<int32_t> window_ids;    // its ids: the token that opened it, then the drafts
  int64_t window_used = 0;            // rows whose picks are made (their ids are kept)
  bool window_from_head = false;      // the MTP head drafted the open window
  int draft_length = speculative.max_draft;
  int head_backoff = 0, head_wait = 0;  // rounds the head sits out after a window it drafted all wrong
  const int64_t vocab = forward_.vocab_size();
  auto close_window = [&]() -> Status {
    if (window_ids.empty()) return Status::Ok();
    const int64_t drafts = static_cast<int64_t>(window_ids.size()) - 1, accepted = window_used - 1;
    result.accepted_tokens += accepted;
    // The draft length follows the acceptance: longer after a full window, shorter after a poor one.
    if (accepted == drafts) draft_length = std::min(speculative.max_draft, draft_length + 1);
    else if (2 * accepted < drafts) draft_length = std::max(1, draft_length / 2);
    if (window_from_head) {  // a head that keeps missing costs a pass of its layer and lm_head a draft: it waits longer each time
      head_backoff = accepted == 0 ? std::min(64, std::max(1, 2 * head_backoff)) : 0;
      head_wait = head_backoff;
    }
    window_ids.clear();
    return forward_.KeepDraft(state, window_used);
  };
  // The logits after id: the open window's next row when id is its next draft, else a new window or a decode.
  auto advance = [&](int32_t id) -> Status {
    if (!window_ids.empty()) {
      if (window_used < static_cast<int64_t>(window_ids.size()) && window_ids[static_cast<size_t>(window_used)] == id) {
        logits.assign(window.begin() + window_used * vocab, window.begin() + (window_used + 1) * vocab);
        ++window_used;
        return Status::Ok();
      }
      RETURN_IF_ERROR(close_window());
    }
    if (drafting) {
      const int64_t room = params.max_tokens - static_cast<int64_t>(result.tokens.size()) - 1;  // drafts past the last pick are wasted
      const int length = static_cast<int>(std::min<int64_t>(draft_length, room));
      std::vector<int32_t> draft;
      if (speculative.lookup && length > 0) {
        draft = LookupDraft(sequence, length);
        if (draft.empty() && speculative.store != nullptr) draft = speculative.store->Draft(sequence, length);
      }
      window_from_head = false;
      if (head != nullptr && head->pending_rows > 0) {
        // The head's waiting rows take the ids after them; the last one is id, about to be forwarded.
        const auto next = std::span<const int32_t>(sequence).subspan(
            static_cast<size_t>(head->begin + head->rows + 1 - sequence_start), static_cast<size_t>(head->pending_rows));
        if (draft.empty() && length > 0 && head_wait == 0) {
          ASSIGN_OR_RETURN(draft, forward_.MtpDraft(*head, next, length, vocab_limit));
          window_from_head = true;
        } else {
          if (head_wait > 0 && draft.empty()) --head_wait;
          RETURN_IF_ERROR(forward_.MtpCommit(*head, next));
        }
      }
      if (!draft.empty()) {
        draft.insert(draft.begin(), id);
        ASSIGN_OR_RETURN(window, forward_.DraftWindow(state, draft, head));
        window_ids = std::move(draft);
        result.drafted_tokens += static_cast<int64_t>(window_ids.size()) - 1;
        logits.assign(window.begin(), window.begin() + vocab);
        window_used = 1;
        return Status::Ok();
      }
    }
    ASSIGN_OR_RETURN(logits, forward_.Decode(state, id, head));
    return Status::Ok();
  };
  Status failed;
  while (static_cast<int64_t>(result.tokens.size()) < params.max_tokens) {
    if (cancel && cancel->load()) {
      result.finish = FinishReason::kCancelled;
      break;
    }
    GeneratedToken token;
    token.sampled = sampler.Sample(logits, result.tokens);
    const int32_t id = token.sampled.id;
    result.tokens.push_back(id);
    if (drafting) sequence.push_back(id);
    const bool stop_id = std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(), id) !=
                         params.stop_token_ids.end();
    const bool at_limit = static_cast<int64_t>(result.tokens.size()) >= params.max_tokens;
    bool stop_text = false;
    if (tokenizer_ && !stop_id) {
      raw += tokenizer_->TokenBytes(id);  // raw bytes: a character split across tokens is whole once its last byte comes
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
    failed = advance(id);
    if (!failed.ok()) break;
  }
  // The state holds every pick but the last, as without drafts.
  Status closed = close_window();
  if (!failed.ok()) return failed;
  RETURN_IF_ERROR(closed);
  if (result.finish == FinishReason::kCancelled && tokenizer_) {
    full += unicode::SanitizeUtf8(std::string_view(raw).substr(sanitized_bytes));
  }
  result.text = full;
  return result;
}

}  // namespace anchorage
