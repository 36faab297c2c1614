#include "engine/runtime/cuda_backend.h"

#include <algorithm>

#include "engine/runtime/forward.h"

namespace anchorage {

class CudaBackend::Mirror final : public StateMirror {
 public:
  Mirror(CudaBackend& backend, std::unique_ptr<DeviceState> device) : backend_(backend), device_(std::move(device)) {}
  ~Mirror() override { backend_.mirrored_bytes_ -= noted_bytes_; }
  const void* owner() const override { return &backend_; }
  Status PullRecurrent(SequenceState& host) override {
    RETURN_IF_ERROR(cuda::UseDevice(backend_.forward_->device().index));  // any thread may read the host state
    ASSIGN_OR_RETURN(Anchor anchor, device_->SaveHostAnchor());
    anchor.length = host.length();
    return host.RestoreAnchor(anchor);
  }
  DeviceState& device() { return *device_; }
  const DeviceState& device() const { return *device_; }
  // The host length its open draft window started from; -1: none open.
  int64_t window_from = -1;
  // Brings the backend's count of device bytes up to this copy's (on the engine thread, after it changed).
  void NoteBytes() {
    const int64_t now = device_->allocated_bytes();
    backend_.mirrored_bytes_ += now - noted_bytes_;
    noted_bytes_ = now;
  }

 private:
  CudaBackend& backend_;
  std::unique_ptr<DeviceState> device_;
  int64_t noted_bytes_ = 0;
};

Result<std::unique_ptr<CudaBackend>> CudaBackend::Create(const ModelConfig& config, const ModelWeights& weights,
                                                         const CudaForwardOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<CudaForward> forward, CudaForward::Create(config, weights, options));
  std::unique_ptr<CudaBackend> backend(new CudaBackend(std::move(forward)));
  if (config.vision && weights.vision) {  // a tower the device cannot hold runs on the CPU, as the note says
    auto tower = CudaVisionTower::Create(*config.vision, *weights.vision, options.device, options.fast_products,
                                         backend->forward_->capture_mutex());
    if (tower.ok()) {
      backend->tower_ = std::move(tower).value();
    } else {
      backend->vision_note_ = tower.status().message();
    }
  }
  return backend;
}

Result<std::vector<float>> CudaBackend::EncodeImage(const ImageGrid& grid, std::span<const float> patches) {
  if (tower_ == nullptr) return ComputeBackend::EncodeImage(grid, patches);
  return tower_->Encode(grid, patches);
}

CudaBackend::~CudaBackend() = default;

std::string CudaBackend::DeviceDescription() const { return "cuda, " + forward_->device().Describe(); }

int64_t CudaBackend::DeviceBytes() const {
  return forward_->weight_bytes() + forward_->workspace_bytes() + mirrored_bytes_.load() + forward_->mtp_bytes() +
         (tower_ != nullptr ? tower_->weight_bytes() : 0);
}

int64_t CudaBackend::DeviceFreeBytes() const {
  if (!cuda::UseDevice(forward_->device().index).ok()) return 0;
  auto free = cuda::FreeDeviceBytes();
  return free.ok() ? *free : 0;
}

Status CudaBackend::FitsDevice(const SequenceState* state, int64_t rows) const {
  const ModelConfig& c = config();
  const Mirror* mirror = state != nullptr && state->mirror() != nullptr && state->mirror()->owner() == this
                             ? static_cast<const Mirror*>(state->mirror())
                             : nullptr;
  const int64_t step = SequenceState::kKvRowStep, wanted = (std::max<int64_t>(rows, 1) + step - 1) / step * step;
  int64_t need = mirror != nullptr ? 0 : SequenceState::AnchorBytes(c);
  // A growth allocates the new rows beside the old ones before it copies them.
  if (wanted > (mirror != nullptr ? mirror->device().capacity() : 0)) need += wanted * SequenceState::KvBytesPerToken(c);
  if (need == 0) return Status::Ok();
  RETURN_IF_ERROR(cuda::UseDevice(forward_->device().index));
  ASSIGN_OR_RETURN(const int64_t free, cuda::FreeDeviceBytes());
  if (need > free)
    return ResourceExhausted("the GPU has " + std::to_string(free >> 20) + " MiB free; " + std::to_string(rows) + " rows of a state need " +
                             std::to_string((need + (1 << 20) - 1) >> 20) + " MiB more");
  return Status::Ok();
}

