// The session spill's lossless codec: a block of words cut into byte planes (every word's first
// byte, then every second byte ...), each plane compressed with zstd in frames of up to 8 MiB on a
// pool's threads, a frame that does not shrink stored as it is. The high byte of a float (sign and
// exponent) takes few values, so its plane shrinks; the mantissa bytes do not. Decoding checks
// every length it reads, and zstd's own checksum every compressed frame (the spill's block sums
// check the rest).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "engine/core/status.h"

namespace anchorage {

class ThreadPool;

inline constexpr int64_t kPlaneFrameBytes = int64_t(8) << 20;

struct PlaneCodecOptions {
  int word_bytes = 4;     // fp32 rows
  int level = 1;          // zstd's
  ThreadPool* pool = nullptr;  // frames are compressed (and decompressed) in parallel on it; null: this thread
};

// Byte planes of data, whose size is a multiple of word_bytes: out[p * n + i] = data[i * word_bytes + p].
void SplitPlanes(std::span<const char> data, int word_bytes, char* out);
void JoinPlanes(std::span<const char> planes, int word_bytes, char* out);

// The encoded block: magic, word size, raw size, the frames' lengths (top bit: stored), then the frames.
Result<std::string> EncodePlanes(std::span<const char> data, const PlaneCodecOptions& options);
// Decodes into out, which must be the raw size the encoding names; Corrupt on anything that does not fit.
Status DecodePlanes(std::string_view encoded, std::span<char> out, ThreadPool* pool = nullptr);
// The raw size an encoding names, or Corrupt.
Result<int64_t> PlanesRawSize(std::string_view encoded);

}  // namespace anchorage
