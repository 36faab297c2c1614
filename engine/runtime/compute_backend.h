// What the caches, the generator and decide ask of a forward pass, whichever device runs it: the
// CPU's Forward, or the CUDA backend (a plugin) that keeps a device copy of each SequenceState.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/image/image_patches.h"
#include "engine/model/model_config.h"
#include "engine/runtime/sequence_state.h"

namespace anchorage {

enum class LogitsRows { kLast, kAll };

// One branch of PrefillBranches: the ids after the prefix, and the first of them whose logits it needs.
struct PrefillBranch {
  std::span<const int32_t> ids;
  int64_t logits_from = 0;  // in [0, ids.size())
};

struct MtpState;

// That ids are not empty and each is in the vocabulary; errors start with `who` (forward.cpp).
Status CheckTokenIds(std::span<const int32_t> ids, int64_t vocab_size, const std::string& who);

// That a decode batch names as many ids as states, at least one, each state once, each id in the vocabulary.
inline Status CheckDecodeBatch(std::span<SequenceState* const> states, std::span<const int32_t> ids, int64_t vocab_size) {
  if (states.empty() || states.size() != ids.size())
    return InvalidArgument("DecodeBatch: " + std::to_string(ids.size()) + " ids for " + std::to_string(states.size()) + " states");
  for (size_t i = 0; i < states.size(); ++i) {
    if (states[i] == nullptr) return InvalidArgument("DecodeBatch: state " + std::to_string(i) + " is null");
    for (size_t j = 0; j < i; ++j)
      if (states[j] == states[i]) return InvalidArgument("DecodeBatch: states " + std::to_string(j) + " and " + std::to_string(i) + " are the same");
  }
  return CheckTokenIds(ids, vocab_size, "DecodeBatch");
}

// Other states' next rows that may ride along a prefill's forward (a mixed step): one id a state.
// The backend that carries them sets taken and their logits [states.size(), vocab], row i the bits
// Decode(*states[i], ids[i]) returns; one that does not leaves them for the caller's DecodeBatch.
struct DecodeRiders {
  DecodeRiders(std::span<SequenceState* const> states, std::span<const int32_t> ids) : states(states), ids(ids) {}
  std::span<SequenceState* const> states;
  std::span<const int32_t> ids;
  bool taken = false;
  std::vector<float> logits;
};

class ComputeBackend {
 public:
  virtual ~ComputeBackend() = default;

  // "cpu" or "cuda".
  virtual const char* device_name() const = 0;
  // What it runs on, for the log and /health: the kernel path and threads, or the GPU.
  virtual std::string DeviceDescription() const = 0;
  // What the matrices are held as, e.g. "bf16" or "fp8-e4m3 + bf16".
  virtual std::string WeightsDescription() const = 0;
  // Bytes the matrices take where the backend holds them.
  virtual int64_t WeightBytes() const = 0;
  virtual const ModelConfig& config() const = 0;
  int64_t vocab_size() const { return config().vocab_size; }
  virtual int64_t grid_tokens() const = 0;
  // CPU worker threads it runs on (the caller included).
  virtual int threads() const = 0;
  // What a cache must match to reuse this backend's states (hex sha256): the model's fingerprint,
  // the backend and its arithmetic.
  virtual std::string StateKey(const std::string& model_fingerprint) const = 0;
  // Bytes held on a device beside host memory (weights, workspace and state copies); 0 for the CPU.
  virtual int64_t DeviceBytes() const { return 0; }
  // The device's free memory now (any thread); 0 for the CPU.
  virtual int64_t DeviceFreeBytes() const { return 0; }
  // Whether the device has room for state (nullptr: a new one) to hold `rows` rows; ResourceExhausted
  // saying so where it has not. The CPU's states live in host memory, which the caches' budget counts.
  virtual Status FitsDevice(const SequenceState* state, int64_t rows) const { return Status::Ok(); }

