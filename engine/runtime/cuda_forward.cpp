#include "engine/runtime/cuda_forward.h"

#include <cuda_runtime_api.h>
#include <cublasLt.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <thread>

#include "engine/compute/cpu/packed_q8.h"
#include "engine/compute/cuda/kernels.h"
#include "engine/core/bf16.h"
#include "engine/core/sha256.h"
#include "engine/runtime/forward.h"

namespace anchorage {

using cuda::DeviceBuffer;

namespace {

// Rows of logits one lm_head product makes; kAll logits go in runs of this many.
constexpr int64_t kLogitRows = 64;

// What a decode step reads from device memory: its token and its position.
struct DecodeStep {
  int32_t id;
  int32_t unused;
  int64_t position;
  int64_t rope_position;  // position plus what images before it moved it by
};

int64_t Floats(int64_t n) { return n * static_cast<int64_t>(sizeof(float)); }

}  // namespace

struct CudaForward::Layer {
  LayerKind kind = LayerKind::kLinearAttention;
  const float* in_norm = nullptr;    // [H], 1 + w
  const float* post_norm = nullptr;  // [H], 1 + w
  Matrix gate, up, down;
  // GDN.
  Matrix qkv, z, b, a, out;
  const float* conv = nullptr;      // [K, conv_dim], tap-major
  const float* a_exp = nullptr;     // [Nv]
  const float* dt_bias = nullptr;   // [Nv]
  const float* gdn_norm = nullptr;  // [dv], plain w
  // Attention.
  Matrix q, k, v, o;
  const float* q_norm = nullptr;  // [hd], 1 + w
  const float* k_norm = nullptr;
};

struct CudaForward::Workspace {
  DeviceBuffer ids;                 // int32 [G]
  DeviceBuffer axes;                // int64 [G, 3]: M-RoPE positions of a chunk's rows
  DeviceBuffer step;                // a decode step: DecodeStep
  DeviceBuffer batch_steps;         // a decode batch's rows: DecodeStep [kLogitRows]
  DeviceBuffer x, a, mix;           // [G, H]
  DeviceBuffer qkv, conv;           // [G, conv_dim]
  DeviceBuffer z, core;             // [G, Nv*dv]
  DeviceBuffer bb, aa, beta, g;     // [G, Nv]
  DeviceBuffer qg;                  // [G, 2*Nh*hd]
  DeviceBuffer krows, vrows;        // [G, Nkv*hd], K/V rows before they go to their place (branches, the MTP head)
  DeviceBuffer state_copy;          // one GDN layer's state, for rows that must not advance it (windows, branches)
  DeviceBuffer cat;                 // [G, 2H], the MTP head's [embedding | hidden] rows
  DeviceBuffer mtp_out;             // [H], the MTP head's last output
  DeviceBuffer attn;                // [G, Nh*hd]
  DeviceBuffer gate, up;            // [G, I]
  DeviceBuffer delta;               // the chunked delta rule's scratch for G rows
  DeviceBuffer logits;              // [kLogitRows, V]
  cuda::PinnedBuffer staging;       // host copies of the states go through it
  int64_t bytes = 0;
};

// A state's draft window, per GDN layer: its pre-conv rows (the tail's), conv rows, beta and g, for
// KeepDraft; `capacity` rows a layer (the state's largest window so far).
struct DeviceDraftLog {
  DeviceBuffer qkv, conv;  // [gdn layers, capacity, conv_dim]
  DeviceBuffer beta, g;    // [gdn layers, capacity, Nv]
  DeviceBuffer hidden;     // [hidden_capacity, H], the window's final-normed rows for the MTP head
  int64_t capacity = 0, hidden_capacity = 0;
  bool open = false;
  int64_t pos0 = 0, rows = 0;
  MtpState* mtp = nullptr;  // where the kept rows' hidden rows go; null: nowhere
  int64_t bytes() const {
    int64_t n = 0;
    for (const DeviceBuffer* b : {&qkv, &conv, &beta, &g, &hidden}) n += static_cast<int64_t>(b->bytes());
    return n;
  }
};

// The multi-token-prediction block: fc over [norm_e(embed(id)) | norm_h(hidden)], one attention layer.
struct CudaForward::MtpHead {
  Matrix fc;                                                              // [H, 2H]
  const float *norm_embedding = nullptr, *norm_hidden = nullptr, *norm = nullptr;  // [H], 1 + w
  Layer layer;
};

// An MtpState's rows in device memory: the head's K/V rows [capacity, KW] and the waiting hidden rows,
// rows [first, first + pending_rows) of [pending_capacity, H].
class CudaForward::DeviceMtp final : public MtpMirror {
 public:
  DeviceMtp(const CudaForward* owner, std::atomic<int64_t>* counted) : owner(owner), counted_(counted) {}
  ~DeviceMtp() override { *counted_ -= noted_; }
  // Brings the forward's count of the head's device bytes up to this one's (after a buffer changed).
  void NoteBytes() {
    const int64_t now = static_cast<int64_t>(k.bytes() + v.bytes() + pending.bytes());
    *counted_ += now - noted_;
    noted_ = now;
  }
  const CudaForward* owner;
  DeviceBuffer k, v, pending;
  int64_t capacity = 0, pending_capacity = 0, first = 0;

