#include "engine/compute/cuda/gemm.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace anchorage::cuda {
namespace {

constexpr int kCandidates = 16;
constexpr size_t kWorkspaceBytes = size_t{32} << 20;

Status LtStatus(cublasStatus_t code, const std::string& what) {
  if (code == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  return Internal("cuBLASLt: " + what + ": status " + std::to_string(static_cast<int>(code)));
}

cublasLtHandle_t Handle(void* h) { return static_cast<cublasLtHandle_t>(h); }

// The layouts of one call: A is W (K x N column-major, used transposed), B the split rows
// (K x stacks*n column-major: the high rows, then the low ones unless fast), C and D the products
// (N x stacks*n column-major).
struct Layouts {
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  Layouts() = default;
  Layouts(const Layouts&) = delete;
  Layouts& operator=(const Layouts&) = delete;
  ~Layouts() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
  }
  Status Make(int64_t N, int64_t K, int64_t n, int64_t stacks) {
    RETURN_IF_ERROR(LtStatus(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, K, N, K), "layout of the weights"));
    RETURN_IF_ERROR(LtStatus(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, K, stacks * n, K), "layout of the split rows"));
    return LtStatus(cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, N, stacks * n, N), "layout of the products");
  }
};

}  // namespace

struct LtGemm::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatmulAlgo_t algo{};
  uint64_t workspace = 0;  // bytes of workspace the algorithm may use
  int64_t min_rows = 1;    // calls of fewer rows run padded to this many
  bool simt = false;       // GemmSimt instead of cuBLASLt
  ~Plan() {
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

Result<std::unique_ptr<LtGemm>> LtGemm::Create(int64_t max_rows, int64_t max_k, int64_t max_n, Stream s, bool fast) {
  std::unique_ptr<LtGemm> gemm(new LtGemm());
  cublasLtHandle_t handle = nullptr;
  RETURN_IF_ERROR(LtStatus(cublasLtCreate(&handle), "creating the handle"));
  gemm->handle_ = handle;
  RETURN_IF_ERROR(gemm->InitScratch(max_rows, max_k, max_n, s, fast));
  return gemm;
}

LtGemm::~LtGemm() {
  plans_.clear();
  if (handle_ != nullptr) cublasLtDestroy(Handle(handle_));
}

// Whether row t of a call of all max_rows rows has the bits of the same row alone, for the first and
// the last row: the property the exactness contract needs of the chosen algorithm.
Result<bool> LtGemm::RowsIndependent(const uint16_t* w, int64_t N, int64_t K) {
  std::vector<float> x(static_cast<size_t>(max_rows_ * K));
  uint64_t z = 0x9e3779b97f4a7c15ull;
  for (float& v : x) {
    z = z * 6364136223846793005ull + 1442695040888963407ull;
    v = static_cast<float>(static_cast<int64_t>(z >> 40) - (1 << 23)) / static_cast<float>(1 << 22);
  }
  ASSIGN_OR_RETURN(DeviceBuffer dx, DeviceBuffer::Allocate(x.size() * 4, "a product check"));
  ASSIGN_OR_RETURN(DeviceBuffer all, DeviceBuffer::Allocate(static_cast<size_t>(max_rows_ * N) * 4, "a product check"));
  ASSIGN_OR_RETURN(DeviceBuffer one, DeviceBuffer::Allocate(static_cast<size_t>(N) * 4, "a product check"));
  RETURN_IF_ERROR(CopyToDevice(dx.data(), x.data(), x.size() * 4, stream_));
  RETURN_IF_ERROR(Run(w, N, K, dx.floats(), max_rows_, all.floats(), N));
  std::vector<float> whole(static_cast<size_t>(max_rows_ * N)), alone(static_cast<size_t>(N));
  RETURN_IF_ERROR(CopyToHost(whole.data(), all.data(), whole.size() * 4, stream_));
  for (const int64_t t : {int64_t{0}, max_rows_ - 1}) {
    RETURN_IF_ERROR(Run(w, N, K, dx.floats() + t * K, 1, one.floats(), N));
    RETURN_IF_ERROR(CopyToHost(alone.data(), one.data(), alone.size() * 4, stream_));
    if (std::memcmp(alone.data(), whole.data() + t * N, alone.size() * 4) != 0) return false;
  }
  return true;
}

Status LtGemm::Prepare(int64_t N, int64_t K, const uint16_t* w) {
  if (plans_.count({N, K})) return Status::Ok();
  if (const char* forced = std::getenv("ANCHORAGE_CUDA_GEMM"); forced != nullptr && std::string(forced) == "simt") {
    auto plan = std::make_unique<Plan>();
    plan->simt = true;
    plans_[{N, K}] = std::move(plan);
    return Status::Ok();
  }
  RETURN_IF_ERROR(ChooseAlgorithm(N, K));
  Plan& plan = *plans_[{N, K}];
  if (plan.simt) return Status::Ok();
  ASSIGN_OR_RETURN(const bool independent, RowsIndependent(w, N, K));
  if (!independent) plan.simt = true;
  return Status::Ok();
}

Status LtGemm::ChooseAlgorithm(int64_t N, int64_t K) {
  if (K > max_k_ || N > max_n_)
    return InvalidArgument("LtGemm: shape " + std::to_string(N) + " x " + std::to_string(K) + " exceeds the scratch");
  auto plan = std::make_unique<Plan>();
  RETURN_IF_ERROR(LtStatus(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "creating a matmul"));
  const cublasOperation_t transpose = CUBLAS_OP_T;
  RETURN_IF_ERROR(LtStatus(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof transpose),
                           "transposing the weights"));
  Layouts largest;
  RETURN_IF_ERROR(largest.Make(N, K, max_rows_, stacks_));
  // Without workspace first, then with; the reduction-scheme filter first, then without it (split-K
  // is refused below either way).
  struct Ask {
    uint64_t workspace;
    bool filter_reduction;
  };
  for (const Ask ask : {Ask{0, true}, Ask{0, false}, Ask{kWorkspaceBytes, true}, Ask{kWorkspaceBytes, false}}) {
    cublasLtMatmulPreference_t pref = nullptr;
    RETURN_IF_ERROR(LtStatus(cublasLtMatmulPreferenceCreate(&pref), "creating a preference"));
    const uint32_t no_reduction = CUBLASLT_REDUCTION_SCHEME_NONE;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ask.workspace, sizeof ask.workspace);
    if (ask.filter_reduction)
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &no_reduction, sizeof no_reduction);
    std::vector<cublasLtMatmulHeuristicResult_t> found(kCandidates);
    int count = 0;
    const cublasStatus_t asked = cublasLtMatmulAlgoGetHeuristic(Handle(handle_), plan->desc, largest.a, largest.b, largest.c,
                                                                largest.c, pref, kCandidates, found.data(), &count);
    cublasLtMatmulPreferenceDestroy(pref);
    if (asked != CUBLAS_STATUS_SUCCESS) count = 0;
    for (int i = 0; i < count; ++i) {
      cublasLtMatmulAlgo_t algo = found[i].algo;
      int32_t splits = 1;
      size_t written = 0;
      cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof splits, &written);
      if (splits > 1 || found[i].workspaceSize > ask.workspace) continue;
      // The fewest rows the algorithm takes: calls with fewer are padded to it (rows stay independent).
      int64_t min_rows = 0;
      for (int64_t rows = 1; rows <= max_rows_ && min_rows == 0; rows *= 2) {
        Layouts small;
        RETURN_IF_ERROR(small.Make(N, K, rows, stacks_));
        cublasLtMatmulHeuristicResult_t check{};
        if (cublasLtMatmulAlgoCheck(Handle(handle_), plan->desc, small.a, small.b, small.c, small.c, &algo, &check) ==
                CUBLAS_STATUS_SUCCESS &&
            check.workspaceSize <= ask.workspace)
          min_rows = rows;
      }
      if (min_rows == 0) continue;
      if (ask.workspace > 0 && workspace_.bytes() == 0) {
        ASSIGN_OR_RETURN(workspace_, DeviceBuffer::Allocate(kWorkspaceBytes, "cuBLASLt workspace"));
      }
      plan->algo = algo;
      plan->workspace = ask.workspace;
      plan->min_rows = min_rows;
      plans_[{N, K}] = std::move(plan);
      return Status::Ok();
    }
  }
  plan->simt = true;  // no algorithm without split-K: the CUDA-core GEMM
  plans_[{N, K}] = std::move(plan);
  return Status::Ok();
}

