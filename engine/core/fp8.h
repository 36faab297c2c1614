// OCP FP8 e4m3 ("fn": no infinities; 0x7f and 0xff are NaN), as Hugging Face's FP8 checkpoints store it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace anchorage {

inline bool Fp8E4m3IsNan(uint8_t byte) { return (byte & 0x7f) == 0x7f; }

// The exact value of an e4m3 byte.
inline float Fp8E4m3ToFloat(uint8_t byte) {
  if (Fp8E4m3IsNan(byte)) return std::numeric_limits<float>::quiet_NaN();
  const int exponent = (byte >> 3) & 0xf, mantissa = byte & 7;
  const float value = exponent == 0 ? std::ldexp(static_cast<float>(mantissa), -9)
                                    : std::ldexp(static_cast<float>(8 + mantissa), exponent - 10);
  return (byte & 0x80) ? -value : value;
}

// The e4m3 byte nearest f (ties to even), saturating at +-448.
inline uint8_t FloatToFp8E4m3(float f) {
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  if (std::isnan(f)) return sign | 0x7f;
  const double a = std::fabs(static_cast<double>(f));
  if (a >= 448.0) return sign | 0x7e;
  if (a < 0x1p-6) return static_cast<uint8_t>(sign | static_cast<int>(std::nearbyint(a * 512.0)));  // 8 is 2^-6's code
  int e = 0;
  const double m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int q = static_cast<int>(std::nearbyint((m * 2.0 - 1.0) * 8.0));
  int exponent = e - 1;
  if (q == 8) {
    q = 0;
    ++exponent;
  }
  return static_cast<uint8_t>(sign | std::min((exponent + 7) << 3 | q, 0x7e));
}

}  // namespace anchorage
