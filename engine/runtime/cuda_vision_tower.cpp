#include "engine/runtime/cuda_vision_tower.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "engine/runtime/cuda_forward.h"
#include "engine/runtime/forward.h"
#include "engine/runtime/vision_tower.h"

namespace anchorage {

namespace {

using cuda::DeviceBuffer;

constexpr float kLayerNormEps = 1e-6f;
constexpr int64_t kProductRows = 1024;  // rows a product call takes; longer images run in pieces

}  // namespace

CudaVisionTower::CudaVisionTower(const VisionConfig& config, int device, std::mutex& device_mutex)
    : config_(config), device_(device), device_mutex_(device_mutex) {}

CudaVisionTower::~CudaVisionTower() {
  gemm_.reset();
  buffers_.clear();
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

Result<std::unique_ptr<CudaVisionTower>> CudaVisionTower::Create(const VisionConfig& c, const VisionWeights& w, int device, bool fast_products,
                                                                 std::mutex& device_mutex) {
  if (c.head_dim() > cuda::kMaxHeadDim || c.head_dim() % 4 != 0)
    return Unsupported("CudaVisionTower: a head of " + std::to_string(c.head_dim()) + " values; the device's attention takes multiples of 4 up to " +
                       std::to_string(cuda::kMaxHeadDim));
  if (static_cast<int64_t>(w.blocks.size()) != c.depth)
    return InvalidArgument("CudaVisionTower: " + std::to_string(w.blocks.size()) + " blocks for a depth of " + std::to_string(c.depth));
  std::unique_ptr<CudaVisionTower> t(new CudaVisionTower(c, device, device_mutex));
  std::lock_guard<std::mutex> lock(device_mutex);
  RETURN_IF_ERROR(cuda::UseDevice(device));
  cudaStream_t stream = nullptr;
  RETURN_IF_ERROR(cuda::CudaStatus(cudaStreamCreate(&stream), "creating the vision tower's stream"));
  t->stream_ = stream;
  const int64_t D = c.hidden_size, I = c.intermediate_size, M = c.merged_width(), P = c.patch_values(), out = c.out_hidden_size;
  ASSIGN_OR_RETURN(t->pos_embed_, TensorValues(w.pos_embed, c.num_position_embeddings * D, 0.0f, "CudaVisionTower", "pos_embed"));
  ASSIGN_OR_RETURN(t->patch_embed_, t->UploadMatrix(w.patch_embed_weight, w.patch_embed_bias, D, P, "patch_embed.proj"));
  for (const VisionBlockWeights& bw : w.blocks) {
    Block b;
    ASSIGN_OR_RETURN(b.norm1_w, t->UploadVector(bw.norm1_weight, D, "norm1.weight"));
    ASSIGN_OR_RETURN(b.norm1_b, t->UploadVector(bw.norm1_bias, D, "norm1.bias"));
    ASSIGN_OR_RETURN(b.norm2_w, t->UploadVector(bw.norm2_weight, D, "norm2.weight"));
    ASSIGN_OR_RETURN(b.norm2_b, t->UploadVector(bw.norm2_bias, D, "norm2.bias"));
    ASSIGN_OR_RETURN(b.qkv, t->UploadMatrix(bw.qkv_weight, bw.qkv_bias, 3 * D, D, "attn.qkv"));
    ASSIGN_OR_RETURN(b.proj, t->UploadMatrix(bw.proj_weight, bw.proj_bias, D, D, "attn.proj"));
    ASSIGN_OR_RETURN(b.fc1, t->UploadMatrix(bw.fc1_weight, bw.fc1_bias, I, D, "mlp.linear_fc1"));
    ASSIGN_OR_RETURN(b.fc2, t->UploadMatrix(bw.fc2_weight, bw.fc2_bias, D, I, "mlp.linear_fc2"));
    t->blocks_.push_back(b);
  }
  ASSIGN_OR_RETURN(t->merger_norm_w_, t->UploadVector(w.merger_norm_weight, D, "merger.norm.weight"));
  ASSIGN_OR_RETURN(t->merger_norm_b_, t->UploadVector(w.merger_norm_bias, D, "merger.norm.bias"));
  ASSIGN_OR_RETURN(t->merger_fc1_, t->UploadMatrix(w.merger_fc1_weight, w.merger_fc1_bias, M, M, "merger.linear_fc1"));
  ASSIGN_OR_RETURN(t->merger_fc2_, t->UploadMatrix(w.merger_fc2_weight, w.merger_fc2_bias, out, M, "merger.linear_fc2"));
  ASSIGN_OR_RETURN(t->gemm_, cuda::LtGemm::Create(kProductRows, std::max({P, D, I, M}), std::max({3 * D, I, M, out}), t->stream_, fast_products));
  std::vector<const Matrix*> matrices = {&t->patch_embed_, &t->merger_fc1_, &t->merger_fc2_};
  for (const Block& b : t->blocks_)
    for (const Matrix* m : {&b.qkv, &b.proj, &b.fc1, &b.fc2}) matrices.push_back(m);
  for (const Matrix* m : matrices) RETURN_IF_ERROR(t->gemm_->Prepare(m->rows, m->cols, m->w));
  RETURN_IF_ERROR(cuda::Synchronize(t->stream_, "preparing the vision tower"));
  return t;
}

Result<CudaVisionTower::Matrix> CudaVisionTower::UploadMatrix(const TensorView& w, const TensorView& bias, int64_t rows, int64_t cols,
                                                              const char* role) {
  RETURN_IF_ERROR(CheckMatrixShape(w, rows, cols, "CudaVisionTower", role));
  if (w.dtype == DType::kF8E4M3) return Unsupported("CudaVisionTower: " + w.name + " is FP8; the vision tower runs BF16, F16 or F32 weights");
  ASSIGN_OR_RETURN(DeviceBuffer buffer, UploadBf16Matrix(w, rows, cols, stream_));
  Matrix m;
  m.w = static_cast<const uint16_t*>(buffer.data());
  m.rows = rows;
  m.cols = cols;
  weight_bytes_ += static_cast<int64_t>(buffer.bytes());
  buffers_.push_back(std::move(buffer));
  ASSIGN_OR_RETURN(m.bias, UploadVector(bias, rows, (std::string(role) + ".bias").c_str()));
  return m;
}

Result<const float*> CudaVisionTower::UploadVector(const TensorView& t, int64_t n, const char* role) {
  ASSIGN_OR_RETURN(const std::vector<float> values, TensorValues(t, n, 0.0f, "CudaVisionTower", role));
  ASSIGN_OR_RETURN(DeviceBuffer buffer, DeviceBuffer::Allocate(values.size() * sizeof(float), t.name));
  RETURN_IF_ERROR(cuda::CopyToDevice(buffer.data(), values.data(), values.size() * sizeof(float), stream_));
  const float* p = buffer.floats();
  weight_bytes_ += static_cast<int64_t>(buffer.bytes());
  buffers_.push_back(std::move(buffer));
  return p;
}

Status CudaVisionTower::Linear(const Matrix& m, const float* x, int64_t n, float* y, cuda::Activation act) {
  for (int64_t r = 0; r < n; r += kProductRows)
    RETURN_IF_ERROR(gemm_->Run(m.w, m.rows, m.cols, x + r * m.cols, std::min(kProductRows, n - r), y + r * m.rows, m.rows));
  cuda::BiasActivation(y, m.bias, n, m.rows, act, stream_);
  return Status::Ok();
}

Result<std::vector<float>> CudaVisionTower::Encode(const ImageGrid& grid, std::span<const float> patches) {
  const VisionConfig& c = config_;
  RETURN_IF_ERROR(CheckTowerInput(c, grid, patches));
  const int64_t n = grid.patches(), D = c.hidden_size, I = c.intermediate_size, P = c.patch_values(), hd = c.head_dim();
  const int64_t m = c.spatial_merge_size, rows = n / (m * m), frame = grid.h * grid.w;
  const std::vector<float> positions = VisionPatchPositions(c, pos_embed_, grid);
  std::vector<float> cos, sin;
  VisionRotaryTable(c, grid, &cos, &sin);

  std::lock_guard<std::mutex> lock(device_mutex_);
  RETURN_IF_ERROR(cuda::UseDevice(device_));
  const auto floats = [](int64_t count) { return static_cast<size_t>(count) * sizeof(float); };
  DeviceBuffer x, h, attended, down, qkv, wide, cos_d, sin_d, out;
  for (auto [buffer, count, what] : {std::tuple{&x, n * D, "the tower's rows"}, {&h, n * D, "the tower's normed rows"},
                                     {&attended, n * D, "the tower's attention rows"}, {&down, n * D, "the tower's residual rows"},
                                     {&qkv, n * 3 * D, "the tower's qkv rows"}, {&wide, n * std::max({P, I, D}), "the tower's MLP rows"},
                                     {&cos_d, n * hd / 2, "the tower's rotary table"}, {&sin_d, n * hd / 2, "the tower's rotary table"},
                                     {&out, rows * c.out_hidden_size, "an image's prompt rows"}}) {
    auto allocated = DeviceBuffer::Allocate(floats(count), what);
    if (!allocated.ok())
      return ResourceExhausted("the GPU has no room to encode an image of " + std::to_string(n) + " patches: " + allocated.status().message());
    *buffer = std::move(allocated).value();
  }
  RETURN_IF_ERROR(cuda::CopyToDevice(wide.data(), patches.data(), floats(n * P), stream_));
  RETURN_IF_ERROR(cuda::CopyToDevice(down.data(), positions.data(), floats(n * D), stream_));
  RETURN_IF_ERROR(cuda::CopyToDevice(cos_d.data(), cos.data(), floats(n * hd / 2), stream_));
  RETURN_IF_ERROR(cuda::CopyToDevice(sin_d.data(), sin.data(), floats(n * hd / 2), stream_));
  RETURN_IF_ERROR(Linear(patch_embed_, wide.floats(), n, x.floats(), cuda::Activation::kNone));
  cuda::AddRows(down.floats(), n * D, x.floats(), stream_);

  cuda::AttentionShape shape{c.num_heads, c.num_heads, hd, static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)))};
  shape.keys = frame;  // each frame attends within itself
  for (const Block& b : blocks_) {
    cuda::LayerNormRows(x.floats(), b.norm1_w, b.norm1_b, n, D, kLayerNormEps, h.floats(), stream_);
    RETURN_IF_ERROR(Linear(b.qkv, h.floats(), n, qkv.floats(), cuda::Activation::kNone));
    cuda::RotateHalves(qkv.floats(), n, 3 * D, 2 * c.num_heads, hd, cos_d.floats(), sin_d.floats(), stream_);  // q's heads, then k's
    for (int64_t f = 0; f < grid.t; ++f) {
      float* base = qkv.floats() + f * frame * 3 * D;
      const cuda::KvBuffers kv{base + D, base + 2 * D, KvDtype::kF32};
      cuda::Attention(shape, base, 3 * D, hd, frame, cuda::Position{}, kv, 3 * D, nullptr, attended.floats() + f * frame * D, D, stream_);
    }
    RETURN_IF_ERROR(Linear(b.proj, attended.floats(), n, down.floats(), cuda::Activation::kNone));
    cuda::AddRows(down.floats(), n * D, x.floats(), stream_);
    cuda::LayerNormRows(x.floats(), b.norm2_w, b.norm2_b, n, D, kLayerNormEps, h.floats(), stream_);
    RETURN_IF_ERROR(Linear(b.fc1, h.floats(), n, wide.floats(), cuda::Activation::kGeluTanh));
    RETURN_IF_ERROR(Linear(b.fc2, wide.floats(), n, down.floats(), cuda::Activation::kNone));
    cuda::AddRows(down.floats(), n * D, x.floats(), stream_);
  }
  // The merger: each merge x merge patches (consecutive in merge order) as one row of M values.
  cuda::LayerNormRows(x.floats(), merger_norm_w_, merger_norm_b_, n, D, kLayerNormEps, h.floats(), stream_);
  RETURN_IF_ERROR(Linear(merger_fc1_, h.floats(), rows, wide.floats(), cuda::Activation::kGeluErf));
  RETURN_IF_ERROR(Linear(merger_fc2_, wide.floats(), rows, out.floats(), cuda::Activation::kNone));
  std::vector<float> result(static_cast<size_t>(rows * c.out_hidden_size));
  RETURN_IF_ERROR(cuda::CopyToHost(result.data(), out.data(), floats(rows * c.out_hidden_size), stream_));
  RETURN_IF_ERROR(cuda::Synchronize(stream_, "encoding an image"));
  return result;
}

}  // namespace anchorage
