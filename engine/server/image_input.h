// A request's images: their URLs resolved to bytes (data: URLs, and files inside --image-folder), decoded,
// preprocessed and encoded by the tower (or its cache), and the prompt's placeholders expanded to their key ids.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/runtime/image_encoder.h"

namespace anchorage {

struct ImageInputOptions {
  int64_t max_pixels = 1048576;       // an image is resized to at most this area (--image-max-pixels)
  int64_t min_pixels = 65536;         // and at least this
  int64_t max_decode_pixels = 1 << 26;  // a larger image is refused before it is decoded
  int64_t max_bytes = 32ll << 20;     // a larger file is refused
  std::string folder;                 // local files are read from inside it; empty: none
  bool fetch_http = false;            // --image-urls allow: http:// and https:// URLs are fetched
  std::string ca_file;                // --image-ca-file: PEM certificates https hosts are checked against; empty: the system's
  int fetch_timeout_ms = 10000;       // the longest a fetch may take to connect, and then between bytes
};

// The bytes an image URL names. http(s) URLs are refused unless fetch_http (then fetched within max_bytes).
Result<std::string> ImageBytesOf(const std::string& url, const ImageInputOptions& options);
Result<std::string> DecodeBase64(std::string_view text);

// Encodes every URL's image and replaces the k-th placeholder id of ids with image k's key ids; the
// placeholders must be as many as the URLs. Errors name the image by its place (#0 is the first): a bad
// image is InvalidArgument; the tower's own failures keep their code (ResourceExhausted: no room on the device).
Result<ImageCatalog> PrepareImages(ImageEncoder& encoder, const std::vector<std::string>& urls, const ImageInputOptions& options,
                                     int32_t placeholder_id, std::vector<int32_t>* ids);

}  // namespace anchorage
