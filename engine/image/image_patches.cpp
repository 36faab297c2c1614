#include "engine/image/image_patches.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/core/sha256.h"

namespace anchorage {

namespace {

double Bicubic(double x) {
  constexpr double a = -0.5;
  x = std::fabs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
  return 0.0;
}

// For each output index: the first input index it reads and the weights of the inputs from there.
struct Taps {
  std::vector<int64_t> first;
  std::vector<std::vector<double>> weights;
};

Taps TapsOf(int64_t in_size, int64_t out_size) {
  Taps taps;
  const double scale = static_cast<double>(in_size) / static_cast<double>(out_size);
  const double widen = std::max(scale, 1.0);
  const double support = 2.0 * widen;
  for (int64_t o = 0; o < out_size; ++o) {
    const double center = (static_cast<double>(o) + 0.5) * scale;
    const int64_t lo = std::max<int64_t>(static_cast<int64_t>(center - support + 0.5), 0);
    const int64_t hi = std::min<int64_t>(static_cast<int64_t>(center + support + 0.5), in_size);
    std::vector<double> w;
    double total = 0.0;
    for (int64_t i = lo; i < hi; ++i) {
      w.push_back(Bicubic((static_cast<double>(i) - center + 0.5) / widen));
      total += w.back();
    }
    for (double& x : w) x = total != 0.0 ? x / total : 0.0;
    taps.first.push_back(lo);
    taps.weights.push_back(std::move(w));
  }
  return taps;
}

uint8_t ToByte(double v) { return static_cast<uint8_t>(std::clamp(std::nearbyint(v), 0.0, 255.0)); }

}  // namespace

std::vector<std::pair<int64_t, int64_t>> PatchesInMergeOrder(const ImageGrid& grid, int64_t merge) {
  std::vector<std::pair<int64_t, int64_t>> out;
  out.reserve(static_cast<size_t>(grid.patches()));
  for (int64_t t = 0; t < grid.t; ++t)
    for (int64_t bh = 0; bh < grid.h / merge; ++bh)
      for (int64_t bw = 0; bw < grid.w / merge; ++bw)
        for (int64_t ih = 0; ih < merge; ++ih)
          for (int64_t iw = 0; iw < merge; ++iw) out.emplace_back(bh * merge + ih, bw * merge + iw);
  return out;
}

Result<std::pair<int64_t, int64_t>> SmartResize(int64_t height, int64_t width, int64_t factor, int64_t min_pixels, int64_t max_pixels) {
  if (height <= 0 || width <= 0) return InvalidArgument("the image has no pixels (" + std::to_string(width) + " x " + std::to_string(height) + ")");
  if (std::max(height, width) > 200 * std::min(height, width))
    return InvalidArgument("the image's aspect ratio is over 200 (" + std::to_string(width) + " x " + std::to_string(height) + ")");
  const double h = static_cast<double>(height), w = static_cast<double>(width), f = static_cast<double>(factor);
  int64_t h_bar = std::max<int64_t>(factor, static_cast<int64_t>(std::nearbyint(h / f)) * factor);
  int64_t w_bar = std::max<int64_t>(factor, static_cast<int64_t>(std::nearbyint(w / f)) * factor);
  if (h_bar * w_bar > max_pixels) {
    const double beta = std::sqrt(h * w / static_cast<double>(max_pixels));
    h_bar = std::max<int64_t>(factor, static_cast<int64_t>(std::floor(h / beta / f)) * factor);
    w_bar = std::max<int64_t>(factor, static_cast<int64_t>(std::floor(w / beta / f)) * factor);
  } else if (h_bar * w_bar < min_pixels) {
    const double beta = std::sqrt(static_cast<double>(min_pixels) / (h * w));
    h_bar = static_cast<int64_t>(std::ceil(h * beta / f)) * factor;
    w_bar = static_cast<int64_t>(std::ceil(w * beta / f)) * factor;
  }
  return std::pair<int64_t, int64_t>{h_bar, w_bar};
}

RgbImage ResizeBicubic(const RgbImage& image, int64_t width, int64_t height) {
  RgbImage wide{width, image.height, std::vector<uint8_t>(static_cast<size_t>(width * image.height * 3))};
  if (width == image.width) {
    wide.rgb = image.rgb;
  } else {
    const Taps taps = TapsOf(image.width, width);
    for (int64_t y = 0; y < image.height; ++y)
      for (int64_t x = 0; x < width; ++x)
        for (int64_t c = 0; c < 3; ++c) {
          double sum = 0.0;
          const std::vector<double>& w = taps.weights[static_cast<size_t>(x)];
          for (size_t i = 0; i < w.size(); ++i) sum += w[i] * image.rgb[static_cast<size_t>((y * image.width + taps.first[x] + int64_t(i)) * 3 + c)];
          wide.rgb[static_cast<size_t>((y * width + x) * 3 + c)] = ToByte(sum);
        }
  }
  if (height == image.height) return wide;
  RgbImage out{width, height, std::vector<uint8_t>(static_cast<size_t>(width * height * 3))};
  const Taps taps = TapsOf(image.height, height);
  for (int64_t y = 0; y < height; ++y) {
    const std::vector<double>& w = taps.weights[static_cast<size_t>(y)];
    for (int64_t x = 0; x < width; ++x)
      for (int64_t c = 0; c < 3; ++c) {
        double sum = 0.0;
        for (size_t i = 0; i < w.size(); ++i) sum += w[i] * wide.rgb[static_cast<size_t>(((taps.first[y] + int64_t(i)) * width + x) * 3 + c)];
        out.rgb[static_cast<size_t>((y * width + x) * 3 + c)] = ToByte(sum);
      }
  }
  return out;
}

std::string ImageDigest(const ImageGrid& grid, const std::vector<float>& values) {
  Sha256 sha;
  sha.Update("anchorage image patches v1");
  for (int64_t v : {grid.t, grid.h, grid.w}) {
    uint8_t bytes[8];
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<uint8_t>(static_cast<uint64_t>(v) >> (8 * i));
    sha.Update(bytes, sizeof bytes);
  }
  sha.Update(values.data(), values.size() * sizeof(float));
  return sha.FinishHex();
}

Result<ImagePatches> PreprocessImage(const RgbImage& image, const ImageProcessing& p) {
  if (image.rgb.size() != static_cast<size_t>(image.width * image.height * 3)) return InvalidArgument("the image's pixels do not fill its size");
  ASSIGN_OR_RETURN(const auto size, SmartResize(image.height, image.width, p.factor(), p.min_pixels, p.max_pixels));
  const auto [height, width] = size;
  const RgbImage resized = ResizeBicubic(image, width, height);
  ImagePatches out;
  out.grid = ImageGrid{1, height / p.patch_size, width / p.patch_size};
  const int64_t P = p.patch_size, T = p.temporal_patch_size, row_values = 3 * T * P * P;
  out.values.resize(static_cast<size_t>(out.grid.patches() * row_values));
  float* row = out.values.data();
  for (const auto& [patch_row, patch_column] : PatchesInMergeOrder(out.grid, p.merge_size)) {
    const int64_t y0 = patch_row * P, x0 = patch_column * P;
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t y = 0; y < P; ++y)
          for (int64_t x = 0; x < P; ++x) {
            const float v = static_cast<float>(resized.rgb[static_cast<size_t>(((y0 + y) * width + x0 + x) * 3 + c)]) * (1.0f / 255.0f);
            row[((c * T + t) * P + y) * P + x] = (v - p.mean[c]) / p.std[c];
          }
    row += row_values;
  }
  out.digest = ImageDigest(out.grid, out.values);
  return out;
}

}  // namespace anchorage
