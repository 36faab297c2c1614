// The vision tower on a CUDA device: VisionTower's math on the backend's kernels and split products
// (bidirectional attention, LayerNorm, GELU, 2-D rotary), on a stream of its own so that an image
// encodes from a request's thread beside the model's forward. The same patches give the same bits on
// every run (every kernel has a fixed order); the bits are this device's, near the CPU tower's.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "engine/compute/cuda/device.h"
#include "engine/compute/cuda/gemm.h"
#include "engine/core/status.h"
#include "engine/image/image_patches.h"
#include "engine/model/model_config.h"
#include "engine/model/weights.h"

namespace anchorage {

class CudaVisionTower {
 public:
  // Copies the tower's matrices to device `device` (BF16 as they are, F16 and F32 rounded to BF16; FP8
  // is refused, as on the CPU). device_mutex is held while an image encodes: the forward holds it while
  // it captures a decode step, which another thread's work on the legacy stream would break.
  static Result<std::unique_ptr<CudaVisionTower>> Create(const VisionConfig& config, const VisionWeights& weights, int device,
                                                         bool fast_products, std::mutex& device_mutex);
  ~CudaVisionTower();

  // VisionTower::Encode on the device, one image at a time; its work memory is allocated for the image
  // and given back after (ResourceExhausted where the device has no room).
  Result<std::vector<float>> Encode(const ImageGrid& grid, std::span<const float> patches);
  int64_t weight_bytes() const { return weight_bytes_; }
  // The products' algorithms, one line a shape: an image's rows depend on them, so the states' key names them.
  std::string KernelSet() const { return gemm_->Describe(); }

 private:
  struct Matrix {
    const uint16_t* w = nullptr;  // bf16 [rows, cols] row-major, device
    int64_t rows = 0, cols = 0;
    const float* bias = nullptr;  // [rows], device
  };
  struct Block {
    const float *norm1_w = nullptr, *norm1_b = nullptr, *norm2_w = nullptr, *norm2_b = nullptr;
    Matrix qkv, proj, fc1, fc2;
  };
  CudaVisionTower(const VisionConfig& config, int device, std::mutex& device_mutex);
  Result<Matrix> UploadMatrix(const TensorView& w, const TensorView& bias, int64_t rows, int64_t cols, const char* role);
  Result<const float*> UploadVector(const TensorView& t, int64_t n, const char* role);
  // y = act(x m^T + bias) for n rows, in pieces of the product's rows.
  Status Linear(const Matrix& m, const float* x, int64_t n, float* y, cuda::Activation act);

  VisionConfig config_;
  int device_ = 0;
  std::mutex& device_mutex_;
  cuda::Stream stream_ = nullptr;
  std::unique_ptr<cuda::LtGemm> gemm_;
  std::vector<cuda::DeviceBuffer> buffers_;  // weights and vectors
  std::vector<float> pos_embed_;              // host: the positions are interpolated there
  Matrix patch_embed_, merger_fc1_, merger_fc2_;
  const float *merger_norm_w_ = nullptr, *merger_norm_b_ = nullptr;
  std::vector<Block> blocks_;
  int64_t weight_bytes_ = 0;
};

}  // namespace anchorage
