#include "engine/image/image_decode.h"

#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <string>

#include <jpeglib.h>
#include <jerror.h>
#include <png.h>
#include <webp/decode.h>

namespace anchorage {

namespace {

std::string SizeText(int64_t width, int64_t height) { return std::to_string(width) + " x " + std::to_string(height); }

Status CheckSize(const char* format, int64_t width, int64_t height, int64_t max_pixels) {
  if (width <= 0 || height <= 0) return InvalidArgument(std::string("the ") + format + " image has no pixels");
  if (width * height > max_pixels)
    return InvalidArgument(std::string("the ") + format + " image is " + SizeText(width, height) + " pixels, over the limit of " +
                           std::to_string(max_pixels) + " pixels");
  return Status::Ok();
}

// RGBA rows composited over white into RGB.
RgbImage FromRgba(const uint8_t* rgba, int64_t width, int64_t height) {
  RgbImage out{width, height, std::vector<uint8_t>(static_cast<size_t>(width * height * 3))};
  for (int64_t i = 0; i < width * height; ++i) {
    const uint32_t a = rgba[i * 4 + 3];
    for (int c = 0; c < 3; ++c) out.rgb[static_cast<size_t>(i * 3 + c)] = static_cast<uint8_t>((rgba[i * 4 + c] * a + 255u * (255u - a) + 127u) / 255u);
  }
  return out;
}

Result<RgbImage> DecodePng(std::string_view bytes, int64_t max_pixels) {
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&image, bytes.data(), bytes.size()))
    return InvalidArgument(std::string("the PNG image cannot be read: ") + image.message);
  if (Status s = CheckSize("PNG", image.width, image.height, max_pixels); !s.ok()) {
    png_image_free(&image);
    return s;
  }
  image.format = PNG_FORMAT_RGBA;
  std::vector<uint8_t> rgba(PNG_IMAGE_SIZE(image));
  if (!png_image_finish_read(&image, nullptr, rgba.data(), 0, nullptr))
    return InvalidArgument(std::string("the PNG image is truncated or corrupt: ") + image.message);
  return FromRgba(rgba.data(), image.width, image.height);
}

struct JpegError {
  jpeg_error_mgr manager;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX] = {};
  int warnings = 0;
  bool failed = false;
};

void JpegFail(j_common_ptr info) {
  JpegError* e = reinterpret_cast<JpegError*>(info->err);
  info->err->format_message(info, e->message);
  std::longjmp(e->jump, 1);
}

// A cut-short file, or a flood of warnings, makes the image corrupt; a stray warning (extraneous bytes, as
// some cameras write) does not.
void JpegMessage(j_common_ptr info, int level) {
  JpegError* e = reinterpret_cast<JpegError*>(info->err);
  if (level >= 0) return;
  if (info->err->msg_code == JWRN_JPEG_EOF || ++e->warnings > 100) {
    if (!e->failed) info->err->format_message(info, e->message);
    e->failed = true;
  }
}

struct JpegProgress {
  jpeg_progress_mgr manager;
  int max_scans = kMaxJpegScans;
};

// Called as libjpeg reads: a file of more scans than allowed stops there.
void JpegScans(j_common_ptr common) {
  const auto* info = reinterpret_cast<j_decompress_ptr>(common);
  const auto* progress = reinterpret_cast<const JpegProgress*>(common->progress);
  if (info->input_scan_number <= progress->max_scans) return;
  JpegError* e = reinterpret_cast<JpegError*>(common->err);
  std::snprintf(e->message, sizeof e->message, "it holds more than %d scans", progress->max_scans);
  std::longjmp(e->jump, 1);
}

