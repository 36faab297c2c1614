// The forward pass on a CUDA device: grid prefill and decode over a state held in device memory.
// The same inputs give the same bits on every run; a prefill resumed at any multiple of 64 writes a
// cold prefill's bits (the delta rule's chunks sit on absolute multiples of 64, every other kernel and
// the cuBLASLt products are row-invariant). Bits differ from the CPU's: the fingerprint names the
// backend, the device and the algorithms. Built only where a CUDA toolkit is found.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "engine/compute/cuda/device.h"
#include "engine/compute/cuda/gemm.h"
#include "engine/core/status.h"
#include "engine/model/model_config.h"
#include "engine/model/weights.h"
#include "engine/runtime/forward.h"
#include "engine/runtime/sequence_state.h"
#include "engine/runtime/prompt_images.h"

namespace anchorage {

struct CudaForwardOptions {
  int64_t grid_tokens = 1024;  // prefill chunk G; a positive multiple of 64
  int device = 0;
  // Decode replays one captured CUDA graph a token (recaptured when the state's buffers change);
  // where capture fails it goes on launch by launch. The bits are the same either way.
  bool decode_graphs = true;
  // Pinned host memory the host copies of states pass through (in pieces of this size); 0: none.
  int64_t staging_bytes = int64_t{32} << 20;
  // BF16, F16 and F32 matrices made int8 at load as the CPU's --weights int8 makes them (a scale a
  // row and 32 inputs); FP8 ones stay FP8.
  bool int8_weights = false;
  // Fast precision: the prefill products take each activation rounded to bf16 once (no low part).
  bool fast_products = false;
};

// The recurrent part of a device state at one length, kept in device memory: an anchor that does not
// leave the GPU (per GDN layer the state then the tail, as Anchor::data).
struct DeviceAnchor {
  int64_t length = 0;
  cuda::DeviceBuffer data;
  int64_t bytes() const { return static_cast<int64_t>(data.bytes()); }
};

// What a state's open draft window leaves for KeepDraft (cuda_forward.cpp).
struct DeviceDraftLog;

// One sequence's state in device memory, laid out as SequenceState's (K/V rows per attention layer in
// the model's kv_dtype, recurrent state and conv tail per GDN layer). Made by CudaForward::NewState; it must not
// outlive that CudaForward (it runs on its stream).
class DeviceState {
 public:
  ~DeviceState();
  int64_t length() const { return length_; }
  int64_t capacity() const { return capacity_; }
  int64_t allocated_bytes() const;
  // Ensures room for `tokens` rows (whole steps of SequenceState::kKvRowStep), keeping rows below the length.
  Status Reserve(int64_t tokens);
  // Replaces host's contents with this state's (the whole state), and the reverse. The host state
  // must be of the same model.
  Status Download(SequenceState& host) const;
  Status Upload(const SequenceState& host);
  // A copy in device memory.
  Result<std::unique_ptr<DeviceState>> Clone() const;

  // The cache tiers' primitives, as SequenceState has them. Anchors copy device to device, or to and
  // from the host tiers' Anchor; K/V rows copy to and from the host tiers' KvRows. A restore sets the
  // length; the K/V rows below it must already be in place. Bad arguments leave the state unchanged.
  Result<DeviceAnchor> SaveAnchor() const;
  Status RestoreAnchor(const DeviceAnchor& anchor);
  Result<Anchor> SaveHostAnchor() const;
  Status RestoreHostAnchor(const Anchor& anchor);
  // Sets the length alone (rows below it must be in place, the recurrent part of that length).
  Status SetLength(int64_t length);
  Result<KvRows> CopyRows(int64_t begin, int64_t end) const;
  Status WriteRows(const KvRows& rows);
  // K/V rows [begin, end) from host's rows in place (end <= host.length()), and back into host's
  // (reserved by the caller): no KvRows between.
  Status UploadRows(const SequenceState& host, int64_t begin, int64_t end);
  Status DownloadRows(SequenceState& host, int64_t begin, int64_t end) const;

