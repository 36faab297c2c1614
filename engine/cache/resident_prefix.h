// The resident prefix: the engine's own buffer of K/V rows kept between requests, with anchors at
// grid lines, the end anchor and end alignment, the guest stash, the pinned head and the parked
// session. Every request asks it where to resume; it restores that state and forwards the rest on
// the grid. Runs on the engine thread only.
#pragma once

#include <atomic>
#include <climits>
#include <map>
#include <memory>
#include <functional>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/cache/anchor_set.h"
#include "engine/cache/cache_stats.h"
#include "engine/cache/response_cache.h"
#include "engine/cache/disk_cache.h"
#include "engine/cache/ram_tiers.h"
#include "engine/cache/spill_tier.h"
#include "engine/cache/end_anchor.h"
#include "engine/cache/guest_stash.h"
#include "engine/cache/parked_session.h"
#include "engine/cache/pinned_head.h"
#include "engine/cache/state_store.h"
#include "engine/text/tokenizer.h"
#include "engine/runtime/forward.h"
#include "engine/runtime/generator.h"
#include "engine/runtime/sequence_state.h"

namespace anchorage {

// The names POST /v1/cache/clear and the console accept, for messages.
inline constexpr const char* kCacheTierNames = "anchors, end, stash, pin, park, store, response, prepared, disk, spill, shadow, resident or ram (every RAM tier) or all";

// The session spill's knobs the resident prefix reads (the spill's budget and TTL are its own).
struct SpillSettings {
  bool enabled = true;          // off: nothing is read from or written to the spill
  int64_t min_tokens = 16384;   // an evicted conversation shorter than this is not written
  bool cost_check = true;       // read an entry only when its read costs less than the prefill it saves
  int64_t budget_bytes = 64ll << 30;
  int64_t ttl_ms = 48ll * 3600 * 1000;  // an entry unused this long goes
};

// Whether a slot drafts while other slots decode (its window's rows in their batch): where its kept
// drafts pay for their rows by the engine's measured step costs, always, or never.
enum class DraftsBesideOthers { kAuto, kOn, kOff };

struct ResidentOptions {
  bool enabled = true;                          // off: every request prefills cold
  int64_t anchor_budget_bytes = 2560ll << 20;   // --resident-gb
  bool end_anchor = true;
  bool end_alignment = true;
  bool end_align_reasoning = true;              // end alignment's second pass: a region's reasoning left out
  int64_t guest_max_tokens = 8192;              // --resident-guest-max
  int64_t stash_budget_bytes = 1ll << 30;       // --resident-stash-gb
  int64_t pin_budget_bytes = 4ll << 30;         // --resident-pin-gb
  int64_t park_budget_bytes = 4ll << 30;        // --resident-park-gb
  int64_t guest_margin_rows = 512;
  bool store_enabled = true;                    // the state store
  int64_t store_budget_bytes = 2ll << 30;
  int64_t store_entry_cap_bytes = 1ll << 30;
  bool store_prefix_snapshots = true;           // prefix snapshots at grid lines (else session snapshots only)
  int64_t memory_ceiling_bytes = INT64_MAX;     // engine bytes between requests
  int64_t memory_peak_bytes = INT64_MAX;        // engine bytes during a prefill, workspace included
  int64_t memory_slack_bytes = 0;               // allocator slack kept free under both
  DiskCacheSettings disk;                       // the disk tier's, when one is open
  SpillSettings spill;                          // the session spill's, when one is open
  int max_draft = 8;                            // drafts a decode window; 0: off
  bool lookup_drafts = true;                    // n-gram copies of the conversation and the suffix store
  bool mtp_drafts = false;                      // the checkpoint's MTP head (where it has one), when lookup finds none
  DraftsBesideOthers drafts_beside_others = DraftsBesideOthers::kAuto;  // a slot's windows while other slots decode
  bool suffix_store = true;                     // draft from (and, unless read-only, append to) the suffix store
  bool suffix_store_read_only = false;
  int64_t suffix_store_bytes = 16ll << 20;
  bool response_cache = false;                  // identical greedy requests answered from memory
  int64_t response_cache_bytes = 64ll << 20;
  bool compaction_prepare = true;               // write a compaction's continuation ahead in idle time
  double compaction_idle_s = 30;                // after this long without a request
  int64_t compaction_min_tokens = 32768;        // for a resident conversation at least this long
};

enum class CacheSource { kCold, kResident, kEnd, kPin, kPark, kStore, kDisk, kSpill, kResponse, kPrepared };
// "cold", "resident", "end", "pin", "park", "store", "disk", "spill", "response", "prepared"
const char* CacheSourceName(CacheSource source);

struct CacheRequest {
  std::vector<int32_t> prompt;  // the client's tokens
  std::string session;          // conversation id or x-session-id; empty when unknown
  int64_t max_new_tokens = 0;   // rows a guest may write past its prompt
  int64_t context_tokens = 0;   // the served prompt plus its output must fit this; 0: the model's
  ImageCatalog images{};        // the images whose key ids the prompt holds
};

// Where a request resumed and what the engine runs.
struct ResumeInfo {
  CacheSource source = CacheSource::kCold;
  int64_t cached_tokens = 0;           // rows reused
  int64_t reread_tokens = 0;           // forwarded by this request's prefill
  std::vector<int32_t> served_prompt;  // the client's tokens, or the rows' own up to the end anchor then the client's
  bool guest = false;
  bool aligned = false;                // served through end alignment
};


struct CachedGeneration {
  ResumeInfo resume;
  GenerationResult generation;
};

// Where a grid prefill is: the lines it stops at besides the grid's, and what it wrote.
struct PrefillCursor {
  int64_t upto = 0;
  bool take_anchors = false;
  std::vector<int64_t> lines;
  int64_t evictions_before = 0, written = 0, last_line = 0;
};

// One request on a resident prefix, in steps (Begin, PrefillPiece until it says done, the task's
// Step and decodes, End), so an engine loop can run several prefixes' requests side by side.
struct ResidentTurn {
  CacheRequest request;
  ResumeInfo info;
  SamplingParams params;                      // fitted to the context
  std::optional<CachedGeneration> replayed;   // answered from memory: nothing to run, End returns it
  std::unique_ptr<GenerationTask> task;       // made once the grid prefill is done
  TokenCallback on_token;
  const std::atomic<bool>* cancel = nullptr;
  std::optional<std::string> response_key;
  CachedResponse written;                     // the tokens as released, for the response cache
  PrefillCursor cursor;
};

class ResidentPrefix {
 public:
  ResidentPrefix(ComputeBackend& forward, const Tokenizer* tokenizer, ResidentOptions options);
  // Waits for the disk cache's writer to finish the last request's lines, then fences it.
  ~ResidentPrefix();
  ResidentPrefix(const ResidentPrefix&) = delete;
  ResidentPrefix& operator=(const ResidentPrefix&) = delete;