int64_t CudaBackend::PrefillWorkspaceBytes(int64_t chunk_tokens) const {
  return config().vocab_size * static_cast<int64_t>(sizeof(float)) + chunk_tokens * static_cast<int64_t>(sizeof(int32_t));
}

Result<DeviceState*> CudaBackend::Sync(const SequenceState& state) {
  SequenceState& host = const_cast<SequenceState&>(state);  // the mirror is the host's own cache; its bits do not change
  Mirror* mirror = host.mirror() != nullptr && host.mirror()->owner() == this ? static_cast<Mirror*>(host.mirror()) : nullptr;
  if (mirror == nullptr) {
    ASSIGN_OR_RETURN(std::unique_ptr<DeviceState> device, forward_->NewState());
    auto made = std::make_unique<Mirror>(*this, std::move(device));
    mirror = made.get();
    host.set_mirror(std::move(made));
  }
  DeviceState& device = mirror->device();
  const int64_t length = host.length(), capacity = device.capacity(), kept_by_growth = device.length();
  const Status reserved = device.Reserve(std::max<int64_t>(length, 1));
  mirror->NoteBytes();
  RETURN_IF_ERROR(reserved);
  int64_t valid = host.mirror_rows();
  if (device.capacity() != capacity) valid = std::min(valid, kept_by_growth);  // a growth keeps rows below the device's length only
  host.set_mirror_sync(valid, host.newest_recurrent());
  if (valid < length) RETURN_IF_ERROR(device.UploadRows(host, valid, length));
  if (host.newest_recurrent() == NewestRecurrent::kHost) {
    RETURN_IF_ERROR(device.RestoreHostAnchor(host.SaveAnchor()));
  } else {
    RETURN_IF_ERROR(device.SetLength(length));
  }
  host.set_mirror_sync(std::max(valid, length),
                       host.newest_recurrent() == NewestRecurrent::kHost ? NewestRecurrent::kBoth : host.newest_recurrent());
  return &device;
}

Status CudaBackend::Reserve(const SequenceState& host, int64_t tokens) {
  auto* mirror = static_cast<Mirror*>(host.mirror());
  const Status reserved = mirror->device().Reserve(tokens);
  mirror->NoteBytes();
  return reserved;
}

Status CudaBackend::WriteBack(SequenceState& host, const DeviceState& device, int64_t from) {
  const int64_t length = device.length();
  RETURN_IF_ERROR(host.Reserve(length));
  RETURN_IF_ERROR(device.DownloadRows(host, from, length));
  host.SetLength(length);
  host.set_mirror_sync(length, NewestRecurrent::kMirror);
  return Status::Ok();
}

void CudaBackend::Drop(SequenceState& host, bool device_ahead) {
  if (device_ahead && host.newest_recurrent() == NewestRecurrent::kMirror) {
    host.set_mirror_sync(0, NewestRecurrent::kHost);
    host.Reset();  // the device held the newest recurrent part and has gone past it: nothing at this length is left
  } else if (device_ahead) {
    host.set_mirror_sync(0, NewestRecurrent::kHost);  // the host's recurrent part is this length's
  }
  (void)host.DropMirror();  // pulls what the device still holds newer; resets where it cannot
}

