// y = x · Wᵀ with packed bf16 weights and fp32 activations, on the kernel path picked at run time.
// The fp32 paths compute each output the same way (its k products in index order, one fused
// multiply-add each); the bf16 paths another (bf16_split.h). Within an arithmetic, the bits depend on
// neither the path, the row count, the thread count nor where a prefill was split.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/compute/cpu/packed_bf16.h"
#include "engine/compute/cpu/packed_q8.h"
#include "engine/core/status.h"
#include "engine/core/thread_pool.h"

namespace anchorage::cpu {

enum class KernelPath {
  kPortable,     // C++ only, std::fma per lane
  kAvx2Fma,      // 8 lanes
  kAvx512F,      // 16 lanes
  kAvx512Bf16,   // VDPBF16PS on activations split into bf16 parts
  kAmxBf16,      // TDPBF16PS tiles on activations split into bf16 parts
  kEmulated16,   // the AVX-512F kernel's lane order in portable C++, for tests on any CPU
  kEmulatedBf16, // the AVX-512 BF16 kernel's arithmetic in portable C++, for tests on any CPU
  kEmulatedAmx,  // the AMX kernel's arithmetic in portable C++, for tests on any CPU
};

// How a path rounds; paths of one arithmetic give the same bits.
enum class Arithmetic {
  kFp32Fma,   // each output's k products in index order, one fused multiply-add each
  kBf16Dot,   // bf16 parts, k in pairs as VDPBF16PS adds them (DotPair)
  kBf16Amx,   // bf16 parts, 32 k at a time as TDPBF16PS adds them (AmxStep, AmxAdd)
};

// How the bf16 paths multiply: exact splits each activation into kBf16Parts bf16 parts (fp32-grade
// products); fast rounds it to bf16 once and multiplies that part alone (a third of the products).
// The fp32 paths multiply in fp32 either way: fast runs as exact there.
enum class Precision { kExact, kFast };
const char* PrecisionName(Precision precision);  // "exact", "fast"
Result<Precision> PrecisionFromName(const std::string& name);
Precision ActivePrecision();
// Sets the precision; where no ANCHORAGE_KERNEL names the path, fast picks the best bf16 path this CPU
// runs (the bf16 units' rate is then its to spend) and exact the best path as at start.
void SetPrecision(Precision precision);
// Whether products on the path run with fewer parts than exact in this precision.
bool RunsFast(KernelPath path, Precision precision);

const char* PathName(KernelPath path);
Result<KernelPath> PathFromName(const std::string& name);
// The paths this CPU runs, best first (the emulated ones are never listed: they exist for tests). The
// bf16 paths come after avx512f: the VDPBF16PS path's three-part split costs more products than its rate
// gains, and the AMX path, faster in prefill, decodes slower (docs/engine.md).
std::vector<KernelPath> AvailablePaths();
bool PathAvailable(KernelPath path);

// The path MatMulBf16 uses: ANCHORAGE_KERNEL if it names an available path, else the best one.
KernelPath ActivePath();
// Tests and benchmarks switch paths; refuses one this CPU cannot run.
Status SetActivePath(KernelPath path);
// How the active path rounds in the active precision: paths with the same name give the same bits (part of
// the fingerprint).
const char* ArithmeticName();
const char* ArithmeticNameOf(KernelPath path);
const char* ArithmeticNameOf(KernelPath path, Precision precision);
Arithmetic ArithmeticOf(KernelPath path);
// Whether the path splits activations into bf16 parts (bf16_split.h) rather than multiplying in fp32.
bool SplitsIntoBf16(KernelPath path);

// Output columns a task covers, k steps a block, rows a block.
inline constexpr int64_t kGemmTaskPanels = 4;
inline constexpr int64_t kGemmKBlock = 256;
inline constexpr int64_t kGemmRowBlock = 96;

// y fp32 [m, ldy] (first w.rows() columns written) = x fp32 [m, w.cols()] (row stride ldx) · Wᵀ.
void MatMulBf16(ThreadPool& pool, const float* x, int64_t m, int64_t ldx, const PackedBf16& w, float* y, int64_t ldy);
void MatMulBf16On(KernelPath path, ThreadPool& pool, const float* x, int64_t m, int64_t ldx, const PackedBf16& w,
                  float* y, int64_t ldy);

// 8-bit weights, the same bits on every path. FP8: each weight (code x scale, rounded once) in the fp32
// paths' order; the bf16 paths run their AVX-512F kernel. int8: activations made int16 per block of 32
// (QuantizeActivations), each block's integer dot exact, then one fused multiply-add by the two scales.
void MatMulQ8On(KernelPath path, ThreadPool& pool, const float* x, int64_t m, int64_t ldx, const PackedQ8& w, float* y,
                int64_t ldy);
// Whether the AVX-512 paths' int8 kernel may use VPDPWSSD (AVX-512 VNNI) where the CPU has it; tests turn it off
// to check the VPMADDWD kernel, which gives the same bits.
void AllowAvx512Vnni(bool allowed);
// One matrix of products that share their input, and the output rows it writes (y [m, ldy], first rows() columns).
struct Product {
  Product(const PackedMatrix& w, float* y, int64_t ldy) : bf16(w.bf16()), q8(w.q8()), y(y), ldy(ldy) {}
  Product(const PackedBf16& w, float* y, int64_t ldy) : bf16(&w), y(y), ldy(ldy) {}
  Product(const PackedQ8& w, float* y, int64_t ldy) : q8(&w), y(y), ldy(ldy) {}
  int64_t rows() const { return bf16 != nullptr ? bf16->rows() : q8->rows(); }
  int64_t cols() const { return bf16 != nullptr ? bf16->cols() : q8->cols(); }
  const PackedBf16* bf16 = nullptr;
  const PackedQ8* q8 = nullptr;
  float* y = nullptr;
  int64_t ldy = 0;
};
// x [m, k] times every product's matrix (each k columns), in one call of the pool: the input is split, packed or
// quantized once, and every product gets the bits MatMul would give it alone.
void MatMulShared(ThreadPool& pool, const float* x, int64_t m, int64_t ldx, std::span<const Product> products);
void MatMulSharedOn(KernelPath path, ThreadPool& pool, const float* x, int64_t m, int64_t ldx,
                    std::span<const Product> products);
// A matrix in any format, on the active path.
void MatMul(ThreadPool& pool, const float* x, int64_t m, int64_t ldx, const PackedMatrix& w, float* y, int64_t ldy);
void MatMulOn(KernelPath path, ThreadPool& pool, const float* x, int64_t m, int64_t ldx, const PackedMatrix& w, float* y,
              int64_t ldy);
// How a path rounds products with weights of this format.
const char* ArithmeticNameOf(KernelPath path, WeightFormat format);

struct Fp32Kernels;
// The fp32 kernels attention uses on a path (see fp32_tile.h for their orders).
const Fp32Kernels& Fp32KernelsOf(KernelPath path);

}  // namespace anchorage::cpu