 private:
  std::atomic<int64_t>* counted_;
  int64_t noted_ = 0;
};

namespace {

// The head's rows only make drafts: where the device has no room for more of them they are given up.
bool GaveUpMtpRows(const Status& why, MtpState& mtp) {
  if (why.code() != StatusCode::kResourceExhausted) return false;
  mtp = MtpState{};
  mtp.gave_up = true;
  return true;
}

}  // namespace

// ---- DeviceState ----

DeviceState::DeviceState(const ModelConfig& c, cuda::Stream stream)
    : DeviceState(stream, c.num_key_value_heads * c.head_dim, c.kv_dtype,
                  c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim,
                  (c.linear_conv_kernel_dim - 1) * c.conv_dim()) {}

DeviceState::DeviceState(cuda::Stream stream, int64_t kv_width, KvDtype kv_dtype, int64_t recurrent_floats, int64_t tail_floats)
    : stream_(stream), kv_width_(kv_width), recurrent_floats_(recurrent_floats), tail_floats_(tail_floats), kv_dtype_(kv_dtype) {}

DeviceState::~DeviceState() = default;

int64_t DeviceState::allocated_bytes() const {
  int64_t n = draft_ ? draft_->bytes() : 0;
  for (const auto* list : {&k_, &v_, &recurrent_, &tail_})
    for (const DeviceBuffer& b : *list) n += static_cast<int64_t>(b.bytes());
  return n;
}

Status DeviceState::Reserve(int64_t tokens) {
  if (tokens <= capacity_) return Status::Ok();
  const int64_t step = SequenceState::kKvRowStep;
  const int64_t capacity = (tokens + step - 1) / step * step;
  std::vector<DeviceBuffer> k, v;
  for (size_t a = 0; a < k_.size(); ++a) {
    ASSIGN_OR_RETURN(DeviceBuffer kb, DeviceBuffer::Allocate(static_cast<size_t>(capacity * row_bytes()), "K rows"));
    ASSIGN_OR_RETURN(DeviceBuffer vb, DeviceBuffer::Allocate(static_cast<size_t>(capacity * row_bytes()), "V rows"));
    RETURN_IF_ERROR(cuda::CopyOnDevice(kb.data(), k_[a].data(), static_cast<size_t>(length_ * row_bytes()), stream_));
    RETURN_IF_ERROR(cuda::CopyOnDevice(vb.data(), v_[a].data(), static_cast<size_t>(length_ * row_bytes()), stream_));
    k.push_back(std::move(kb));
    v.push_back(std::move(vb));
  }
  RETURN_IF_ERROR(cuda::Synchronize(stream_, "growing a state's K/V rows"));
  k_ = std::move(k);
  v_ = std::move(v);
  capacity_ = capacity;
  return Status::Ok();
}

bool DeviceState::Matches(const SequenceState& host) const {
  return host.num_attention_layers() == static_cast<int64_t>(k_.size()) &&
         host.num_gdn_layers() == static_cast<int64_t>(recurrent_.size()) && host.kv_width() == kv_width_ && host.kv_dtype() == kv_dtype_ &&
         host.recurrent_floats() == recurrent_floats_ && host.tail_floats() == tail_floats_;
}

// Whole states move as the tiers' K/V rows and anchor do.
Status DeviceState::Download(SequenceState& host) const {
  if (!Matches(host)) return InvalidArgument("DeviceState: the host state belongs to another model");
  ASSIGN_OR_RETURN(const KvRows rows, CopyRows(0, length_));
  ASSIGN_OR_RETURN(const Anchor anchor, SaveHostAnchor());
  host.Reset();
  RETURN_IF_ERROR(host.WriteRows(rows));
  return host.RestoreAnchor(anchor);
}

Status DeviceState::Upload(const SequenceState& host) {
  RETURN_IF_ERROR(UploadRows(host, 0, host.length()));
  return RestoreHostAnchor(host.SaveAnchor());
}

Result<std::unique_ptr<DeviceState>> DeviceState::Clone() const {
  std::unique_ptr<DeviceState> copy(new DeviceState(stream_, kv_width_, kv_dtype_, recurrent_floats_, tail_floats_));
  copy->staging_ = staging_;
  const auto duplicate = [this](const std::vector<DeviceBuffer>& from, size_t used, std::vector<DeviceBuffer>& to,
                                const char* what) -> Status {
    for (const DeviceBuffer& b : from) {
      ASSIGN_OR_RETURN(DeviceBuffer d, DeviceBuffer::Allocate(b.bytes(), what));
      RETURN_IF_ERROR(cuda::CopyOnDevice(d.data(), b.data(), std::min(used, b.bytes()), stream_));
      to.push_back(std::move(d));
    }
    return Status::Ok();
  };
  const size_t rows = static_cast<size_t>(length_ * row_bytes());
  RETURN_IF_ERROR(duplicate(k_, rows, copy->k_, "K rows"));
  RETURN_IF_ERROR(duplicate(v_, rows, copy->v_, "V rows"));
  RETURN_IF_ERROR(duplicate(recurrent_, static_cast<size_t>(Floats(recurrent_floats_)), copy->recurrent_, "a recurrent state"));
  RETURN_IF_ERROR(duplicate(tail_, static_cast<size_t>(Floats(tail_floats_)), copy->tail_, "a conv tail"));
  RETURN_IF_ERROR(cuda::Synchronize(stream_, "copying a state"));
  copy->length_ = length_;
  copy->capacity_ = capacity_;
  return copy;
}

Status DeviceState::CopyStaged(std::span<const HostPiece> pieces, bool to_host) const {
  Status copied = CopyStagedPieces(pieces, to_host);
  if (!copied.ok()) (void)cuda::Synchronize(stream_, "after a failed copy");  // nothing queued may still read the staging
  return copied;
}

Status DeviceState::CopyStagedPieces(std::span<const HostPiece> pieces, bool to_host) const {
  if (staging_ == nullptr || staging_->bytes() == 0) {
    for (const HostPiece& p : pieces)
      RETURN_IF_ERROR(to_host ? cuda::CopyToHost(p.host, p.device, p.bytes, stream_) : cuda::CopyToDevice(p.device, p.host, p.bytes, stream_));
    return Status::Ok();
  }
  struct Part {
    char* host;
    char* staged;
    size_t bytes;
  };
  std::vector<Part> batch;
  size_t piece = 0, offset = 0;
  while (piece < pieces.size()) {
    batch.clear();
    size_t used = 0;
    while (piece < pieces.size() && used < staging_->bytes()) {
      const HostPiece& p = pieces[piece];
      const size_t n = std::min(p.bytes - offset, staging_->bytes() - used);
      char* device = static_cast<char*>(p.device) + offset;
      Part part{static_cast<char*>(p.host) + offset, staging_->data() + used, n};
      if (to_host) {
        RETURN_IF_ERROR(cuda::CopyToHostAsync(part.staged, device, n, stream_));
      } else {
        std::memcpy(part.staged, part.host, n);
        RETURN_IF_ERROR(cuda::CopyToDeviceAsync(device, part.staged, n, stream_));
      }
      batch.push_back(part);
      used += n;
      offset += n;
      if (offset == p.bytes) {
        ++piece;
        offset = 0;
      }
    }
    RETURN_IF_ERROR(cuda::Synchronize(stream_, to_host ? "copying a state to the host" : "copying a state to the device"));
    if (to_host)
      for (const Part& part : batch) std::memcpy(part.host, part.staged, part.bytes);
  }
  return Status::Ok();
}

std::vector<DeviceState::HostPiece> DeviceState::RecurrentPieces(const float* floats) const {
  std::vector<HostPiece> pieces;
  char* host = reinterpret_cast<char*>(const_cast<float*>(floats));
  for (size_t g = 0; g < recurrent_.size(); ++g) {
    pieces.push_back({recurrent_[g].data(), host, static_cast<size_t>(Floats(recurrent_floats_))});
    host += Floats(recurrent_floats_);
    pieces.push_back({tail_[g].data(), host, static_cast<size_t>(Floats(tail_floats_))});
    host += Floats(tail_floats_);
  }
  return pieces;
}

Status DeviceState::CopyRecurrentOut(float* floats, int kind) const {
  if (kind == cudaMemcpyDeviceToHost) return CopyStaged(RecurrentPieces(floats), true);
  for (const HostPiece& p : RecurrentPieces(floats)) RETURN_IF_ERROR(cuda::CopyOnDevice(p.host, p.device, p.bytes, stream_));
  return cuda::Synchronize(stream_, "copying a recurrent part");
}

Status DeviceState::CopyRecurrentIn(const float* floats, int kind) {
  if (kind == cudaMemcpyHostToDevice) return CopyStaged(RecurrentPieces(floats), false);
  for (const HostPiece& p : RecurrentPieces(floats)) RETURN_IF_ERROR(cuda::CopyOnDevice(p.device, p.host, p.bytes, stream_));
  return cuda::Synchronize(stream_, "copying a recurrent part");
}

Status DeviceState::CheckAnchorLength(int64_t length) const {
  if (length < 0 || (!k_.empty() && length > capacity_))
    return OutOfRange("DeviceState: anchor length " + std::to_string(length) + " exceeds capacity " + std::to_string(capacity_));
  return Status::Ok();
}

Result<DeviceAnchor> DeviceState::SaveAnchor() const {
  DeviceAnchor anchor;
  anchor.length = length_;
  ASSIGN_OR_RETURN(anchor.data, DeviceBuffer::Allocate(static_cast<size_t>(Floats(std::max<int64_t>(1, anchor_floats()))), "an anchor"));
  RETURN_IF_ERROR(CopyRecurrentOut(anchor.data.floats(), cudaMemcpyDeviceToDevice));
  return anchor;
}

Status DeviceState::RestoreAnchor(const DeviceAnchor& anchor) {
  if (anchor.bytes() < Floats(anchor_floats()))
    return InvalidArgument("DeviceState: the anchor holds " + std::to_string(anchor.bytes()) + " bytes, the state wants " +
                           std::to_string(Floats(anchor_floats())));
  RETURN_IF_ERROR(CheckAnchorLength(anchor.length));
  RETURN_IF_ERROR(CopyRecurrentIn(anchor.data.floats(), cudaMemcpyDeviceToDevice));
  length_ = anchor.length;
  return Status::Ok();
}

Result<Anchor> DeviceState::SaveHostAnchor() const {
  Anchor anchor;
  anchor.length = length_;
  anchor.data.resize(static_cast<size_t>(anchor_floats()));
  RETURN_IF_ERROR(CopyRecurrentOut(anchor.data.data(), cudaMemcpyDeviceToHost));
  return anchor;
}

Status DeviceState::RestoreHostAnchor(const Anchor& anchor) {
  if (static_cast<int64_t>(anchor.data.size()) != anchor_floats())
    return InvalidArgument("DeviceState: the anchor holds " + std::to_string(anchor.data.size()) + " floats, the state wants " +
                           std::to_string(anchor_floats()));
  RETURN_IF_ERROR(CheckAnchorLength(anchor.length));
  RETURN_IF_ERROR(CopyRecurrentIn(anchor.data.data(), cudaMemcpyHostToDevice));
  length_ = anchor.length;
  return Status::Ok();
}

Status DeviceState::UploadRows(const SequenceState& host, int64_t begin, int64_t end) {
  if (!Matches(host)) return InvalidArgument("DeviceState: the host state belongs to another model");
  if (begin < 0 || end < begin || end > host.length())
    return OutOfRange("DeviceState: host rows [" + std::to_string(begin) + ", " + std::to_string(end) + ") outside length " +
                      std::to_string(host.length()));
  RETURN_IF_ERROR(Reserve(end));
  return CopyStaged(HostRowPieces(host, begin, end), false);
}

Status DeviceState::DownloadRows(SequenceState& host, int64_t begin, int64_t end) const {
  if (!Matches(host)) return InvalidArgument("DeviceState: the host state belongs to another model");
  if (begin < 0 || end < begin || end > length_ || end > host.capacity())
    return OutOfRange("DeviceState: rows [" + std::to_string(begin) + ", " + std::to_string(end) + ") outside length " +
                      std::to_string(length_) + " or the host's capacity");
  host.PrepareHostWrites(false);  // its rows change below
  return CopyStaged(HostRowPieces(host, begin, end), true);
}

std::vector<DeviceState::HostPiece> DeviceState::HostRowPieces(const SequenceState& host, int64_t begin, int64_t end) const {
  std::vector<HostPiece> pieces;
  const int64_t at = begin * row_bytes();
  const size_t bytes = static_cast<size_t>((end - begin) * row_bytes());
  for (size_t a = 0; a < k_.size(); ++a) {
    const int64_t layer = static_cast<int64_t>(a);
    pieces.push_back({static_cast<char*>(k_[a].data()) + at, const_cast<uint8_t*>(host.k_bytes(layer)) + at, bytes});
    pieces.push_back({static_cast<char*>(v_[a].data()) + at, const_cast<uint8_t*>(host.v_bytes(layer)) + at, bytes});
  }
  return pieces;
}

std::vector<DeviceState::HostPiece> DeviceState::RowPieces(int64_t begin, int64_t rows, const void* data) const {
  std::vector<HostPiece> pieces;
  char* host = static_cast<char*>(const_cast<void*>(data));
  const int64_t at = begin * row_bytes();
  const size_t bytes = static_cast<size_t>(rows * row_bytes());
  for (size_t a = 0; a < k_.size(); ++a) {
    pieces.push_back({static_cast<char*>(k_[a].data()) + at, host, bytes});
    pieces.push_back({static_cast<char*>(v_[a].data()) + at, host + bytes, bytes});
    host += 2 * bytes;
  }
  return pieces;
}

Status DeviceState::SetLength(int64_t length) {
  RETURN_IF_ERROR(CheckAnchorLength(length));
  length_ = length;
  return Status::Ok();
}

Result<KvRows> DeviceState::CopyRows(int64_t begin, int64_t end) const {
  if (begin < 0 || end < begin || end > length_)
    return OutOfRange("DeviceState: rows [" + std::to_string(begin) + ", " + std::to_string(end) + ") outside length " +
                      std::to_string(length_));
  KvRows rows;
  rows.begin = begin;
  rows.end = end;
  rows.dtype = kv_dtype_;
  rows.data.resize(static_cast<size_t>(2 * (end - begin) * row_bytes()) * k_.size());
  RETURN_IF_ERROR(CopyStaged(RowPieces(begin, end - begin, rows.data.data()), true));
  return rows;
}

Status DeviceState::WriteRows(const KvRows& rows) {
  if (rows.dtype != kv_dtype_)
    return InvalidArgument(std::string("DeviceState: keeps ") + KvDtypeName(kv_dtype_) + " K/V rows, not " + KvDtypeName(rows.dtype));
  const int64_t n = rows.end - rows.begin;
  if (rows.begin < 0 || rows.end < rows.begin || rows.bytes() != 2 * n * row_bytes() * static_cast<int64_t>(k_.size()))
    return InvalidArgument("DeviceState: rows [" + std::to_string(rows.begin) + ", " + std::to_string(rows.end) + ") with " +
                           std::to_string(rows.data.size()) + " bytes do not fit this model");
  RETURN_IF_ERROR(Reserve(rows.end));
  return CopyStaged(RowPieces(rows.begin, n, rows.data.data()), false);
}

// ---- CudaForward ----

CudaForward::CudaForward(const ModelConfig& config, const CudaForwardOptions& options)
    : config_(config), options_(options), ws_(std::make_unique<Workspace>()) {}

CudaForward::~CudaForward() {
  graph_.reset();
  batch_graph_.reset();
  gemm_.reset();
  logits_gemm_.reset();
  buffers_.clear();
  ws_.reset();
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

Result<cuda::DeviceBuffer> UploadBf16Matrix(const TensorView& t, int64_t rows, int64_t cols, cuda::Stream s) {
  ASSIGN_OR_RETURN(DeviceBuffer buffer, DeviceBuffer::Allocate(static_cast<size_t>(rows * cols) * 2, t.name));
  if (t.dtype == DType::kBF16) {
    RETURN_IF_ERROR(cuda::CopyToDevice(buffer.data(), t.data, t.bytes, s));
    return buffer;
  }
  std::vector<uint16_t> rounded(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows * cols; ++i) rounded[static_cast<size_t>(i)] = FloatToBf16(t.At(i));
  RETURN_IF_ERROR(cuda::CopyToDevice(buffer.data(), rounded.data(), rounded.size() * 2, s));
  return buffer;
}

Result<CudaForward::Matrix> CudaForward::Upload(const TensorView& t, int64_t rows, int64_t cols, const char* role, bool fp8_allowed) {
  RETURN_IF_ERROR(CheckMatrixShape(t, rows, cols, "CudaForward", role));
  if (t.dtype == DType::kF8E4M3) {  // kept as it is stored: codes and block scales
    if (!fp8_allowed) return Unsupported("CudaForward: " + t.name + " is F8_E4M3; the embeddings and lm_head must be BF16, F16 or F32");
    ASSIGN_OR_RETURN(const std::vector<float> scales, Fp8BlockScales(t, rows, cols, "CudaForward"));
    ASSIGN_OR_RETURN(DeviceBuffer codes, DeviceBuffer::Allocate(static_cast<size_t>(rows * cols), t.name));
    RETURN_IF_ERROR(cuda::CopyToDevice(codes.data(), t.data, static_cast<size_t>(rows * cols), stream_));
    ASSIGN_OR_RETURN(const float* scales_on_device, UploadFloats(scales, t.scale_inv->name));
    Matrix m;
    m.rows = rows;
    m.cols = cols;
    m.q8 = {static_cast<const uint8_t*>(codes.data()), scales_on_device, t.scale_block_rows, t.scale_block_cols,
             (cols + t.scale_block_cols - 1) / t.scale_block_cols};
    m.bytes = static_cast<int64_t>(codes.bytes() + scales.size() * sizeof(float));
    weight_bytes_ += m.bytes;
    buffers_.push_back(std::move(codes));
    ++fp8_matrices_;
    return m;
  }
  if (options_.int8_weights) return UploadInt8(t, rows, cols);
  ASSIGN_OR_RETURN(DeviceBuffer buffer, UploadBf16Matrix(t, rows, cols, stream_));
  ++bf16_matrices_;
  Matrix m;
  m.w = static_cast<const uint16_t*>(buffer.data());
  m.rows = rows;
  m.cols = cols;
  m.bytes = static_cast<int64_t>(buffer.bytes());
  weight_bytes_ += m.bytes;
  buffers_.push_back(std::move(buffer));
  return m;
}

Result<CudaForward::Matrix> CudaForward::UploadInt8(const TensorView& t, int64_t rows, int64_t cols) {
  constexpr int64_t kBlock = cpu::PackedQ8::kInt8Block;
  const int64_t blocks = (cols + kBlock - 1) / kBlock;
  std::vector<int8_t> codes(static_cast<size_t>(rows * cols));
  std::vector<float> scales(static_cast<size_t>(rows * blocks));
  // The CPU's quantization of each row, the rows shared among the host's threads.
  const int64_t threads = std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, std::max<int64_t>(1, rows / 64));
  std::vector<std::thread> workers;
  for (int64_t w = 0; w < threads; ++w)
    workers.emplace_back([&, w] {
      std::vector<float> row(static_cast<size_t>(cols));
      for (int64_t j = rows * w / threads; j < rows * (w + 1) / threads; ++j) {
        t.ToFloat(j * cols, cols, row.data());
        cpu::QuantizeInt8Row(row.data(), cols, codes.data() + j * cols, scales.data() + j * blocks);
      }
    });
  for (std::thread& worker : workers) worker.join();
  ASSIGN_OR_RETURN(DeviceBuffer on_device, DeviceBuffer::Allocate(codes.size(), t.name));
  RETURN_IF_ERROR(cuda::CopyToDevice(on_device.data(), codes.data(), codes.size(), stream_));
  ASSIGN_OR_RETURN(const float* scales_on_device, UploadFloats(scales, t.name + " (int8 scales)"));
  Matrix m;
  m.rows = rows;
  m.cols = cols;
  m.q8 = {static_cast<const uint8_t*>(on_device.data()), scales_on_device, 1, kBlock, blocks, true};
  m.bytes = static_cast<int64_t>(on_device.bytes() + scales.size() * sizeof(float));
  weight_bytes_ += m.bytes;
  buffers_.push_back(std::move(on_device));
  ++int8_matrices_;
  return m;
}

std::string CudaForward::WeightsDescription() const {
  std::string out;
  for (const auto& [count, name] : {std::pair{fp8_matrices_, "fp8-e4m3"}, std::pair{int8_matrices_, "int8"}, std::pair{bf16_matrices_, "bf16"}})
    if (count > 0) out += (out.empty() ? "" : " + ") + std::string(name);
  return out;
}

Status CudaForward::EmbedRows(const int32_t* ids, int64_t n, float* x) {
  cuda::EmbedRows(embed_.w, ids, n, config_.hidden_size, x, stream_, embed_.q8);
  const int64_t H = config_.hidden_size;
  for (size_t i = 0; i < image_rows_.size();) {  // an image's rows in one copy (its tower rows are consecutive)
    size_t run = 1;
    while (i + run < image_rows_.size() && image_rows_[i + run].first == image_rows_[i].first + static_cast<int64_t>(run) &&
           image_rows_[i + run].second == image_rows_[i].second + static_cast<int64_t>(run) * H)
      ++run;
    RETURN_IF_ERROR(cuda::CopyToDevice(x + image_rows_[i].first * H, image_rows_[i].second, run * static_cast<size_t>(H) * sizeof(float), stream_));
    i += run;
  }
  return Status::Ok();
}

Result<const float*> CudaForward::UploadFloats(const std::vector<float>& values, const std::string& what) {
  ASSIGN_OR_RETURN(DeviceBuffer buffer, DeviceBuffer::Allocate(values.size() * sizeof(float), what));
  RETURN_IF_ERROR(cuda::CopyToDevice(buffer.data(), values.data(), values.size() * sizeof(float), stream_));
  const float* p = buffer.floats();
  buffers_.push_back(std::move(buffer));
  return p;
}

Result<const float*> CudaForward::UploadVector(const TensorView& t, int64_t n, float add, const char* role) {
  ASSIGN_OR_RETURN(const std::vector<float> values, TensorValues(t, n, add, "CudaForward", role));
  return UploadFloats(values, t.name);
}

Result<std::unique_ptr<CudaForward>> CudaForward::Create(const ModelConfig& c, const ModelWeights& w,
                                                         const CudaForwardOptions& options) {
  RETURN_IF_ERROR(CheckForwardShape(c, w, options.grid_tokens, "CudaForward"));
  if (c.head_dim > cuda::kMaxHeadDim)
    return Unsupported("CudaForward: head_dim " + std::to_string(c.head_dim) + " is above the attention kernel's " +
                       std::to_string(cuda::kMaxHeadDim));
  ASSIGN_OR_RETURN(cuda::DeviceInfo device, cuda::FindDevice(options.device));
  const cuda::DeltaShape delta{c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim,
                               c.conv_dim()};
  if (!cuda::GatedDeltaChunkedSupports(delta))
    return Unsupported("CudaForward: linear_key_head_dim " + std::to_string(c.linear_key_head_dim) +
                       " is not a multiple of 4 up to 128, which the delta rule's state pass holds");
  if (cuda::GatedDeltaChunkedSharedBytes(delta) > device.shared_bytes_per_block)
    return Unsupported("CudaForward: the delta rule's chunk needs " + std::to_string(cuda::GatedDeltaChunkedSharedBytes(delta)) +
                       " bytes of shared memory; " + device.name + " allows " + std::to_string(device.shared_bytes_per_block));
  const cuda::AttentionShape attention{c.num_attention_heads, c.num_key_value_heads, c.head_dim, 1.0f};
  if (cuda::AttentionSharedBytes(attention) > device.shared_bytes_per_block)
    return Unsupported("CudaForward: attention needs " + std::to_string(cuda::AttentionSharedBytes(attention)) +
                       " bytes of shared memory; " + device.name + " allows " + std::to_string(device.shared_bytes_per_block));
  RETURN_IF_ERROR(cuda::CudaStatus(cudaSetDevice(options.device), "selecting the device"));
  int attention_threads = 0;
  RETURN_IF_ERROR(cuda::CudaStatus(cuda::AttentionMaxThreads(&attention_threads), "reading the attention kernel's limits"));
  if (const int64_t group = c.num_attention_heads / c.num_key_value_heads; 32 * group > attention_threads)
    return Unsupported("CudaForward: attention with " + std::to_string(group) + " query heads a kv head needs blocks of " +
                       std::to_string(32 * group) + " threads; on " + device.name + " the kernel's registers allow " +
                       std::to_string(attention_threads));
  std::unique_ptr<CudaForward> f(new CudaForward(c, options));
  f->device_ = device;
  cudaStream_t stream = nullptr;
  // A blocking stream: it waits for the zeroing and copies the runtime does on the default stream.
  RETURN_IF_ERROR(cuda::CudaStatus(cudaStreamCreate(&stream), "creating a stream"));
  f->stream_ = stream;
  RETURN_IF_ERROR(f->Init(w));
  return f;
}

Result<CudaForward::Layer> CudaForward::UploadLayer(const LayerWeights& lw, LayerKind kind) {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size, I = c.intermediate_size, hd = c.head_dim, C = c.conv_dim(), VD = c.value_dim();
  const int64_t Nh = c.num_attention_heads, Nkv = c.num_key_value_heads, Nv = c.linear_num_value_heads, K = c.linear_conv_kernel_dim;
  Layer layer;
  layer.kind = kind;
  ASSIGN_OR_RETURN(layer.in_norm, UploadVector(lw.input_layernorm, H, 1.0f, "input_layernorm"));
  ASSIGN_OR_RETURN(layer.post_norm, UploadVector(lw.post_attention_layernorm, H, 1.0f, "post_attention_layernorm"));
  ASSIGN_OR_RETURN(layer.gate, Upload(lw.gate_proj, I, H, "gate_proj"));
  ASSIGN_OR_RETURN(layer.up, Upload(lw.up_proj, I, H, "up_proj"));
  ASSIGN_OR_RETURN(layer.down, Upload(lw.down_proj, H, I, "down_proj"));
  if (layer.kind == LayerKind::kLinearAttention) {
    const GdnWeights& g = lw.gdn;
    ASSIGN_OR_RETURN(layer.qkv, Upload(g.in_proj_qkv, C, H, "in_proj_qkv"));
    ASSIGN_OR_RETURN(layer.z, Upload(g.in_proj_z, VD, H, "in_proj_z"));
    ASSIGN_OR_RETURN(layer.b, Upload(g.in_proj_b, Nv, H, "in_proj_b"));
    ASSIGN_OR_RETURN(layer.a, Upload(g.in_proj_a, Nv, H, "in_proj_a"));
    ASSIGN_OR_RETURN(layer.out, Upload(g.out_proj, H, VD, "out_proj"));
    ASSIGN_OR_RETURN(const std::vector<float> taps, ConvTapsOf(g.conv1d, C, K, "CudaForward"));
    ASSIGN_OR_RETURN(layer.conv, UploadFloats(taps, g.conv1d.name));
    ASSIGN_OR_RETURN(std::vector<float> a_exp, TensorValues(g.A_log, Nv, 0.0f, "CudaForward", "A_log"));
    for (float& v : a_exp) v = std::exp(v);
    ASSIGN_OR_RETURN(layer.a_exp, UploadFloats(a_exp, g.A_log.name));
    ASSIGN_OR_RETURN(layer.dt_bias, UploadVector(g.dt_bias, Nv, 0.0f, "dt_bias"));
    ASSIGN_OR_RETURN(layer.gdn_norm, UploadVector(g.norm, c.linear_value_head_dim, 0.0f, "linear_attn.norm"));
  } else {
    const AttentionWeights& at = lw.attn;
    ASSIGN_OR_RETURN(layer.q, Upload(at.q_proj, 2 * Nh * hd, H, "q_proj"));
    ASSIGN_OR_RETURN(layer.k, Upload(at.k_proj, Nkv * hd, H, "k_proj"));
    ASSIGN_OR_RETURN(layer.v, Upload(at.v_proj, Nkv * hd, H, "v_proj"));
    ASSIGN_OR_RETURN(layer.o, Upload(at.o_proj, H, Nh * hd, "o_proj"));
    ASSIGN_OR_RETURN(layer.q_norm, UploadVector(at.q_norm, hd, 1.0f, "q_norm"));
    ASSIGN_OR_RETURN(layer.k_norm, UploadVector(at.k_norm, hd, 1.0f, "k_norm"));
  }
  return layer;
}

Status CudaForward::Init(const ModelWeights& w) {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size, I = c.intermediate_size, hd = c.head_dim, C = c.conv_dim(), VD = c.value_dim();
  const int64_t Nh = c.num_attention_heads, Nkv = c.num_key_value_heads, Nv = c.linear_num_value_heads;
  const int64_t G = options_.grid_tokens, rows = std::max(G, kMaxDraftRows);
  ASSIGN_OR_RETURN(embed_, Upload(w.embed_tokens, c.vocab_size, H, "embed_tokens", false));
  if (w.lm_head.data == w.embed_tokens.data) {
    lm_head_ = embed_;
  } else {
    ASSIGN_OR_RETURN(lm_head_, Upload(w.lm_head, c.vocab_size, H, "lm_head", false));
  }
  ASSIGN_OR_RETURN(final_norm_, UploadVector(w.norm, H, 1.0f, "norm"));
  {
    const int64_t rot = c.rotary_dim();
    std::vector<double> inv_freq;
    for (int64_t i = 0; i < rot / 2; ++i)
      inv_freq.push_back(1.0 / std::pow(c.rope_theta, static_cast<double>(2 * i) / static_cast<double>(rot)));
    ASSIGN_OR_RETURN(DeviceBuffer buffer, DeviceBuffer::Allocate(std::max<size_t>(1, inv_freq.size()) * sizeof(double), "RoPE frequencies"));
    RETURN_IF_ERROR(cuda::CopyToDevice(buffer.data(), inv_freq.data(), inv_freq.size() * sizeof(double), stream_));
    inv_freq_ = static_cast<const double*>(buffer.data());
    buffers_.push_back(std::move(buffer));
  }
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    ASSIGN_OR_RETURN(Layer layer, UploadLayer(w.layers[static_cast<size_t>(l)], c.layer_types[static_cast<size_t>(l)]));
    layers_.push_back(layer);
  }
  if (w.mtp) {
    const MtpWeights& mw = *w.mtp;
    auto head = std::make_unique<MtpHead>();
    ASSIGN_OR_RETURN(head->fc, Upload(mw.fc, H, 2 * H, "mtp.fc"));
    ASSIGN_OR_RETURN(head->norm_embedding, UploadVector(mw.pre_fc_norm_embedding, H, 1.0f, "mtp.pre_fc_norm_embedding"));
    ASSIGN_OR_RETURN(head->norm_hidden, UploadVector(mw.pre_fc_norm_hidden, H, 1.0f, "mtp.pre_fc_norm_hidden"));
    ASSIGN_OR_RETURN(head->norm, UploadVector(mw.norm, H, 1.0f, "mtp.norm"));
    ASSIGN_OR_RETURN(head->layer, UploadLayer(mw.layer, LayerKind::kFullAttention));
    mtp_ = std::move(head);
  }
  // Products: every shape's algorithm chosen once for the grid's rows.
  const int64_t max_k = std::max({H, I, VD, Nh * hd, mtp_ ? 2 * H : 0});
  const int64_t max_n = std::max({H, I, C, VD, 2 * Nh * hd, Nkv * hd});
  ASSIGN_OR_RETURN(gemm_, cuda::LtGemm::Create(G, max_k, max_n, stream_, options_.fast_products));
  if (lm_head_.w != nullptr) {  // an 8-bit lm_head takes the CUDA-core GEMM
    ASSIGN_OR_RETURN(logits_gemm_, cuda::LtGemm::Create(kLogitRows, H, c.vocab_size, stream_, options_.fast_products));
    RETURN_IF_ERROR(logits_gemm_->Prepare(c.vocab_size, H, lm_head_.w));
  }
  std::vector<const Layer*> product_layers;
  for (const Layer& layer : layers_) product_layers.push_back(&layer);
  if (mtp_) {
    product_layers.push_back(&mtp_->layer);
    if (mtp_->fc.w != nullptr) RETURN_IF_ERROR(gemm_->Prepare(H, 2 * H, mtp_->fc.w));  // 8-bit matrices take no cuBLASLt product
  }
  for (const Layer* layer : product_layers)
    for (const Matrix* m : {&layer->gate, &layer->up, &layer->down, &layer->qkv, &layer->z, &layer->b, &layer->a, &layer->out,
                            &layer->q, &layer->k, &layer->v, &layer->o})
      if (m->w != nullptr) RETURN_IF_ERROR(gemm_->Prepare(m->rows, m->cols, m->w));
  // The workspace for a grid chunk or a draft window.
  Workspace& ws = *ws_;
  const auto make = [&ws](DeviceBuffer& b, int64_t bytes, const char* what) -> Status {
    ASSIGN_OR_RETURN(b, DeviceBuffer::Allocate(static_cast<size_t>(bytes), what));
    ws.bytes += bytes;
    return Status::Ok();
  };
  RETURN_IF_ERROR(make(ws.ids, rows * 4, "token ids"));
  RETURN_IF_ERROR(make(ws.axes, rows * 3 * 8, "M-RoPE positions"));
  RETURN_IF_ERROR(make(ws.step, sizeof(DecodeStep), "a decode step"));
  RETURN_IF_ERROR(make(ws.batch_steps, kLogitRows * sizeof(DecodeStep), "a decode batch's steps"));
  for (DeviceBuffer* b : {&ws.x, &ws.a, &ws.mix}) RETURN_IF_ERROR(make(*b, Floats(rows * H), "hidden rows"));
  for (DeviceBuffer* b : {&ws.qkv, &ws.conv}) RETURN_IF_ERROR(make(*b, Floats(rows * C), "conv rows"));
  for (DeviceBuffer* b : {&ws.z, &ws.core}) RETURN_IF_ERROR(make(*b, Floats(rows * VD), "value rows"));
  for (DeviceBuffer* b : {&ws.bb, &ws.aa, &ws.beta, &ws.g}) RETURN_IF_ERROR(make(*b, Floats(rows * Nv), "gate rows"));
  RETURN_IF_ERROR(make(ws.qg, Floats(rows * 2 * Nh * hd), "query rows"));
  for (DeviceBuffer* b : {&ws.krows, &ws.vrows}) RETURN_IF_ERROR(make(*b, Floats(rows * Nkv * hd), "branch K/V rows"));
  RETURN_IF_ERROR(make(ws.state_copy, Floats(std::max<int64_t>(1, Nv * c.linear_key_head_dim * c.linear_value_head_dim)), "a state's copy"));
  RETURN_IF_ERROR(make(ws.attn, Floats(rows * Nh * hd), "attention rows"));
  for (DeviceBuffer* b : {&ws.gate, &ws.up}) RETURN_IF_ERROR(make(*b, Floats(rows * I), "MLP rows"));
  const cuda::DeltaShape delta{c.linear_num_key_heads, Nv, c.linear_key_head_dim, c.linear_value_head_dim, C};
  RETURN_IF_ERROR(make(ws.delta, Floats(cuda::GatedDeltaChunkedScratchFloats(delta, G)), "the delta rule's scratch"));
  RETURN_IF_ERROR(make(ws.logits, Floats(kLogitRows * c.vocab_size), "logits"));
  ASSIGN_OR_RETURN(ws.staging, cuda::PinnedBuffer::Allocate(static_cast<size_t>(options_.staging_bytes), "the host copies' staging"));
  if (mtp_) {
    RETURN_IF_ERROR(make(ws.cat, Floats(rows * 2 * H), "the MTP head's rows"));
    RETURN_IF_ERROR(make(ws.mtp_out, Floats(H), "the MTP head's output"));
  }
  return cuda::Synchronize(stream_, "loading the weights");
}