 private:
  friend class CudaForward;
  DeviceState(const ModelConfig& config, cuda::Stream stream);
  DeviceState(cuda::Stream stream, int64_t kv_width, KvDtype kv_dtype, int64_t recurrent_floats, int64_t tail_floats);
  int64_t row_bytes() const { return KvRowBytes(kv_dtype_, kv_width_); }
  cuda::KvBuffers kv_buffers(int64_t a) const { return {k_[static_cast<size_t>(a)].data(), v_[static_cast<size_t>(a)].data(), kv_dtype_}; }
  bool Matches(const SequenceState& host) const;
  // Every buffer a forward writes into: what a captured decode step was made for.
  std::vector<const void*> Buffers() const;
  int64_t anchor_floats() const { return static_cast<int64_t>(recurrent_.size()) * (recurrent_floats_ + tail_floats_); }
  // A stretch of device memory and its place in pageable host memory.
  struct HostPiece {
    void* device;
    void* host;
    size_t bytes;
  };
  // Copies the pieces through the pinned staging buffer (directly where there is none), waiting for the stream.
  Status CopyStaged(std::span<const HostPiece> pieces, bool to_host) const;
  Status CopyStagedPieces(std::span<const HostPiece> pieces, bool to_host) const;
  // The recurrent part laid out as Anchor::data at floats; K/V rows [begin, begin + rows) as KvRows::data at data.
  std::vector<HostPiece> RecurrentPieces(const float* floats) const;
  std::vector<HostPiece> RowPieces(int64_t begin, int64_t rows, const void* data) const;
  // K/V rows [begin, end) of every attention layer and their places in host's rows.
  std::vector<HostPiece> HostRowPieces(const SequenceState& host, int64_t begin, int64_t end) const;
  // Copies the recurrent part to or from `floats` (device or host memory, as kind says).
  Status CopyRecurrentOut(float* floats, int kind) const;
  Status CopyRecurrentIn(const float* floats, int kind);
  // A restored anchor's length must fit the K/V rows reserved.
  Status CheckAnchorLength(int64_t length) const;

  cuda::Stream stream_ = nullptr;
  cuda::PinnedBuffer* staging_ = nullptr;  // the forward's; one copy at a time, on the engine thread
  int64_t kv_width_ = 0, recurrent_floats_ = 0, tail_floats_ = 0;
  KvDtype kv_dtype_ = KvDtype::kF32;
  int64_t length_ = 0, capacity_ = 0;
  std::vector<cuda::DeviceBuffer> k_, v_, recurrent_, tail_;
  std::unique_ptr<DeviceDraftLog> draft_;  // made at its first draft window, grown to its largest
};

// A BF16, F16 or F32 matrix [rows, cols] (shape already checked) as bf16 on the device: F16 and F32
// rounded to bf16 once, as the CPU backend does.
Result<cuda::DeviceBuffer> UploadBf16Matrix(const TensorView& t, int64_t rows, int64_t cols, cuda::Stream s);

class CudaForward {
 public:
  // Finds the device, copies every matrix there (BF16 as it is, F16/F32 rounded to BF16 once, as on
  // the CPU; block-scaled FP8 as codes and scales) and chooses the products' algorithms.
  static Result<std::unique_ptr<CudaForward>> Create(const ModelConfig& config, const ModelWeights& weights,
                                                     const CudaForwardOptions& options);
  ~CudaForward();

  Result<std::unique_ptr<DeviceState>> NewState();
  // The images of the sequence the next calls run on (not owned; nullptr: none): a prefill takes image
  // rows' inputs from them (an image key id anywhere else is refused), and every row turns by its M-RoPE position.
  void set_images(const PromptImages* images) { images_ = images; }
  // Appends ids in chunks that end on multiples of grid_tokens; returns fp32 logits of the last row
  // (kLast) or of every row (kAll). Bad ids leave the state unchanged; after a device error the state
  // is undefined and must be dropped. With mtp (and an MTP head) the rows' hidden states feed the
  // head as Forward's do, its rows in device memory.
  Result<std::vector<float>> Prefill(DeviceState& state, std::span<const int32_t> ids, LogitsRows rows = LogitsRows::kLast,
                                     MtpState* mtp = nullptr);
  // Appends one token with the one-token recurrence and one-row products; returns its logits.
  Result<std::vector<float>> Decode(DeviceState& state, int32_t id, MtpState* mtp = nullptr);

  // Branches that all go on from state (at its length) in one forward over their stacked rows, as
  // Forward::PrefillBranches: each from a copy of the state's recurrent part, over its K/V rows below
  // the length. Returns the logits of each branch's rows logits_from.., branch after branch, with the
  // bits a Prefill (kAll) of that branch on a copy of state returns. The state keeps its length,
  // recurrent part and rows below the length; its rows above the length are overwritten. A branch
  // holds at most grid_tokens ids; branches of more rows than that together run in several passes.
  Result<std::vector<float>> PrefillBranches(DeviceState& state, std::span<const PrefillBranch> branches);

