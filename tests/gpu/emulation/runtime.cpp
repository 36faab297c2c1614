// The CUDA runtime calls of the backend's host code, for the SIMT emulator: one device whose memory
// is host memory; streams are names only, since every launch runs to its end before it returns.
#include <cuda_runtime_api.h>

#include <functional>
#include <map>
#include <mutex>
#include <vector>

#include "simt.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>

// A captured graph and its instance: the launches recorded between the capture's begin and end.
struct CUgraph_st {
  std::vector<std::function<void()>> launches;
};
struct CUgraphExec_st {
  std::vector<std::function<void()>> launches;
};

namespace {

CUstream_st* const kStream = reinterpret_cast<CUstream_st*>(uintptr_t{0x5eed});

}  // namespace

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  std::memset(prop, 0, sizeof *prop);
  std::strcpy(prop->name, "SIMT emulator (CPU)");
  prop->totalGlobalMem = size_t{16} << 30;
  prop->sharedMemPerBlockOptin = 227 * 1024;
  prop->multiProcessorCount = 1;
  return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int* version) {
  *version = 0;
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int* version) {
  *version = 0;
  return cudaSuccess;
}

const char* cudaGetErrorName(cudaError_t error) { return error == cudaSuccess ? "cudaSuccess" : "cudaErrorEmulated"; }
const char* cudaGetErrorString(cudaError_t error) { return error == cudaSuccess ? "no error" : "emulated error"; }
cudaError_t cudaGetLastError() { return cudaSuccess; }
cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : cudaErrorInvalidDevice; }

namespace {

// Device memory in use, and the device's size: ANCHORAGE_EMULATED_DEVICE_BYTES where set (a full
// device for tests), else 1 TiB.
struct DeviceMemory {
  std::mutex mutex;
  std::map<void*, size_t> sizes;
  size_t used = 0;
  size_t total = [] {
    const char* named = std::getenv("ANCHORAGE_EMULATED_DEVICE_BYTES");
    return named != nullptr && *named != '\0' ? static_cast<size_t>(std::strtoull(named, nullptr, 10)) : size_t{1} << 40;
  }();
};
DeviceMemory& Memory() {
  static DeviceMemory memory;
  return memory;
}

}  // namespace

cudaError_t cudaMalloc(void** p, size_t bytes) {
  const size_t rounded = (bytes + 255) / 256 * 256;
  DeviceMemory& m = Memory();
  std::lock_guard lock(m.mutex);
  if (m.used + rounded > m.total) return cudaErrorMemoryAllocation;
  *p = std::aligned_alloc(256, rounded);
  if (*p == nullptr) return cudaErrorMemoryAllocation;
  std::memset(*p, 0xff, bytes);  // device memory starts as garbage: NaN where read as floats
  m.sizes[*p] = rounded;
  m.used += rounded;
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  DeviceMemory& m = Memory();
  std::lock_guard lock(m.mutex);
  if (auto it = m.sizes.find(p); it != m.sizes.end()) {
    m.used -= it->second;
    m.sizes.erase(it);
  }
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  DeviceMemory& m = Memory();
  std::lock_guard lock(m.mutex);
  *free = m.total - m.used;
  *total = m.total;
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned) {
  *p = std::malloc(bytes);
  if (*p == nullptr) return cudaErrorMemoryAllocation;
  std::memset(*p, 0xff, bytes);
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* p) {
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  std::memset(p, value, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* to, const void* from, size_t bytes, cudaMemcpyKind) {
  std::memmove(to, from, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* to, const void* from, size_t bytes, cudaMemcpyKind kind, cudaStream_t) {
  return cudaMemcpy(to, from, bytes, kind);
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  *stream = kStream;
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned) { return cudaStreamCreate(stream); }
cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }

cudaError_t cudaStreamBeginCapture(cudaStream_t, cudaStreamCaptureMode) {
  simt::BeginCapture();
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t* graph) {
  *graph = new CUgraph_st{simt::EndCapture()};
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  *exec = new CUgraphExec_st{graph->launches};
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t) {
  for (const auto& launch : exec->launches) launch();
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}