int64_t CudaForward::decode_weight_bytes() const {
  const bool tied = embed_.w == lm_head_.w && embed_.q8.q == lm_head_.q8.q;
  return weight_bytes_ - (tied ? 0 : embed_.bytes);
}

int64_t CudaForward::workspace_bytes() const { return ws_->bytes; }

Result<DeviceDraftLog*> CudaForward::DraftLogOf(DeviceState& state, int64_t rows, bool hidden) {
  if (!state.draft_) state.draft_ = std::make_unique<DeviceDraftLog>();
  DeviceDraftLog& log = *state.draft_;
  log.open = false;
  const ModelConfig& c = config_;
  const int64_t layers = std::max<int64_t>(1, c.num_linear_attention_layers()), C = c.conv_dim(), Nv = c.linear_num_value_heads;
  if (rows > log.capacity) {
    for (DeviceBuffer* b : {&log.qkv, &log.conv, &log.beta, &log.g}) *b = DeviceBuffer();
    log.capacity = 0;
    for (DeviceBuffer* b : {&log.qkv, &log.conv}) {
      ASSIGN_OR_RETURN(*b, DeviceBuffer::Allocate(static_cast<size_t>(Floats(layers * rows * C)), "a draft window's rows"));
    }
    for (DeviceBuffer* b : {&log.beta, &log.g}) {
      ASSIGN_OR_RETURN(*b, DeviceBuffer::Allocate(static_cast<size_t>(Floats(layers * rows * Nv)), "a draft window's gates"));
    }
    log.capacity = rows;
  }
  if (hidden && rows > log.hidden_capacity) {
    log.hidden = DeviceBuffer();
    log.hidden_capacity = 0;
    ASSIGN_OR_RETURN(log.hidden, DeviceBuffer::Allocate(static_cast<size_t>(Floats(rows * c.hidden_size)), "a draft window's hidden rows"));
    log.hidden_capacity = rows;
  }
  return &log;
}

