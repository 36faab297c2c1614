// Images for the server tests: PNGs whose pixels follow a seed, as data: URLs in OpenAI content parts.
#pragma once

#include <png.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace anchorage::testing {

inline std::string Base64(const std::string& bytes) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v = uint8_t(bytes[i]) << 16 | uint8_t(bytes[i + 1]) << 8 | uint8_t(bytes[i + 2]);
    for (int s : {18, 12, 6, 0}) out += kAlphabet[v >> s & 63];
  }
  if (i + 1 == bytes.size()) {
    const uint32_t v = uint8_t(bytes[i]) << 16;
    out += std::string{kAlphabet[v >> 18 & 63], kAlphabet[v >> 12 & 63]} + "==";
  } else if (i + 2 == bytes.size()) {
    const uint32_t v = uint8_t(bytes[i]) << 16 | uint8_t(bytes[i + 1]) << 8;
    out += std::string{kAlphabet[v >> 18 & 63], kAlphabet[v >> 12 & 63], kAlphabet[v >> 6 & 63]} + "=";
  }
  return out;
}

// A width x height PNG whose pixels follow seed.
inline std::string Png(int width, int height, int seed) {
  std::vector<uint8_t> rgb(static_cast<size_t>(width * height * 3));
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x)
      for (int c = 0; c < 3; ++c) rgb[static_cast<size_t>((y * width + x) * 3 + c)] = static_cast<uint8_t>(x * (3 + seed) + y * 7 + c * 50 + seed * 31);
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  image.width = width;
  image.height = height;
  image.format = PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  png_image_write_to_memory(&image, nullptr, &size, 0, rgb.data(), 0, nullptr);
  std::string out(size, '\0');
  png_image_write_to_memory(&image, out.data(), &size, 0, rgb.data(), 0, nullptr);
  out.resize(size);
  return out;
}

inline std::string DataUrl(const std::string& png) { return "data:image/png;base64," + Base64(png); }

inline nlohmann::json ImagePart(const std::string& url) { return {{"type", "image_url"}, {"image_url", {{"url", url}}}}; }
inline nlohmann::json TextPart(const std::string& text) { return {{"type", "text"}, {"text", text}}; }

}  // namespace anchorage::testing