Status CudaBackend::Prepare(const SequenceState& host, int64_t tokens, DeviceState** device) {
  forward_->set_images(host.images().get());
  RETURN_IF_ERROR(cuda::UseDevice(forward_->device().index));
  auto synced = Sync(host);
  Status ready = synced.ok() ? Reserve(host, tokens) : synced.status();
  if (!ready.ok()) {
    Drop(const_cast<SequenceState&>(host), false);
    return ready;
  }
  *device = *synced;
  return Status::Ok();
}

Result<std::vector<float>> CudaBackend::Prefill(SequenceState& state, std::span<const int32_t> ids, LogitsRows rows, MtpState* mtp) {
  RETURN_IF_ERROR(CheckPromptIds(ids, config().vocab_size, state.images().get(), state.length(), "CudaBackend"));
  const int64_t from = state.length();
  DeviceState* device = nullptr;
  RETURN_IF_ERROR(Prepare(state, from + static_cast<int64_t>(ids.size()), &device));
  auto logits = forward_->Prefill(*device, ids, rows, mtp);
  Status written = logits.ok() ? WriteBack(state, *device, from) : logits.status();
  if (!written.ok()) {
    Drop(state, true);
    return written;
  }
  return logits;
}

Result<std::vector<float>> CudaBackend::Decode(SequenceState& state, int32_t id, MtpState* mtp) {
  RETURN_IF_ERROR(CheckTokenIds(std::span<const int32_t>(&id, 1), config().vocab_size, "CudaBackend"));
  const int64_t from = state.length();
  DeviceState* device = nullptr;
  RETURN_IF_ERROR(Prepare(state, from + 1, &device));
  auto logits = forward_->Decode(*device, id, mtp);
  Status written = logits.ok() ? WriteBack(state, *device, from) : logits.status();
  if (!written.ok()) {
    Drop(state, true);
    return written;
  }
  return logits;
}

Status CudaBackend::PrepareBatch(std::span<SequenceState* const> states, const std::function<int64_t(size_t)>& rows,
                                 std::vector<DeviceState*>& devices, std::vector<const PromptImages*>& images, std::vector<int64_t>& from) {
  for (size_t i = 0; i < states.size(); ++i) {
    from.push_back(states[i]->length());
    images.push_back(states[i]->images().get());
    devices.push_back(nullptr);
    RETURN_IF_ERROR(Prepare(*states[i], from[i] + rows(i), &devices[i]));
    static_cast<Mirror*>(states[i]->mirror())->window_from = -1;  // a window left open on the state is given up
  }
  return Status::Ok();
}

Result<std::vector<float>> CudaBackend::DecodeBatch(std::span<SequenceState* const> states, std::span<const int32_t> ids) {
  RETURN_IF_ERROR(CheckDecodeBatch(states, ids, config().vocab_size));
  if (states.size() == 1) return Decode(*states.front(), ids.front());  // one state: Decode, with its captured graph
  std::vector<DeviceState*> devices;
  std::vector<const PromptImages*> images;
  std::vector<int64_t> from;
  RETURN_IF_ERROR(PrepareBatch(states, [](size_t) { return int64_t{1}; }, devices, images, from));
  auto logits = forward_->DecodeBatch(devices, ids, images);
  Status status = logits.ok() ? Status::Ok() : logits.status();
  for (size_t i = 0; i < states.size(); ++i) {  // after a device error a copy may be anywhere: each is dropped
    const Status written = logits.ok() ? WriteBack(*states[i], *devices[i], from[i]) : logits.status();
    if (written.ok()) continue;
    Drop(*states[i], true);
    if (status.ok()) status = written;
  }
  if (!status.ok()) return status;
  return logits;
}