const int64_t* CudaForward::StepRopePosition() const {
  return reinterpret_cast<const int64_t*>(static_cast<const char*>(ws_->step.data()) + offsetof(DecodeStep, rope_position));
}

int64_t CudaForward::RopeShiftOf(const PromptImages* images, int64_t row) {
  if (images == nullptr) return 0;
  int64_t axes[3];
  images->PositionOf(row, axes);
  return axes[0] - row;
}

Status CudaForward::StageImageRows(std::span<const int32_t> ids, int64_t pos, std::vector<int32_t>* embedded) {
  const int64_t m = static_cast<int64_t>(ids.size());
  embedded->assign(ids.begin(), ids.end());
  image_rows_.clear();
  rope_axes_ = {};
  if (images_ == nullptr) return Status::Ok();
  const int64_t shift = RopeShift(pos);
  std::vector<int64_t> axes(static_cast<size_t>(m * 3));
  bool plain = true;
  for (int64_t t = 0; t < m; ++t) {
    images_->PositionOf(pos + t, &axes[static_cast<size_t>(t * 3)]);
    const int64_t* a = &axes[static_cast<size_t>(t * 3)];
    plain = plain && a[0] == a[1] && a[1] == a[2] && a[0] == pos + t + shift;
    if (IsImageKey(ids[static_cast<size_t>(t)])) {
      image_rows_.emplace_back(t, images_->EmbeddingOf(pos + t, ids[static_cast<size_t>(t)]));
      (*embedded)[static_cast<size_t>(t)] = 0;
    }
  }
  if (plain) return Status::Ok();
  if (Status copied = cuda::CopyToDevice(ws_->axes.data(), axes.data(), axes.size() * sizeof(int64_t), stream_); !copied.ok()) {
    image_rows_.clear();
    return copied;
  }
  rope_axes_ = {static_cast<const int64_t*>(ws_->axes.data()), 3 * config_.mrope_section[1], 3 * config_.mrope_section[2]};
  return Status::Ok();
}

const int64_t* CudaForward::StepPosition() const {
  return reinterpret_cast<const int64_t*>(static_cast<const char*>(ws_->step.data()) + offsetof(DecodeStep, position));
}

void CudaForward::set_decode_graphs(bool on) {
  graph_.reset();
  batch_graph_.reset();
  graph_note_.clear();
  options_.decode_graphs = on;
}

std::string CudaForward::DecodeLaunches() const {
  if (options_.decode_graphs) return "one captured graph a token";
  return graph_note_.empty() ? "launch by launch" : "launch by launch (" + graph_note_ + ")";
}

std::string CudaForward::KernelSet() const {
  const int lt_version = static_cast<int>(cublasLtGetVersion());
  return "cuda-kernels-v1 " + device_.name + " sm_" + std::to_string(device_.sm_major) + std::to_string(device_.sm_minor) +
         " runtime " + std::to_string(device_.runtime_version) + " cublasLt " + std::to_string(lt_version) + "\n" + gemm_->Describe() +
         (logits_gemm_ ? logits_gemm_->Describe() : "") +
         (fp8_matrices_ > 0 ? std::to_string(fp8_matrices_) + " FP8 matrices: CUDA-core k-order products, fp8-gemv-v1\n" : "") +
         (int8_matrices_ > 0 ? std::to_string(int8_matrices_) + " int8 matrices (a scale a row and 32 inputs): CUDA-core k-order products\n" : "");
}

std::string CudaForward::StateFingerprint(const std::string& model_fingerprint) const {
  Sha256 h;
  h.Update("anchorage-state-fingerprint-v1\n" + model_fingerprint + "\n" + KernelSet() + "\n");
  if (config_.kv_dtype != KvDtype::kF32) h.Update(std::string("kv ") + KvDtypeName(config_.kv_dtype) + "\n");
  return h.FinishHex();
}