  // The disk tier behind the RAM tiers (not owned; it outlives this); nullptr: none.
  void set_disk_cache(DiskCache* disk);
  DiskCache* disk_cache() const { return disk_; }
  // The session spill (not owned; it outlives this); nullptr: none.
  void set_session_spill(SessionSpill* spill);
  SessionSpill* session_spill() const { return spill_; }
  // Writes the resident conversation to the spill (a planned stop passes resident: the next start
  // reads it back first). Nothing to write (no spill, no rows) is ok.
  Status SpillResident(const std::string& reason, bool resident = false);
  // Earlier requests' ids for the lookup drafter (not owned); nullptr: none.
  void set_suffix_store(SuffixStore* store);
  // This slot's state store, and the other slots' (not owned; the caller keeps the list current as
  // slots come and go): a peer's snapshots serve this slot's requests as its own do (exact by the same
  // rules), read on the engine thread, counted in the peer's bytes.
  StateStore& state_store() { return store_; }
  void set_peer_stores(const std::vector<StateStore*>& peers);
  // The day's write budget the spill shares with the disk tier (not owned); nullptr: none.
  void set_write_guard(WriteGuard* guard) { guard_ = guard; }
  // A planned stop: writes the parked conversation (its head from the rows in place) and then the
  // resident one, marked to be read back first.
  Status SpillForStop();
  // Its slot goes away (fewer slots): the parked and the resident conversation go to the spill.
  Status SpillForRemoval();
  // Reads back the conversation a planned stop left resident; false when there was none.
  Result<bool> ResumeSpilledResident();

