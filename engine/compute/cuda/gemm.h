// Prefill products through cuBLASLt: y = x W^T with bf16 weights W [N, K] (row-major, read in place)
// and fp32 activations x [n, K] split into a bf16 high and low row stacked in one GEMM (the weights
// are read once), fp32 accumulation and output, the two halves summed; with fast products the high
// rows alone (each activation rounded to bf16 once: half the GEMM). One algorithm per weight
// shape, chosen once for the largest call and used for every n, with no split-K (and no workspace
// where cuBLASLt offers such an algorithm): a row's bits are the same in a call of any number of
// rows, and every run gives the same bits.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "engine/compute/cuda/device.h"
#include "engine/core/status.h"

namespace anchorage::cuda {

class LtGemm {
 public:
  // max_rows: the most activation rows one call takes; fast: the high rows alone (fast precision).
  static Result<std::unique_ptr<LtGemm>> Create(int64_t max_rows, int64_t max_k, int64_t max_n, Stream s, bool fast = false);
  ~LtGemm();

  // Chooses the algorithm of weight shape [N, K] (w: that matrix on the device); Run needs it first.
  // It then runs the algorithm on max_rows random rows, on the first row alone and on the last alone:
  // where the rows' bits differ, or cuBLASLt offers no algorithm without split-K, or
  // ANCHORAGE_CUDA_GEMM=simt is set, the shape falls back to GemmSimt (exact, slower).
  Status Prepare(int64_t N, int64_t K, const uint16_t* w);
  // y[t * y_stride + j] = sum_i x[t, i] W[j, i] for t < n <= max_rows (device pointers).
  Status Run(const uint16_t* w, int64_t N, int64_t K, const float* x, int64_t n, float* y, int64_t y_stride);
  // The algorithms chosen, one line a shape: part of the state fingerprint.
  std::string Describe() const;

 private:
  struct Plan;
  LtGemm() = default;
  // The sizes and the split and product scratch both implementations (cuBLASLt, the emulator's) share.
  Status InitScratch(int64_t max_rows, int64_t max_k, int64_t max_n, Stream s, bool fast) {
    stream_ = s;
    stacks_ = fast ? 1 : 2;
    max_rows_ = max_rows;
    max_k_ = max_k;
    max_n_ = max_n;
    ASSIGN_OR_RETURN(split_, DeviceBuffer::Allocate(static_cast<size_t>(2 * max_rows * max_k) * 2, "split activation rows"));
    ASSIGN_OR_RETURN(halves_, DeviceBuffer::Allocate(static_cast<size_t>(2 * max_rows * max_n) * 4, "product halves"));
    return Status::Ok();
  }
  // cuBLASLt's algorithm for [N, K], or the CUDA-core fallback where it has none without split-K.
  Status ChooseAlgorithm(int64_t N, int64_t K);
  Result<bool> RowsIndependent(const uint16_t* w, int64_t N, int64_t K);

  void* handle_ = nullptr;  // cublasLtHandle_t
  Stream stream_ = nullptr;
  int64_t max_rows_ = 0, max_k_ = 0, max_n_ = 0;
  int64_t stacks_ = 2;  // the split's rows a GEMM takes a row: high and low, or the high alone (fast)
  DeviceBuffer split_;   // bf16 [2 * max_rows, max_k]
  DeviceBuffer halves_;  // fp32 [2 * max_rows, max_n]
  DeviceBuffer workspace_;  // only when an algorithm needs one
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<Plan>> plans_;
};

}  // namespace anchorage::cuda