Result<std::unique_ptr<DeviceState>> CudaForward::NewState() {
  const ModelConfig& c = config_;
  std::unique_ptr<DeviceState> state(new DeviceState(c, stream_));
  state->staging_ = &ws_->staging;
  for (LayerKind kind : c.layer_types) {
    if (kind == LayerKind::kFullAttention) {
      state->k_.emplace_back();
      state->v_.emplace_back();
      continue;
    }
    ASSIGN_OR_RETURN(DeviceBuffer r, DeviceBuffer::Allocate(static_cast<size_t>(Floats(state->recurrent_floats_)), "a recurrent state"));
    ASSIGN_OR_RETURN(DeviceBuffer t, DeviceBuffer::Allocate(static_cast<size_t>(Floats(std::max<int64_t>(1, state->tail_floats_))), "a conv tail"));
    state->recurrent_.push_back(std::move(r));
    state->tail_.push_back(std::move(t));
  }
  return state;
}

Status CudaForward::CheckIds(std::span<const int32_t> ids) const { return CheckTokenIds(ids, config_.vocab_size, "CudaForward"); }

Result<std::vector<float>> CudaForward::Prefill(DeviceState& state, std::span<const int32_t> ids, LogitsRows rows, MtpState* mtp) {
  RETURN_IF_ERROR(CheckPromptIds(ids, config_.vocab_size, images_, state.length(), "CudaForward"));
  const int64_t n = static_cast<int64_t>(ids.size());
  RETURN_IF_ERROR(state.Reserve(state.length() + n));
  const bool all = rows == LogitsRows::kAll;
  if (!mtp_) mtp = nullptr;
  mtp = Forward::HeadReads(ids, mtp);
  if (mtp != nullptr && mtp->pending_rows > 1) *mtp = MtpState{};  // their next ids are not here: start the head anew
  std::vector<float> logits(static_cast<size_t>((all ? n : 1) * config_.vocab_size));
  const int64_t G = options_.grid_tokens;
  int64_t done = 0;
  while (done < n) {
    const int64_t pos = state.length();
    const int64_t m = GridChunkRows(pos, n - done, G);
    const bool last = done + m == n;
    std::vector<int32_t> embedded;
    RETURN_IF_ERROR(StageImageRows(ids.subspan(static_cast<size_t>(done), static_cast<size_t>(m)), pos, &embedded));
    float* out = all ? logits.data() + done * config_.vocab_size : (last ? logits.data() : nullptr);
    Status ran = cuda::CopyToDevice(ws_->ids.data(), embedded.data(), static_cast<size_t>(m) * 4, stream_);
    if (ran.ok()) ran = RunChunk(state, m, all ? 0 : m - 1, out);
    image_rows_.clear();  // host rows only for this chunk, whatever happened
    rope_axes_ = {};
    RETURN_IF_ERROR(ran);
    done += m;
    if (mtp == nullptr) continue;
    ASSIGN_OR_RETURN(float* waiting, MtpWait(*mtp, pos, m));
    if (waiting == nullptr) {
      mtp = nullptr;
      continue;
    }
    cuda::RmsNormRows(ws_->x.floats(), final_norm_, m, config_.hidden_size, static_cast<float>(config_.rms_norm_eps), waiting, stream_);
    // Every waiting row whose next id this call holds becomes a K/V row of the head.
    const int64_t first = mtp->begin + mtp->rows, start = state.length() - done;
    const int64_t known = std::min(mtp->pending_rows, start + n - 1 - first);
    if (known > 0) RETURN_IF_ERROR(MtpCommit(*mtp, ids.subspan(static_cast<size_t>(first + 1 - start), static_cast<size_t>(known))));
  }
  if (mtp != nullptr) RETURN_IF_ERROR(cuda::Synchronize(stream_, "the MTP head's rows"));
  return logits;
}

// A captured decode step, valid for the state buffers it was captured with.
struct CudaForward::DecodeGraph {
  cudaGraphExec_t exec = nullptr;
  std::vector<const void*> buffers;
  DecodeGraph() = default;
  DecodeGraph(const DecodeGraph&) = delete;
  DecodeGraph& operator=(const DecodeGraph&) = delete;
  ~DecodeGraph() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
  }
};

std::vector<const void*> DeviceState::Buffers() const {
  std::vector<const void*> out;
  for (const auto* list : {&k_, &v_, &recurrent_, &tail_})
    for (const DeviceBuffer& b : *list) out.push_back(b.data());
  return out;
}

Result<std::vector<float>> CudaForward::Decode(DeviceState& state, int32_t id, MtpState* mtp) {
  RETURN_IF_ERROR(CheckIds(std::span<const int32_t>(&id, 1)));
  RETURN_IF_ERROR(state.Reserve(state.length() + 1));
  std::vector<float> logits(static_cast<size_t>(config_.vocab_size));
  const DecodeStep step{id, 0, state.length(), state.length() + RopeShift(state.length())};
  RETURN_IF_ERROR(cuda::CopyToDevice(ws_->step.data(), &step, sizeof step, stream_));
  RETURN_IF_ERROR(LaunchCaptured(graph_, state.Buffers(), [&] { return EnqueueDecode(state); }, "launching the decode graph"));
  if (mtp_ && mtp != nullptr) {  // the step's final-normed row waits for the head
    ASSIGN_OR_RETURN(float* waiting, MtpWait(*mtp, state.length(), 1));
    if (waiting != nullptr) RETURN_IF_ERROR(cuda::CopyOnDevice(waiting, ws_->a.data(), static_cast<size_t>(Floats(config_.hidden_size)), stream_));
  }
  RETURN_IF_ERROR(cuda::CopyToHost(logits.data(), ws_->logits.data(), logits.size() * sizeof(float), stream_));
  RETURN_IF_ERROR(cuda::Synchronize(stream_, "a decode step"));
  ++state.length_;
  return logits;
}

Result<std::vector<float>> CudaForward::PrefillBranches(DeviceState& state, std::span<const PrefillBranch> branches) {
  const int64_t G = options_.grid_tokens, V = config_.vocab_size, pos0 = state.length();
  int64_t longest = 0, logits_rows = 0;
  for (const PrefillBranch& b : branches) {
    RETURN_IF_ERROR(CheckBranch(b, V, "CudaForward::PrefillBranches"));
    const int64_t n = static_cast<int64_t>(b.ids.size());
    if (n > G)
      return InvalidArgument("CudaForward::PrefillBranches: a branch of " + std::to_string(n) + " ids; at most the grid's " + std::to_string(G));
    longest = std::max(longest, n);
    logits_rows += n - b.logits_from;
  }
  RETURN_IF_ERROR(state.Reserve(pos0 + longest));
  std::vector<float> logits(static_cast<size_t>(logits_rows * V));
  float* out = logits.data();
  Workspace& ws = *ws_;
  std::vector<int32_t> ids;
  std::vector<Segment> pass;
  for (size_t first = 0; first < branches.size();) {  // passes of whole branches, up to the grid's rows each
    ids.clear();
    pass.clear();
    size_t end = first;
    for (; end < branches.size() && static_cast<int64_t>(ids.size() + branches[end].ids.size()) <= G; ++end) {
      Segment branch;
      branch.row0 = static_cast<int64_t>(ids.size());
      branch.n = static_cast<int64_t>(branches[end].ids.size());
      pass.push_back(branch);
      ids.insert(ids.end(), branches[end].ids.begin(), branches[end].ids.end());
    }
    const int64_t n = static_cast<int64_t>(ids.size());
    RETURN_IF_ERROR(cuda::CopyToDevice(ws.ids.data(), ids.data(), static_cast<size_t>(n) * 4, stream_));
    RETURN_IF_ERROR(EnqueueLayers(state, static_cast<const int32_t*>(ws.ids.data()), n, Mode::kBranches, pass));
    for (size_t i = first; i < end; ++i) {
      const Segment& b = pass[i - first];
      RETURN_IF_ERROR(LogitsOfRows(b.row0 + branches[i].logits_from, b.row0 + b.n, out));
      out += (b.n - branches[i].logits_from) * V;
    }
    first = end;
  }
  RETURN_IF_ERROR(cuda::Synchronize(stream_, "a forward of branches"));
  return logits;
}

Result<std::vector<float>> CudaForward::DraftWindow(DeviceState& state, std::span<const int32_t> ids, MtpState* mtp) {
  RETURN_IF_ERROR(CheckIds(ids));
  const int64_t n = static_cast<int64_t>(ids.size()), H = config_.hidden_size, V = config_.vocab_size;
  if (n > kMaxDraftRows)
    return InvalidArgument("CudaForward: a draft window of " + std::to_string(n) + " rows; at most " + std::to_string(kMaxDraftRows));
  RETURN_IF_ERROR(state.Reserve(state.length() + n));
  if (!mtp_) mtp = nullptr;
  ASSIGN_OR_RETURN(DeviceDraftLog* log, DraftLogOf(state, n, mtp != nullptr));
  Workspace& ws = *ws_;
  RETURN_IF_ERROR(cuda::CopyToDevice(ws.ids.data(), ids.data(), static_cast<size_t>(n) * 4, stream_));
  RETURN_IF_ERROR(EnqueueLayers(state, static_cast<const int32_t*>(ws.ids.data()), n, Mode::kDraft));
  std::vector<float> logits(static_cast<size_t>(n * V));
  cuda::RmsNormRows(ws.x.floats(), final_norm_, n, H, static_cast<float>(config_.rms_norm_eps), ws.a.floats(), stream_);
  if (mtp != nullptr) RETURN_IF_ERROR(cuda::CopyOnDevice(log->hidden.data(), ws.a.data(), static_cast<size_t>(Floats(n * H)), stream_));
  RETURN_IF_ERROR(DecodeLogitsOfRows(n, logits.data()));
  RETURN_IF_ERROR(cuda::Synchronize(stream_, "a draft window"));
  log->open = true;
  log->pos0 = state.length();
  log->rows = n;
  log->mtp = mtp;
  state.length_ += n;
  return logits;
}

Result<std::vector<float>> CudaForward::DecodeBatch(std::span<DeviceState* const> states, std::span<const int32_t> ids,
                                                     std::span<const PromptImages* const> images) {
  if (ids.size() != states.size() || images.size() != states.size())
    return InvalidArgument("CudaForward::DecodeBatch: " + std::to_string(ids.size()) + " ids and " + std::to_string(images.size()) +
                           " image lists for " + std::to_string(states.size()) + " states");
  RETURN_IF_ERROR(CheckIds(ids));
  const int64_t V = config_.vocab_size;
  for (DeviceState* state : states) RETURN_IF_ERROR(state->Reserve(state->length() + 1));
  std::vector<float> logits(states.size() * static_cast<size_t>(V));
  Workspace& ws = *ws_;
  const auto* steps = static_cast<const DecodeStep*>(ws.batch_steps.data());
  std::vector<Segment> rows;
  std::vector<DecodeStep> host_steps;
  for (size_t first = 0; first < states.size(); first += kLogitRows) {  // the logits' rows a forward
    const int64_t n = std::min<int64_t>(kLogitRows, static_cast<int64_t>(states.size() - first));
    rows.clear();
    host_steps.clear();
    std::vector<const void*> buffers;
    for (int64_t i = 0; i < n; ++i) {
      const size_t at = first + static_cast<size_t>(i);
      DeviceState* state = states[at];
      const int64_t position = state->length();
      host_steps.push_back({ids[at], 0, position, position + RopeShiftOf(images[at], position)});
      rows.push_back({i, 1, state, cuda::Position{0, &steps[i].position}, cuda::Position{0, &steps[i].rope_position}});
      const std::vector<const void*> own = state->Buffers();
      buffers.insert(buffers.end(), own.begin(), own.end());
    }
    RETURN_IF_ERROR(cuda::CopyToDevice(ws.ids.data(), ids.data() + first, static_cast<size_t>(n) * 4, stream_));
    RETURN_IF_ERROR(cuda::CopyToDevice(ws.batch_steps.data(), host_steps.data(), host_steps.size() * sizeof(DecodeStep), stream_));
    RETURN_IF_ERROR(LaunchCaptured(batch_graph_, std::move(buffers), [&] { return EnqueueBatch(rows); }, "launching the decode batch's graph"));
    RETURN_IF_ERROR(cuda::CopyToHost(logits.data() + static_cast<int64_t>(first) * V, ws.logits.data(), static_cast<size_t>(Floats(n * V)),
                                     stream_));
    RETURN_IF_ERROR(cuda::Synchronize(stream_, "a decode batch"));
    for (const Segment& row : rows) ++row.state->length_;
  }
  return logits;
}

