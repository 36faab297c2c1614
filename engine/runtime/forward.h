// The CPU forward pass of a Qwen3.5 text model: grid prefill, decode and verify over a SequenceState.
// Deterministic: the same inputs give the same bits for every run and every thread count.
// One call at a time (it owns a workspace and a thread pool); the engine thread drives it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/compute/cpu/attention.h"
#include "engine/compute/cpu/packed_q8.h"
#include "engine/core/status.h"
#include "engine/core/thread_pool.h"
#include "engine/model/model_config.h"
#include "engine/model/weights.h"
#include "engine/runtime/compute_backend.h"
#include "engine/runtime/sequence_state.h"

namespace anchorage {

// A prefill resumed from the state at any multiple of this writes a cold prefill's bits: the
// delta rule's chunks sit on absolute multiples of it and every other kernel is row-invariant.
inline constexpr int64_t kExactLineTokens = 64;

struct ForwardOptions {
  int64_t grid_tokens = 1024;  // prefill chunk G; a positive multiple of 64
  int threads = 0;             // worker threads including the caller; 0 means the machine's cores
  // BF16, F16 and F32 matrices made int8 at load (per output row and 32 inputs); FP8 ones stay FP8.
  bool int8_weights = false;
  // Called after each layer's weights are packed; false stops Create with kCancelled.
  std::function<bool(int64_t packed, int64_t layers)> on_layer = nullptr;
};

// The checks every backend's forward makes at creation (grid, layer count, head grouping; on ids:
// CheckTokenIds in compute_backend.h); errors start with `who`.
Status CheckForwardShape(const ModelConfig& config, const ModelWeights& weights, int64_t grid_tokens, const std::string& who);
// A prompt's ids from row first_row: tokens of the vocabulary, and image key ids only where images hold them at that row.
Status CheckPromptIds(std::span<const int32_t> ids, int64_t vocab_size, const PromptImages* images, int64_t first_row, const std::string& who);
// The ids an MTP commit (up to one a waiting row) or draft (one every waiting row) takes; errors start with `who`.
Status CheckMtpIds(const MtpState& mtp, std::span<const int32_t> next_ids, bool every_row, int64_t vocab_size, const std::string& who);
// A branch's ids and that its logits start inside them.
Status CheckBranch(const PrefillBranch& branch, int64_t vocab_size, const std::string& who);
// That a matrix tensor is there and holds rows x cols elements.
Status CheckMatrixShape(const TensorView& t, int64_t rows, int64_t cols, const std::string& who, const char* role);
// A vector tensor's n values in fp32, each plus `add` (1 for the zero-centred norm weights).
Result<std::vector<float>> TensorValues(const TensorView& t, int64_t n, float add, const std::string& who, const char* role);
// An F8_E4M3 matrix's block scales in fp32, [ceil(rows / block rows), ceil(cols / block cols)], checked
// against its shape and block size.
Result<std::vector<float>> Fp8BlockScales(const TensorView& t, int64_t rows, int64_t cols, const std::string& who);
// conv1d [channels, 1, taps] made tap-major [taps, channels], as both forwards hold it.
Result<std::vector<float>> ConvTapsOf(const TensorView& conv1d, int64_t channels, int64_t taps, const std::string& who);
// Rows of the prefill chunk from `position` with `remaining` ids left: chunks end on multiples of grid.
inline int64_t GridChunkRows(int64_t position, int64_t remaining, int64_t grid) {
  return std::min(remaining, (position / grid + 1) * grid - position);
}

// The multi-token-prediction head's own state for one sequence: K/V rows of its attention layer
// from position begin, and the trunk's final-normed hidden rows still waiting for the id after them.
// Only drafts come from it, so it may start anywhere (a restored prefix has no rows of it).
// A backend keeps the rows in device memory instead (the CUDA backend), in a mirror of its own.
struct MtpMirror {
  virtual ~MtpMirror() = default;
};
struct MtpState {
  int64_t begin = -1;          // position of its first row; -1: none yet
  int64_t rows = 0;            // K/V rows made from the trunk's hidden rows (positions begin..)
  int64_t pending_rows = 0;    // hidden rows at positions begin + rows.. not yet made K/V rows
  std::vector<float> k, v;     // fp32 [capacity, Nkv*head_dim]
  std::vector<float> pending;  // fp32 [pending_rows, H]
  std::unique_ptr<MtpMirror> mirror;  // the device's k, v and pending, where a device backend holds them
  bool gave_up = false;  // the device had no room for its rows: the head makes no more rows or drafts
};

// The CPU backend.
class Forward final : public ComputeBackend {
 public:
  // The MTP head reads token ids only: ids with image rows start it anew after them (returns null), else mtp.
  static MtpState* HeadReads(std::span<const int32_t> ids, MtpState* mtp);
  // Checks shapes, repacks every matrix once into the kernels' layout (F16/F32 rounded to BF16) and
  // expands the small tensors to fp32. Keeps no pointer into the weights: they may be unmapped after.
  static Result<std::unique_ptr<Forward>> Create(const ModelConfig& config, const ModelWeights& weights,
                                                 const ForwardOptions& options);
  ~Forward() override;

