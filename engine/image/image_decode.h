// PNG, JPEG and WebP bytes made 8-bit RGB (alpha composited over white, as Hugging Face's processors do),
// with Debian's libpng, libjpeg-turbo and libwebp. Errors say what is wrong in words a client can act on.
#pragma once

#include <cstdint>
#include <string_view>

#include "engine/core/status.h"
#include "engine/image/image_patches.h"

namespace anchorage {

enum class ImageFormat { kUnknown, kPng, kJpeg, kWebp };
ImageFormat SniffImageFormat(std::string_view bytes);

// A progressive JPEG may hold many scans, each a pass over the whole image: past this many it is refused.
inline constexpr int kMaxJpegScans = 256;

// Decodes an image of at most max_pixels (width x height, checked from its header before decoding).
Result<RgbImage> DecodeImage(std::string_view bytes, int64_t max_pixels, int max_jpeg_scans = kMaxJpegScans);

}  // namespace anchorage