  // Appends ids at positions state.length().. in chunks that end on multiples of grid_tokens; returns
  // fp32 logits [1, vocab] (kLast) or [ids.size(), vocab] (kAll). Bad ids leave the state unchanged.
  // mtp: see Forward (only where has_mtp()).
  virtual Result<std::vector<float>> Prefill(SequenceState& state, std::span<const int32_t> ids,
                                             LogitsRows rows = LogitsRows::kLast, MtpState* mtp = nullptr) = 0;
  // Prefill (logits of the last row) whose forward may carry riders; see DecodeRiders. The caller
  // keeps ids inside one grid chunk for them to ride.
  virtual Result<std::vector<float>> PrefillCarrying(SequenceState& state, std::span<const int32_t> ids, MtpState* mtp, DecodeRiders& riders) {
    return Prefill(state, ids, LogitsRows::kLast, mtp);
  }
  // The most prompt rows a prefill piece forwards while other states decode: a long prefill holds
  // their next tokens back for at most one piece. A multiple of 64 no larger than the grid.
  virtual int64_t piece_tokens_beside_decodes() const { return grid_tokens(); }
  // Appends one token with the one-token recurrence; returns fp32 logits [vocab].
  virtual Result<std::vector<float>> Decode(SequenceState& state, int32_t id, MtpState* mtp = nullptr) = 0;
  // Appends ids[i] to *states[i] for every i (distinct states); returns fp32 logits [states.size(), vocab], row i
  // the bits Decode(*states[i], ids[i]) returns. A backend that batches reads each weight once for all of them.
  // Bad arguments change no state; a backend that fails part way (a device without room) leaves the states
  // before that one advanced, as that many Decode calls would.
  virtual Result<std::vector<float>> DecodeBatch(std::span<SequenceState* const> states, std::span<const int32_t> ids);
  // The last row's logits of ids on a fork of state: state keeps its bits, rows above its length included.
  virtual Result<std::vector<float>> ForkLastLogits(const SequenceState& state, std::span<const int32_t> ids) = 0;
  // Host bytes a prefill call of chunk_tokens allocates at its peak (the state's growth is the caller's).
  virtual int64_t PrefillWorkspaceBytes(int64_t chunk_tokens) const = 0;

  // Many branches from one prefix in one forward (decide's batches); see Forward::PrefillBranches.
  virtual bool has_branches() const { return false; }
  virtual Result<std::vector<float>> PrefillBranches(const SequenceState& prefix, std::span<const PrefillBranch> branches) {
    return Unsupported(std::string("PrefillBranches: not on the ") + device_name() + " backend");
  }
  virtual int64_t BranchesBytes(int64_t branches, int64_t rows, int64_t logits_rows) const { return 0; }

  // Draft windows for speculative decoding; see Forward::DraftWindow.
  virtual bool has_draft_windows() const { return false; }
  virtual Result<std::vector<float>> DraftWindow(SequenceState& state, std::span<const int32_t> ids, MtpState* mtp = nullptr) {
    return Unsupported(std::string("DraftWindow: not on the ") + device_name() + " backend");
  }
  virtual Status KeepDraft(SequenceState& state, int64_t rows) {
    return Unsupported(std::string("KeepDraft: not on the ") + device_name() + " backend");
  }
  // Several states' next rows in one forward, each weight read once for all: rows[i] of one id decodes
  // it on *states[i] (DecodeBatch's bits), of more ids opens a draft window there (DraftWindow's bits;
  // KeepDraft closes it). A backend that has it keeps a window open on every state at once. Returns the
  // logits of every row, state after state. Bad arguments change no state.
  virtual bool has_window_batches() const { return false; }
  virtual Result<std::vector<float>> DecodeWindowsBatch(std::span<SequenceState* const> states, std::span<const std::vector<int32_t>> rows) {
    return Unsupported(std::string("DecodeWindowsBatch: not on the ") + device_name() + " backend");
  }

  // The checkpoint's vision tower on this backend's device, callable from any thread beside the forward
  // (VisionTower::Encode's input and output). A backend without one leaves the tower to the CPU.
  virtual bool has_vision_tower() const { return false; }
  // Why a backend that runs towers has none for this model's (the CPU runs it then); empty otherwise.
  virtual std::string VisionTowerNote() const { return {}; }
  virtual Result<std::vector<float>> EncodeImage(const ImageGrid& grid, std::span<const float> patches) {
    return Unsupported(std::string("EncodeImage: no vision tower on the ") + device_name() + " backend");
  }

  // The checkpoint's multi-token-prediction head; see Forward::MtpCommit and MtpDraft.
  virtual bool has_mtp() const { return false; }
  virtual Status MtpCommit(MtpState& mtp, std::span<const int32_t> next_ids) {
    return Unsupported(std::string("MtpCommit: not on the ") + device_name() + " backend");
  }
  virtual Result<std::vector<int32_t>> MtpDraft(MtpState& mtp, std::span<const int32_t> next_ids, int max_draft,
                                                int64_t vocab_limit, std::vector<float>* logits = nullptr) {
    return Unsupported(std::string("MtpDraft: not on the ") + device_name() + " backend");
  }
};

inline Result<std::vector<float>> ComputeBackend::DecodeBatch(std::span<SequenceState* const> states, std::span<const int32_t> ids) {
  RETURN_IF_ERROR(CheckDecodeBatch(states, ids, config().vocab_size));
  std::vector<float> logits;
  logits.reserve(states.size() * static_cast<size_t>(config().vocab_size));
  for (SequenceState* state : states) RETURN_IF_ERROR(FitsDevice(state, state->length() + 1));
  for (size_t i = 0; i < states.size(); ++i) {
    ASSIGN_OR_RETURN(std::vector<float> row, Decode(*states[i], ids[i]));
    logits.insert(logits.end(), row.begin(), row.end());
  }
  return logits;
}

}  // namespace anchorage
