// The shadow reader: a second, small engine over a model of the same vocabulary that keeps every
// session's exact state (ShadowSession), reads it in idle windows and in a ration inside each turn,
// answers typed questions on a fork, keeps the operator's agreement question, and holds its
// resident states under a byte cap with the least recently used ones on disk. Every model call
// runs with the engine lock held (the engine thread, or an ask that took the lock).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/cache/disk_env.h"
#include "engine/core/status.h"
#include "engine/journal/journal.h"
#include "engine/model/model.h"
#include "engine/runtime/forward.h"
#include "engine/shadow/shadow_session.h"

namespace anchorage {

inline constexpr int64_t kShadowGridTokens = 512;

struct ShadowOptions {
  bool enabled = true;
  double ration = 0.02;          // share of a turn's time since its first token the reader may use
  double slice_ms = 150;         // most a rationed slice reads between two decode steps
  double idle_read_ms = 2000;    // most an idle window reads
  int64_t budget_bytes = 4ll << 30;          // resident states; past it the least recent go to disk
  int64_t disk_budget_bytes = 16ll << 30;    // session files
  int64_t disk_ttl_ms = 48ll * 3600 * 1000;  // a session file unused this long goes
  std::string question = "What does the user ask for in the last message?";
  std::vector<std::string> choices = {"a code edit", "an explanation", "something else"};
  int64_t min_tokens = 8192;     // the agreement question is asked at turns with prompts this long
  int64_t context_tokens = 0;    // read rows plus a question must fit; 0: the shadow model's
};

// A question as ids: the choices' letters and the user turn that asks it.
struct ShadowQuestion {
  std::vector<int32_t> ids;
  std::vector<int32_t> letter_ids;  // "A", "B", ... one token each
  std::vector<std::string> choices;
  std::string text;
};

struct ShadowAnswer {
  int choice = 0;
  std::vector<double> probabilities;  // softmax over the letters, in choice order
  int64_t read_tokens = 0;            // session ids the answer saw
  int64_t behind_tokens = 0;          // session ids it did not
  double ms = 0;
};

// One turn's agreement: the shadow's answer and the main model's at the turn's insertion point.
struct ShadowAgreement {
  int64_t time_ms = 0;
  std::string session;
  std::string question;
  std::vector<std::string> choices;
  int64_t insertion = 0;      // ids before the question (the prompt's last <|im_end|> included)
  int64_t behind_tokens = 0;  // how far behind the reader was when the turn began
  double lag_ms = 0;          // from the turn's start to the shadow's answer
  std::optional<ShadowAnswer> shadow, main;
  std::string main_note;      // why the main model did not answer, when it did not
  std::optional<bool> agree;
};

struct ShadowSessionInfo {
  std::string session;
  int64_t known = 0, read = 0, backlog = 0, bytes = 0;
  std::vector<int64_t> checkpoints;
  bool on_disk = false;  // not resident: its file is on disk
  int64_t last_used_ms = 0;
};

struct ShadowStatus {
  bool enabled = false;
  std::string model;
  int64_t grid_tokens = kShadowGridTokens;
  std::vector<ShadowSessionInfo> sessions;  // most recently used first
  int64_t resident_bytes = 0, budget_bytes = 0, disk_bytes = 0, disk_files = 0;
  int64_t ration_tokens = 0;  // of tokens_read, those read inside turns (the rest in idle windows)
  int64_t chunks_read = 0, tokens_read = 0, rollbacks = 0, reread_tokens = 0, evictions = 0, disk_loads = 0, drops = 0;
  double read_ms = 0;                  // over every chunk
  double ms_per_1000_tokens = 0;
  int64_t asks = 0, compared = 0, agreed = 0;
  std::vector<ShadowAgreement> last_agreements;  // newest first
  std::string question;
  std::vector<std::string> choices;
  double ration = 0;
  std::string last_error;
};

// GET /v1/shadow/status's document.
nlohmann::ordered_json ShadowStatusJson(const ShadowStatus& status);

class ShadowReader {
 public:
  // main: the served model, whose vocabulary and tokenizer the shadow model must share. disk_dir
  // empty: no disk (an evicted session is dropped and read again). journal may be null.
  static Result<std::unique_ptr<ShadowReader>> Create(std::unique_ptr<Model> shadow_model, const Model& main, const ForwardOptions& forward,
                                                      const std::string& disk_dir, ShadowOptions options, Journal* journal = nullptr);
  ~ShadowReader();

  // Options apply from the next call (any thread).
  void SetOptions(const ShadowOptions& options);
  ShadowOptions options() const;