Result<std::vector<float>> CudaForward::DecodeWindowsBatch(std::span<DeviceState* const> states, std::span<const std::vector<int32_t>> rows,
                                                            std::span<const PromptImages* const> images) {
  if (rows.size() != states.size() || images.size() != states.size())
    return InvalidArgument("CudaForward::DecodeWindowsBatch: " + std::to_string(rows.size()) + " rows and " + std::to_string(images.size()) +
                           " image lists for " + std::to_string(states.size()) + " states");
  const int64_t H = config_.hidden_size, V = config_.vocab_size;
  int64_t total = 0;
  for (const std::vector<int32_t>& r : rows) {
    RETURN_IF_ERROR(CheckIds(r));
    const int64_t n = static_cast<int64_t>(r.size());
    if (n < 1 || n > kMaxDraftRows)
      return InvalidArgument("CudaForward::DecodeWindowsBatch: " + std::to_string(n) + " rows for a state; 1 to " + std::to_string(kMaxDraftRows));
    total += n;
  }
  for (size_t i = 0; i < states.size(); ++i) RETURN_IF_ERROR(states[i]->Reserve(states[i]->length() + static_cast<int64_t>(rows[i].size())));
  for (size_t i = 0; i < states.size(); ++i)
    if (rows[i].size() > 1) RETURN_IF_ERROR(DraftLogOf(*states[i], static_cast<int64_t>(rows[i].size()), false).status());
  std::vector<float> logits(static_cast<size_t>(total * V));
  Workspace& ws = *ws_;
  const int64_t pass_rows = std::max(options_.grid_tokens, kMaxDraftRows);  // the workspace's rows
  std::vector<Segment> pass;
  std::vector<int32_t> ids;
  int64_t logit_row = 0;
  for (size_t first = 0; first < states.size();) {  // passes of whole states
    pass.clear();
    ids.clear();
    size_t end = first;
    for (; end < states.size() && static_cast<int64_t>(ids.size() + rows[end].size()) <= pass_rows; ++end) {
      DeviceState* state = states[end];
      const int64_t n = static_cast<int64_t>(rows[end].size()), position = state->length();
      const int64_t rope = position + RopeShiftOf(images[end], position);
      pass.push_back({static_cast<int64_t>(ids.size()), n, state, cuda::Position{position, nullptr}, cuda::Position{rope, nullptr}, n > 1});
      ids.insert(ids.end(), rows[end].begin(), rows[end].end());
    }
    const int64_t n = static_cast<int64_t>(ids.size());
    RETURN_IF_ERROR(cuda::CopyToDevice(ws.ids.data(), ids.data(), static_cast<size_t>(n) * 4, stream_));
    RETURN_IF_ERROR(EnqueueLayers(*pass.front().state, static_cast<const int32_t*>(ws.ids.data()), n, Mode::kBatch, pass));
    cuda::RmsNormRows(ws.x.floats(), final_norm_, n, H, static_cast<float>(config_.rms_norm_eps), ws.a.floats(), stream_);
    RETURN_IF_ERROR(DecodeLogitsOfRows(n, logits.data() + logit_row * V));
    RETURN_IF_ERROR(cuda::Synchronize(stream_, "a batch of decodes and draft windows"));
    for (const Segment& s : pass) {
      if (s.window) {
        DeviceDraftLog& log = *s.state->draft_;
        log.open = true;
        log.pos0 = s.state->length();
        log.rows = s.n;
        log.mtp = nullptr;
      }
      s.state->length_ += s.n;
    }
    logit_row += n;
    first = end;
  }
  return logits;
}

Status CudaForward::EnqueueBatch(std::span<const Segment> rows) {
  const int64_t H = config_.hidden_size, n = static_cast<int64_t>(rows.size());
  Workspace& ws = *ws_;
  RETURN_IF_ERROR(EnqueueLayers(*rows.front().state, static_cast<const int32_t*>(ws.ids.data()), n, Mode::kBatch, rows));
  cuda::RmsNormRows(ws.x.floats(), final_norm_, n, H, static_cast<float>(config_.rms_norm_eps), ws.a.floats(), stream_);
  GemvOf(lm_head_, ws.a.floats(), n, ws.logits.floats());
  return Status::Ok();
}

Status CudaForward::KeepDraft(DeviceState& state, int64_t rows) {
  if (!state.draft_ || !state.draft_->open || state.length() != state.draft_->pos0 + state.draft_->rows)
    return InvalidArgument("CudaForward::KeepDraft: no draft window is open on this state");
  DeviceDraftLog& log = *state.draft_;
  if (rows < 0 || rows > log.rows)
    return InvalidArgument("CudaForward::KeepDraft: " + std::to_string(rows) + " rows of a window of " + std::to_string(log.rows));
  log.open = false;
  const ModelConfig& c = config_;
  const int64_t C = c.conv_dim(), Nv = c.linear_num_value_heads;
  const cuda::DeltaShape shape{c.linear_num_key_heads, Nv, c.linear_key_head_dim, c.linear_value_head_dim, C};
  for (int64_t gi = 0; gi < static_cast<int64_t>(state.recurrent_.size()) && rows > 0; ++gi) {
    const int64_t at = gi * log.capacity;
    cuda::GatedDeltaRecurrent(shape, log.conv.floats() + at * C, log.beta.floats() + at * Nv, log.g.floats() + at * Nv, rows,
                              state.recurrent_[static_cast<size_t>(gi)].floats(), ws_->core.floats(), nullptr, nullptr, 0.0f, stream_);
    cuda::NextTail(log.qkv.floats() + at * C, state.tail_[static_cast<size_t>(gi)].floats(), rows, C, c.linear_conv_kernel_dim, stream_);
  }
  if (log.mtp != nullptr && rows > 0) {  // the kept rows' hidden rows wait for the head
    ASSIGN_OR_RETURN(float* waiting, MtpWait(*log.mtp, log.pos0, rows));
    if (waiting != nullptr)
      RETURN_IF_ERROR(cuda::CopyOnDevice(waiting, log.hidden.data(), static_cast<size_t>(Floats(rows * c.hidden_size)), stream_));
  }
  RETURN_IF_ERROR(cuda::Synchronize(stream_, "keeping a draft window's rows"));
  state.length_ = log.pos0 + rows;
  return Status::Ok();
}

Status CudaForward::EnqueueDecode(DeviceState& state) {
  const int64_t H = config_.hidden_size;
  RETURN_IF_ERROR(EnqueueLayers(state, static_cast<const int32_t*>(ws_->step.data()), 1, Mode::kRecurrent));
  float* a = ws_->a.floats();
  cuda::RmsNormRows(ws_->x.floats(), final_norm_, 1, H, static_cast<float>(config_.rms_norm_eps), a, stream_);
  GemvOf(lm_head_, a, 1, ws_->logits.floats());
  return Status::Ok();
}

template <typename Fn>
Status CudaForward::LaunchCaptured(std::unique_ptr<DecodeGraph>& graph, std::vector<const void*> buffers, Fn&& enqueue, const char* what) {
  if (options_.decode_graphs && (!graph || graph->buffers != buffers)) {
    graph.reset();
    auto captured = Capture(std::move(buffers), enqueue);
    if (captured.ok()) {
      graph = std::move(*captured);
    } else {  // decode goes on launch by launch; the reason stays for DecodeLaunches
      cudaGetLastError();  // the failed capture's error is not this step's
      options_.decode_graphs = false;
      graph_note_ = captured.status().message();
    }
  }
  if (options_.decode_graphs) return cuda::CudaStatus(cudaGraphLaunch(graph->exec, stream_), what);
  return enqueue();
}

template <typename Fn>
Result<std::unique_ptr<CudaForward::DecodeGraph>> CudaForward::Capture(std::vector<const void*> buffers, Fn&& fn) {
  std::lock_guard<std::mutex> capturing(capture_mutex_);
  RETURN_IF_ERROR(cuda::CudaStatus(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "capturing a decode step"));
  const Status enqueued = fn();
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
  RETURN_IF_ERROR(enqueued);
  RETURN_IF_ERROR(cuda::CudaStatus(ended, "ending the decode capture"));
  auto captured = std::make_unique<DecodeGraph>();
  const cudaError_t made = cudaGraphInstantiate(&captured->exec, graph, 0);
  cudaGraphDestroy(graph);
  RETURN_IF_ERROR(cuda::CudaStatus(made, "instantiating the decode graph"));
  captured->buffers = std::move(buffers);
  return captured;
}

Status CudaForward::Product(const Matrix& m, const float* x, int64_t n, float* y, int64_t y_stride, Mode mode) {
  if (mode == Mode::kChunked || mode == Mode::kBranches) return GemmOf(m, gemm_.get(), x, n, y, y_stride);
  if (y_stride != m.rows) return Internal("CudaForward: the GEMV writes whole rows of " + std::to_string(m.rows) + " outputs");
  GemvOf(m, x, n, y);
  return Status::Ok();
}

void CudaForward::GemvOf(const Matrix& m, const float* x, int64_t n, float* y) {
  if (m.q8.q != nullptr) {
    cuda::GemvQ8(m.q8, m.rows, m.cols, x, n, y, stream_);
  } else {
    cuda::Gemv(m.w, m.rows, m.cols, x, n, y, stream_);
  }
}

Status CudaForward::GemmOf(const Matrix& m, cuda::LtGemm* gemm, const float* x, int64_t n, float* y, int64_t y_stride) {
  if (m.q8.q == nullptr) return gemm->Run(m.w, m.rows, m.cols, x, n, y, y_stride);
  cuda::GemmSimtQ8(m.q8, m.rows, m.cols, x, n, y, y_stride, stream_);
  return Status::Ok();
}

Status CudaForward::EnqueueLayers(DeviceState& state, const int32_t* ids, int64_t n, Mode mode, std::span<const Segment> branches) {
  const int64_t H = config_.hidden_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  Workspace& ws = *ws_;
  float* x = ws.x.floats();
  float* a = ws.a.floats();
  RETURN_IF_ERROR(EmbedRows(ids, n, x));
  int64_t gi = 0, ai = 0;
  cuda::RmsNormRows(x, layers_.front().in_norm, n, H, eps, a, stream_);
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& layer = layers_[l];
    if (layer.kind == LayerKind::kLinearAttention) {
      RETURN_IF_ERROR(GdnMixer(layer, state, gi++, n, mode, branches));
    } else {
      RETURN_IF_ERROR(AttentionMixer(layer, state, ai++, n, mode, branches));
    }
    cuda::AddRmsNorm(x, ws.mix.floats(), layer.post_norm, n, H, eps, a, stream_);
    RETURN_IF_ERROR(Mlp(layer, n, mode));
    if (l + 1 < layers_.size()) {
      cuda::AddRmsNorm(x, ws.mix.floats(), layers_[l + 1].in_norm, n, H, eps, a, stream_);
    } else {
      cuda::AddRows(ws.mix.floats(), n * H, x, stream_);
    }
  }
  return Status::Ok();
}

Status CudaForward::RunChunk(DeviceState& state, int64_t n, int64_t first_logit_row, float* logits) {
  Workspace& ws = *ws_;
  RETURN_IF_ERROR(EnqueueLayers(state, static_cast<const int32_t*>(ws.ids.data()), n, Mode::kChunked));
  state.length_ += n;
  if (logits != nullptr) RETURN_IF_ERROR(LogitsOfRows(first_logit_row, n, logits));
  return cuda::Synchronize(stream_, "a forward chunk");
}

