#include "engine/server/image_input.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <semaphore>

#include <httplib.h>

#include "engine/core/file_util.h"
#include "engine/image/image_decode.h"

namespace anchorage {

namespace {

int Base64Value(unsigned char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+' || c == '-') return 62;
  if (c == '/' || c == '_') return 63;
  return -1;
}

// GET of an http:// or https:// URL: 200 with at most options.max_bytes, within the timeout between
// bytes. https verifies the host's certificate and name against the system's CAs (or options.ca_file).
Result<std::string> FetchHttp(const std::string& url, const ImageInputOptions& options) {
  const bool tls = url.rfind("https://", 0) == 0;
  const size_t host_at = tls ? 8 : 7, path_at = url.find('/', host_at);
  const std::string origin = url.substr(0, path_at);
  const std::string path = path_at == std::string::npos ? "/" : url.substr(path_at);
  if (origin.size() <= host_at) return InvalidArgument("the image URL names no host");
  httplib::Client client(origin);
  if (!client.is_valid()) return InvalidArgument("the image URL's host '" + origin.substr(host_at) + "' cannot be used");
  client.enable_server_certificate_verification(true);
  if (tls && !options.ca_file.empty()) client.set_ca_cert_path(options.ca_file);
  const auto timeout = std::chrono::milliseconds(options.fetch_timeout_ms);
  client.set_connection_timeout(timeout);
  client.set_read_timeout(timeout);
  client.set_follow_location(false);
  std::string body;
  bool too_large = false, too_slow = false;
  const auto deadline = std::chrono::steady_clock::now() + 3 * timeout;  // a slow drip cannot hold the thread past it
  auto response = client.Get(path, [&](const char* data, size_t n) {
    too_large = body.size() + n > static_cast<size_t>(options.max_bytes);
    too_slow = std::chrono::steady_clock::now() > deadline;
    if (too_large || too_slow) return false;
    body.append(data, n);
    return true;
  });
  if (too_large) return InvalidArgument("the image at " + url + " is over " + std::to_string(options.max_bytes) + " bytes");
  if (too_slow) return InvalidArgument("the image at " + url + " took too long to arrive");
  if (!response && response.error() == httplib::Error::SSLServerVerification)
    return InvalidArgument("the image at " + url + " could not be fetched: its host's certificate is not trusted (no CA of the system's or of " +
                           "--image-ca-file vouches for it, or it names another host)");
  if (!response && response.error() == httplib::Error::SSLConnection)
    return InvalidArgument("the image at " + url + " could not be fetched: the TLS handshake failed");
  if (!response) return InvalidArgument("the image at " + url + " could not be fetched: " + httplib::to_string(response.error()));
  if (response->status != 200) return InvalidArgument("fetching the image at " + url + " answered HTTP " + std::to_string(response->status));
  return body;
}

}  // namespace

Result<std::string> DecodeBase64(std::string_view text) {
  std::string out;
  out.reserve(text.size() / 4 * 3);
  uint32_t bits = 0;
  int held = 0;
  size_t padding = 0;
  for (unsigned char c : text) {
    if (c == '\r' || c == '\n' || c == ' ' || c == '\t') continue;
    if (c == '=') {
      ++padding;
      continue;
    }
    const int v = Base64Value(c);
    if (v < 0 || padding > 0) return InvalidArgument("the data: URL's base64 holds a character outside the alphabet");
    bits = bits << 6 | static_cast<uint32_t>(v);
    held += 6;
    if (held >= 8) {
      held -= 8;
      out.push_back(static_cast<char>(bits >> held & 0xff));
    }
  }
  if (padding > 2 || held >= 6) return InvalidArgument("the data: URL's base64 is cut short");
  return out;
}

Result<std::string> ImageBytesOf(const std::string& url, const ImageInputOptions& options) {
  namespace fs = std::filesystem;
  if (url.rfind("data:", 0) == 0) {
    const size_t comma = url.find(',');
    if (comma == std::string::npos) return InvalidArgument("the data: URL has no ',' before its data");
    const std::string header = url.substr(5, comma - 5);
    if (header.size() < 7 || header.compare(header.size() - 7, 7, ";base64") != 0)
      return InvalidArgument("the data: URL must be base64 (data:image/png;base64,...)");
    if ((url.size() - comma - 1) / 4 * 3 > static_cast<size_t>(options.max_bytes))
      return InvalidArgument("the image is over " + std::to_string(options.max_bytes) + " bytes");
    return DecodeBase64(std::string_view(url).substr(comma + 1));
  }
  const bool remote = url.rfind("http://", 0) == 0 || url.rfind("https://", 0) == 0;
  if (remote && options.fetch_http) return FetchHttp(url, options);
  if (remote)
    return InvalidArgument("image URLs over http(s) are not fetched (start the server with --image-urls allow); send the image as a data: URL");
  const std::string path = url.rfind("file://", 0) == 0 ? url.substr(7) : url;
  if (options.folder.empty())
    return InvalidArgument("local image files are off; send the image as a data: URL (or start the server with --image-folder DIR)");
  const fs::path asked(path);
  for (const fs::path& part : asked)
    if (part == "..") return InvalidArgument("the image file '" + path + "' names a parent folder ('..')");
  std::error_code ec;
  const fs::path folder = fs::canonical(options.folder, ec);
  if (ec) return InvalidArgument("the server's --image-folder cannot be read");
  // Fully resolved (symlinks included), so a link inside the folder cannot lead outside it.
  const fs::path file = fs::canonical(asked.is_absolute() ? asked : folder / asked, ec);
  if (ec) return InvalidArgument("the image file '" + path + "' does not exist or cannot be read");
  const auto [end, _] = std::mismatch(folder.begin(), folder.end(), file.begin(), file.end());
  if (end != folder.end()) return InvalidArgument("the image file '" + path + "' is outside --image-folder");
  if (!fs::is_regular_file(file, ec)) return InvalidArgument("the image file '" + path + "' is not a file");
  if (static_cast<int64_t>(fs::file_size(file, ec)) > options.max_bytes)
    return InvalidArgument("the image file '" + path + "' is over " + std::to_string(options.max_bytes) + " bytes");
  return ReadFile(file.string());
}

Result<ImageCatalog> PrepareImages(ImageEncoder& encoder, const std::vector<std::string>& urls, const ImageInputOptions& options,
                                     int32_t placeholder_id, std::vector<int32_t>* ids) {
  const int64_t placeholders = std::count(ids->begin(), ids->end(), placeholder_id);
  if (placeholders != static_cast<int64_t>(urls.size()))
    return InvalidArgument("the prompt holds " + std::to_string(placeholders) + " image placeholders for " + std::to_string(urls.size()) +
                           " images (is <|image_pad|> written in a text part?)");
  // Decoding holds up to a few hundred MiB an image: two requests' images at a time, the others wait.
  static std::counting_semaphore<2> decoding(2);
  decoding.acquire();
  struct Release {
    ~Release() { decoding.release(); }
  } release;
  ImageCatalog out;
  ImageProcessing processing = encoder.Processing();
  processing.min_pixels = options.min_pixels;
  processing.max_pixels = options.max_pixels;
  for (size_t k = 0; k < urls.size(); ++k) {
    const std::string which = "image #" + std::to_string(k) + ": ";
    const auto fail = [&](const Status& s) { return InvalidArgument(which + s.message()); };
    Result<std::string> bytes = ImageBytesOf(urls[k], options);
    if (!bytes.ok()) return fail(bytes.status());
    Result<RgbImage> image = DecodeImage(*bytes, options.max_decode_pixels);
    if (!image.ok()) return fail(image.status());
    Result<ImagePatches> patches = PreprocessImage(*image, processing);
    if (!patches.ok()) return fail(patches.status());
    Result<std::shared_ptr<const PromptImage>> encoded = encoder.Encode(*patches);
    if (!encoded.ok()) return Status(encoded.status().code(), which + encoded.status().message());  // the tower's: not the image's fault
    out.push_back(*encoded);
  }
  std::vector<int32_t> expanded;
  expanded.reserve(ids->size() + static_cast<size_t>(ImageRows(out)));
  size_t k = 0;
  for (int32_t id : *ids) {
    if (id != placeholder_id) {
      expanded.push_back(id);
      continue;
    }
    const std::vector<int32_t>& keys = out[k++]->key_ids;
    expanded.insert(expanded.end(), keys.begin(), keys.end());
  }
  *ids = std::move(expanded);
  return out;
}

}  // namespace anchorage
