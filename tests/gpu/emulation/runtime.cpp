// The CUDA runtime calls of the backend's host code, for the SIMT emulator: one device whose memory
// is host memory and one stream (every stream is it), whose work runs when the host waits for it.
// Copies behave as CUDA documents them: from pageable memory they are taken at the call, to pageable
// memory they wait for the stream, and pinned memory is read or written when the copy runs. A stream
// capture fails, as CUDA's does, at a wait, a synchronous copy or memset, a pageable copy, or a free.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <utility>
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

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    default: return "cudaErrorEmulated";
  }
}
const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    default: return "emulated error";
  }
}
namespace {

// Set by a call a stream capture cannot hold, returned once by cudaGetLastError.
thread_local cudaError_t last_error = cudaSuccess;

cudaError_t Fail(cudaError_t error) {
  last_error = error;
  return error;
}

// During a capture: the capture fails and the call returns why.
cudaError_t RefusedInCapture() {
  simt::InvalidateCapture();
  return Fail(cudaErrorStreamCaptureUnsupported);
}

}  // namespace

cudaError_t cudaGetLastError() { return std::exchange(last_error, cudaSuccess); }
cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : cudaErrorInvalidDevice; }

namespace {

// Device memory in use, and the device's size: ANCHORAGE_EMULATED_DEVICE_BYTES where set (a full
// device for tests), else 1 TiB.
struct DeviceMemory {
  std::mutex mutex;
  std::map<void*, size_t> sizes;
  std::map<const char*, size_t> pinned;  // cudaHostAlloc's blocks
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

bool Pinned(const void* p, size_t bytes) {
  DeviceMemory& m = Memory();
  std::lock_guard lock(m.mutex);
  const char* c = static_cast<const char*>(p);
  auto it = m.pinned.upper_bound(c);
  if (it == m.pinned.begin()) return false;
  --it;
  return c + bytes <= it->first + it->second;
}

}  // namespace

cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (simt::Capturing()) return RefusedInCapture();
  const size_t rounded = (bytes + 255) / 256 * 256;
  DeviceMemory& m = Memory();
  std::lock_guard lock(m.mutex);
  if (m.used + rounded > m.total) return Fail(cudaErrorMemoryAllocation);
  *p = nullptr;
  if (posix_memalign(p, 256, std::max<size_t>(bytes, 1)) != 0) return Fail(cudaErrorMemoryAllocation);  // the exact size: a sanitizer sees reads past it
  std::memset(*p, 0xff, bytes);  // device memory starts as garbage: NaN where read as floats
  m.sizes[*p] = rounded;
  m.used += rounded;
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  if (!simt::Flush()) return RefusedInCapture();  // a free waits for the device
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

size_t simtSetDeviceBytes(size_t total) {
  DeviceMemory& m = Memory();
  std::lock_guard lock(m.mutex);
  return std::exchange(m.total, total);
}

cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned) {
  if (simt::Capturing()) return RefusedInCapture();
  *p = std::malloc(std::max<size_t>(bytes, 1));
  if (*p == nullptr) return cudaErrorMemoryAllocation;
  std::memset(*p, 0xff, bytes);
  DeviceMemory& m = Memory();
  std::lock_guard lock(m.mutex);
  m.pinned[static_cast<const char*>(*p)] = bytes;
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* p) {
  if (!simt::Flush()) return RefusedInCapture();
  {
    DeviceMemory& m = Memory();
    std::lock_guard lock(m.mutex);
    m.pinned.erase(static_cast<const char*>(p));
  }
  std::free(p);
  return cudaSuccess;
}

// On the legacy stream, which waits for the backend's blocking stream: queued, not run now.
cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  if (simt::Capturing()) return RefusedInCapture();
  simt::Submit([p, value, bytes] { std::memset(p, value, bytes); });
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* to, const void* from, size_t bytes, cudaMemcpyKind) {
  if (!simt::Flush()) return RefusedInCapture();
  std::memmove(to, from, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* to, const void* from, size_t bytes, cudaMemcpyKind kind, cudaStream_t) {
  const bool pageable = (kind == cudaMemcpyHostToDevice && !Pinned(from, bytes)) || (kind == cudaMemcpyDeviceToHost && !Pinned(to, bytes));
  if (pageable && simt::Capturing()) return RefusedInCapture();
  if (kind == cudaMemcpyDeviceToHost && pageable) return cudaMemcpy(to, from, bytes, kind);  // returns when the copy is done
  if (kind == cudaMemcpyHostToDevice && pageable) {  // the source is taken now, written when the stream gets there
    auto taken = std::make_shared<std::vector<char>>(static_cast<const char*>(from), static_cast<const char*>(from) + bytes);
    simt::Submit([to, taken] { std::memcpy(to, taken->data(), taken->size()); });
    return cudaSuccess;
  }
  simt::Submit([to, from, bytes] { std::memmove(to, from, bytes); });
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  *stream = kStream;
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned) { return cudaStreamCreate(stream); }
cudaError_t cudaStreamDestroy(cudaStream_t) { return simt::Flush() ? cudaSuccess : RefusedInCapture(); }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return simt::Flush() ? cudaSuccess : RefusedInCapture(); }

cudaError_t cudaStreamBeginCapture(cudaStream_t, cudaStreamCaptureMode) {
  simt::BeginCapture();
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t* graph) {
  auto captured = simt::EndCapture();
  if (!captured) {
    *graph = nullptr;
    return Fail(cudaErrorStreamCaptureInvalidated);
  }
  *graph = new CUgraph_st{std::move(*captured)};
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  *exec = new CUgraphExec_st{graph->launches};
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t) {
  for (const auto& launch : exec->launches) simt::Submit(launch);
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