Status LtGemm::Run(const uint16_t* w, int64_t N, int64_t K, const float* x, int64_t n, float* y, int64_t y_stride) {
  if (n <= 0) return Status::Ok();
  if (n > max_rows_) return InvalidArgument("LtGemm: " + std::to_string(n) + " rows, at most " + std::to_string(max_rows_));
  auto it = plans_.find({N, K});
  if (it == plans_.end()) return Internal("LtGemm: shape " + std::to_string(N) + " x " + std::to_string(K) + " was not prepared");
  const Plan& plan = *it->second;
  if (plan.simt) {
    GemmSimt(w, N, K, x, n, y, y_stride, stream_);
    return Status::Ok();
  }
  const int64_t rows = std::max(n, plan.min_rows);  // padding rows hold whatever was there; their outputs are dropped
  auto* split = static_cast<uint16_t*>(split_.data());
  SplitBf16(x, n, K, rows, stacks_ == 2, split, stream_);
  Layouts layouts;
  RETURN_IF_ERROR(layouts.Make(N, K, rows, stacks_));
  const float one = 1.0f, zero = 0.0f;
  void* workspace = plan.workspace > 0 ? workspace_.data() : nullptr;
  RETURN_IF_ERROR(LtStatus(cublasLtMatmul(Handle(handle_), plan.desc, &one, w, layouts.a, split, layouts.b, &zero, halves_.floats(),
                                          layouts.c, halves_.floats(), layouts.c, &plan.algo, workspace, plan.workspace, stream_),
                           "running a product"));
  SumHalves(halves_.floats(), n, N, rows, stacks_ == 2, y, y_stride, stream_);
  return Status::Ok();
}

