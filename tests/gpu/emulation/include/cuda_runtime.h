// Device-side CUDA for the SIMT emulator: qualifiers, built-in indices, barriers, shuffles and the
// intrinsics kernels.cu uses, in plain C++.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#include "cuda_runtime_api.h"
#include "../simt.h"

#define __global__
#define __device__
#define __host__
#define __shared__ static  // blocks run one at a time, so a static is the block's shared variable
#define threadIdx (::simt::ThreadIdx())
#define blockIdx (::simt::BlockIdx())
#define blockDim (::simt::BlockDim())
#define gridDim (::simt::GridDim())

using std::max;
using std::min;

struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(8) uint2 {
  unsigned x, y;
};

inline void __syncthreads() { simt::SyncThreads(); }
inline void __syncwarp(unsigned = 0xffffffffu) { simt::SyncWarp(); }
inline float __shfl_xor_sync(unsigned, float v, int lane_mask) {
  return std::bit_cast<float>(simt::ShuffleWord(std::bit_cast<uint32_t>(v), lane_mask, true));
}
inline float __shfl_sync(unsigned, float v, int lane) {
  return std::bit_cast<float>(simt::ShuffleWord(std::bit_cast<uint32_t>(v), lane, false));
}
inline float __uint_as_float(uint32_t u) { return std::bit_cast<float>(u); }
inline uint32_t __float_as_uint(float f) { return std::bit_cast<uint32_t>(f); }
