// The CUDA backend as a plugin the server loads at run time (dlopen), so a build with CUDA starts
// where no CUDA library is installed. The plugin resolves the engine's own symbols from the program
// that loads it (which exports them), so both must come from one build: the layout check says so.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "engine/model/model_config.h"
#include "engine/model/weights.h"
#include "engine/runtime/compute_backend.h"

namespace anchorage {

// The sizes of the types that cross the plugin's boundary: a plugin of another build refuses to start.
struct CudaPluginLayout {
  int64_t config = sizeof(ModelConfig);
  int64_t weights = sizeof(ModelWeights);
  int64_t state = sizeof(SequenceState);
  int64_t status = sizeof(Status);
  bool operator==(const CudaPluginLayout&) const = default;
};

struct CudaPluginRequest {
  CudaPluginLayout layout;
  const ModelConfig* config = nullptr;
  const ModelWeights* weights = nullptr;
  int64_t grid_tokens = 1024;
  int device = 0;
  bool decode_graphs = true;
  bool int8_weights = false;  // --weights int8
  bool fast_products = false;  // --precision fast
};

// The plugin's entry point: the backend, or nullptr with error set.
using CudaPluginEntry = ComputeBackend* (*)(const CudaPluginRequest* request, std::string* error);
inline constexpr const char* kCudaPluginEntry = "anchorage_cuda_backend_v5";  // bumped with ComputeBackend or the request
inline constexpr const char* kCudaPluginFile = "anchorage-cuda.so";

// Where the plugin is looked for: ANCHORAGE_CUDA_PLUGIN where set, else beside the program, else
// ../lib/anchorage/ from it (the package's layout).
std::string CudaPluginPath();
// Loads the plugin (once; it stays loaded) and makes its backend on the request's device.
Result<std::unique_ptr<ComputeBackend>> LoadCudaBackend(CudaPluginRequest request);

}  // namespace anchorage