  // Resumes, prefills the rest on the grid, generates, and keeps the end. Cancellation as Generator's.
  // on_admitted runs once the request fits the memory budget, before its prefill; a request that
  // cannot fit even after shedding every cache fails with ResourceExhausted and changes no tier.
  Result<CachedGeneration> Generate(const CacheRequest& request, const SamplingParams& params, const TokenCallback& on_token,
                                    const std::atomic<bool>* cancel = nullptr,
                                    const std::function<void(const ResumeInfo&)>& on_admitted = nullptr);
  // Whether the answer written ahead serves the request (Begin then replays it).
  bool PreparedAnswerFits(const CacheRequest& request, const SamplingParams& params) const;
  // The response cache it answers from and fills: its own, or one it shares with other prefixes (not owned).
  ResponseCache& response_cache() { return *responses_; }
  void share_response_cache(ResponseCache* cache) { responses_ = cache != nullptr ? cache : &own_responses_; }
  // Generate in steps. Begin resumes and admits (a replayed answer comes back done); PrefillPiece
  // forwards one piece of the grid prefill and returns false once the task is ready to Step (its
  // prompt forwarded); End finishes the task and keeps the end. Nothing else may use this prefix
  // between Begin and End. With riders (other slots' pending decodes) a piece is at most the
  // backend's piece_tokens_beside_decodes, and its forward may carry them.
  Result<std::unique_ptr<ResidentTurn>> Begin(const CacheRequest& request, const SamplingParams& params, TokenCallback on_token,
                                              const std::atomic<bool>* cancel = nullptr,
                                              const std::function<void(const ResumeInfo&)>& on_admitted = nullptr);
  Result<bool> PrefillPiece(ResidentTurn& turn, DecodeRiders* riders = nullptr);
  Result<CachedGeneration> End(ResidentTurn& turn);
  // Brings a state held by the pin, the park or the store into the engine's buffer ahead of its
  // request; returns where the request would then resume.
  Result<ResumeInfo> Prewarm(const CacheRequest& request);
  // Bytes the engine holds now: its state buffers, every cache tier and the outside bytes.
  int64_t ShedFloorBytes() const;  // EngineBytes with every tier shed
  int64_t EngineBytes() const;
  // Its own part of them: the state, its tiers and its anchors staged for the disk.
  int64_t OwnBytes() const;
  // What it holds for the memory budget: its own bytes, or while a request of Begin runs, what that
  // request was admitted with (its rows up to its last token, its prefill workspace) if more.
  int64_t HeldBytes() const { return std::max(OwnBytes(), committed_bytes_); }
  // Bytes held beside this prefix that count in the engine's memory budget (the shadow reader's
  // states, the other slots).
  void set_outside_bytes(std::function<int64_t()> bytes) { outside_bytes_ = std::move(bytes); }
  // The last row's logits of context and then extra, on a fork of the state in place: from the rows
  // and an anchor this conversation shares with context, re-reading at most max_reread ids; the
  // state is the same bits afterwards. NotFound when no such state is in place.
  Result<std::vector<float>> ForkLogits(std::span<const int32_t> context, std::span<const int32_t> extra, int64_t max_reread);
  // The workspace a prefill of new_tokens (plus max_new decoded rows) adds at its peak.
  int64_t PrefillPeakBytes(int64_t prompt_tokens, int64_t resume_at, int64_t max_new) const;
  // Resumes and prefills the whole prompt; returns the last position's logits (no end anchor is kept).
  Result<std::vector<float>> Prefill(const CacheRequest& request, ResumeInfo* info = nullptr);
  // A stored answer (a response cache hit, a prepared answer): its tokens through on_token, as a
  // generation would release them.
  Result<CachedGeneration> Replay(const CacheRequest& request, const CachedResponse& response, CacheSource source,
                                  const TokenCallback& on_token, const std::function<void(const ResumeInfo&)>& on_admitted);
  // Writes ahead on a fork of session's resident conversation: from its end anchor, the rest of ids
  // (which continue its rows) prefilled and params generated in scratch within context_tokens (0: the
  // model's), then the state put back to the same bits. should_stop is asked between prefill pieces
  // and tokens (Cancelled when it said stop). The answer is kept as the prepared one, which Generate
  // serves to a request it fits.
  Status WriteAhead(const std::string& session, std::span<const int32_t> ids, const SamplingParams& params, int64_t context_tokens,
                    const std::function<bool()>& should_stop);
  // The prepared answer's ids, or nullptr when none is kept.
  const std::vector<int32_t>* prepared_prompt() const { return prepared_ ? &prepared_->prompt : nullptr; }
  // The session of the rows in place ("" when unknown).
  const std::string& session() const { return session_; }
  // The tokens up to the end anchor of session's conversation when it is the resident, the parked or a spilled one.
  std::optional<std::vector<int32_t>> EndRecord(const std::string& session) const;
  // Where a request would resume, without changing anything.
  ResumeInfo Peek(const CacheRequest& request) const;

