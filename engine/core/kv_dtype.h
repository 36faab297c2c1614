// How a state stores attention K/V rows: fp32; bf16 rounded (to nearest even) once, when the row is
// written; or fp8: e4m3 codes with a power-of-two scale per block of values, so widening is exact.
#pragma once

#include <cstdint>
#include <cstring>

namespace anchorage {

enum class KvDtype { kF32, kBf16, kFp8 };

// An fp8 row is kv_width e4m3 codes, then one scale byte per block of this many values: the block's
// values are code x 2^(byte - 127) (OCP MX's E8M0 exponent).
inline constexpr int64_t kKvFp8Block = 32;

inline const char* KvDtypeName(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kBf16: return "bf16";
    case KvDtype::kFp8: return "fp8";
    case KvDtype::kF32: break;
  }
  return "f32";
}
// Bytes of one value's code (an fp8 row's scales come after its codes: KvRowBytes).
inline int64_t KvDtypeBytes(KvDtype dtype) { return dtype == KvDtype::kBf16 ? 2 : dtype == KvDtype::kFp8 ? 1 : 4; }
// Bytes of a row of width values.
inline int64_t KvRowBytes(KvDtype dtype, int64_t width) {
  return width * KvDtypeBytes(dtype) + (dtype == KvDtype::kFp8 ? width / kKvFp8Block : 0);
}
// The factor an fp8 row's scale byte stands for, 2^(byte - 127) (the quantizer writes bytes of normal factors only).
inline float KvFp8Scale(uint8_t byte) {
  const uint32_t bits = static_cast<uint32_t>(byte) << 23;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

}  // namespace anchorage
