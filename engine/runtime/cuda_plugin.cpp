#include "engine/runtime/cuda_plugin.h"

#include "engine/runtime/cuda_backend.h"

extern "C" __attribute__((visibility("default"))) anchorage::ComputeBackend* anchorage_cuda_backend_v5(
    const anchorage::CudaPluginRequest* request, std::string* error) {
  using namespace anchorage;
  if (!(request->layout == CudaPluginLayout{})) {
    *error = "the CUDA plugin comes from another build of Anchorage than this program";
    return nullptr;
  }
  CudaForwardOptions options;
  options.grid_tokens = request->grid_tokens;
  options.device = request->device;
  options.decode_graphs = request->decode_graphs;
  options.int8_weights = request->int8_weights;
  options.fast_products = request->fast_products;
  auto backend = CudaBackend::Create(*request->config, *request->weights, options);
  if (!backend.ok()) {
    *error = backend.status().message();
    return nullptr;
  }
  return std::move(backend).value().release();
}
