// LtGemm for the SIMT emulator: the split and the sum run as kernels, and a plain product (each
// output element over k in order, one fma a term) stands in for cuBLASLt. Calls of fewer than 8
// rows are padded to 8, as an algorithm with a minimum would be, so the padded layout is exercised.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "engine/compute/cuda/gemm.h"
#include "simt.h"

namespace anchorage::cuda {

struct LtGemm::Plan {
  bool simt = false;
};

namespace {
constexpr int64_t kMinRows = 8;
}  // namespace

Result<std::unique_ptr<LtGemm>> LtGemm::Create(int64_t max_rows, int64_t max_k, int64_t max_n, Stream s, bool fast) {
  std::unique_ptr<LtGemm> gemm(new LtGemm());
  RETURN_IF_ERROR(gemm->InitScratch(max_rows, max_k, max_n, s, fast));
  return gemm;
}

LtGemm::~LtGemm() = default;

Status LtGemm::Prepare(int64_t N, int64_t K, const uint16_t* w) {
  if (w == nullptr) return InvalidArgument("LtGemm: no weights to prepare " + std::to_string(N) + " x " + std::to_string(K) + " with");
  if (K > max_k_ || N > max_n_)
    return InvalidArgument("LtGemm: shape " + std::to_string(N) + " x " + std::to_string(K) + " exceeds the scratch");
  auto plan = std::make_unique<Plan>();
  const char* forced = std::getenv("ANCHORAGE_CUDA_GEMM");
  plan->simt = forced != nullptr && std::string(forced) == "simt";
  plans_.try_emplace({N, K}, std::move(plan));
  return Status::Ok();
}

Status LtGemm::ChooseAlgorithm(int64_t, int64_t) { return Status::Ok(); }
Result<bool> LtGemm::RowsIndependent(const uint16_t*, int64_t, int64_t) { return true; }


Status LtGemm::Run(const uint16_t* w, int64_t N, int64_t K, const float* x, int64_t n, float* y, int64_t y_stride) {
  if (n <= 0) return Status::Ok();
  if (n > max_rows_) return InvalidArgument("LtGemm: " + std::to_string(n) + " rows, at most " + std::to_string(max_rows_));
  auto it = plans_.find({N, K});
  if (it == plans_.end()) return Internal("LtGemm: shape " + std::to_string(N) + " x " + std::to_string(K) + " was not prepared");
  if (it->second->simt) {
    GemmSimt(w, N, K, x, n, y, y_stride, stream_);
    return Status::Ok();
  }
  const int64_t rows = std::max(n, std::min<int64_t>(kMinRows, max_rows_));
  auto* split = static_cast<uint16_t*>(split_.data());
  SplitBf16(x, n, K, rows, stacks_ == 2, split, stream_);
  float* halves = halves_.floats();
  const int64_t stacks = stacks_;
  simt::Submit([=] {  // on the stream, between the split and the sum
    const auto widen = [](uint16_t v) { return std::bit_cast<float>(static_cast<uint32_t>(v) << 16); };
    for (int64_t col = 0; col < stacks * rows; ++col) {  // cuBLASLt's column-major view: column col is split row col
      const uint16_t* b = split + col * K;
      for (int64_t j = 0; j < N; ++j) {
        const uint16_t* a = w + j * K;
        float acc = 0.0f;
        for (int64_t i = 0; i < K; ++i) acc = std::fma(widen(a[i]), widen(b[i]), acc);
        halves[col * N + j] = acc;
      }
    }
  });
  SumHalves(halves, n, N, rows, stacks == 2, y, y_stride, stream_);
  return Status::Ok();
}

std::string LtGemm::Describe() const {
  std::string out = stacks_ == 1 ? "fast: activations rounded to bf16 once\n" : "";
  for (const auto& [shape, plan] : plans_)
    out += std::to_string(shape.first) + "x" + std::to_string(shape.second) +
           (plan->simt ? " cuda-core fp32 k-order gemm\n" : " emulated k-order product\n");
  return out;
}

}  // namespace anchorage::cuda
