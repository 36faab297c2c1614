// The AVX-512F GEMM path (with AVX-512BW for 8-bit codes): 16 fp32 lanes; a 64-byte load of a super-panel's k row gives two vectors.
// GCC 12 reports its own AVX-512 intrinsic headers as reading uninitialised values; not our code.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

// Everything included before the pragma keeps the baseline target; the tile below it takes the path's.
#include "engine/compute/cpu/fp32_block.h"
#include "engine/compute/cpu/gemm_block.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw")

#include "engine/compute/cpu/avx512_int8_lanes.h"
#include "engine/compute/cpu/avx512_lanes.h"
#include "engine/compute/cpu/fp32_tile.h"
#include "engine/compute/cpu/gemm_int8_tile.h"
#include "engine/compute/cpu/gemm_tile.h"

namespace anchorage::cpu {
namespace {

void Run(const GemmBlock& b) { RunGemmBlock<Avx512Lanes>(b); }
void RunFp8(const GemmBlock& b) { RunGemmBlock<Avx512Lanes, Fp8Weights>(b); }
void RunInt8(const GemmBlock& b) { RunInt8Block<Avx512Int8Lanes<false>>(b); }
void RowsTimes(const RowsTimesArgs& p) { RunRowsTimes<Avx512Lanes>(p); }

}  // namespace

#pragma GCC pop_options

void GemmBlockAvx512(const GemmBlock& b) { Run(b); }
const Fp32Kernels kFp32Avx512{RowsTimes};
const Q8Kernels kQ8Avx512{RunFp8, RunInt8};

}  // namespace anchorage::cpu
