// Images made the vision tower's input: the resize to whole merged patches, the normalization and the
// patch layout of Qwen2-VL's image processor, and the digest that keys every cache of an image's rows.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/status.h"

namespace anchorage {

// Pixels, 8-bit RGB, row-major.
struct RgbImage {
  int64_t width = 0, height = 0;
  std::vector<uint8_t> rgb;  // [height, width, 3]
};

// An image's size in patches: t frames (temporal patches), h rows and w columns.
struct ImageGrid {
  int64_t t = 1, h = 0, w = 0;
  int64_t patches() const { return t * h * w; }
  // Rows the image takes in the prompt: one per merge x merge patches.
  int64_t tokens(int64_t merge) const { return t * (h / merge) * (w / merge); }
  bool operator==(const ImageGrid&) const = default;
};

struct ImageProcessing {
  int64_t patch_size = 16;
  int64_t merge_size = 2;
  int64_t temporal_patch_size = 2;
  int64_t min_pixels = 65536;    // the resized image's least area
  int64_t max_pixels = 1048576;  // and its largest
  float mean[3] = {0.5f, 0.5f, 0.5f};
  float std[3] = {0.5f, 0.5f, 0.5f};
  int64_t factor() const { return patch_size * merge_size; }
};

// The preprocessed image: patch rows in merge order (each merge x merge patches consecutive, blocks in
// raster order), a row being channel, frame, pixel row, pixel column.
struct ImagePatches {
  ImageGrid grid;
  std::vector<float> values;  // [grid.patches(), 3 * temporal_patch_size * patch_size²]
  std::string digest;         // hex sha256 over the grid and the values: what every cache keys the image by
};

// Where each patch of the grid lies, in merge order (each merge x merge patches consecutive, blocks in raster
// order, frame after frame): {row, column} in patches.
std::vector<std::pair<int64_t, int64_t>> PatchesInMergeOrder(const ImageGrid& grid, int64_t merge);

// The resized height and width: each side rounded to a multiple of factor, then scaled as one to keep the
// area within [min_pixels, max_pixels]. Refuses a side of zero and an aspect ratio over 200.
Result<std::pair<int64_t, int64_t>> SmartResize(int64_t height, int64_t width, int64_t factor, int64_t min_pixels, int64_t max_pixels);
// Separable bicubic resampling (a = -0.5, the support widened by the scale when shrinking), rounded to 8 bits
// after each pass: horizontal, then vertical.
RgbImage ResizeBicubic(const RgbImage& image, int64_t width, int64_t height);
// Resizes, normalizes and lays out the patches; an image repeats its one frame over the temporal patch.
Result<ImagePatches> PreprocessImage(const RgbImage& image, const ImageProcessing& processing);
// The digest of a grid and its patch values (what PreprocessImage writes into ImagePatches::digest).
std::string ImageDigest(const ImageGrid& grid, const std::vector<float>& values);

}  // namespace anchorage