  // What a cache must match to reuse states: the model's fingerprint, the kernels' arithmetic
  // (paths that round differently give different bits) and the K/V rows' dtype. Hex sha256.
  // weights: WeightsArithmetic() of the Forward that computes the states.
  static std::string StateFingerprint(const std::string& model_fingerprint, const std::string& weights = "", KvDtype kv_dtype = KvDtype::kF32);
  // How 8-bit matrices are multiplied ("" when every matrix is bf16): part of the state fingerprint.
  std::string WeightsArithmetic() const;
  // What the matrices are held as, e.g. "bf16" or "fp8-e4m3 + bf16", and their bytes in memory.
  std::string WeightsDescription() const override;
  int64_t weight_bytes() const;
  int64_t WeightBytes() const override { return weight_bytes(); }
  // The formats the matrices are held in: FP8, int8, BF16, those present in that order.
  std::vector<cpu::WeightFormat> FormatsHeld() const;
  // Bytes a decoded token reads: every matrix but an untied embedding (read a row at a time).
  int64_t decode_weight_bytes() const;

  // Appends ids at positions state.length().. in chunks that end on multiples of grid_tokens; returns
  // fp32 logits [1, vocab] (kLast) or [ids.size(), vocab] (kAll). On error the state is unchanged.
  // With mtp (and an MTP head), the rows' hidden states feed it: every row but the last becomes a
  // K/V row of the head, the last waits in mtp for the id after it.
  Result<std::vector<float>> Prefill(SequenceState& state, std::span<const int32_t> ids,
                                     LogitsRows rows = LogitsRows::kLast, MtpState* mtp = nullptr) override;
  // A prefill inside one grid chunk and the riders' next rows in one forward: every weight is read
  // once for all rows, and each row's bits are what Prefill and Decode give it alone. Riders stay with
  // the caller where the ids cross a grid line or a rider's state has no room.
  Result<std::vector<float>> PrefillCarrying(SequenceState& state, std::span<const int32_t> ids, MtpState* mtp, DecodeRiders& riders) override;
  int64_t piece_tokens_beside_decodes() const override;
  // Branches that all go on from prefix (at its length) in one forward over their stacked rows, each
  // with its own recurrent states, conv tails and K/V rows; prefix is not changed (a fork that never
  // writes its snapshot).
  // Returns the logits of each branch's rows logits_from.., branch after branch: the bits a Prefill
  // (kAll) of that branch's ids on a copy of prefix returns for those rows. The rows are not split
  // at the grid: the workspace grows to all of them, so callers keep them near a grid chunk.
  bool has_branches() const override { return true; }
  Result<std::vector<float>> PrefillBranches(const SequenceState& prefix, std::span<const PrefillBranch> branches) override;
  // The last row's logits of ids on a fork of state that never writes it (a one-branch PrefillBranches).
  Result<std::vector<float>> ForkLastLogits(const SequenceState& state, std::span<const int32_t> ids) override;
  // Bytes PrefillBranches allocates beside the workspace: per branch the recurrent part and its K/V
  // rows, and the logits rows.
  int64_t BranchesBytes(int64_t branches, int64_t rows, int64_t logits_rows) const override;
  // Appends one token with the one-token recurrence; returns fp32 logits [vocab]. With mtp its
  // hidden state waits there.
  Result<std::vector<float>> Decode(SequenceState& state, int32_t id, MtpState* mtp = nullptr) override;
  // One forward over every state's next row: each weight is read once for all of them, and row i's logits
  // and state are the bits Decode(*states[i], ids[i]) gives (every kernel is row-invariant).
  Result<std::vector<float>> DecodeBatch(std::span<SequenceState* const> states, std::span<const int32_t> ids) override;
  // Appends ids in one forward (no grid split) and returns fp32 logits [ids.size(), vocab].
  Result<std::vector<float>> Verify(SequenceState& state, std::span<const int32_t> ids);