Status CudaForward::DecodeLogitsOfRows(int64_t n, float* logits) {
  const int64_t H = config_.hidden_size, V = config_.vocab_size;
  for (int64_t t = 0; t < n; t += kLogitRows) {
    const int64_t run = std::min(kLogitRows, n - t);
    GemvOf(lm_head_, ws_->a.floats() + t * H, run, ws_->logits.floats());
    RETURN_IF_ERROR(cuda::CopyToHost(logits + t * V, ws_->logits.data(), static_cast<size_t>(Floats(run * V)), stream_));
  }
  return Status::Ok();
}

Status CudaForward::LogitsOfRows(int64_t begin, int64_t end, float* logits) {
  const int64_t H = config_.hidden_size, V = config_.vocab_size;
  Workspace& ws = *ws_;
  for (int64_t t = begin; t < end; t += kLogitRows) {
    const int64_t run = std::min(kLogitRows, end - t);
    cuda::RmsNormRows(ws.x.floats() + t * H, final_norm_, run, H, static_cast<float>(config_.rms_norm_eps), ws.a.floats(), stream_);
    RETURN_IF_ERROR(GemmOf(lm_head_, logits_gemm_.get(), ws.a.floats(), run, ws.logits.floats(), V));
    RETURN_IF_ERROR(cuda::CopyToHost(logits + (t - begin) * V, ws.logits.data(), static_cast<size_t>(Floats(run * V)), stream_));
  }
  return Status::Ok();
}

Status CudaForward::GdnMixer(const Layer& L, DeviceState& state, int64_t gi, int64_t n, Mode mode, std::span<const Segment> branches) {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size, C = c.conv_dim(), K = c.linear_conv_kernel_dim, Nv = c.linear_num_value_heads;
  const int64_t dk = c.linear_key_head_dim, VD = c.value_dim();
  const float eps = static_cast<float>(c.rms_norm_eps);
  Workspace& ws = *ws_;
  const float* a = ws.a.floats();
  // A draft window keeps its rows' delta-rule inputs in its log for KeepDraft.
  float *qkv = ws.qkv.floats(), *conv = ws.conv.floats(), *beta = ws.beta.floats(), *g = ws.g.floats();
  if (mode == Mode::kDraft) {
    const DeviceDraftLog& log = *state.draft_;
    const int64_t at = gi * log.capacity;
    qkv = log.qkv.floats() + at * C;
    conv = log.conv.floats() + at * C;
    beta = log.beta.floats() + at * Nv;
    g = log.g.floats() + at * Nv;
  }
  if (mode == Mode::kRecurrent) {  // one row: the four projections in one launch
    cuda::GemvSet set;
    set.count = 4;
    const Matrix* matrices[4] = {&L.qkv, &L.z, &L.b, &L.a};
    float* outputs[4] = {qkv, ws.z.floats(), ws.bb.floats(), ws.aa.floats()};
    for (int m = 0; m < 4; ++m) {
      set.w[m] = matrices[m]->w;
      set.q8[m] = matrices[m]->q8;
      set.rows[m] = matrices[m]->rows;
      set.y[m] = outputs[m];
    }
    cuda::GemvMany(set, H, a, stream_);
  } else {
    RETURN_IF_ERROR(Product(L.qkv, a, n, qkv, C, mode));
    RETURN_IF_ERROR(Product(L.z, a, n, ws.z.floats(), VD, mode));
    RETURN_IF_ERROR(Product(L.b, a, n, ws.bb.floats(), Nv, mode));
    RETURN_IF_ERROR(Product(L.a, a, n, ws.aa.floats(), Nv, mode));
  }
  float* tail = state.tail_[static_cast<size_t>(gi)].floats();
  cuda::ConvNormGates gates;
  gates.qkv = qkv;
  gates.tail = tail;
  gates.w = L.conv;
  gates.out = conv;
  gates.channels = C;
  gates.taps = K;
  gates.key_heads = c.linear_num_key_heads;
  gates.dk = dk;
  gates.eps = eps;
  gates.q_scale = 1.0f / std::sqrt(static_cast<float>(dk));
  gates.b = ws.bb.floats();
  gates.a = ws.aa.floats();
  gates.a_exp = L.a_exp;
  gates.dt_bias = L.dt_bias;
  gates.beta = beta;
  gates.g = g;
  gates.value_heads = Nv;
  const auto gates_from = [&](int64_t row0) {  // the gates' arguments for the rows from row0 on
    cuda::ConvNormGates own = gates;
    own.qkv += row0 * C;
    own.out += row0 * C;
    own.b += row0 * Nv;
    own.a += row0 * Nv;
    own.beta += row0 * Nv;
    own.g += row0 * Nv;
    return own;
  };
  const cuda::DeltaShape shape{c.linear_num_key_heads, Nv, dk, c.linear_value_head_dim, C};
  float* S = state.recurrent_[static_cast<size_t>(gi)].floats();
  const size_t state_bytes = static_cast<size_t>(Floats(state.recurrent_floats_));
  if (mode == Mode::kBranches) {  // each branch from the state's tail and a copy of its state, which stays
    for (const Segment& b : branches) {
      const cuda::ConvNormGates own = gates_from(b.row0);
      cuda::ConvNormGatesRows(own, b.n, stream_);
      RETURN_IF_ERROR(cuda::CopyOnDevice(ws.state_copy.data(), S, state_bytes, stream_));
      cuda::GatedDeltaChunked(shape, own.out, own.beta, own.g, b.n, state.length(), ws.state_copy.floats(),
                              ws.core.floats() + b.row0 * VD, ws.delta.floats(), stream_);
    }
    cuda::GatedNorm(ws.core.floats(), ws.z.floats(), L.gdn_norm, n, Nv, c.linear_value_head_dim, eps, stream_);
    return Product(L.out, ws.core.floats(), n, ws.mix.floats(), H, mode);
  }
  if (mode == Mode::kBatch) {  // each state's rows: the conv over its own tail, the recurrence on its own state
    for (const Segment& row : branches) {
      float* own_tail = row.state->tail_[static_cast<size_t>(gi)].floats();
      float* own_state = row.state->recurrent_[static_cast<size_t>(gi)].floats();
      cuda::ConvNormGates own = gates_from(row.row0);
      own.tail = own_tail;
      if (row.window) {  // its inputs go to the state's draft log for KeepDraft, the recurrence runs on a copy
        const DeviceDraftLog& log = *row.state->draft_;
        const int64_t at = gi * log.capacity;
        RETURN_IF_ERROR(cuda::CopyOnDevice(log.qkv.floats() + at * C, own.qkv, static_cast<size_t>(Floats(row.n * C)), stream_));
        own.out = log.conv.floats() + at * C;
        own.beta = log.beta.floats() + at * Nv;
        own.g = log.g.floats() + at * Nv;
        RETURN_IF_ERROR(cuda::CopyOnDevice(ws.state_copy.data(), own_state, state_bytes, stream_));
        own_state = ws.state_copy.floats();
      }
      cuda::ConvNormGatesRows(own, row.n, stream_);
      if (!row.window) cuda::NextTail(own.qkv, own_tail, row.n, C, K, stream_);
      cuda::GatedDeltaRecurrent(shape, own.out, own.beta, own.g, row.n, own_state, ws.core.floats() + row.row0 * VD,
                                ws.z.floats() + row.row0 * VD, L.gdn_norm, eps, stream_);
    }
    return Product(L.out, ws.core.floats(), n, ws.mix.floats(), H, mode);
  }
  cuda::ConvNormGatesRows(gates, n, stream_);
  if (mode != Mode::kDraft) cuda::NextTail(qkv, tail, n, C, K, stream_);  // a window's tail moves at KeepDraft
  if (mode == Mode::kChunked) {
    cuda::GatedDeltaChunked(shape, conv, beta, g, n, state.length(), S, ws.core.floats(), ws.delta.floats(), stream_);
    cuda::GatedNorm(ws.core.floats(), ws.z.floats(), L.gdn_norm, n, Nv, c.linear_value_head_dim, eps, stream_);
  } else {
    if (mode == Mode::kDraft) {  // on a copy: the state itself waits for KeepDraft
      RETURN_IF_ERROR(cuda::CopyOnDevice(ws.state_copy.data(), S, state_bytes, stream_));
      S = ws.state_copy.floats();
    }
    cuda::GatedDeltaRecurrent(shape, conv, beta, g, n, S, ws.core.floats(), ws.z.floats(), L.gdn_norm, eps, stream_);
  }
  return Product(L.out, ws.core.floats(), n, ws.mix.floats(), H, mode);
}

Status CudaForward::AttentionMixer(const Layer& L, DeviceState& state, int64_t ai, int64_t n, Mode mode,
                                   std::span<const Segment> branches) {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size, Nh = c.num_attention_heads, Nkv = c.num_key_value_heads, hd = c.head_dim;
  const int64_t QW = 2 * Nh * hd, KW = Nkv * hd, pos0 = state.length();
  Workspace& ws = *ws_;
  const float* a = ws.a.floats();
  const cuda::KvBuffers rows = state.kv_buffers(ai);
  // Decode reads its position from the step in device memory (one captured graph serves every step).
  const cuda::Position position = mode == Mode::kRecurrent ? cuda::Position{0, StepPosition()} : cuda::Position{pos0, nullptr};
  // Rows turn at their position plus what images before them moved it by (3-D positions, where a chunk has them, win).
  const cuda::Position rope = mode == Mode::kRecurrent ? cuda::Position{0, StepRopePosition()} : cuda::Position{pos0 + RopeShift(pos0), nullptr};
  // K and V go to the workspace in fp32, are normed there and then stored in the state's rows in its dtype.
  if (mode == Mode::kRecurrent) {  // one row: q, k and v in one launch
    cuda::GemvSet set;
    set.count = 3;
    set.position = position;
    set.w[0] = L.q.w;
    set.q8[0] = L.q.q8;
    set.rows[0] = L.q.rows;
    set.y[0] = ws.qg.floats();
    set.w[1] = L.k.w;
    set.q8[1] = L.k.q8;
    set.rows[1] = L.k.rows;
    set.y[1] = ws.krows.floats();
    set.w[2] = L.v.w;
    set.q8[2] = L.v.q8;
    set.rows[2] = L.v.rows;
    set.y[2] = ws.vrows.floats();
    cuda::GemvMany(set, H, a, stream_);
  } else {
    RETURN_IF_ERROR(Product(L.q, a, n, ws.qg.floats(), QW, mode));
    RETURN_IF_ERROR(Product(L.k, a, n, ws.krows.floats(), KW, mode));
    RETURN_IF_ERROR(Product(L.v, a, n, ws.vrows.floats(), KW, mode));
  }
  if (mode == Mode::kBranches) {  // each branch's K/V rows go above the state's length in turn, then its rows attend
    const cuda::Position at{pos0, nullptr};
    for (const Segment& b : branches)
      RETURN_IF_ERROR(AttendRows(L, ws.qg.floats() + b.row0 * QW, ws.krows.floats() + b.row0 * KW, ws.vrows.floats() + b.row0 * KW, b.n,
                                 rope, at, rows, ws.attn.floats() + b.row0 * Nh * hd));
  } else if (mode == Mode::kBatch) {  // each row's K/V row goes to its own state, and it attends that state's rows
    for (const Segment& row : branches)
      RETURN_IF_ERROR(AttendRows(L, ws.qg.floats() + row.row0 * QW, ws.krows.floats() + row.row0 * KW, ws.vrows.floats() + row.row0 * KW, row.n,
                                 row.rope_position, row.position, row.state->kv_buffers(ai), ws.attn.floats() + row.row0 * Nh * hd));
  } else {
    RETURN_IF_ERROR(AttendRows(L, ws.qg.floats(), ws.krows.floats(), ws.vrows.floats(), n, rope, position, rows, ws.attn.floats(), rope_axes_));
  }
  return Product(L.o, ws.attn.floats(), n, ws.mix.floats(), H, mode);
}
Status CudaForward::AttendRows(const Layer& L, float* q, float* k, const float* v, int64_t n, cuda::Position rope_pos,
                               cuda::Position kv_row, const cuda::KvBuffers& rows, float* out, cuda::RopeAxes axes) {
  const ModelConfig& c = config_;
  const int64_t Nh = c.num_attention_heads, Nkv = c.num_key_value_heads, hd = c.head_dim, QW = 2 * Nh * hd, KW = Nkv * hd;
  const int64_t half = c.rotary_dim() / 2;
  const float eps = static_cast<float>(c.rms_norm_eps);
  cuda::NormRope(q, n, QW, Nh, 2 * hd, hd, L.q_norm, eps, inv_freq_, half, rope_pos, false, stream_, axes);
  cuda::NormRope(k, n, KW, Nkv, hd, hd, L.k_norm, eps, inv_freq_, half, rope_pos, false, stream_, axes);
  cuda::StoreKvRows(k, v, n, KW, kv_row, rows, stream_);
  const cuda::AttentionShape shape{Nh, Nkv, hd, 1.0f / std::sqrt(static_cast<float>(hd))};
  cuda::Attention(shape, q, QW, 2 * hd, n, kv_row, rows, KW, q + hd, out, Nh * hd, stream_);
  return Status::Ok();
}

