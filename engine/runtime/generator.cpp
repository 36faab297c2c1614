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

namespace {
int64_t VocabLimit(const ComputeBackend& forward, const Tokenizer* tokenizer) {
  return tokenizer ? std::min<int64_t>(tokenizer->vocab_size(), forward.vocab_size()) : forward.vocab_size();
}
}  // namespace

GenerationTask::GenerationTask(ComputeBackend& forward, const Tokenizer* tokenizer, SequenceState& state, std::vector<int32_t> prompt_ids,
                               const SamplingParams& params, TokenCallback on_token, const std::atomic<bool>* cancel,
                               const SpeculativeOptions& speculative)
    : forward_(forward),
      tokenizer_(tokenizer),
      state_(state),
      prompt_ids_(std::move(prompt_ids)),
      params_(params),
      on_token_(std::move(on_token)),
      cancel_(cancel),
      speculative_(speculative),
      vocab_limit_(VocabLimit(forward, tokenizer)),
      sampler_(params, vocab_limit_) {
  result_.prompt_tokens = static_cast<int64_t>(prompt_ids_.size());
  result_.finish = FinishReason::kLength;
  drafting_ = speculative.max_draft > 0 && (speculative.lookup || speculative.mtp) && forward_.has_draft_windows();
  head_ = drafting_ && speculative.mtp && forward_.has_mtp() ? &mtp_ : nullptr;
  draft_length_ = speculative.max_draft;
  for (const auto& s : params.stop_strings) hold_ = std::max(hold_, s.empty() ? 0 : s.size() - 1);
  // Every pick is the sampler's on the same logits, history and draw as without drafts: a draft only
  // decides which rows are forwarded ahead, so sampled requests keep their tokens too.
  if (drafting_) {
    sequence_.assign(speculative.history.begin(), speculative.history.end());
    sequence_.insert(sequence_.end(), prompt_ids_.begin(), prompt_ids_.end());
  }
}

Status GenerationTask::Prefill(DecodeRiders* riders) {
  sequence_start_ = state_.length() - static_cast<int64_t>(speculative_.history.size());
  auto logits = riders != nullptr ? forward_.PrefillCarrying(state_, prompt_ids_, head_, *riders)
                                  : forward_.Prefill(state_, prompt_ids_, LogitsRows::kLast, head_);
  if (!logits.ok()) return Fail(logits.status());
  logits_ = std::move(logits).value();
  return Status::Ok();
}

Status GenerationTask::CloseWindow() {
  if (pending_.size() > 1) {  // a deferred window never forwarded: nothing to keep
    pending_.clear();
    window_ids_.clear();
  }
  if (window_ids_.empty()) return Status::Ok();
  const int64_t drafts = static_cast<int64_t>(window_ids_.size()) - 1, accepted = window_used_ - 1;
  result_.accepted_tokens += accepted;
  // The draft length follows the acceptance: longer after a full window, shorter after a poor one.
  if (accepted == drafts) draft_length_ = std::min(speculative_.max_draft, draft_length_ + 1);
  else if (2 * accepted < drafts) draft_length_ = std::max(1, draft_length_ / 2);
  if (window_from_head_) {  // a head that keeps missing costs a pass of its layer and lm_head a draft: it waits longer each time
    head_backoff_ = accepted == 0 ? std::min(64, std::max(1, 2 * head_backoff_)) : 0;
    head_wait_ = head_backoff_;
  }
  window_ids_.clear();
  return forward_.KeepDraft(state_, window_used_);
}

Status GenerationTask::Advance(int32_t id) {
  const int64_t vocab = forward_.vocab_size();
  if (!window_ids_.empty()) {
    if (may_draft_ && window_used_ < static_cast<int64_t>(window_ids_.size()) && window_ids_[static_cast<size_t>(window_used_)] == id) {
      logits_.assign(window_.begin() + window_used_ * vocab, window_.begin() + (window_used_ + 1) * vocab);
      ++window_used_;
      return Status::Ok();
    }
    RETURN_IF_ERROR(CloseWindow());
  }
  if (drafting_) {
    const int64_t room = params_.max_tokens - generated() - 1;  // drafts past the last pick are wasted
    const int length = may_draft_ && !windows_refused_ ? static_cast<int>(std::min<int64_t>(draft_length_, room)) : 0;
    std::vector<int32_t> draft;
    if (speculative_.lookup && length > 0) {
      draft = LookupDraft(sequence_, length);
      if (draft.empty() && speculative_.store != nullptr) draft = speculative_.store->Draft(sequence_, length);
      draft.erase(std::find_if(draft.begin(), draft.end(), IsImageKey), draft.end());  // a copy runs into an image: drafts are tokens
    }
    window_from_head_ = false;
    if (head_ != nullptr && head_->pending_rows > 0) {
      // The head's waiting rows take the ids after them; the last one is id, about to be forwarded.
      const auto next = std::span<const int32_t>(sequence_).subspan(
          static_cast<size_t>(head_->begin + head_->rows + 1 - sequence_start_), static_cast<size_t>(head_->pending_rows));
      if (draft.empty() && length > 0 && head_wait_ == 0) {
        ASSIGN_OR_RETURN(draft, forward_.MtpDraft(*head_, next, length, vocab_limit_));
        window_from_head_ = true;
      } else {
        if (head_wait_ > 0 && draft.empty()) --head_wait_;
        RETURN_IF_ERROR(forward_.MtpCommit(*head_, next));
      }
    }
    if (!draft.empty()) {
      draft.insert(draft.begin(), id);
      window_ids_ = std::move(draft);
      if (defer_windows_ && head_ == nullptr) {
        pending_ = window_ids_;
        return Status::Ok();
      }
      return OpenWindow(forward_.DraftWindow(state_, window_ids_, head_));
    }
  }
  if (head_ != nullptr) {
    ASSIGN_OR_RETURN(logits_, forward_.Decode(state_, id, head_));
    return Status::Ok();
  }
  pending_ = {id};
  return Status::Ok();
}