  // A draft window: forwards ids (the last sampled token and the drafts) at state.length().. in one
  // forward whose every row computes what Decode of that id would, and returns logits [ids.size(),
  // vocab]. K/V rows are written; the recurrent states and conv tails stay as they were, the
  // window's DeltaNet inputs logged. KeepDraft(state, rows) then advances them by the first rows
  // with Decode's fp32 steps in the same order and cuts the length back, so the state is bit-equal
  // to rows Decode calls. Nothing else may touch the state in between. With mtp the kept rows'
  // hidden states wait there.
  // A window may be open on each state at once (each keeps its own log).
  bool has_draft_windows() const override { return true; }
  Result<std::vector<float>> DraftWindow(SequenceState& state, std::span<const int32_t> ids, MtpState* mtp = nullptr) override;
  Status KeepDraft(SequenceState& state, int64_t rows) override;
  // Decodes and draft windows of several states in one forward (ComputeBackend::DecodeWindowsBatch).
  bool has_window_batches() const override { return true; }
  Result<std::vector<float>> DecodeWindowsBatch(std::span<SequenceState* const> states, std::span<const std::vector<int32_t>> rows) override;

  // The multi-token-prediction head (the checkpoint's mtp.* block), when it has one.
  bool has_mtp() const override { return mtp_ != nullptr; }
  // Makes mtp's first next_ids.size() waiting rows K/V rows: row i with the id that followed it.
  Status MtpCommit(MtpState& mtp, std::span<const int32_t> next_ids) override;
  // Commits every waiting row (next_ids: one id each, the last the id about to be forwarded) and
  // drafts up to max_draft ids after it, each the head's argmax below vocab_limit fed back as the
  // next row's input (those rows are overwritten by the next commit). logits (optional) gets each
  // draft's head logits [drafts, vocab].
  Result<std::vector<int32_t>> MtpDraft(MtpState& mtp, std::span<const int32_t> next_ids, int max_draft,
                                        int64_t vocab_limit, std::vector<float>* logits = nullptr) override;

  const char* device_name() const override { return "cpu"; }
  // The kernel path and the threads.
  std::string DeviceDescription() const override;
  std::string StateKey(const std::string& model_fingerprint) const override {
    return StateFingerprint(model_fingerprint, WeightsArithmetic(), config_.kv_dtype);
  }
  const ModelConfig& config() const override { return config_; }
  int64_t grid_tokens() const override { return options_.grid_tokens; }
  int threads() const override { return pool_->size(); }
  ThreadPool& pool() { return *pool_; }
  // Bytes a prefill call of chunk_tokens allocates at its peak: activations and one logits row
  // (the state's K/V growth is the caller's).
  int64_t PrefillWorkspaceBytes(int64_t chunk_tokens) const override;
  // Matrices the checkpoint stored as F16 or F32, held here rounded to BF16.
  int64_t converted_matrices() const { return converted_matrices_; }
  int64_t converted_bytes() const { return converted_bytes_; }

 private:
  struct Layer;
  struct Workspace;
  struct DraftLog;
  struct Mtp;
  enum class Mode { kChunked, kRecurrent, kDraft };

  Forward(const ModelConfig& config, const ForwardOptions& options);
  Status CheckIds(std::span<const int32_t> ids) const;
  // As CheckIds, and each image key id must be an image row of state.images() at its row (from state.length()).
  Status CheckIds(std::span<const int32_t> ids, const SequenceState& state) const;
  Result<Layer> NormsAndMlp(const LayerWeights& weights);
  Result<Layer> AttentionLayer(const LayerWeights& weights);
  // A [rows, cols] matrix repacked for the kernels (F16/F32 rounded to BF16, FP8 with its block scales, int8
  // when asked); tied tensors share one.
  Result<const cpu::PackedMatrix*> Matrix(const TensorView& t, int64_t rows, int64_t cols, const char* role);
  // Rows of one sequence in a forward over stacked rows: rows [row0, row0 + n) at positions pos0..,
  // run as a prefill chunk, one-token decode steps or a draft window (drafts run alone).
  struct Segment {
    int64_t row0 = 0, n = 0, pos0 = 0;
    Mode mode = Mode::kChunked;
    std::vector<float*> recurrent, tails;  // per GDN layer: the state and conv tail it advances
    std::vector<cpu::KvSource> kv;         // per attention layer: K/V rows 0..pos0 + n
    std::vector<uint8_t*> k_out, v_out;    // per attention layer: where its rows pos0.. go, in kv's dtype
    const PromptImages* images = nullptr;  // the sequence's images: image rows' inputs and every row's rotary position
    DraftLog* log = nullptr;               // kDraft: where the window's DeltaNet inputs wait for KeepDraft
  };
  // The segment of a whole state: its rows at positions state.length().., K/V rows in the state.
  static Segment SegmentOf(SequenceState& state, int64_t n, Mode mode);
  // Each state's next row as a one-token decode segment at stacked rows row0.., its logits wanted.
  static void AppendDecodeRows(std::span<SequenceState* const> states, int64_t row0, std::vector<Segment>* segments,
                               std::vector<int64_t>* logit_rows);