  // Whether the request (max_tokens fitted to its context) could fit cold with every tier of this
  // prefix shed and `outside` bytes held beside it.
  bool WouldFitBeside(const CacheRequest& request, int64_t max_tokens, int64_t outside) const;
  // An idle slot gives its memory back for another's request: the conversation goes to the spill
  // (where it is long enough), every RAM tier of its own empties and its state's rows are freed.
  void GiveBack(const std::string& reason);
  // Empties one tier: "anchors", "end", "stash", "pin", "park", "store", "disk"; "resident" / "ram" for
  // every RAM tier; "all" for those and the disk.
  Status Clear(const std::string& tier);
  void set_options(const ResidentOptions& options);
  // Receives every hit, write, eviction and clear; called on the engine thread.
  void set_event_sink(CacheEventSink sink);
  const ResidentOptions& options() const { return options_; }

  // Every tier's entries, bytes and counters.
  CacheStats Stats() const;

  const SequenceState& state() const { return state_; }
  const std::vector<int32_t>& rows() const { return rows_; }
  int64_t taint_row() const { return taint_row_; }
  const AnchorSet& anchors() const { return anchors_; }

 private:
  // The state's images are the ones its rows in place hold (none where they hold none): what a fork's positions
  // follow. NotFound where the rows hold images the state no longer has (a guest's or an older request's are set).
  Status CheckImagesInPlace();
  struct Plan {
    ResumeInfo info;
    int64_t resume_length = 0;    // 0 means cold
    bool resume_from_end = false;  // the anchor at resume_length is the (possibly parked) end anchor
    enum class Copy { kNone, kStash, kPin, kPark } copy = Copy::kNone;  // what Apply copies aside
    int64_t copy_bytes = 0;        // an upper bound of that copy
    bool skip_copy = false;        // given up for memory: Apply copies nothing aside
    TierOffer offer;                // what the chosen tier offered
    const CacheTier* store = nullptr;  // kStore: the store tier that offered it (this slot's or a peer's)
    bool declined_by_cost = false;  // a tier held a longer line whose read cost more than its prefill
    bool restore_failed = false;    // a restore into the state failed: plan again from what is in place
    std::string spill_refused;      // why a spill entry that shares much with the prompt did not serve it
    std::string spill_refusal_note;
  };
  Plan MakePlan(const CacheRequest& request) const;
  Status Apply(const CacheRequest& request, Plan& plan);
  // The context a request's prompt as served and its output must fit (context_tokens, else the model's).
  int64_t ContextLimit(int64_t context_tokens) const;
  // Admit and Apply, planning again (without the file that failed) when a disk restore fails.
  Status AdmitAndApply(const CacheRequest& request, Plan& plan, int64_t max_new);
  // Rows in place a disk restore of line can keep: this prompt's, below the taint, on the disk's grid.
  // Prefill tokens a second this process measured (a default before it has).
  double PrefillRate() const;
  // Asks the disk admission which lines of the served prompt to write; stages those already in place.
  void PlanDiskWrites(const CacheRequest& request, const ResumeInfo& info);
  // Hands the staged anchors to the disk cache's writer, once the prefill is done.
  void SubmitDiskWrites(const ResumeInfo& info, const std::string& session);
  // Where the prompt's first answer starts (its <|im_start|>assistant), or -1.
  int64_t FirstAnswerStart(std::span<const int32_t> prompt) const;
  // The grid-split prefill of served_prompt up to `upto`, with anchors at grid lines and AnchorLines:
  // StartPrefill, then PrefillStep (one piece) until the state reaches upto, then EndPrefill.
  PrefillCursor StartPrefill(const ResumeInfo& info, int64_t upto, bool take_anchors) const;
  Status PrefillStep(const ResumeInfo& info, PrefillCursor& cursor, DecodeRiders* riders = nullptr);
  void EndPrefill(const PrefillCursor& cursor);
  Status PrefillRange(ResumeInfo& info, int64_t upto, bool take_anchors);
  // Where the anchored prefill stops: the last exact line below the prompt's end (the grid line for a guest).
  int64_t PrefillUpto(const ResumeInfo& info) const;
  // The lines besides the grid's that get anchors: the last exact line at or below the start of the
  // last user message (clients rewrite it) and the last one below the prompt's end.
  std::vector<int64_t> AnchorLines(const std::vector<int32_t>& prompt) const;
  void KeepEnd(const ResumeInfo& info, int64_t forwarded_generated, const std::vector<int32_t>& generated);
  void FinishGuest();
  // Gives back caches, cheapest first (store, anchors, end, stash, park, pin), until EngineBytes()
  // plus extra fits under limit; a plan's own copy is given up at its tier's place. Returns whether it fits.
  bool Shed(int64_t extra, int64_t limit, const std::string& reason, Plan* plan = nullptr);
  // Fits the plan under the memory peak, shedding caches (and re-planning) where that is enough;
  // a request that cannot fit even cold is refused before any tier changes.
  Status Admit(const CacheRequest& request, Plan& plan, int64_t max_new);
  // Sets what Apply will copy aside for the plan (stash, pin or park) and an upper bound of its bytes.
  void PlanCopy(const CacheRequest& request, Plan& plan) const;
  void PutPrefixSnapshot(int64_t prompt_tokens);
  void PutSessionSnapshot();
  void PinHead();
  void ParkResident(int64_t shared_head);
  void InstallPark(ParkedSession parked);
  // An eviction writes the resident conversation to the spill instead of the park when it is long
  // enough and the park cannot hold its rows above the shared head.
  bool SpillsOnEviction(int64_t shared_head, const ResumeInfo& info) const;
  // Writes a spill entry, counted against the day's writes (a drain always may); events say how it went.
  Status SaveToSpill(const SpillEntry& entry, const SequenceState& state, const std::string& reason, bool drain);
  Status SpillParked(const std::string& reason);
  // The rows in place as the tiers see them.
  ResidentRows View();
  ResidentRows View() const;
  // Hands the options each tier reads to it.
  void ConfigureTiers();
  int64_t RowBytes(int64_t rows) const;
  // Runs fn on the state restored to from, then writes back the rows it may overwrite (from.length up
  // to the length in place) and the state in place: the same bits afterwards. When that cannot be
  // done the rows are forgotten (Internal).
  Status OnFork(const Anchor& from, const std::function<void()>& fn);
  // The state matches no token list we could name: no rows, regions, anchors or end anchor.
  void ForgetRows();
  // The drafting of a generation whose state holds history before its prompt.
  SpeculativeOptions Speculative(std::span<const int32_t> history) const;
  bool IsGuest(const CacheRequest& request, int64_t resume_at) const;
  // Where the prompt's last user message starts (its <|im_start|>user), or -1.
  int64_t LastUserStart(std::span<const int32_t> prompt) const;
  // Whether a request that parts from the rows at common is the resident conversation: the same
  // session id, or without one, a prompt that keeps every row up to its last user message.
  bool SameConversation(const CacheRequest& request, int64_t common) const;
  // A cut inside the request's last user message (a client rewriting its newest turn): nothing to pin or park.
  bool EditsLastUserMessage(const CacheRequest& request, int64_t common) const;
  // An id-less request of the id-less resident conversation that keeps its opening (every row up to
  // its second user turn) and rewrote a later turn (Qwen Code moves its reminder): nothing to pin or park.
  bool RewritesALaterTurn(const CacheRequest& request, std::span<const int32_t> served, int64_t common) const;