  // The most rows a draft window takes: the last sampled token and up to 64 drafts (the settings' most).
  static constexpr int64_t kMaxDraftRows = 65;
  // A draft window, as Forward::DraftWindow: ids at state.length().. in one forward whose every row
  // computes Decode's bits for that id (the GEMV's products, the one-token recurrence on a copy of
  // each GDN state); returns logits [ids.size(), vocab]. K/V rows are written and the length set past
  // them; the recurrent states and conv tails wait for KeepDraft, which advances them by the first
  // `rows` rows with Decode's steps and sets the length there, so the state equals `rows` Decode
  // calls. Nothing else may run on the state in between.
  // With mtp the kept rows' hidden states wait there.
  Result<std::vector<float>> DraftWindow(DeviceState& state, std::span<const int32_t> ids, MtpState* mtp = nullptr);
  Status KeepDraft(DeviceState& state, int64_t rows);

  // Appends ids[i] to *states[i] (distinct states) in one forward, as Forward::DecodeBatch: every product
  // runs over all the rows, each weight read once (a GEMV row's bits do not depend on the rows beside it),
  // while each state's conv tail, recurrence, K/V rows and attention are its own. images[i]: the images of
  // states[i]'s sequence (they shift its rotary position), or null. Returns logits [states.size(), vocab],
  // row i the bits Decode(*states[i], ids[i]) returns; up to 64 states a forward. With decode graphs on,
  // a batch's launches are captured once and replayed while the same states (with the same buffers) decode
  // together. Bad ids or no room for a row change no state.
  Result<std::vector<float>> DecodeBatch(std::span<DeviceState* const> states, std::span<const int32_t> ids,
                                         std::span<const PromptImages* const> images);
  // Decodes and draft windows of several states in one forward, as Forward::DecodeWindowsBatch: rows[i]
  // of one id decodes it on *states[i] (Decode's bits), of more ids (at most kMaxDraftRows) opens a
  // draft window there (DraftWindow's bits; KeepDraft closes it, in any order). Every window stays open
  // until its KeepDraft or another window on its state. Returns the logits of every row, state after state. Runs
  // launch by launch, in passes of whole states. Bad ids or no room change no state.
  Result<std::vector<float>> DecodeWindowsBatch(std::span<DeviceState* const> states, std::span<const std::vector<int32_t>> rows,
                                                std::span<const PromptImages* const> images);

  // The checkpoint's multi-token-prediction head, as Forward's (MtpCommit, MtpDraft), on the device:
  // the head's K/V rows and the waiting hidden rows live in mtp.mirror. Its bits are this backend's
  // (drafts only decide which rows a window forwards, so tokens never depend on them). Where the device
  // has no room for the head's rows they are given up (mtp.gave_up): the commit does nothing and the
  // draft returns the drafts made so far, perhaps none.
  bool has_mtp() const { return mtp_ != nullptr; }
  Status MtpCommit(MtpState& mtp, std::span<const int32_t> next_ids);
  Result<std::vector<int32_t>> MtpDraft(MtpState& mtp, std::span<const int32_t> next_ids, int max_draft, int64_t vocab_limit,
                                        std::vector<float>* logits = nullptr);

  // What states computed here depend on: backend, device, CUDA and cuBLASLt versions, the algorithms.
  std::string KernelSet() const;
  // A cache's key for states of this backend (hex sha256), as Forward::StateFingerprint is for the CPU's.
  std::string StateFingerprint(const std::string& model_fingerprint) const;
  const cuda::DeviceInfo& device() const { return device_; }
  const ModelConfig& config() const { return config_; }
  int64_t grid_tokens() const { return options_.grid_tokens; }
  int64_t weight_bytes() const { return weight_bytes_; }
  // The formats the matrices are held in, as the CPU names them: "bf16", "fp8-e4m3 + bf16", "int8", ...
  std::string WeightsDescription() const;
  // Bytes a decoded token reads: every matrix but an untied embedding.
  int64_t decode_weight_bytes() const;
  int64_t workspace_bytes() const;
  // The MTP head's rows on the device, over every MtpState that holds some.
  int64_t mtp_bytes() const { return mtp_bytes_.load(); }
  // How decode launches its kernels: "one captured graph a token" or "launch by launch (why)".
  std::string DecodeLaunches() const;
  // Turns decode graphs on (they are tried again) or off.
  void set_decode_graphs(bool on);
  // Held while a decode step is captured: another thread's device work that touches the legacy stream
  // (the vision tower's copies) would break the capture, so it holds this too.
  std::mutex& capture_mutex() { return capture_mutex_; }