  // Runs ids[0..n) at positions state.length()..; writes logits of the last row or all rows, and
  // (when hidden is set) every row's final-normed hidden state [n, H]; a draft window's inputs go to log.
  void RunChunk(SequenceState& state, const int32_t* ids, int64_t n, Mode mode, bool all_rows, float* logits,
                float* hidden = nullptr, DraftLog* log = nullptr);
  // Runs the stacked ids of every segment in one forward; writes the logits of the stacked rows
  // logit_rows (in that order) and, when hidden is set, every row's final-normed hidden state.
  void RunRows(std::span<const Segment> segments, const int32_t* ids, int64_t n, std::span<const int64_t> logit_rows, float* logits,
               float* hidden);
  // cos and sin of rows [row0, row0 + n) at positions pos0..: on the t, h and w axes of images where given.
  void RopeTable(int64_t pos0, int64_t n, int64_t row0 = 0, const PromptImages* images = nullptr);
  void GdnMixer(const Layer& layer, std::span<const Segment> segments, int64_t gdn_index, int64_t n);
  // Per segment: writes its K/V rows to k_out/v_out and attends its query row t over kv rows 0..pos0 + t.
  void AttentionMixer(const Layer& layer, std::span<const Segment> segments, int64_t attn_index, int64_t n);
  // One sequence's K/V rows: written at row pos0 of k and v, attended over rows 0..pos0 + t.
  void AttentionMixer(const Layer& layer, float* k, float* v, int64_t pos0, int64_t n, Mode mode);
  // After a chunk of a prefill call whose ids start at position start: the chunk's hidden rows (m
  // from position pos) wait in mtp, and each waiting row whose next id the call holds becomes a K/V row of the head.
  Status MtpAfterChunk(MtpState& mtp, std::span<const int32_t> ids, int64_t start, int64_t pos, const float* hidden, int64_t m);
  // Hidden rows [n, H] at positions mtp.begin + mtp.rows.. join the waiting ones (a gap starts mtp anew).
  void MtpWait(MtpState& mtp, int64_t pos0, const float* hidden, int64_t n);
  // The head over n rows (trunk-or-head hidden rows and the ids after them) at K/V row `slot`;
  // writes the last row's output (after mtp.norm) to out when set.
  void MtpRows(MtpState& mtp, const float* hidden, const int32_t* ids, int64_t n, int64_t slot, float* out);
  void Mlp(const Layer& layer, int64_t n);
  void RmsNormRows(const float* x, const float* w1, int64_t n, int64_t width, float* y);
  // fn over [0, count) in contiguous ranges, on the pool when count is large.
  void Elementwise(int64_t count, const std::function<void(size_t begin, size_t end)>& fn);
  // to[i] += from[i] for i < count.
  void AddRows(const float* from, int64_t count, float* to);

  ModelConfig config_;
  ForwardOptions options_;
  std::unique_ptr<ThreadPool> pool_;
  std::vector<Layer> layers_;
  const cpu::PackedMatrix* embed_ = nullptr;    // [V, H]
  const cpu::PackedMatrix* lm_head_ = nullptr;  // [V, H]
  std::vector<float> final_norm_;      // fp32 [H], 1 + w
  std::vector<double> inv_freq_;       // [rotary_dim / 2]
  std::vector<int> rope_axis_;         // [rotary_dim / 2]: the position axis (t, h, w) each frequency turns by
  std::unique_ptr<Workspace> ws_;
  std::map<const SequenceState*, std::unique_ptr<DraftLog>> drafts_;  // the open draft windows, one a state
  // A new window's log for n rows on state (replacing one left open there).
  DraftLog& OpenDraftLog(SequenceState& state, int64_t n, MtpState* mtp);
  std::unique_ptr<Mtp> mtp_;
  std::deque<cpu::PackedMatrix> packed_;                           // every matrix, in the kernels' layout
  std::map<const void*, const cpu::PackedMatrix*> packed_index_;  // mapped data -> its packed copy
  int64_t converted_matrices_ = 0;
  int64_t converted_bytes_ = 0;
};

}  // namespace anchorage