Result<RgbImage> DecodeJpeg(std::string_view bytes, int64_t max_pixels, int max_scans) {
  jpeg_decompress_struct info;
  JpegError error;
  JpegProgress progress;
  progress.manager.progress_monitor = JpegScans;
  progress.max_scans = max_scans;
  info.err = jpeg_std_error(&error.manager);
  error.manager.error_exit = JpegFail;
  error.manager.emit_message = JpegMessage;
  // Nothing with a destructor lives between setjmp and the calls that may jump back to it.
  RgbImage* out = new RgbImage;
  if (setjmp(error.jump)) {
    jpeg_destroy_decompress(&info);
    delete out;
    return InvalidArgument(std::string("the JPEG image is corrupt: ") + error.message);
  }
  jpeg_create_decompress(&info);
  info.progress = &progress.manager;
  jpeg_mem_src(&info, reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&info, TRUE);
  if (info.jpeg_color_space == JCS_CMYK || info.jpeg_color_space == JCS_YCCK) {
    jpeg_destroy_decompress(&info);
    delete out;
    return InvalidArgument("the JPEG image is CMYK; send it as RGB or grayscale");
  }
  if (Status s = CheckSize("JPEG", info.image_width, info.image_height, max_pixels); !s.ok()) {
    jpeg_destroy_decompress(&info);
    delete out;
    return s;
  }
  info.out_color_space = JCS_RGB;
  jpeg_start_decompress(&info);
  out->width = info.output_width;
  out->height = info.output_height;
  out->rgb.resize(static_cast<size_t>(out->width * out->height * 3));
  while (info.output_scanline < info.output_height) {
    JSAMPROW row = out->rgb.data() + static_cast<size_t>(info.output_scanline) * static_cast<size_t>(out->width) * 3;
    jpeg_read_scanlines(&info, &row, 1);
  }
  jpeg_finish_decompress(&info);
  jpeg_destroy_decompress(&info);
  RgbImage image = std::move(*out);
  delete out;
  if (error.failed) return InvalidArgument(std::string("the JPEG image is truncated or corrupt: ") + error.message);
  return image;
}

Result<RgbImage> DecodeWebp(std::string_view bytes, int64_t max_pixels) {
  WebPBitstreamFeatures features;
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  if (WebPGetFeatures(data, bytes.size(), &features) != VP8_STATUS_OK) return InvalidArgument("the WebP image's header cannot be read");
  if (features.has_animation) return InvalidArgument("the WebP image is animated; send one frame");
  RETURN_IF_ERROR(CheckSize("WebP", features.width, features.height, max_pixels));
  int width = 0, height = 0;
  uint8_t* rgba = WebPDecodeRGBA(data, bytes.size(), &width, &height);
  if (rgba == nullptr) return InvalidArgument("the WebP image is truncated or corrupt");
  RgbImage out = FromRgba(rgba, width, height);
  WebPFree(rgba);
  return out;
}

}  // namespace

ImageFormat SniffImageFormat(std::string_view b) {
  if (b.size() >= 8 && b.substr(0, 8) == std::string_view("\x89PNG\r\n\x1a\n", 8)) return ImageFormat::kPng;
  if (b.size() >= 3 && b.substr(0, 3) == "\xFF\xD8\xFF") return ImageFormat::kJpeg;
  if (b.size() >= 12 && b.substr(0, 4) == "RIFF" && b.substr(8, 4) == "WEBP") return ImageFormat::kWebp;
  return ImageFormat::kUnknown;
}

Result<RgbImage> DecodeImage(std::string_view bytes, int64_t max_pixels, int max_jpeg_scans) {
  if (bytes.empty()) return InvalidArgument("the image is empty");
  switch (SniffImageFormat(bytes)) {
    case ImageFormat::kPng: return DecodePng(bytes, max_pixels);
    case ImageFormat::kJpeg: return DecodeJpeg(bytes, max_pixels, max_jpeg_scans);
    case ImageFormat::kWebp: return DecodeWebp(bytes, max_pixels);
    case ImageFormat::kUnknown: break;
  }
  return InvalidArgument("the image is not PNG, JPEG or WebP");
}

}  // namespace anchorage
