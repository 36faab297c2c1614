#include "engine/runtime/prompt_images.h"

#include <algorithm>

#include "engine/core/sha256.h"

namespace anchorage {

std::vector<int32_t> ImageKeyIds(const std::string& digest, int64_t tokens) {
  std::vector<int32_t> ids(static_cast<size_t>(tokens));
  for (int64_t r = 0; r < tokens; ++r) {
    Sha256 sha;
    sha.Update(digest);
    sha.Update(&r, sizeof r);
    const std::array<uint8_t, 32> h = sha.Finish();
    const uint32_t bits = (uint32_t(h[0]) | uint32_t(h[1]) << 8 | uint32_t(h[2]) << 16 | uint32_t(h[3]) << 24) & 0x3fffffffu;
    ids[static_cast<size_t>(r)] = kImageKeyBase | static_cast<int32_t>(bits);
  }
  return ids;
}

Result<std::shared_ptr<const PromptImages>> PromptImages::Locate(std::span<const int32_t> ids,
                                                                 std::span<const std::shared_ptr<const PromptImage>> catalog) {
  auto out = std::make_shared<PromptImages>();
  int64_t shift = 0;
  const int64_t n = static_cast<int64_t>(ids.size());
  for (int64_t i = 0; i < n;) {
    if (!IsImageKey(ids[static_cast<size_t>(i)])) {
      ++i;
      continue;
    }
    std::shared_ptr<const PromptImage> found;
    for (const auto& image : catalog) {
      const int64_t t = image->tokens();
      if (t > 0 && i + t <= n && std::equal(image->key_ids.begin(), image->key_ids.end(), ids.begin() + i)) {
        found = image;
        break;
      }
    }
    if (!found) return InvalidArgument("row " + std::to_string(i) + " holds an image key id that no image of the request starts");
    out->spans_.push_back(Span{i, shift, found});
    shift += std::max(found->rows, found->columns) - found->tokens();
    i += found->tokens();
  }
  return std::shared_ptr<const PromptImages>(std::move(out));
}

void PromptImages::PositionOf(int64_t row, int64_t out[3]) const {
  auto after = std::upper_bound(spans_.begin(), spans_.end(), row, [](int64_t r, const Span& s) { return r < s.row; });
  if (after == spans_.begin()) return TextPositions(row, out);
  const Span& s = *(after - 1);
  const PromptImage& image = *s.image;
  const int64_t base = s.row + s.shift, k = row - s.row;
  if (k < image.tokens()) {
    out[0] = base;
    out[1] = base + k / image.columns;
    out[2] = base + k % image.columns;
    return;
  }
  const int64_t p = row + s.shift + std::max(image.rows, image.columns) - image.tokens();
  out[0] = out[1] = out[2] = p;
}

const float* PromptImages::EmbeddingOf(int64_t row, int32_t id) const {
  auto after = std::upper_bound(spans_.begin(), spans_.end(), row, [](int64_t r, const Span& s) { return r < s.row; });
  if (after == spans_.begin()) return nullptr;
  const Span& s = *(after - 1);
  const int64_t k = row - s.row;
  if (k >= s.image->tokens() || s.image->key_ids[static_cast<size_t>(k)] != id || !s.image->embeddings) return nullptr;
  const int64_t width = static_cast<int64_t>(s.image->embeddings->size()) / s.image->tokens();
  return s.image->embeddings->data() + k * width;
}

bool PromptImages::Holds(std::span<const int32_t> ids) const {
  const int64_t n = static_cast<int64_t>(ids.size());
  int64_t covered = 0;
  for (const Span& s : spans_) {
    if (s.row >= n) break;
    const int64_t end = std::min(n, s.row + s.image->tokens());
    if (!std::equal(ids.begin() + s.row, ids.begin() + end, s.image->key_ids.begin())) return false;
    covered += end - s.row;
  }
  return covered == std::count_if(ids.begin(), ids.end(), IsImageKey);
}

int64_t ImageRows(const ImageCatalog& catalog) {
  int64_t rows = 0;
  for (const auto& image : catalog) rows += image->tokens();
  return rows;
}

int64_t PromptImages::image_rows() const {
  int64_t rows = 0;
  for (const Span& s : spans_) rows += s.image->tokens();
  return rows;
}

}  // namespace anchorage
