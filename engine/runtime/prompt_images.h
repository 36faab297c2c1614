// Images in a prompt. An image's rows carry key ids made from its digest instead of the one placeholder
// token, so every cache that compares ids tells images apart; the forward takes those rows from the
// tower's output. A prompt's images also move the rotary positions (Qwen3-VL's M-RoPE): an image's rows
// sit at (t, h, w) = (base, base + row, base + column), and the text after it goes on from
// base + max(rows, columns).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/core/status.h"

namespace anchorage {

// Ids from here up are image rows' key ids: no vocabulary comes near.
inline constexpr int32_t kImageKeyBase = 1 << 30;
inline bool IsImageKey(int32_t id) { return id >= kImageKeyBase; }
// The key ids of an image's rows: 30 bits each of sha256(digest, row).
std::vector<int32_t> ImageKeyIds(const std::string& digest, int64_t tokens);

// One image of a request: its key ids and the tower's rows for them.
struct PromptImage {
  std::string digest;              // ImagePatches::digest
  int64_t rows = 0, columns = 0;   // merged patches: the image's rows in the prompt are rows x columns
  std::vector<int32_t> key_ids;    // ImageKeyIds(digest, rows * columns)
  std::shared_ptr<const std::vector<float>> embeddings;  // [rows * columns, hidden]: the tower's output
  int64_t tokens() const { return rows * columns; }
};

// A request's images, in the prompt's order.
using ImageCatalog = std::vector<std::shared_ptr<const PromptImage>>;
// The rows a catalog's images take.
int64_t ImageRows(const ImageCatalog& catalog);

// Where a sequence's images are among its rows, found from its ids.
class PromptImages {
 public:
  // Every run of image key ids in ids must be one whole image of catalog; an error says which is not.
  static Result<std::shared_ptr<const PromptImages>> Locate(std::span<const int32_t> ids, std::span<const std::shared_ptr<const PromptImage>> catalog);
  // The rotary position of a row on the t, h and w axes (a text row's three are equal).
  void PositionOf(int64_t row, int64_t out[3]) const;
  // The tower's row for a row holding key id `id`; nullptr when no image of this sequence holds it there.
  const float* EmbeddingOf(int64_t row, int32_t id) const;
  // Whether these are the images of ids: each of its images lying below ids.size() holds its key ids there,
  // and no other row of ids holds an image key id.
  bool Holds(std::span<const int32_t> ids) const;
  int64_t image_rows() const;

 private:
  struct Span {
    int64_t row = 0;           // the image's first row
    int64_t shift = 0;         // position minus row at that row
    std::shared_ptr<const PromptImage> image;
  };
  std::vector<Span> spans_;    // by row
};

// A row's positions in a sequence without images: the row itself on every axis.
inline void TextPositions(int64_t row, int64_t out[3]) { out[0] = out[1] = out[2] = row; }

}  // namespace anchorage