Result<std::vector<float>> CudaBackend::PrefillBranches(const SequenceState& prefix, std::span<const PrefillBranch> branches) {
  int64_t longest = 0;
  for (const PrefillBranch& b : branches) {
    RETURN_IF_ERROR(CheckTokenIds(b.ids, config().vocab_size, "CudaBackend"));
    longest = std::max(longest, static_cast<int64_t>(b.ids.size()));
  }
  if (branches.empty()) return std::vector<float>();
  SequenceState& host = const_cast<SequenceState&>(prefix);  // its bits do not change; its device copy's rows above the length do
  const int64_t length = host.length();
  DeviceState* device = nullptr;
  RETURN_IF_ERROR(Prepare(host, length + longest, &device));
  auto logits = forward_->PrefillBranches(*device, branches);
  host.set_mirror_sync(std::min(host.mirror_rows(), length), host.newest_recurrent());
  if (!logits.ok() && logits.status().code() != StatusCode::kInvalidArgument) Drop(host, false);  // the state's own part is untouched
  return logits;
}

int64_t CudaBackend::BranchesBytes(int64_t branches, int64_t rows, int64_t logits_rows) const {
  return logits_rows * config().vocab_size * static_cast<int64_t>(sizeof(float));
}

Result<std::vector<float>> CudaBackend::DraftWindow(SequenceState& state, std::span<const int32_t> ids, MtpState* mtp) {
  RETURN_IF_ERROR(CheckTokenIds(ids, config().vocab_size, "CudaBackend"));
  const int64_t from = state.length(), n = static_cast<int64_t>(ids.size());
  if (n > CudaForward::kMaxDraftRows)
    return InvalidArgument("CudaBackend: a draft window of " + std::to_string(n) + " rows; at most " + std::to_string(CudaForward::kMaxDraftRows));
  DeviceState* device = nullptr;
  RETURN_IF_ERROR(Prepare(state, from + n, &device));
  static_cast<Mirror*>(state.mirror())->window_from = -1;
  state.set_mirror_sync(std::min(state.mirror_rows(), from), state.newest_recurrent());  // the window writes the copy's rows from here
  auto logits = forward_->DraftWindow(*device, ids, mtp);
  if (!logits.ok()) {
    Drop(state, false);  // a window leaves the copy's recurrent part and its rows below `from` as they were
    return logits.status();
  }
  static_cast<Mirror*>(state.mirror())->window_from = from;
  return logits;
}

Result<std::vector<float>> CudaBackend::DecodeWindowsBatch(std::span<SequenceState* const> states, std::span<const std::vector<int32_t>> rows) {
  if (rows.size() != states.size())
    return InvalidArgument("CudaBackend::DecodeWindowsBatch: " + std::to_string(rows.size()) + " rows for " + std::to_string(states.size()) + " states");
  std::vector<int32_t> firsts;
  for (const std::vector<int32_t>& r : rows) {
    if (r.empty() || static_cast<int64_t>(r.size()) > CudaForward::kMaxDraftRows)
      return InvalidArgument("CudaBackend::DecodeWindowsBatch: " + std::to_string(r.size()) + " rows for a state; 1 to " +
                             std::to_string(CudaForward::kMaxDraftRows));
    RETURN_IF_ERROR(CheckTokenIds(r, config().vocab_size, "CudaBackend"));
    firsts.push_back(r.front());
  }
  RETURN_IF_ERROR(CheckDecodeBatch(states, firsts, config().vocab_size));  // distinct states
  std::vector<DeviceState*> devices;
  std::vector<const PromptImages*> images;
  std::vector<int64_t> from;
  RETURN_IF_ERROR(PrepareBatch(states, [&](size_t i) { return static_cast<int64_t>(rows[i].size()); }, devices, images, from));
  for (size_t i = 0; i < states.size(); ++i)  // a window writes its copy's rows from its length on
    if (rows[i].size() > 1) states[i]->set_mirror_sync(std::min(states[i]->mirror_rows(), from[i]), states[i]->newest_recurrent());
  auto logits = forward_->DecodeWindowsBatch(devices, rows, images);
  Status status = logits.ok() ? Status::Ok() : logits.status();
  for (size_t i = 0; i < states.size(); ++i) {
    const bool window = rows[i].size() > 1;
    if (logits.ok() && window) {
      static_cast<Mirror*>(states[i]->mirror())->window_from = from[i];
      continue;
    }
    const Status written = logits.ok() ? WriteBack(*states[i], *devices[i], from[i]) : logits.status();
    if (written.ok()) continue;
    Drop(*states[i], !window);  // a window leaves its copy's recurrent part as it was; a decode may have moved it
    if (status.ok()) status = written;
  }
  if (!status.ok()) return status;
  return logits;
}