  // Engine side, with the engine lock held.
  // A turn begins: the session now holds its served prompt.
  void BeginTurn(const std::string& session, std::span<const int32_t> served_prompt);
  // The turn's output as it comes.
  void NoteOutput(const std::string& session, std::span<const int32_t> ids);
  // Between two decode steps: reads whole chunks of the session within the ration of ms_since_first_token.
  void ReadRationed(const std::string& session, double ms_since_first_token);
  // An idle window: reads (and answers what is due) until should_stop() or the window ends; returns
  // whether anything was done. main_fork answers the main model's side of the agreement question.
  using MainFork = std::function<Result<std::vector<float>>(std::span<const int32_t> context, std::span<const int32_t> question)>;
  bool IdleWork(const std::function<bool()>& should_stop, const MainFork& main_fork);
  // Whether IdleWork has anything to do.
  bool HasIdleWork() const;
  // A typed question over everything the session holds that the reader has read (the committed
  // rows and up to a grid less one of the pending tail).
  Result<ShadowAnswer> Ask(const std::string& session, const ShadowQuestion& question);
  // Writes every resident session to disk (a planned stop).
  Status WriteAll();
  // Drops every session, resident and on disk.
  Status Clear();

  // Any thread.
  Result<ShadowQuestion> PrepareQuestion(const std::string& question, const std::vector<std::string>& choices) const;
  // Waits until the session is fresh (less than a chunk behind) or timeout_ms passes; NotFound when
  // the reader holds no such session.
  Status WaitFresh(const std::string& session, int timeout_ms);
  ShadowStatus Snapshot() const;
  int64_t resident_bytes() const { return resident_bytes_.load(); }
  // Chunks read since the start, and that count when the last turn began (tests assert ordering).
  int64_t chunks_read() const { return chunks_read_.load(); }
  int64_t chunks_at_last_turn() const { return chunks_at_turn_.load(); }
  const Model& model() const { return *model_; }
  Forward& forward() { return *forward_; }
  // A resident session's state, or null (engine lock held).
  const ShadowSession* Find(const std::string& session) const;
  const std::string& fingerprint() const { return fingerprint_; }

 private:
  struct Entry {
    std::unique_ptr<ShadowSession> state;  // null: on disk
    int64_t last_used_ms = 0;
    uint64_t use = 0;                      // the order of uses: the least recent goes first
    int64_t disk_bytes = 0;                // its file's size, 0 when none
    int64_t disk_read_tokens = 0;          // the committed length its file holds
  };
  struct Pending {
    std::shared_ptr<const ShadowQuestion> question;
    ShadowAgreement row;
    std::vector<int32_t> context;  // the prompt up to the insertion point
    double started_ms = 0;
    bool main_done = false;
    bool shadow_done = false;
    std::string shadow_note;  // why the shadow did not answer, when it did not
  };

  ShadowReader() = default;
  // The session's state, read back from disk or made new; null on a failed load (dropped, noted).
  ShadowSession* Resident(const std::string& session, bool create);
  // Reads one chunk of s, answering first any agreement question due at its position; false when none is pending.
  Result<bool> ReadOne(const std::string& session, ShadowSession& s);
  void AnswerDue(const std::string& session, ShadowSession& s);
  void AnswerMain(Pending& p, const MainFork& main_fork);
  Result<ShadowAnswer> AnswerOn(ShadowSession& s, int64_t upto, const ShadowQuestion& q);
  void FinishAgreements();
  void EnforceBudget(const std::string& keep);
  Status Evict(const std::string& session, Entry& e);
  // At the start: lists the session files, removing cut-short and foreign ones (TrimDisk then expires).
  void ScanDisk();
  // In memory: drops files past the TTL, then the least recently used past the disk budget.
  void TrimDisk();
  std::string PathOf(const std::string& session) const;
  void Publish();
  void NoteError(const std::string& what);

  std::unique_ptr<Model> model_;
  std::unique_ptr<Forward> forward_;
  std::string fingerprint_;
  std::string disk_dir_;
  Journal* journal_ = nullptr;
  int32_t im_end_ = -1;
  int32_t image_row_ = -1;  // what an image's row reads as

  mutable std::mutex options_mu_;
  ShadowOptions options_;

  // Engine-lock side.
  std::map<std::string, Entry> sessions_;
  std::deque<Pending> pending_;
  std::shared_ptr<const ShadowQuestion> agreement_question_;  // built from the options; each turn keeps its own
  std::string agreement_key_;  // the question and choices it was built from
  double turn_used_ms_ = 0;
  double last_chunk_ms_ = 0;
  ShadowStatus counters_;
  uint64_t uses_ = 0;

  // Published for other threads.
  mutable std::mutex status_mu_;
  std::condition_variable published_;
  ShadowStatus status_;
  std::atomic<int64_t> resident_bytes_{0};
  std::atomic<int64_t> chunks_read_{0};
  std::atomic<int64_t> chunks_at_turn_{0};
};

}  // namespace anchorage