 private:
  struct Matrix {
    const uint16_t* w = nullptr;  // bf16 [rows, cols] row-major, device; null where q8 holds it
    int64_t rows = 0, cols = 0;
    cuda::Q8Weights q8;  // block-scaled 8-bit codes: F8_E4M3 as the checkpoint stores them, or int8
    int64_t bytes = 0;   // on the device, scales included
  };
  struct Layer;
  struct Workspace;
  struct DecodeGraph;
  struct MtpHead;
  class DeviceMtp;
  // kDraft: a draft window's rows, each with decode's arithmetic, the recurrent part left as it was.
  // kBranches: branches' stacked rows, each from the state at its length, which stays as it was.
  // kBatch: one row of each of several states, each with decode's arithmetic on its own state.
  enum class Mode { kChunked, kRecurrent, kDraft, kBranches, kBatch };
  // One branch's rows [row0, row0 + n) in a forward over stacked rows; in a batch, one state's rows and
  // their first position and rotary position (from device memory in a captured batch, so it serves every
  // step), and whether they are a draft window (logged in the state's draft log, the state left as it was).
  struct Segment {
    int64_t row0 = 0, n = 0;
    DeviceState* state = nullptr;
    cuda::Position position, rope_position;
    bool window = false;
  };

  CudaForward(const ModelConfig& config, const CudaForwardOptions& options);
  Status Init(const ModelWeights& weights);
  // A matrix on the device: BF16 as it is, F16 and F32 rounded to BF16, F8_E4M3 as codes and block
  // scales (where allowed); with int8_weights every one but F8_E4M3 made int8.
  Result<Matrix> Upload(const TensorView& t, int64_t rows, int64_t cols, const char* role, bool fp8_allowed = true);
  // The CPU's int8 quantization of a matrix (a scale a row and 32 inputs), on the device.
  Result<Matrix> UploadInt8(const TensorView& t, int64_t rows, int64_t cols);
  // The embedding rows of ids, then the chunk's staged image rows over theirs.
  Status EmbedRows(const int32_t* ids, int64_t n, float* x);
  Result<Layer> UploadLayer(const LayerWeights& weights, LayerKind kind);
  Result<const float*> UploadVector(const TensorView& t, int64_t n, float add, const char* role);
  Result<const float*> UploadFloats(const std::vector<float>& values, const std::string& what);
  Status CheckIds(std::span<const int32_t> ids) const;

