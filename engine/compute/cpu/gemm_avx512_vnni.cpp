// int8 weights on AVX-512 VNNI: VPDPWSSD adds a pair of int16 activation codes times int8 weight codes a lane.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

// Everything included before the pragma keeps the baseline target; the tile below it takes the path's.
#include "engine/compute/cpu/gemm_block.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vnni")

#include "engine/compute/cpu/avx512_int8_lanes.h"
#include "engine/compute/cpu/gemm_int8_tile.h"

namespace anchorage::cpu {
namespace {

void RunInt8(const GemmBlock& b) { RunInt8Block<Avx512Int8Lanes<true>>(b); }

}  // namespace

#pragma GCC pop_options

void GemmBlockInt8Avx512Vnni(const GemmBlock& b) { RunInt8(b); }

}  // namespace anchorage::cpu
