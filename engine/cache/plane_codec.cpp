#include "engine/cache/plane_codec.h"

#include <zstd.h>

#include <algorithm>
#include <memory>
#include <cstring>
#include <vector>

#include "engine/core/thread_pool.h"

namespace anchorage {
namespace {

constexpr char kMagic[8] = {'A', 'N', 'C', 'P', 'L', 'N', '0', '1'};
constexpr size_t kFixedHeader = sizeof(kMagic) + 4 + 8 + 4;  // magic, word bytes, raw bytes, frames

void PutU32(std::string& s, uint32_t v) { s.append(reinterpret_cast<const char*>(&v), 4); }
void PutU64(std::string& s, uint64_t v) { s.append(reinterpret_cast<const char*>(&v), 8); }
uint32_t GetU32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t GetU64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

void RunTasks(ThreadPool* pool, size_t tasks, const std::function<void(size_t)>& fn) {
  if (pool != nullptr && tasks > 1) {
    pool->Run(tasks, fn);
    return;
  }
  for (size_t t = 0; t < tasks; ++t) fn(t);
}

}  // namespace

void SplitPlanes(std::span<const char> data, int word_bytes, char* out) {
  const size_t n = data.size() / static_cast<size_t>(word_bytes);
  if (word_bytes == 4) {
    const auto* in = reinterpret_cast<const unsigned char*>(data.data());
    for (size_t i = 0; i < n; ++i) {
      out[i] = static_cast<char>(in[4 * i]);
      out[n + i] = static_cast<char>(in[4 * i + 1]);
      out[2 * n + i] = static_cast<char>(in[4 * i + 2]);
      out[3 * n + i] = static_cast<char>(in[4 * i + 3]);
    }
    return;
  }
  for (size_t i = 0; i < n; ++i)
    for (int p = 0; p < word_bytes; ++p) out[static_cast<size_t>(p) * n + i] = data[i * static_cast<size_t>(word_bytes) + static_cast<size_t>(p)];
}

void JoinPlanes(std::span<const char> planes, int word_bytes, char* out) {
  const size_t n = planes.size() / static_cast<size_t>(word_bytes);
  if (word_bytes == 4) {
    const char* p = planes.data();
    for (size_t i = 0; i < n; ++i) {
      out[4 * i] = p[i];
      out[4 * i + 1] = p[n + i];
      out[4 * i + 2] = p[2 * n + i];
      out[4 * i + 3] = p[3 * n + i];
    }
    return;
  }
  for (size_t i = 0; i < n; ++i)
    for (int p = 0; p < word_bytes; ++p) out[i * static_cast<size_t>(word_bytes) + static_cast<size_t>(p)] = planes[static_cast<size_t>(p) * n + i];
}

// Frames never straddle planes: each plane is cut into frames of up to kPlaneFrameBytes, so a plane
// that does not shrink (a float's low mantissa bytes) is stored as it is, at no cost.
std::vector<std::pair<size_t, size_t>> FrameSpans(size_t bytes, int word_bytes) {
  std::vector<std::pair<size_t, size_t>> spans;
  const size_t plane = bytes / static_cast<size_t>(word_bytes);
  for (int p = 0; p < word_bytes && plane > 0; ++p)
    for (size_t begin = 0; begin < plane; begin += kPlaneFrameBytes)
      spans.emplace_back(static_cast<size_t>(p) * plane + begin, std::min<size_t>(kPlaneFrameBytes, plane - begin));
  return spans;
}

constexpr uint64_t kStoredFlag = uint64_t(1) << 63;  // in a frame's length: its bytes are the plane's as they are

Result<std::string> EncodePlanes(std::span<const char> data, const PlaneCodecOptions& options) {
  const int w = options.word_bytes;
  if (w < 1 || w > 8 || data.size() % static_cast<size_t>(w) != 0)
    return InvalidArgument("plane codec: " + std::to_string(data.size()) + " bytes are not whole words of " + std::to_string(w));
  const std::unique_ptr<char[]> planes(new char[data.size()]);  // every byte is written: no zero fill
  SplitPlanes(data, w, planes.get());
  const auto spans = FrameSpans(data.size(), w);
  std::vector<std::string> encoded(spans.size());
  std::vector<size_t> errors(spans.size(), 0);
  RunTasks(options.pool, spans.size(), [&](size_t f) {
    const auto [begin, size] = spans[f];
    std::string& out = encoded[f];
    out.resize(ZSTD_compressBound(size));
    ZSTD_CCtx* cctx = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, options.level);
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);  // a flipped byte fails the decode, not just the sums after it
    const size_t n = ZSTD_compress2(cctx, out.data(), out.size(), planes.get() + begin, size);
    ZSTD_freeCCtx(cctx);
    if (ZSTD_isError(n)) errors[f] = n;
    else if (n >= size) out.clear();  // stored
    else out.resize(n);
  });
  for (size_t e : errors)
    if (e != 0) return Internal(std::string("plane codec: zstd: ") + ZSTD_getErrorName(e));
  std::string out;
  size_t total = kFixedHeader + 8 * spans.size();
  for (size_t f = 0; f < spans.size(); ++f) total += encoded[f].empty() ? spans[f].second : encoded[f].size();
  out.reserve(total);
  out.append(kMagic, sizeof(kMagic));
  PutU32(out, static_cast<uint32_t>(w));
  PutU64(out, data.size());
  PutU32(out, static_cast<uint32_t>(spans.size()));
  for (size_t f = 0; f < spans.size(); ++f) PutU64(out, encoded[f].empty() ? (spans[f].second | kStoredFlag) : encoded[f].size());
  for (size_t f = 0; f < spans.size(); ++f) {
    if (encoded[f].empty()) out.append(planes.get() + spans[f].first, spans[f].second);
    else out += encoded[f];
  }
  return out;
}

