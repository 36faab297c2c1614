// bf16 for the SIMT emulator: round to nearest even, as __float2bfloat16_rn does.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

struct __nv_bfloat16 {
  uint16_t bits;
};

inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if (std::isnan(f)) return {static_cast<uint16_t>((u >> 16) | 0x40)};
  return {static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}
inline float __bfloat162float(__nv_bfloat16 b) { return std::bit_cast<float>(static_cast<uint32_t>(b.bits) << 16); }
inline uint16_t __bfloat16_as_ushort(__nv_bfloat16 b) { return b.bits; }
