#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "engine/runtime/cuda_plugin.h"

namespace anchorage {

namespace fs = std::filesystem;

std::string CudaPluginPath() {
  if (const char* named = std::getenv("ANCHORAGE_CUDA_PLUGIN"); named != nullptr && *named != '\0') return named;
  std::error_code ec;
  const fs::path program = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return kCudaPluginFile;
  const fs::path beside = program.parent_path() / kCudaPluginFile;
  if (fs::exists(beside, ec)) return beside.string();
  return (program.parent_path().parent_path() / "lib" / "anchorage" / kCudaPluginFile).string();
}

Result<std::unique_ptr<ComputeBackend>> LoadCudaBackend(CudaPluginRequest request) {
  static std::mutex mutex;
  static CudaPluginEntry entry = nullptr;
  static std::string load_error;
  {
    std::lock_guard lock(mutex);
    if (entry == nullptr && load_error.empty()) {
      const std::string path = CudaPluginPath();
      void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle == nullptr) {
        const char* why = dlerror();
        load_error = "cannot load the CUDA plugin " + path + ": " + (why ? why : "unknown error");
      } else if (void* symbol = dlsym(handle, kCudaPluginEntry); symbol == nullptr) {
        load_error = path + " has no " + kCudaPluginEntry;
      } else {
        entry = reinterpret_cast<CudaPluginEntry>(symbol);
      }
    }
    if (entry == nullptr) return Unsupported(load_error);
  }
  std::string error;
  ComputeBackend* backend = entry(&request, &error);
  if (backend == nullptr) return Unsupported(error.empty() ? "the CUDA plugin made no backend" : error);
  return std::unique_ptr<ComputeBackend>(backend);
}

}  // namespace anchorage