Result<int64_t> PlanesRawSize(std::string_view encoded) {
  if (encoded.size() < kFixedHeader || std::memcmp(encoded.data(), kMagic, sizeof(kMagic)) != 0)
    return Corrupt("plane codec: not an encoded block");
  return static_cast<int64_t>(GetU64(encoded.data() + sizeof(kMagic) + 4));
}

Status DecodePlanes(std::string_view encoded, std::span<char> out, ThreadPool* pool) {
  ASSIGN_OR_RETURN(const int64_t raw, PlanesRawSize(encoded));
  const uint32_t w = GetU32(encoded.data() + sizeof(kMagic));
  const uint64_t frames = GetU32(encoded.data() + sizeof(kMagic) + 12);
  if (w < 1 || w > 8 || raw % w != 0 || static_cast<uint64_t>(raw) != out.size())
    return Corrupt("plane codec: the block holds " + std::to_string(raw) + " bytes of " + std::to_string(w) + "-byte words, " +
                   std::to_string(out.size()) + " expected");
  const auto spans = FrameSpans(out.size(), static_cast<int>(w));
  if (frames != spans.size() || encoded.size() < kFixedHeader + 8 * frames) return Corrupt("plane codec: a frame table that does not fit the block");
  std::vector<size_t> offsets(frames + 1, kFixedHeader + 8 * frames);
  std::vector<bool> stored(frames);
  for (uint64_t f = 0; f < frames; ++f) {
    uint64_t n = GetU64(encoded.data() + kFixedHeader + 8 * f);
    stored[f] = (n & kStoredFlag) != 0;
    n &= ~kStoredFlag;
    if (stored[f] && n != spans[f].second) return Corrupt("plane codec: stored frame " + std::to_string(f) + " of the wrong size");
    if (n > encoded.size() - offsets[f]) return Corrupt("plane codec: frame " + std::to_string(f) + " runs past the block (truncated?)");
    offsets[f + 1] = offsets[f] + n;
  }
  if (offsets[frames] != encoded.size()) return Corrupt("plane codec: bytes after the last frame");
  const std::unique_ptr<char[]> planes(new char[out.size()]);  // every byte is written before it is read
  std::vector<std::string> errors(frames);
  RunTasks(pool, frames, [&](size_t f) {
    const auto [begin, size] = spans[f];
    if (stored[f]) {
      std::memcpy(planes.get() + begin, encoded.data() + offsets[f], size);
      return;
    }
    const size_t n = ZSTD_decompress(planes.get() + begin, size, encoded.data() + offsets[f], offsets[f + 1] - offsets[f]);
    if (ZSTD_isError(n)) errors[f] = ZSTD_getErrorName(n);
    else if (n != size) errors[f] = "decodes to " + std::to_string(n) + " bytes, not " + std::to_string(size);
  });
  for (uint64_t f = 0; f < frames; ++f)
    if (!errors[f].empty()) return Corrupt("plane codec: frame " + std::to_string(f) + ": " + errors[f]);
  JoinPlanes(std::span<const char>(planes.get(), out.size()), static_cast<int>(w), out.data());
  return Status::Ok();
}

}  // namespace anchorage