  ComputeBackend& forward_;
  const Tokenizer* tokenizer_;
  std::vector<int32_t> user_turn_ids_;  // "<|im_start|>user" as ids; empty without a tokenizer
  std::vector<int32_t> answer_turn_ids_;  // "<|im_start|>assistant" as ids
  ResidentOptions options_;
  CacheEventSink sink_;
  std::function<int64_t()> outside_bytes_;
  void Emit(const char* kind, const std::string& tier, int64_t tokens, int64_t bytes, std::string reason = "") const {
    CacheEvent event{kind, tier, tokens, bytes, std::move(reason), std::nullopt, 0};
    if (tier == "spill" && spill_ != nullptr) spill_->Record(event);  // the console's last spill events
    if (sink_) sink_(event);
  }
  SequenceState state_;
  std::vector<int32_t> rows_;     // tokens whose K/V rows are valid in state_
  std::vector<TokenRegion> regions_;  // spans of rows_ that generations wrote, ascending
  int64_t taint_row_;             // lowest decode-written row among rows_; rows_.size() or more when none
  std::string session_;           // the session the resident rows belong to
  AnchorSet anchors_;
  std::optional<EndAnchor> end_;
  GuestStash stash_;
  std::vector<int32_t> guest_saved_rows_;  // rows_ of the resident prompt while a guest runs
  PinnedHead pin_;
  ParkedSession park_;
  StateStore store_;
  int64_t guest_resume_ = 0;      // where the running guest resumed
  DiskCache* disk_ = nullptr;
  SessionSpill* spill_ = nullptr;
  SuffixStore* suffix_store_ = nullptr;
  ResponseCache own_responses_;
  ResponseCache* responses_ = &own_responses_;
  std::optional<PreparedAnswer> prepared_;
  PreparedStats prepared_counts_;  // its counters (the entry's own fields are filled by Stats)
  std::unique_ptr<SpillTier> spill_tier_;
  WriteGuard* guard_ = nullptr;
  std::vector<int64_t> disk_lines_;   // lines this prefill stages for the disk as it passes them
  std::vector<Anchor> disk_staged_;   // their anchors, waiting for the prefill to end
  double prefill_tokens_ = 0, prefill_seconds_ = 0;
  int64_t committed_bytes_ = 0;   // what the running request was admitted with; 0 between requests
  bool stash_shed_ = false;       // the running guest's stash was given back: its rows are lost
  struct Counters {
    int64_t requests = 0, cold = 0, resident_hits = 0, end_hits = 0, aligned_hits = 0, pin_hits = 0, park_hits = 0;
    int64_t guests = 0, pins = 0, parks = 0, cached_tokens = 0, reread_tokens = 0, store_hits = 0;
    int64_t refused = 0, disk_hits = 0, spill_hits = 0, spill_saves = 0, spill_skips = 0;
    std::map<std::string, int64_t> spill_refused;  // by why
    std::map<std::string, int64_t> sheds;  // by tier
  } counters_;
  // The tiers over the data above, asked in turn (declared after it: they hold references to it).
  AnchorsTier anchors_tier_;
  EndTier end_tier_;
  StashTier stash_tier_;
  PinTier pin_tier_;
  ParkTier park_tier_;
  StoreTier store_tier_;
  std::vector<std::unique_ptr<StoreTier>> peer_store_tiers_;  // the other slots' stores
};

}  // namespace anchorage
