// The server's start-up configuration: defaults, then a JSON config file (--config), then flags.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/kv_dtype.h"
#include "engine/core/status.h"
#include "engine/server/backends.h"

namespace anchorage {

struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string model_dir;          // empty: the generated tiny model in data_dir
  std::string data_dir;           // default: $XDG_DATA_HOME/anchorage or ~/.local/share/anchorage
  std::string disk_cache_dir;     // the disk tier's folder; empty: DATA_DIR/cache/disk; "off": no disk tier
  std::string shadow_model_dir;   // the shadow reader's model; empty: shadow.model, else beside the generated tiny model; "off": none
  std::string served_model_name;  // default: the model folder's name; "id,alias,alias" adds names
  bool strict_model_names = false;  // refuse a request naming another model (default: any name is served)
  int64_t grid_tokens = 1024;
  std::string admin_token;
  std::vector<std::string> api_keys;       // --api-key (repeatable) and the lines of --api-keys-file
  std::vector<std::string> allowed_hosts;  // --allowed-hosts a,b: Host names accepted besides loopback
  std::vector<std::string> cors_origins;   // --cors-origins a,b: web origins allowed to call
  size_t max_queue = 16;
  int64_t context_tokens = 0;     // 0: the model's max_position_embeddings
  int threads = 0;                // 0: every core
  std::string device = "auto";   // --device cpu|cuda|auto: auto is the GPU where the CUDA plugin finds one
  int cuda_device = 0;            // --cuda-device N
  // --kv-dtype auto|f32|bf16: how every state stores its attention K/V rows; auto (unset) leaves it to the
  // settings' engine.kv_dtype, whose auto is bf16.
  std::optional<KvDtype> kv_dtype;
  // --precision exact|fast: how the bf16 kernel paths multiply (cpu::Precision); unset: the settings'
  // engine.precision, whose default is exact.
  std::optional<std::string> precision;
  // Slots (--parallel); unset: the settings' engine.parallel, whose 0 is 2 on the CPU and 4 on CUDA.
  std::optional<int> parallel;
  bool int8_weights = false;      // --weights int8: matrices made int8 at load; default: as the checkpoint stores them
  std::string test_replies_file;  // testing aid: scripted replies (engine/server/reply_script.h)
  std::vector<BackendSpec> backends;  // --backend NAME=URL[,key=ENVVAR] (repeatable)
  int64_t backend_timeout_ms = 600000;  // --backend-timeout-s: the longest wait for an upstream's next bytes
  // The HTTP transport: timeouts (ms), connection caps, worker threads and the body limit.
  int64_t http_header_timeout_ms = 10000;
  int64_t http_body_timeout_ms = 10000;
  int64_t http_keep_alive_timeout_ms = 30000;
  int64_t max_connections = 1024;
  int64_t max_connections_per_client = 128;
  int64_t http_threads = 64;
  int64_t max_body_bytes = 32 << 20;
  int64_t image_cache_mb = 512;         // --image-cache-mb: the tower's output kept by digest
  int64_t image_max_count = 8;          // --image-max-count: images a prompt keeps (older ones left out in steps of half)
  int64_t image_max_pixels = 1048576;   // --image-max-pixels: an image is resized to at most this area
  std::string image_folder;             // --image-folder: local image files are read from inside it; empty: none
  bool image_urls = false;              // --image-urls allow: http(s) image URLs are fetched (default refuse)
  std::string image_ca_file;            // --image-ca-file: PEM certificates for https image hosts; empty: the system's
  bool help = false;
  std::map<std::string, std::string> run_time_knobs;  // flags that override the settings document: flag -> value
  std::vector<std::string> notes;  // what overrode what, printed at start
};

const char* ServerUsage();
Result<ServerConfig> ParseServerCommandLine(int argc, char** argv);
bool IsLoopbackHost(const std::string& host);
// An endpoint may bind host: a non-loopback address needs the admin token (the start and a move alike).
Status CheckBindAllowed(const std::string& host, const std::string& admin_token);

}  // namespace anchorage
