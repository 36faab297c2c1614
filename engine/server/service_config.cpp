#include "engine/server/service_config.h"

#include <arpa/inet.h>

#include <cstdlib>
#include <map>

#include <nlohmann/json.hpp>

#include "engine/compute/cpu/matmul.h"
#include "engine/core/file_util.h"
#include "engine/core/text_split.h"
#include "engine/model/model_config.h"

namespace anchorage {

namespace {

std::string DefaultDataDir() {
  if (const char* xdg = std::getenv("XDG_DATA_HOME"); xdg && *xdg) return std::string(xdg) + "/anchorage";
  if (const char* home = std::getenv("HOME"); home && *home) return std::string(home) + "/.local/share/anchorage";
  return ".anchorage";
}

Status Apply(ServerConfig& c, const std::string& key, const std::string& value, const std::string& source) {
  auto integer = [&](int64_t lo, int64_t hi, int64_t* out) -> Status {
    char* end = nullptr;
    long long v = std::strtoll(value.c_str(), &end, 10);
    if (value.empty() || *end != '\0' || v < lo || v > hi)
      return InvalidArgument(source + ": " + key + " must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got '" + value + "'");
    *out = v;
    return Status::Ok();
  };
  int64_t v = 0;
  if (key == "host") c.host = value;
  else if (key == "port") { RETURN_IF_ERROR(integer(0, 65535, &v)); c.port = static_cast<int>(v); }
  else if (key == "model") c.model_dir = value;
  else if (key == "data-dir") c.data_dir = value;
  else if (key == "disk-cache") {
    if (value.empty()) return InvalidArgument(source + ": disk-cache needs a folder, or off");
    c.disk_cache_dir = value;
  }
  else if (key == "shadow-model") {
    if (value.empty()) return InvalidArgument(source + ": shadow-model needs a model folder, or off");
    c.shadow_model_dir = value;
  }
  else if (key == "served-model-name") c.served_model_name = value;
  else if (key == "grid") {
    RETURN_IF_ERROR(integer(64, 1 << 20, &v));
    if (v % 64 != 0) return InvalidArgument(source + ": grid must be a multiple of 64, got " + value);
    c.grid_tokens = v;
  }
  else if (key == "admin-token") c.admin_token = value;
  else if (key == "api-key") {
    if (value.empty()) return InvalidArgument(source + ": api-key must not be empty");
    c.api_keys.push_back(value);
  }
  else if (key == "api-keys-file") {
    ASSIGN_OR_RETURN(std::string text, ReadFile(value));
    size_t added = 0;
    for (std::string& line : SplitList(text, '\n')) {
      if (line[0] == '#') continue;
      c.api_keys.push_back(std::move(line));
      ++added;
    }
    if (added == 0) return InvalidArgument(source + ": " + value + " holds no API key (one a line; # starts a comment)");
  }
  else if (key == "allowed-hosts" || key == "cors-origins") {
    std::vector<std::string>& list = key == "allowed-hosts" ? c.allowed_hosts : c.cors_origins;
    for (std::string& item : SplitList(value, ',')) {
      while (key == "cors-origins" && !item.empty() && item.back() == '/') item.pop_back();
      if (!item.empty()) list.push_back(std::move(item));
    }
  }
  else if (key == "test-replies") c.test_replies_file = value;
  else if (key == "backend") {
    ASSIGN_OR_RETURN(BackendSpec spec, ParseBackendSpec(value));
    for (const BackendSpec& b : c.backends)
      if (b.name == spec.name) return InvalidArgument(source + ": two backends are named '" + spec.name + "'");
    c.backends.push_back(std::move(spec));
  }
  else if (key == "backend-timeout-s") { RETURN_IF_ERROR(integer(1, 86400, &v)); c.backend_timeout_ms = v * 1000; }
  // The cache knobs are checked here and applied as overrides of the settings document (run_time_knobs).
  else if (key == "caches" || key == "end-anchor" || key == "strict-model-names") {
    if (value != "on" && value != "off") return InvalidArgument(source + ": " + key + " must be on or off, got '" + value + "'");
    if (key == "strict-model-names") c.strict_model_names = value == "on";
  }
  else if (key == "resident-gb" || key == "resident-stash-gb" || key == "resident-pin-gb" || key == "resident-park-gb") {
    char* end = nullptr;
    double gb = std::strtod(value.c_str(), &end);
    if (value.empty() || *end != '\0' || !(gb >= 0) || gb > 1e6) return InvalidArgument(source + ": " + key + " must be a number of GiB >= 0, got '" + value + "'");
  }
  else if (key == "resident-guest-max") { RETURN_IF_ERROR(integer(0, int64_t(1) << 32, &v)); }
  else if (key == "max-queue") { RETURN_IF_ERROR(integer(0, 100000, &v)); c.max_queue = static_cast<size_t>(v); }
  else if (key == "ctx") { RETURN_IF_ERROR(integer(16, int64_t(1) << 32, &v)); c.context_tokens = v; }
  else if (key == "http-header-timeout-ms") { RETURN_IF_ERROR(integer(100, 3600000, &c.http_header_timeout_ms)); }
  else if (key == "http-body-timeout-ms") { RETURN_IF_ERROR(integer(100, 3600000, &c.http_body_timeout_ms)); }
  else if (key == "http-keep-alive-timeout-ms") { RETURN_IF_ERROR(integer(100, 3600000, &c.http_keep_alive_timeout_ms)); }
  else if (key == "max-connections") { RETURN_IF_ERROR(integer(4, 1000000, &c.max_connections)); }
  else if (key == "max-connections-per-client") { RETURN_IF_ERROR(integer(1, 1000000, &c.max_connections_per_client)); }
  else if (key == "http-threads") { RETURN_IF_ERROR(integer(1, 4096, &c.http_threads)); }
  else if (key == "max-body-bytes") { RETURN_IF_ERROR(integer(1024, int64_t(1) << 32, &c.max_body_bytes)); }
  else if (key == "image-cache-mb") { RETURN_IF_ERROR(integer(0, int64_t(1) << 20, &c.image_cache_mb)); }
  else if (key == "image-max-count") { RETURN_IF_ERROR(integer(0, 1024, &c.image_max_count)); }
  else if (key == "image-max-pixels") { RETURN_IF_ERROR(integer(65536, int64_t(1) << 24, &c.image_max_pixels)); }
  else if (key == "image-folder") c.image_folder = value;
  else if (key == "image-ca-file") c.image_ca_file = value;
  else if (key == "image-urls") {
    if (value != "allow" && value != "refuse") return InvalidArgument(source + ": image-urls must be allow or refuse, got '" + value + "'");
    c.image_urls = value == "allow";
  }
  else if (key == "threads") { RETURN_IF_ERROR(integer(0, 1024, &v)); c.threads = static_cast<int>(v); }
  else if (key == "device") {
    if (value != "cpu" && value != "cuda" && value != "auto")
      return InvalidArgument(source + ": device must be cpu, cuda or auto, got '" + value + "'");
    c.device = value;
  }
  else if (key == "cuda-device") { RETURN_IF_ERROR(integer(0, 255, &v)); c.cuda_device = static_cast<int>(v); }
  else if (key == "parallel" && value == "auto") { c.parallel.reset(); }
  else if (key == "parallel") { RETURN_IF_ERROR(integer(1, 64, &v)); c.parallel = static_cast<int>(v); }
  else if (key == "precision") {
    if (auto precision = cpu::PrecisionFromName(value); !precision.ok()) return InvalidArgument(source + ": " + precision.status().message());
    c.precision = value;
  }
  else if (key == "kv-dtype" && value == "auto") { c.kv_dtype.reset(); }
  else if (key == "kv-dtype") {
    auto dtype = ParseKvDtype(value);
    if (!dtype.ok()) return InvalidArgument(source + ": kv-dtype must be auto, f32, bf16 or fp8, got '" + value + "'");
    c.kv_dtype = *dtype;
  }
  else if (key == "weights") {
    if (value != "as-stored" && value != "int8")
      return InvalidArgument(source + ": weights must be as-stored or int8, got '" + value + "'");
    c.int8_weights = value == "int8";
  }
  else return InvalidArgument(source + ": unknown setting '" + key + "'");
  return Status::Ok();
}

}  // namespace

const char* ServerUsage() {
  return "usage: anchorage-server [--config FILE] [--host ADDR] [--port N] [--model DIR] [--data-dir DIR]\n"
         "                        [--served-model-name NAME[,ALIAS...]] [--grid TOKENS] [--admin-token TOKEN]\n"
         "                        [--api-key KEY]... [--api-keys-file FILE] [--allowed-hosts H,H]\n"
         "                        [--cors-origins ORIGIN,ORIGIN] [--strict-model-names on|off]\n"
         "                        [--max-queue N] [--ctx TOKENS] [--threads N] [--weights as-stored|int8]\n"
         "                        [--kv-dtype auto|f32|bf16|fp8] [--precision exact|fast] [--parallel N|auto]\n"
         "                        [--device cpu|cuda|auto] [--cuda-device N]\n"
         "                        [--image-max-count N] [--image-max-pixels N] [--image-cache-mb MB] [--image-folder DIR]\n"
         "                        [--image-urls refuse|allow] [--image-ca-file FILE]\n"
         "                        [--caches on|off]\n"
         "                        [--resident-gb GB] [--resident-guest-max TOKENS] [--resident-stash-gb GB]\n"
         "                        [--resident-pin-gb GB] [--resident-park-gb GB] [--end-anchor on|off]\n"
         "                        [--disk-cache DIR|off] [--shadow-model DIR|off]\n"
         "                        [--http-threads N] [--max-connections N] [--max-connections-per-client N]\n"
         "                        [--http-header-timeout-ms MS] [--http-body-timeout-ms MS]\n"
         "                        [--http-keep-alive-timeout-ms MS] [--max-body-bytes N] [--test-replies FILE]\n"
         "                        [--backend NAME=URL[,key=ENVVAR]]... [--backend-timeout-s S]\n"
         "Serves the OpenAI-compatible API on http://127.0.0.1:8000/v1 by default. Without --model it\n"
         "generates the tiny model in DATA_DIR/models/tiny-seed0 and serves that. The disk tier lives in\n"
         "DATA_DIR/cache/disk unless --disk-cache names another folder (off: none). The shadow reader runs\n"
         "on --shadow-model (a small model of the same vocabulary), or beside the generated tiny model on\n"
         "the generated shadow model; its session files live in DATA_DIR/cache/shadow. FILE is a JSON object\n"
         "with the same keys as the flags (\"port\": 8001, \"grid\": 1024, ...); flags override it.\n"
         "--backend forwards requests for model NAME to an OpenAI-compatible server at URL (vLLM, SGLang,\n"
         "llama-server, another anchorage-server), with the API key in environment variable ENVVAR.\n"
         "--weights int8 makes the BF16 matrices int8 at load (a scale a row and 32 inputs: about half the bytes\n"
         "and faster decode, not exact); it prints the logits' measured distance from the stored weights'.\n"
         "--kv-dtype bf16 keeps attention K/V rows in bf16 (rounded once, when written: half the bytes a token in\n"
         "every tier, every resume still equal to a cold prefill of the same dtype); fp8 keeps e4m3 codes with a\n"
         "power-of-two scale per 32 values (about a quarter of f32's bytes, resumes as exact, logits further off);\n"
         "f32 keeps fp32 rows; auto (the default) takes the settings' engine.kv_dtype, bf16 unless it says otherwise.\n"
         "--precision fast multiplies activations rounded once to bf16 on the CPU's bf16 units (AVX-512 BF16, AMX),\n"
         "a third of exact's products there, and in half the GPU's prefill GEMM; logits further from the reference.\n"
         "A CPU without bf16 units runs exact and says so. exact (the default, or the settings' engine.precision)\n"
         "keeps fp32-grade products. Every resume stays exact within a precision; stored states name it.\n"
         "--parallel N runs up to N conversations at once (slots), their decode steps batched and each one's tokens\n"
         "the same bits as alone; auto (the default) takes the settings' engine.parallel, else 2 on the CPU, 4 on CUDA.\n"
         "--device picks what runs the model: cuda (the GPU, through the CUDA plugin anchorage-cuda.so; an error\n"
         "where none can be used), cpu, or auto (the default: the GPU where one is found, else the CPU).\n";
}

bool IsLoopbackHost(const std::string& host) {
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  return host == "localhost" || host == "::1" || host == "[::1]";
}

Status CheckBindAllowed(const std::string& host, const std::string& admin_token) {
  if (IsLoopbackHost(host) || !admin_token.empty()) return Status::Ok();
  return InvalidArgument("binding a non-loopback address needs --admin-token");
}

Result<ServerConfig> ParseServerCommandLine(int argc, char** argv) {
  ServerConfig c;
  c.data_dir = DefaultDataDir();
  std::vector<std::pair<std::string, std::string>> flags;
  std::string config_file;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") { c.help = true; return c; }
    if (a.rfind("--", 0) != 0) return InvalidArgument("unexpected argument '" + a + "'");
    std::string key = a.substr(2), value;
    if (size_t eq = key.find('='); eq != std::string::npos) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
    } else {
      if (i + 1 >= argc) return InvalidArgument("flag --" + key + " needs a value");
      value = argv[++i];
    }
    if (key == "config") config_file = value;
    else flags.emplace_back(key, value);
  }
  std::map<std::string, std::string> from_file;
  if (!config_file.empty()) {
    ASSIGN_OR_RETURN(std::string text, ReadFile(config_file));
    nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return InvalidArgument(config_file + ": must hold a JSON object");
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (it.value().is_array()) {  // a repeatable flag: "backend": ["a=http://...", "b=http://..."]
        for (const auto& item : it.value()) RETURN_IF_ERROR(Apply(c, it.key(), item.is_string() ? item.get<std::string>() : item.dump(), config_file));
        continue;
      }
      std::string value = it.value().is_string() ? it.value().get<std::string>() : it.value().dump();
      RETURN_IF_ERROR(Apply(c, it.key(), value, config_file));
      from_file[it.key()] = value;
    }
  }
  for (const auto& [key, value] : flags) {
    RETURN_IF_ERROR(Apply(c, key, value, "--" + key));
    if (key == "caches" || key == "end-anchor" || key.rfind("resident-", 0) == 0) c.run_time_knobs[key] = value;
    const bool secret = key == "admin-token" || key == "api-key";
    if (from_file.count(key) && from_file[key] != value)
      c.notes.push_back("--" + key + " " + (secret ? "(hidden)" : value) + " overrides " + config_file + "'s " + (secret ? "(hidden)" : from_file[key]));
  }
  return c;
}

}  // namespace anchorage