std::string LtGemm::Describe() const {
  std::string out = stacks_ == 1 ? "fast: activations rounded to bf16 once\n" : "";
  for (const auto& [shape, plan] : plans_) {
    if (plan->simt) {
      out += std::to_string(shape.first) + "x" + std::to_string(shape.second) + " cuda-core fp32 k-order gemm\n";
      continue;
    }
    char line[256];
    int32_t id = 0, tile = 0, stages = 0, splits = 0, swizzle = 0, custom = 0;
    size_t written = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&plan->algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &written);
    cublasLtMatmulAlgoConfigGetAttribute(&plan->algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &written);
    cublasLtMatmulAlgoConfigGetAttribute(&plan->algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &written);
    cublasLtMatmulAlgoConfigGetAttribute(&plan->algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof splits, &written);
    cublasLtMatmulAlgoConfigGetAttribute(&plan->algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swizzle, sizeof swizzle, &written);
    cublasLtMatmulAlgoConfigGetAttribute(&plan->algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &custom, sizeof custom, &written);
    std::snprintf(line, sizeof line,
                  "%lldx%lld algo %d tile %d stages %d splitk %d swizzle %d custom %d workspace %llu min rows %lld data",
                  static_cast<long long>(shape.first), static_cast<long long>(shape.second), id, tile, stages, splits, swizzle,
                  custom, static_cast<unsigned long long>(plan->workspace), static_cast<long long>(plan->min_rows));
    out += line;
    for (uint64_t word : plan->algo.data) {  // the whole opaque algorithm: inner and cluster shapes too
      std::snprintf(line, sizeof line, " %016llx", static_cast<unsigned long long>(word));
      out += line;
    }
    out += '\n';
  }
  return out;
}

}  // namespace anchorage::cuda
