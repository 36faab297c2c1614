#include "engine/compute/cpu/matmul.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "engine/compute/cpu/bf16_split.h"
#include "engine/compute/cpu/cpu_features.h"
#include "engine/compute/cpu/fp32_block.h"
#include "engine/compute/cpu/gemm_block.h"

namespace anchorage::cpu {
namespace {

GemmBlockFn BlockOf(KernelPath path) {
  switch (path) {
    case KernelPath::kAvx2Fma: return GemmBlockAvx2;
    case KernelPath::kAvx512F: return GemmBlockAvx512;
    case KernelPath::kAvx512Bf16: return GemmBlockAvx512Bf16;
    case KernelPath::kAmxBf16: return GemmBlockAmxBf16;
    case KernelPath::kEmulated16: return GemmBlockEmulated16;
    case KernelPath::kEmulatedBf16: return GemmBlockEmulatedBf16;
    case KernelPath::kEmulatedAmx: return GemmBlockEmulatedAmx;
    case KernelPath::kPortable: break;
  }
  return GemmBlockPortable;
}

using SplitFn = void (*)(const float* x, int64_t ldx, int64_t rows, int64_t k, int64_t pair_stride, uint32_t* out, int parts);

// The activation split of a bf16 path; null for the fp32 paths.
SplitFn SplitOf(KernelPath path) {
  switch (path) {
    case KernelPath::kAvx512Bf16: return SplitRowsAvx512Bf16;
    case KernelPath::kAmxBf16: return SplitRowsAmxBf16;
    case KernelPath::kEmulatedBf16:
    case KernelPath::kEmulatedAmx: return SplitRowsPortable;
    default: return nullptr;
  }
}

constexpr KernelPath kAllPaths[] = {KernelPath::kPortable,   KernelPath::kAvx2Fma,    KernelPath::kAvx512F,
                                    KernelPath::kAvx512Bf16, KernelPath::kAmxBf16,    KernelPath::kEmulated16,
                                    KernelPath::kEmulatedBf16, KernelPath::kEmulatedAmx};

// Words a part of a split row takes: the AMX paths read 16 pairs at a time, zero past the row's end.
int64_t PairStrideOf(KernelPath path, int64_t k) {
  const int64_t pairs = PairCount(k);
  if (ArithmeticOf(path) != Arithmetic::kBf16Amx) return pairs;
  const int64_t tile_pairs = kAmxChunk / 2;
  return (pairs + tile_pairs - 1) / tile_pairs * tile_pairs;
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

std::atomic<Precision>& ActivePrecisionSlot() {
  static std::atomic<Precision> precision{Precision::kExact};
  return precision;
}

// The rows packed into kRowGroup groups in the calling thread's buffer for more than kFewRows rows, else null.
const float* RowGroupsFor(ThreadPool& pool, const float* x, int64_t m, int64_t ldx, int64_t k) {
  if (m <= kFewRows) return nullptr;
  thread_local std::vector<float> group_buffer;
  const int64_t groups = (m + kRowGroup - 1) / kRowGroup;
  group_buffer.resize(static_cast<size_t>(groups * kRowGroup * k));
  float* out = group_buffer.data();
  const int64_t groups_a_task = 4;
  pool.Run(static_cast<size_t>((groups + groups_a_task - 1) / groups_a_task), [&](size_t t) {
    const int64_t r0 = static_cast<int64_t>(t) * groups_a_task * kRowGroup;
    PackRowGroups(x + r0 * ldx, ldx, std::min(groups_a_task * kRowGroup, m - r0), k, out + r0 * k);
  });
  return out;
}

// Whether there is nothing to multiply: no rows or columns, or k = 0 (then y's rows are zeroed).
bool EmptyProduct(int64_t m, int64_t n, int64_t k, float* y, int64_t ldy) {
  if (m <= 0 || n <= 0) return true;
  if (k > 0) return false;
  for (int64_t r = 0; r < m; ++r) std::fill_n(y + r * ldy, n, 0.0f);
  return true;
}

// One product's kernel and call fields (x_pairs, x_groups and x_codes at row 0), and the product itself.
struct PanelJob {
  GemmBlockFn block = nullptr;
  GemmBlock proto;
  const Product* product = nullptr;
  int64_t k_block = 0;
};

inline constexpr int64_t kTaskColumns = kGemmTaskPanels * kPanelColumns;

int64_t TasksOf(const PanelJob& job) { return (job.product->rows() + kTaskColumns - 1) / kTaskColumns; }

// Task t of a job: kGemmTaskPanels super-panels over row blocks of kGemmRowBlock and k blocks of job.k_block.
void RunPanelTask(const PanelJob& job, const float* x, int64_t m, int64_t t) {
  const int64_t first = t * kTaskColumns, panel = first / kPanelColumns;
  GemmBlock b = job.proto;
  if (const PackedBf16* w = job.product->bf16) {
    b.panels = w->panel(panel);
    b.panel_count = std::min(kGemmTaskPanels, w->panels() - panel);
  } else {
    const PackedQ8* q = job.product->q8;
    b.q8_panels = q->panel(panel);
    b.q8_scales = q->panel_scales(panel);
    b.panel_count = std::min(kGemmTaskPanels, q->panels() - panel);
  }
  b.cols = std::min(kTaskColumns, job.product->rows() - first);
  for (int64_t r0 = 0; r0 < m; r0 += kGemmRowBlock) {
    b.x = x + r0 * b.ldx;
    if (job.proto.x_pairs != nullptr) b.x_pairs = job.proto.x_pairs + r0 * kBf16Parts * b.pair_stride;
    if (job.proto.x_groups != nullptr) b.x_groups = job.proto.x_groups + r0 * b.k;
    if (job.proto.x_codes != nullptr) {
      b.x_codes = job.proto.x_codes + r0 * ActivationCodesStride(b.k);
      b.x_code_scales = job.proto.x_code_scales + r0 * ActivationScalesStride(b.k);
    }
    b.y = job.product->y + r0 * b.ldy + first;
    b.rows = std::min(kGemmRowBlock, m - r0);
    for (int64_t k0 = 0; k0 < b.k; k0 += job.k_block) {
      b.k0 = k0;
      b.k1 = std::min(b.k, k0 + job.k_block);
      b.accumulate = k0 > 0;
      job.block(b);
    }
  }
}

const Q8Kernels& Q8KernelsOf(KernelPath path) {
  switch (path) {
    case KernelPath::kAvx2Fma: return kQ8Avx2;
    case KernelPath::kAvx512F:
    case KernelPath::kAvx512Bf16:
    case KernelPath::kAmxBf16: return kQ8Avx512;
    case KernelPath::kEmulated16:
    case KernelPath::kEmulatedBf16:
    case KernelPath::kEmulatedAmx: return kQ8Emulated16;
    case KernelPath::kPortable: break;
  }
  return kQ8Portable;
}

std::atomic<bool>& VnniAllowed() {
  static std::atomic<bool> allowed{true};
  return allowed;
}

// The rows' first `parts` bf16 parts in the calling thread's buffer (the AMX layout gives a partial last row tile a
// whole tile's words).
const uint32_t* SplitRows(ThreadPool& pool, SplitFn split, const float* x, int64_t m, int64_t ldx, int64_t k,
                          int64_t pair_stride, int parts) {
  thread_local std::vector<uint32_t> buf;
  const int64_t rows_held = split == SplitRowsAmxBf16 ? (m + 15) / 16 * 16 : m;
  buf.resize(static_cast<size_t>(rows_held * kBf16Parts * pair_stride));
  uint32_t* out = buf.data();
  const int64_t rows_a_task = 16;  // one AMX row tile
  static_assert(kGemmRowBlock % rows_a_task == 0, "a row block starts a row tile");
  pool.Run(static_cast<size_t>((m + rows_a_task - 1) / rows_a_task), [&](size_t t) {
    const int64_t r0 = static_cast<int64_t>(t) * rows_a_task;
    split(x + r0 * ldx, ldx, std::min(rows_a_task, m - r0), k, pair_stride, out + r0 * kBf16Parts * pair_stride, parts);
  });
  return out;
}

// The int8 kernel of a path: the AVX-512 paths use VPDPWSSD where the CPU has it.
GemmBlockFn Int8BlockOf(KernelPath path) {
  const GemmBlockFn block = Q8KernelsOf(path).int8;
  if (block == kQ8Avx512.int8 && DetectCpu().avx512_vnni && VnniAllowed().load(std::memory_order_relaxed))
    return GemmBlockInt8Avx512Vnni;
  return block;
}

// The rows as int8 weights' kernels read them, in the calling thread's buffers.
void QuantizeRows(ThreadPool& pool, const float* x, int64_t m, int64_t ldx, int64_t k, GemmBlock& proto) {
  thread_local std::vector<int16_t> codes;
  thread_local std::vector<float> scales;
  codes.resize(static_cast<size_t>(m * ActivationCodesStride(k)));
  scales.resize(static_cast<size_t>(m * ActivationScalesStride(k)));
  const int64_t rows_a_task = 16;
  int16_t* codes_out = codes.data();
  float* scales_out = scales.data();
  pool.Run(static_cast<size_t>((m + rows_a_task - 1) / rows_a_task), [&](size_t t) {
    const int64_t r0 = static_cast<int64_t>(t) * rows_a_task;
    QuantizeActivations(x + r0 * ldx, ldx, std::min(rows_a_task, m - r0), k, codes_out + r0 * ActivationCodesStride(k),
                        scales_out + r0 * ActivationScalesStride(k));
  });
  proto.x_codes = codes_out;
  proto.x_code_scales = scales_out;
}

}  // namespace

void AllowAvx512Vnni(bool allowed) { VnniAllowed().store(allowed, std::memory_order_relaxed); }

void PackRowGroups(const float* x, int64_t ldx, int64_t rows, int64_t k, float* out) {
  for (int64_t g0 = 0; g0 < rows; g0 += kRowGroup) {
    const int64_t in_group = std::min(kRowGroup, rows - g0);
    float* group = out + g0 * k;
    for (int64_t r = 0; r < in_group; ++r) {
      const float* row = x + (g0 + r) * ldx;
      for (int64_t t = 0; t < k; ++t) group[t * kRowGroup + r] = row[t];
    }
  }
}

const char* PathName(KernelPath path) {
  switch (path) {
    case KernelPath::kPortable: return "portable";
    case KernelPath::kAvx2Fma: return "avx2-fma";
    case KernelPath::kAvx512F: return "avx512f";
    case KernelPath::kAvx512Bf16: return "avx512-bf16";
    case KernelPath::kAmxBf16: return "amx-bf16";
    case KernelPath::kEmulated16: return "emulated16";
    case KernelPath::kEmulatedBf16: return "emulated-bf16";
    case KernelPath::kEmulatedAmx: return "emulated-amx";
  }
  return "?";
}

Result<KernelPath> PathFromName(const std::string& name) {
  std::string names;
  for (KernelPath p : kAllPaths) {
    if (name == PathName(p)) return p;
    names += (names.empty() ? "" : ", ") + std::string(PathName(p));
  }
  return InvalidArgument("unknown kernel path '" + name + "' (" + names + ")");
}

bool PathAvailable(KernelPath path) {
  const CpuFeatures& f = DetectCpu();
  switch (path) {
    case KernelPath::kPortable:
    case KernelPath::kEmulated16:
    case KernelPath::kEmulatedBf16:
    case KernelPath::kEmulatedAmx: return true;
    case KernelPath::kAvx2Fma: return f.avx2 && f.fma && f.f16c;
    case KernelPath::kAvx512F: return f.avx512f && f.avx512bw;
    case KernelPath::kAvx512Bf16: return f.avx512f && f.avx512bw && f.avx512_bf16;
    case KernelPath::kAmxBf16: return f.avx512f && f.avx512bw && f.avx512_bf16 && f.amx_tile && f.amx_bf16 && f.amx_permitted;
  }
  return false;
}

std::vector<KernelPath> AvailablePaths() {
  std::vector<KernelPath> out;
  for (KernelPath p : {KernelPath::kAvx512F, KernelPath::kAmxBf16, KernelPath::kAvx512Bf16, KernelPath::kAvx2Fma,
                       KernelPath::kPortable})
    if (PathAvailable(p)) out.push_back(p);
  return out;
}

KernelPath ActivePath() { return Active().load(std::memory_order_relaxed); }

const char* PrecisionName(Precision precision) { return precision == Precision::kFast ? "fast" : "exact"; }

Result<Precision> PrecisionFromName(const std::string& name) {
  if (name == "exact") return Precision::kExact;
  if (name == "fast") return Precision::kFast;
  return InvalidArgument("precision must be exact or fast, got '" + name + "'");
}

Precision ActivePrecision() { return ActivePrecisionSlot().load(std::memory_order_relaxed); }

void SetPrecision(Precision precision) {
  ActivePrecisionSlot().store(precision, std::memory_order_relaxed);
  if (const char* wanted = std::getenv("ANCHORAGE_KERNEL"); wanted != nullptr && *wanted != '\0') return;
  KernelPath best = AvailablePaths().front();
  if (precision == Precision::kFast)
    for (KernelPath p : {KernelPath::kAmxBf16, KernelPath::kAvx512Bf16})
      if (PathAvailable(p)) {
        best = p;
        break;
      }
  Active().store(best, std::memory_order_relaxed);
}

bool RunsFast(KernelPath path, Precision precision) { return precision == Precision::kFast && SplitsIntoBf16(path); }

Status SetActivePath(KernelPath path) {
  if (!PathAvailable(path)) return InvalidArgument(std::string("this CPU cannot run the ") + PathName(path) + " kernels");
  Active().store(path, std::memory_order_relaxed);
  return Status::Ok();
}

const Fp32Kernels& Fp32KernelsOf(KernelPath path) {
  switch (path) {
    case KernelPath::kAvx2Fma: return kFp32Avx2;
    case KernelPath::kAvx512F:
    case KernelPath::kAvx512Bf16:
    case KernelPath::kAmxBf16: return kFp32Avx512;
    case KernelPath::kEmulated16: return kFp32Emulated16;
    case KernelPath::kEmulatedBf16:
    case KernelPath::kEmulatedAmx:
    case KernelPath::kPortable: break;
  }
  return kFp32Portable;
}

Arithmetic ArithmeticOf(KernelPath path) {
  switch (path) {
    case KernelPath::kAvx512Bf16:
    case KernelPath::kEmulatedBf16: return Arithmetic::kBf16Dot;
    case KernelPath::kAmxBf16:
    case KernelPath::kEmulatedAmx: return Arithmetic::kBf16Amx;
    case KernelPath::kPortable:
    case KernelPath::kAvx2Fma:
    case KernelPath::kAvx512F:
    case KernelPath::kEmulated16: break;
  }
  return Arithmetic::kFp32Fma;
}

bool SplitsIntoBf16(KernelPath path) { return ArithmeticOf(path) != Arithmetic::kFp32Fma; }

const char* ArithmeticNameOf(KernelPath path, Precision precision) {
  static_assert(kBf16Parts == 3, "the bf16 arithmetics' names say how many parts they split into");
  static_assert(kAmxChunk == 32, "the AMX arithmetic's name says how many k it sums apart");
  const bool fast = RunsFast(path, precision);
  switch (ArithmeticOf(path)) {
    case Arithmetic::kBf16Dot: return fast ? "bf16-round1-dpbf16-k-pairs-v1" : "bf16-split3-dpbf16-k-pairs-v1";
    case Arithmetic::kBf16Amx: return fast ? "bf16-round1-amx-k32-v1" : "bf16-split3-amx-k32-v1";
    case Arithmetic::kFp32Fma: break;
  }
  return "fp32-fma-k-order-v2";
}

const char* ArithmeticNameOf(KernelPath path) { return ArithmeticNameOf(path, ActivePrecision()); }

const char* ArithmeticName() { return ArithmeticNameOf(ActivePath()); }

void MatMulBf16(ThreadPool& pool, const float* x, int64_t m, int64_t ldx, const PackedBf16& w, float* y, int64_t ldy) {
  MatMulBf16On(ActivePath(), pool, x, m, ldx, w, y, ldy);
}

void MatMulBf16On(KernelPath path, ThreadPool& pool, const float* x, int64_t m, int64_t ldx, const PackedBf16& w,
                  float* y, int64_t ldy) {
  const Product product(w, y, ldy);
  MatMulSharedOn(path, pool, x, m, ldx, std::span(&product, 1));
}

void MatMulQ8On(KernelPath path, ThreadPool& pool, const float* x, int64_t m, int64_t ldx, const PackedQ8& w, float* y,
                int64_t ldy) {
  const Product product(w, y, ldy);
  MatMulSharedOn(path, pool, x, m, ldx, std::span(&product, 1));
}

void MatMulOn(KernelPath path, ThreadPool& pool, const float* x, int64_t m, int64_t ldx, const PackedMatrix& w, float* y,
              int64_t ldy) {
  const Product product(w, y, ldy);
  MatMulSharedOn(path, pool, x, m, ldx, std::span(&product, 1));
}

void MatMulShared(ThreadPool& pool, const float* x, int64_t m, int64_t ldx, std::span<const Product> products) {
  MatMulSharedOn(ActivePath(), pool, x, m, ldx, products);
}

void MatMulSharedOn(KernelPath path, ThreadPool& pool, const float* x, int64_t m, int64_t ldx,
                    std::span<const Product> products) {
  constexpr size_t kMaxProducts = 8;
  const bool same_k = std::all_of(products.begin(), products.end(),
                                  [&](const Product& p) { return p.cols() == products.front().cols(); });
  if (!same_k) {
    for (const Product& p : products) MatMulSharedOn(path, pool, x, m, ldx, std::span(&p, 1));
    return;
  }
  if (products.size() > kMaxProducts) {
    MatMulSharedOn(path, pool, x, m, ldx, products.first(kMaxProducts));
    return MatMulSharedOn(path, pool, x, m, ldx, products.subspan(kMaxProducts));
  }
  // What the kernels read besides x, each made once for every product that needs it.
  const SplitFn split = SplitOf(path);
  const uint32_t* split_rows = nullptr;
  const float* x_groups = nullptr;
  GemmBlock quantized;
  PanelJob jobs[kMaxProducts];
  int64_t first_task[kMaxProducts + 1] = {0};
  size_t count = 0;
  for (const Product& product : products) {
    const int64_t n = product.rows(), k = product.cols();
    if (EmptyProduct(m, n, k, product.y, product.ldy)) continue;
    PanelJob& job = jobs[count];
    job.product = &product;
    job.proto.ldx = ldx;
    job.proto.k = k;
    job.proto.ldy = product.ldy;
    if (product.bf16 != nullptr) {
      job.block = BlockOf(path);
      job.proto.pair_stride = PairStrideOf(path, k);
      job.proto.parts = RunsFast(path, ActivePrecision()) ? 1 : kBf16Parts;
      if (split != nullptr) {
        if (split_rows == nullptr) split_rows = SplitRows(pool, split, x, m, ldx, k, job.proto.pair_stride, job.proto.parts);
        job.proto.x_pairs = split_rows;
      } else {
        if (x_groups == nullptr) x_groups = RowGroupsFor(pool, x, m, ldx, k);
        job.proto.x_groups = x_groups;
      }
      // The whole k for a decode batch (each weight streamed once) and always for the bf16 kernels, whose sums stay in
      // registers (AMX: tiles): a k block would store and reload every sum through lane permutes.
      const bool whole_k = m <= kStreamRows || ArithmeticOf(path) != Arithmetic::kFp32Fma;
      job.k_block = whole_k ? k : kGemmKBlock;
    } else {
      const PackedQ8& w = *product.q8;
      job.proto.q8_block_k = w.block_k();
      job.proto.q8_panel_bytes = w.panel_bytes();
      if (w.code() == Q8Code::kInt8) {
        job.block = Int8BlockOf(path);
        if (quantized.x_codes == nullptr) QuantizeRows(pool, x, m, ldx, k, quantized);
        job.proto.x_codes = quantized.x_codes;
        job.proto.x_code_scales = quantized.x_code_scales;
      } else {
        job.block = Q8KernelsOf(path).fp8;
        if (x_groups == nullptr) x_groups = RowGroupsFor(pool, x, m, ldx, k);
        job.proto.x_groups = x_groups;
      }
      job.k_block = m <= kFewRows ? k : kGemmKBlock;
    }
    first_task[count + 1] = first_task[count] + TasksOf(job);
    ++count;
  }
  if (count == 0) return;
  pool.Run(static_cast<size_t>(first_task[count]), [&](size_t task) {
    const int64_t t = static_cast<int64_t>(task);
    size_t j = 0;
    while (first_task[j + 1] <= t) ++j;
    RunPanelTask(jobs[j], x, m, t - first_task[j]);
  });
}

void MatMul(ThreadPool& pool, const float* x, int64_t m, int64_t ldx, const PackedMatrix& w, float* y, int64_t ldy) {
  MatMulOn(ActivePath(), pool, x, m, ldx, w, y, ldy);
}

const char* ArithmeticNameOf(KernelPath path, WeightFormat format) {
  switch (format) {
    case WeightFormat::kFp8E4m3: return "fp8-e4m3-times-scale-fp32-fma-k-order-v1";
    case WeightFormat::kInt8: return "int8-b32-int16-activations-b32-exact-dot-v1";
    case WeightFormat::kBf16: break;
  }
  return ArithmeticNameOf(path);
}

}  // namespace anchorage::cpu