  // y = x m^T for n rows: cuBLASLt split products for prefill rows and branches, the warp-a-row GEMV otherwise.
  Status Product(const Matrix& m, const float* x, int64_t n, float* y, int64_t y_stride, Mode mode);
  // The two kinds of product: the warp-a-row GEMV (decode's arithmetic, y [n, m.rows]), and the rows'
  // product through gemm's split products (8-bit weights: the CUDA-core k-order GEMM).
  void GemvOf(const Matrix& m, const float* x, int64_t n, float* y);
  Status GemmOf(const Matrix& m, cuda::LtGemm* gemm, const float* x, int64_t n, float* y, int64_t y_stride);
  // Enqueues every layer over n rows (ids on the device) at the state's length (decode: the step's
  // position in device memory); the final hidden rows are left in the workspace.
  Status EnqueueLayers(DeviceState& state, const int32_t* ids, int64_t n, Mode mode, std::span<const Segment> branches = {});
  // state's draft log with room for a window of rows rows (and their hidden rows for an MTP head), closed.
  Result<DeviceDraftLog*> DraftLogOf(DeviceState& state, int64_t rows, bool hidden);
  // Logits of the workspace's n normed rows (ws.a) through decode's lm_head GEMV, kLogitRows rows a run, to host.
  Status DecodeLogitsOfRows(int64_t n, float* logits);
  // Logits of the workspace's hidden rows [begin, end) (final norm, the lm_head's split product) to host.
  Status LogitsOfRows(int64_t begin, int64_t end, float* logits);
  // Runs n ids already in the workspace at positions state.length()..; logits of rows [first, n) to host.
  Status RunChunk(DeviceState& state, int64_t n, int64_t first_logit_row, float* logits);
  // A decode step's launches, up to its logits in the workspace: no copy and no wait, so it can be captured.
  Status EnqueueDecode(DeviceState& state);
  // A decode batch's launches over rows (ids and positions in the workspace), up to its logits there.
  Status EnqueueBatch(std::span<const Segment> rows);
  // Runs fn's launches captured into a graph for buffers, or returns why it could not.
  template <typename Fn>
  Result<std::unique_ptr<DecodeGraph>> Capture(std::vector<const void*> buffers, Fn&& fn);
  // Launches graph, captured anew from enqueue's launches where it is missing or was made for other
  // buffers; where capture fails graphs go off (DecodeLaunches says why) and enqueue runs launch by launch.
  template <typename Fn>
  Status LaunchCaptured(std::unique_ptr<DecodeGraph>& graph, std::vector<const void*> buffers, Fn&& enqueue, const char* what);
  const int64_t* StepPosition() const;
  const int64_t* StepRopePosition() const;  // the step's position as its rotary angles take it
  Status GdnMixer(const Layer& layer, DeviceState& state, int64_t gi, int64_t n, Mode mode, std::span<const Segment> branches);
  Status AttentionMixer(const Layer& layer, DeviceState& state, int64_t ai, int64_t n, Mode mode, std::span<const Segment> branches);
  Status Mlp(const Layer& layer, int64_t n, Mode mode);
  // Query rows q (n of them, ws.qg's layout) and K/V rows k, v (workspace) of one sequence: RMSNorm
  // and RoPE at positions rope_pos.., the K/V rows stored at rows kv_row.. of rows (in its dtype), then
  // each query row attends keys 0..kv_row + t; the output to out.
  Status AttendRows(const Layer& layer, float* q, float* k, const float* v, int64_t n, cuda::Position rope_pos, cuda::Position kv_row,
                    const cuda::KvBuffers& rows, float* out, cuda::RopeAxes axes = {});
  // Rotary position minus row of the text rows from `row` on (what images before them moved them by).
  int64_t RopeShift(int64_t row) const { return RopeShiftOf(images_, row); }
  static int64_t RopeShiftOf(const PromptImages* images, int64_t row);
  // ids as the device embeds them (an image row's key id made 0) and, for a chunk from position pos, the
  // image rows' inputs and the rows' M-RoPE positions where they are not row + one shift.
  Status StageImageRows(std::span<const int32_t> ids, int64_t pos, std::vector<int32_t>* embedded);
  // mtp's device rows (made, the head starting anew, where it has none of this forward's).
  bool HoldsMtpRows(const MtpState& mtp) const;
  DeviceMtp& MtpRowsOf(MtpState& mtp);
  // Where n hidden rows at positions pos0.. join mtp's waiting rows (a gap starts mtp anew). Where
  // the device has no room for them, nullptr: the head's rows are given up for good (mtp.gave_up;
  // they only make drafts), so the trunk's forward goes on.
  Result<float*> MtpWait(MtpState& mtp, int64_t pos0, int64_t n);
  // The head over hidden rows (device) and the ids after them at K/V row slot.. (in pieces of the
  // workspace's rows); the last row's output after mtp.norm goes to out (device) when set.
  Status MtpRows(MtpState& mtp, const float* hidden, std::span<const int32_t> ids, int64_t slot, float* out);

  ModelConfig config_;
  CudaForwardOptions options_;
  cuda::DeviceInfo device_;
  cuda::Stream stream_ = nullptr;
  std::unique_ptr<cuda::LtGemm> gemm_;         // rows up to the grid
  std::unique_ptr<cuda::LtGemm> logits_gemm_;  // lm_head, up to kLogitRows rows a call
  std::vector<cuda::DeviceBuffer> buffers_;    // weights and vectors
  std::vector<Layer> layers_;
  Matrix embed_, lm_head_;
  const float* final_norm_ = nullptr;
  const double* inv_freq_ = nullptr;
  const PromptImages* images_ = nullptr;  // set_images
  cuda::RopeAxes rope_axes_;              // the chunk's rows' positions, where images make them 3-D
  std::vector<std::pair<int64_t, const float*>> image_rows_;  // the chunk's image rows and their inputs (host)
  std::unique_ptr<Workspace> ws_;
  std::unique_ptr<DecodeGraph> graph_;
  std::unique_ptr<DecodeGraph> batch_graph_;  // the last decode batch's, for its states' buffers and row count
  std::unique_ptr<MtpHead> mtp_;
  std::string graph_note_;  // why decode went launch by launch
  int64_t weight_bytes_ = 0;
  int64_t fp8_matrices_ = 0, int8_matrices_ = 0, bf16_matrices_ = 0;
  std::atomic<int64_t> mtp_bytes_{0};
  std::mutex capture_mutex_;
};

}  // namespace anchorage