Status CudaBackend::KeepDraft(SequenceState& state, int64_t rows) {
  auto* mirror = state.mirror() != nullptr && state.mirror()->owner() == this ? static_cast<Mirror*>(state.mirror()) : nullptr;
  // The host must not have changed the state since the window opened: its rows and recurrent part are the copy's.
  if (mirror == nullptr || mirror->window_from < 0 || state.length() != mirror->window_from || state.mirror_rows() < mirror->window_from ||
      state.newest_recurrent() == NewestRecurrent::kHost)
    return InvalidArgument("CudaBackend::KeepDraft: no draft window is open on this state");
  const int64_t window_from = mirror->window_from;
  mirror->window_from = -1;
  RETURN_IF_ERROR(cuda::UseDevice(forward_->device().index));
  DeviceState& device = mirror->device();
  if (Status kept = forward_->KeepDraft(device, rows); !kept.ok()) {
    if (kept.code() != StatusCode::kInvalidArgument) Drop(state, true);  // a device error: the copy may be anywhere
    return kept;
  }
  if (rows == 0) return Status::Ok();
  if (Status written = WriteBack(state, device, window_from); !written.ok()) {
    Drop(state, true);
    return written;
  }
  return Status::Ok();
}

Status CudaBackend::MtpCommit(MtpState& mtp, std::span<const int32_t> next_ids) {
  RETURN_IF_ERROR(cuda::UseDevice(forward_->device().index));
  return forward_->MtpCommit(mtp, next_ids);
}

Result<std::vector<int32_t>> CudaBackend::MtpDraft(MtpState& mtp, std::span<const int32_t> next_ids, int max_draft, int64_t vocab_limit,
                                                   std::vector<float>* logits) {
  RETURN_IF_ERROR(cuda::UseDevice(forward_->device().index));
  return forward_->MtpDraft(mtp, next_ids, max_draft, vocab_limit, logits);
}

// A fork of a grid's ids or fewer is a branch; a longer one runs in the state's own device copy from an
// anchor of it, then puts the anchor back. Either way the rows it wrote above the length are the
// device's only, so the copy holds the host's rows below it alone.
Result<std::vector<float>> CudaBackend::ForkLastLogits(const SequenceState& state, std::span<const int32_t> ids) {
  RETURN_IF_ERROR(CheckTokenIds(ids, config().vocab_size, "CudaBackend"));
  if (static_cast<int64_t>(ids.size()) <= grid_tokens()) {
    const PrefillBranch fork{ids, static_cast<int64_t>(ids.size()) - 1};
    return PrefillBranches(state, std::span(&fork, 1));
  }
  SequenceState& host = const_cast<SequenceState&>(state);
  const int64_t length = host.length();
  DeviceState* device = nullptr;
  RETURN_IF_ERROR(Prepare(host, length + static_cast<int64_t>(ids.size()), &device));
  auto anchor = device->SaveAnchor();
  if (!anchor.ok()) {
    Drop(host, false);
    return anchor.status();
  }
  auto logits = forward_->Prefill(*device, ids, LogitsRows::kLast);
  host.set_mirror_sync(std::min(host.mirror_rows(), length), host.newest_recurrent());
  if (Status back = device->RestoreAnchor(*anchor); !back.ok()) {
    Drop(host, true);
    return back;
  }
  return logits;
}

}  // namespace anchorage
