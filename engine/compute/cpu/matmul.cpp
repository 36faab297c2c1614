#include "engine/compute/cpu/matmul.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "engine/compute/cpu/cpu_features.h"
#include "engine/compute/cpu/fp32_block.h"
#include "engine/compute/cpu/gemm_block.h"

namespace anchorage::cpu {
namespace {

using BlockFn = void (*)(const GemmBlock&);

BlockFn BlockOf(KernelPath path) {
  switch (path) {
    case KernelPath::kAvx2Fma: return GemmBlockAvx2;
    case KernelPath::kAvx512F: return GemmBlockAvx512;
    case KernelPath::kEmulated16: return GemmBlockEmulated16;
    case KernelPath::kPortable: break;
  }
  return GemmBlockPortable;
}

KernelPath InitialPath() {
  const KernelPath best = AvailablePaths().front();
  const char* wanted = std::getenv("ANCHORAGE_KERNEL");
  if (wanted == nullptr || *wanted == '\0') return best;
  auto path = PathFromName(wanted);
  if (path.ok() && PathAvailable(*path)) return *path;
  std::fprintf(stderr, "anchorage: ANCHORAGE_KERNEL=%s is not a kernel path this CPU runs; using %s\n", wanted,
               PathName(best));
  return best;
}

std::atomic<KernelPath>& Active() {
  static std::atomic<KernelPath> active{InitialPath()};
  return active;
}

}  // namespace

const char* PathName(KernelPath path) {
  switch (path) {
    case KernelPath::kPortable: return "portable";
    case KernelPath::kAvx2Fma: return "avx2-fma";
    case KernelPath::kAvx512F: return "avx512f";
    case KernelPath::kEmulated16: return "emulated16";
  }
  return "?";
}

Result<KernelPath> PathFromName(const std::string& name) {
  for (KernelPath p : {KernelPath::kPortable, KernelPath::kAvx2Fma, KernelPath::kAvx512F, KernelPath::kEmulated16})
    if (name == PathName(p)) return p;
  return InvalidArgument("unknown kernel path '" + name + "' (portable, avx2-fma, avx512f, emulated16)");
}

bool PathAvailable(KernelPath path) {
  const CpuFeatures& f = DetectCpu();
  switch (path) {
    case KernelPath::kPortable:
    case KernelPath::kEmulated16: return true;
    case KernelPath::kAvx2Fma: return f.avx2 && f.fma;
    case KernelPath::kAvx512F: return f.avx512f;
  }
  return false;
}

std::vector<KernelPath> AvailablePaths() {
  std::vector<KernelPath> out;
  for (KernelPath p : {KernelPath::kAvx512F, KernelPath::kAvx2Fma, KernelPath::kPortable})
    if (PathAvailable(p)) out.push_back(p);
  return out;
}

KernelPath ActivePath() { return Active().load(std::memory_order_relaxed); }

Status SetActivePath(KernelPath path) {
  if (!PathAvailable(path)) return InvalidArgument(std::string("this CPU cannot run the ") + PathName(path) + " kernels");
  Active().store(path, std::memory_order_relaxed);
  return Status::Ok();
}

const Fp32Kernels& Fp32KernelsOf(KernelPath path) {
  switch (path) {
    case KernelPath::kAvx2Fma: return kFp32Avx2;
    case KernelPath::kAvx512F: return kFp32Avx512;
    case KernelPath::kEmulated16: return kFp32Emulated16;
    case KernelPath::kPortable: break;
  }
  return kFp32Portable;
}

const char* ArithmeticName() { return "fp32-fma-k-order-v2"; }

void MatMulBf16(ThreadPool& pool, const float* x, int64_t m, int64_t ldx, const PackedBf16& w, float* y, int64_t ldy) {
  MatMulBf16On(ActivePath(), pool, x, m, ldx, w, y, ldy);
}

void MatMulBf16On(KernelPath path, ThreadPool& pool, const float* x, int64_t m, int64_t ldx, const PackedBf16& w,
                  float* y, int64_t ldy) {
  const int64_t n = w.rows(), k = w.cols();
  if (m <= 0 || n <= 0) return;
  if (k == 0) {
    for (int64_t r = 0; r < m; ++r) std::fill_n(y + r * ldy, n, 0.0f);
    return;
  }
  const BlockFn block = BlockOf(path);
  const int64_t task_columns = kGemmTaskPanels * kPanelColumns;
  const int64_t tasks = (n + task_columns - 1) / task_columns;
  const int64_t k_block = m <= 2 ? k : kGemmKBlock;
  pool.Run(static_cast<size_t>(tasks), [&](size_t t) {
    const int64_t first = static_cast<int64_t>(t) * task_columns;
    GemmBlock b;
    b.ldx = ldx;
    b.panels = w.panel(first / kPanelColumns);
    b.panel_count = std::min(kGemmTaskPanels, w.panels() - first / kPanelColumns);
    b.k = k;
    b.cols = std::min(task_columns, n - first);
    b.ldy = ldy;
    for (int64_t r0 = 0; r0 < m; r0 += kGemmRowBlock) {
      b.x = x + r0 * ldx;
      b.y = y + r0 * ldy + first;
      b.rows = std::min(kGemmRowBlock, m - r0);
      for (int64_t k0 = 0; k0 < k; k0 += k_block) {
        b.k0 = k0;
        b.k1 = std::min(k, k0 + k_block);
        b.accumulate = k0 > 0;
        block(b);
      }
    }
  });
}

}  // namespace anchorage::cpu