Status GenerationTask::OpenWindow(Result<std::vector<float>> logits) {
  if (!logits.ok()) {
    const int32_t id = window_ids_.empty() ? -1 : window_ids_.front();
    window_ids_.clear();
    if (logits.status().code() != StatusCode::kResourceExhausted || id < 0) return logits.status();
    // No room for a window's rows (a device's draft log): the generation goes on without drafts.
    windows_refused_ = true;
    ASSIGN_OR_RETURN(logits_, forward_.Decode(state_, id, head_));
    return Status::Ok();
  }
  const int64_t vocab = forward_.vocab_size();
  window_ = std::move(logits).value();
  result_.drafted_tokens += static_cast<int64_t>(window_ids_.size()) - 1;
  logits_.assign(window_.begin(), window_.begin() + vocab);
  window_used_ = 1;
  return Status::Ok();
}

bool GenerationTask::Step() {
  if (ended_ || !pending_.empty()) return !ended_;
  if (generated() >= params_.max_tokens) return !(ended_ = true);
  if (cancel_ && cancel_->load()) {
    result_.finish = FinishReason::kCancelled;
    return !(ended_ = true);
  }
  GeneratedToken token;
  token.sampled = sampler_.Sample(logits_, result_.tokens);
  const int32_t id = token.sampled.id;
  result_.tokens.push_back(id);
  if (drafting_) sequence_.push_back(id);
  const bool stop_id = std::find(params_.stop_token_ids.begin(), params_.stop_token_ids.end(), id) != params_.stop_token_ids.end();
  const bool at_limit = generated() >= params_.max_tokens;
  bool stop_text = false;
  if (tokenizer_ && !stop_id) {
    raw_ += tokenizer_->TokenBytes(id);  // raw bytes: a character split across tokens is whole once its last byte comes
    // A finished generation flushes an unfinished character as U+FFFD; else it waits for more bytes.
    const size_t complete = at_limit ? raw_.size() : unicode::CompleteUtf8Prefix(raw_);
    if (complete > sanitized_bytes_) {
      full_ += unicode::SanitizeUtf8(std::string_view(raw_).substr(sanitized_bytes_, complete - sanitized_bytes_));
      sanitized_bytes_ = complete;
    }
    size_t cut = std::string::npos;
    for (const auto& s : params_.stop_strings) {
      if (s.empty()) continue;
      const size_t at = full_.find(s, emitted_ > s.size() ? emitted_ - s.size() : 0);
      if (at != std::string::npos) cut = std::min(cut, at);
    }
    size_t release;
    if (cut != std::string::npos) {
      stop_text = true;
      full_.resize(cut);
      release = cut;
    } else {
      release = at_limit ? full_.size() : (full_.size() > hold_ ? full_.size() - hold_ : 0);
    }
    if (release > emitted_) {
      token.text = full_.substr(emitted_, release - emitted_);
      emitted_ = release;
    }
  }
  if (stop_id && tokenizer_) {
    full_ += unicode::SanitizeUtf8(std::string_view(raw_).substr(sanitized_bytes_));  // flush what was held back
    sanitized_bytes_ = raw_.size();
    token.text = full_.substr(emitted_);
    emitted_ = full_.size();
  }
  const bool keep_going = on_token_ ? on_token_(token) : true;
  if (stop_id || stop_text) {
    result_.finish = FinishReason::kStop;
    return !(ended_ = true);
  }
  if (at_limit) return !(ended_ = true);
  if (!keep_going) {
    result_.finish = FinishReason::kCancelled;
    return !(ended_ = true);
  }
  (void)Fail(Advance(id));  // a failure ends the task: Finish reports it
  return !ended_;
}

void GenerationTask::set_may_draft(bool may) {
  may_draft_ = may;
  if (may || window_ids_.empty() || ended_) return;
  (void)Fail(CloseWindow());
}

Status GenerationTask::Fail(Status status) {
  if (!status.ok()) {
    failed_ = status;
    ended_ = true;
  }
  return status;
}

void GenerationTask::Forwarded(Result<std::vector<float>> logits) {
  const bool window = pending_.size() > 1;
  pending_.clear();
  if (window) {
    (void)Fail(OpenWindow(std::move(logits)));
  } else if (logits.ok()) {
    logits_ = std::move(logits).value();
  } else {
    (void)Fail(logits.status());
  }
}

void GenerationTask::DecodeAlone() {
  if (pending_.size() == 1) Forwarded(forward_.Decode(state_, pending_.front()));
  else if (pending_.size() > 1) Forwarded(forward_.DraftWindow(state_, pending_, head_));
}

Result<GenerationResult> GenerationTask::Finish() {
  // The state holds every pick but the last, as without drafts.
  Status closed = CloseWindow();
  if (!failed_.ok()) return failed_;
  RETURN_IF_ERROR(closed);
  if (result_.finish == FinishReason::kCancelled && tokenizer_) full_ += unicode::SanitizeUtf8(std::string_view(raw_).substr(sanitized_bytes_));
  result_.text = full_;
  return result_;
}

Result<GenerationResult> RunGeneration(GenerationTask& task) {
  if (task.Prefill().ok())
        while (task.Step()) task.DecodeAlone();
  return task.Finish();
}

}  // namespace anchorage