bool CudaForward::HoldsMtpRows(const MtpState& mtp) const {
  const auto* rows = dynamic_cast<const DeviceMtp*>(mtp.mirror.get());
  return rows != nullptr && rows->owner == this;
}

CudaForward::DeviceMtp& CudaForward::MtpRowsOf(MtpState& mtp) {
  auto* rows = dynamic_cast<DeviceMtp*>(mtp.mirror.get());
  if (!HoldsMtpRows(mtp)) {  // no rows of this forward: the head starts anew
    auto made = std::make_unique<DeviceMtp>(this, &mtp_bytes_);
    rows = made.get();
    mtp = MtpState{};
    mtp.mirror = std::move(made);
  }
  return *rows;
}

Result<float*> CudaForward::MtpWait(MtpState& mtp, int64_t pos0, int64_t n) {
  if (mtp.gave_up) return static_cast<float*>(nullptr);
  const int64_t H = config_.hidden_size;
  DeviceMtp& rows = MtpRowsOf(mtp);
  if (mtp.begin < 0 || mtp.begin + mtp.rows + mtp.pending_rows != pos0) {
    mtp.begin = pos0;
    mtp.rows = 0;
    mtp.pending_rows = 0;
    rows.first = 0;
  }
  if (rows.first + mtp.pending_rows + n > rows.pending_capacity) {  // the waiting rows move to the front of a larger buffer
    const int64_t capacity = std::max(2 * rows.pending_capacity, mtp.pending_rows + n);
    auto grown = DeviceBuffer::Allocate(static_cast<size_t>(Floats(capacity * H)), "the MTP head's waiting rows");
    if (!grown.ok() && GaveUpMtpRows(grown.status(), mtp)) return static_cast<float*>(nullptr);
    RETURN_IF_ERROR(grown.status());
    RETURN_IF_ERROR(cuda::CopyOnDevice(grown->data(), rows.pending.floats() + rows.first * H, static_cast<size_t>(Floats(mtp.pending_rows * H)), stream_));
    RETURN_IF_ERROR(cuda::Synchronize(stream_, "moving the MTP head's waiting rows"));
    rows.pending = std::move(*grown);
    rows.pending_capacity = capacity;
    rows.first = 0;
    rows.NoteBytes();
  }
  float* at = rows.pending.floats() + (rows.first + mtp.pending_rows) * H;
  mtp.pending_rows += n;
  return at;
}

Status CudaForward::MtpRows(MtpState& mtp, const float* hidden, std::span<const int32_t> ids, int64_t slot, float* out) {
  const MtpHead& head = *mtp_;
  const Layer& L = head.layer;
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size, KW = c.num_key_value_heads * c.head_dim, QW = 2 * c.num_attention_heads * c.head_dim;
  const float eps = static_cast<float>(c.rms_norm_eps);
  DeviceMtp& rows = MtpRowsOf(mtp);
  const int64_t total = static_cast<int64_t>(ids.size());
  if (slot + total > rows.capacity) {  // the head's K/V rows grow in the trunk's steps, keeping rows below slot
    const int64_t step = SequenceState::kKvRowStep, capacity = (slot + total + step - 1) / step * step;
    DeviceBuffer grown[2];
    for (int i = 0; i < 2; ++i) {
      ASSIGN_OR_RETURN(grown[i], DeviceBuffer::Allocate(static_cast<size_t>(Floats(capacity * KW)), "the MTP head's K/V rows"));
      const DeviceBuffer& from = i == 0 ? rows.k : rows.v;
      RETURN_IF_ERROR(cuda::CopyOnDevice(grown[i].data(), from.data(), static_cast<size_t>(Floats(std::min(slot, rows.capacity) * KW)), stream_));
    }
    RETURN_IF_ERROR(cuda::Synchronize(stream_, "growing the MTP head's K/V rows"));
    rows.k = std::move(grown[0]);
    rows.v = std::move(grown[1]);
    rows.capacity = capacity;
    rows.NoteBytes();
  }
  Workspace& ws = *ws_;
  const int64_t piece_rows = options_.grid_tokens;
  for (int64_t done = 0; done < total;) {
    const int64_t n = std::min(piece_rows, total - done);
    const Mode mode = n == 1 ? Mode::kRecurrent : Mode::kChunked;
    RETURN_IF_ERROR(cuda::CopyToDevice(ws.ids.data(), ids.data() + done, static_cast<size_t>(n) * 4, stream_));
    RETURN_IF_ERROR(EmbedRows(static_cast<const int32_t*>(ws.ids.data()), n, ws.x.floats()));
    cuda::RmsNormRows(ws.x.floats(), head.norm_embedding, n, H, eps, ws.a.floats(), stream_);
    cuda::RmsNormRows(hidden + done * H, head.norm_hidden, n, H, eps, ws.mix.floats(), stream_);
    cuda::JoinRows(ws.a.floats(), ws.mix.floats(), n, H, ws.cat.floats(), stream_);
    RETURN_IF_ERROR(Product(head.fc, ws.cat.floats(), n, ws.x.floats(), H, mode));
    cuda::RmsNormRows(ws.x.floats(), L.in_norm, n, H, eps, ws.a.floats(), stream_);
    RETURN_IF_ERROR(Product(L.q, ws.a.floats(), n, ws.qg.floats(), QW, mode));
    RETURN_IF_ERROR(Product(L.k, ws.a.floats(), n, ws.krows.floats(), KW, mode));
    RETURN_IF_ERROR(Product(L.v, ws.a.floats(), n, ws.vrows.floats(), KW, mode));
    RETURN_IF_ERROR(AttendRows(L, ws.qg.floats(), ws.krows.floats(), ws.vrows.floats(), n, cuda::Position{mtp.begin + slot + done, nullptr},
                               cuda::Position{slot + done, nullptr}, cuda::KvBuffers{rows.k.data(), rows.v.data(), KvDtype::kF32},
                               ws.attn.floats()));
    RETURN_IF_ERROR(Product(L.o, ws.attn.floats(), n, ws.mix.floats(), H, mode));
    cuda::AddRmsNorm(ws.x.floats(), ws.mix.floats(), L.post_norm, n, H, eps, ws.a.floats(), stream_);
    RETURN_IF_ERROR(Mlp(L, n, mode));
    cuda::AddRows(ws.mix.floats(), n * H, ws.x.floats(), stream_);
    done += n;
    if (out != nullptr && done == total) cuda::RmsNormRows(ws.x.floats() + (n - 1) * H, head.norm, 1, H, eps, out, stream_);
  }
  return Status::Ok();
}

Status CudaForward::MtpCommit(MtpState& mtp, std::span<const int32_t> next_ids) {
  if (!mtp_) return Unsupported("the checkpoint has no MTP head");
  RETURN_IF_ERROR(CheckMtpIds(mtp, next_ids, false, config_.vocab_size, "MtpCommit"));
  const int64_t n = static_cast<int64_t>(next_ids.size());
  if (n == 0) return Status::Ok();
  if (!HoldsMtpRows(mtp)) return InvalidArgument("MtpCommit: the waiting rows are not on this device");
  DeviceMtp& rows = MtpRowsOf(mtp);
  const Status made = MtpRows(mtp, rows.pending.floats() + rows.first * config_.hidden_size, next_ids, mtp.rows, nullptr);
  if (GaveUpMtpRows(made, mtp)) return Status::Ok();
  RETURN_IF_ERROR(made);
  rows.first += n;
  mtp.pending_rows -= n;
  mtp.rows += n;
  return cuda::Synchronize(stream_, "the MTP head's rows");
}

Result<std::vector<int32_t>> CudaForward::MtpDraft(MtpState& mtp, std::span<const int32_t> next_ids, int max_draft, int64_t vocab_limit,
                                                   std::vector<float>* all_logits) {
  if (!mtp_) return Unsupported("the checkpoint has no MTP head");
  RETURN_IF_ERROR(CheckMtpIds(mtp, next_ids, true, config_.vocab_size, "MtpDraft"));
  if (!HoldsMtpRows(mtp)) return InvalidArgument("MtpDraft: the waiting rows are not on this device");
  const int64_t n = static_cast<int64_t>(next_ids.size()), H = config_.hidden_size, V = std::min(vocab_limit, config_.vocab_size);
  DeviceMtp& rows = MtpRowsOf(mtp);
  float* out = ws_->mtp_out.floats();
  const Status made = MtpRows(mtp, rows.pending.floats() + rows.first * H, next_ids, mtp.rows, out);
  if (GaveUpMtpRows(made, mtp)) return std::vector<int32_t>();
  RETURN_IF_ERROR(made);
  rows.first = 0;
  mtp.pending_rows = 0;
  mtp.rows += n;
  std::vector<int32_t> drafts;
  std::vector<float> logits(static_cast<size_t>(config_.vocab_size));
  if (all_logits != nullptr) all_logits->clear();
  for (int j = 0; j < max_draft; ++j) {
    if (j > 0) {  // the head's own output and its last draft, one position on
      const int32_t last = drafts.back();
      const Status made_next = MtpRows(mtp, out, std::span<const int32_t>(&last, 1), mtp.rows + j - 1, out);
      if (GaveUpMtpRows(made_next, mtp)) break;  // the drafts so far stand
      RETURN_IF_ERROR(made_next);
    }
    GemvOf(lm_head_, out, 1, ws_->logits.floats());
    RETURN_IF_ERROR(cuda::CopyToHost(logits.data(), ws_->logits.data(), logits.size() * sizeof(float), stream_));
    if (all_logits != nullptr) all_logits->insert(all_logits->end(), logits.begin(), logits.end());
    drafts.push_back(static_cast<int32_t>(std::max_element(logits.begin(), logits.begin() + V) - logits.begin()));
  }
  RETURN_IF_ERROR(cuda::Synchronize(stream_, "the MTP head's drafts"));
  return drafts;
}

Status CudaForward::Mlp(const Layer& L, int64_t n, Mode mode) {
  const int64_t H = config_.hidden_size, I = config_.intermediate_size;
  Workspace& ws = *ws_;
  if (mode == Mode::kRecurrent) {  // one row: gate, up and their product in one launch
    cuda::GemvSwiGlu(L.gate.w, L.up.w, I, H, ws.a.floats(), ws.gate.floats(), stream_, L.gate.q8, L.up.q8);
  } else {
    RETURN_IF_ERROR(Product(L.gate, ws.a.floats(), n, ws.gate.floats(), I, mode));
    RETURN_IF_ERROR(Product(L.up, ws.a.floats(), n, ws.up.floats(), I, mode));
    cuda::SwiGlu(ws.gate.floats(), ws.up.floats(), n * I, stream_);
  }
  return Product(L.down, ws.gate.floats(), n, ws.mix.floats(), H, mode);
}

}  // namespace anchorage
