// The CUDA backend behind ComputeBackend: CudaForward over a device copy (a StateMirror) of each host
// SequenceState it is given. A forward first brings the copy up to what the host changed (K/V rows
// below the length, the recurrent part), runs on the device and writes its new K/V rows back to the
// host at once; the recurrent part stays on the device until the host reads it. So every cache tier
// keeps working on host states, with the GPU's bits, and decode copies one K/V row a layer a token.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <atomic>
#include <span>
#include <string>
#include <vector>

#include "engine/runtime/compute_backend.h"
#include "engine/runtime/cuda_forward.h"
#include "engine/runtime/cuda_vision_tower.h"

namespace anchorage {

class CudaBackend final : public ComputeBackend {
 public:
  static Result<std::unique_ptr<CudaBackend>> Create(const ModelConfig& config, const ModelWeights& weights,
                                                     const CudaForwardOptions& options);
  // Every state's mirror must be gone first (they run on its stream).
  ~CudaBackend() override;

  const char* device_name() const override { return "cuda"; }
  std::string DeviceDescription() const override;
  std::string WeightsDescription() const override { return forward_->WeightsDescription(); }
  int64_t WeightBytes() const override { return forward_->weight_bytes(); }
  const ModelConfig& config() const override { return forward_->config(); }
  int64_t grid_tokens() const override { return forward_->grid_tokens(); }
  int threads() const override { return 1; }
  // The forward's fingerprint, and the tower's products where it runs here (its rows are image rows' inputs).
  std::string StateKey(const std::string& model_fingerprint) const override {
    return forward_->StateFingerprint(tower_ != nullptr ? model_fingerprint + "\nvision tower:\n" + tower_->KernelSet() : model_fingerprint);
  }
  int64_t DeviceBytes() const override;
  int64_t DeviceFreeBytes() const override;
  Status FitsDevice(const SequenceState* state, int64_t rows) const override;

  Result<std::vector<float>> Prefill(SequenceState& state, std::span<const int32_t> ids, LogitsRows rows = LogitsRows::kLast,
                                     MtpState* mtp = nullptr) override;
  Result<std::vector<float>> Decode(SequenceState& state, int32_t id, MtpState* mtp = nullptr) override;
  // Every state's next row in one forward on the device (CudaForward::DecodeBatch). A state whose copy
  // cannot be made or grown leaves every state as it was.
  Result<std::vector<float>> DecodeBatch(std::span<SequenceState* const> states, std::span<const int32_t> ids) override;
  Result<std::vector<float>> ForkLastLogits(const SequenceState& state, std::span<const int32_t> ids) override;
  int64_t PrefillWorkspaceBytes(int64_t chunk_tokens) const override;

  // Branches run in the prefix's device copy (which then holds its rows below the length alone, as
  // after a fork); only their logits reach host memory.
  bool has_branches() const override { return true; }
  Result<std::vector<float>> PrefillBranches(const SequenceState& prefix, std::span<const PrefillBranch> branches) override;
  int64_t BranchesBytes(int64_t branches, int64_t rows, int64_t logits_rows) const override;

  // Draft windows run in the state's device copy and leave the host state as it was: KeepDraft
  // advances the copy by the kept rows and writes only those rows back to the host.
  bool has_draft_windows() const override { return true; }
  Result<std::vector<float>> DraftWindow(SequenceState& state, std::span<const int32_t> ids, MtpState* mtp = nullptr) override;
  Status KeepDraft(SequenceState& state, int64_t rows) override;
  // Decodes and windows of several states in one forward (CudaForward::DecodeWindowsBatch): a window
  // stays open on every state that got one, until its KeepDraft or another window on that state.
  bool has_window_batches() const override { return true; }
  Result<std::vector<float>> DecodeWindowsBatch(std::span<SequenceState* const> states, std::span<const std::vector<int32_t>> rows) override;

  // The checkpoint's MTP head on the device (its rows in each MtpState's mirror).
  bool has_mtp() const override { return forward_->has_mtp(); }
  Status MtpCommit(MtpState& mtp, std::span<const int32_t> next_ids) override;
  Result<std::vector<int32_t>> MtpDraft(MtpState& mtp, std::span<const int32_t> next_ids, int max_draft, int64_t vocab_limit,
                                        std::vector<float>* logits = nullptr) override;

  // The checkpoint's vision tower on the device (where it has one and the device can hold it).
  bool has_vision_tower() const override { return tower_ != nullptr; }
  Result<std::vector<float>> EncodeImage(const ImageGrid& grid, std::span<const float> patches) override;
  std::string VisionTowerNote() const override { return vision_note_; }

  CudaForward& forward() { return *forward_; }

 private:
  class Mirror;
  explicit CudaBackend(std::unique_ptr<CudaForward> forward) : forward_(std::move(forward)) {}
  // The device copy of host, equal to it below its length and in its recurrent part.
  Result<DeviceState*> Sync(const SequenceState& host);
  // Room for tokens rows in the device copy Sync made (fails without change).
  Status Reserve(const SequenceState& host, int64_t tokens);
  // After a forward from `from`: the device's new rows to the host, the length, the recurrent part newer on the device.
  Status WriteBack(SequenceState& host, const DeviceState& device, int64_t from);
  // The device made current, host synced and room for tokens rows, the forward reading host's images;
  // on failure the copy is dropped.
  Status Prepare(const SequenceState& host, int64_t tokens, DeviceState** device);
  // After an error the copy is dropped (the next forward makes another). device_ahead: the device
  // ran past the host's length, so where it held the newest recurrent part the host state is reset.
  static void Drop(SequenceState& host, bool device_ahead);
  // Prepare for every state with room for rows(i) more rows; its device copy, images and length. The first
  // that cannot be prepared leaves every state as it was.
  Status PrepareBatch(std::span<SequenceState* const> states, const std::function<int64_t(size_t)>& rows, std::vector<DeviceState*>& devices,
                      std::vector<const PromptImages*>& images, std::vector<int64_t>& from);

  std::unique_ptr<CudaForward> forward_;
  std::unique_ptr<CudaVisionTower> tower_;
  std::string vision_note_;
  std::atomic<int64_t> mirrored_bytes_{0};  // every state copy's device memory
};

}  // namespace anchorage
