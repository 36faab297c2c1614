// The CUDA device: finding it, device memory that frees itself, and CUDA errors as Status.
// Plain C++: callers need no CUDA header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/compute/cuda/kernels.h"
#include "engine/core/status.h"

namespace anchorage::cuda {

struct DeviceInfo {
  int index = 0;
  std::string name;
  int sm_major = 0, sm_minor = 0;
  int multiprocessors = 0;
  int64_t memory_bytes = 0;
  int64_t shared_bytes_per_block = 0;  // the opt-in limit of dynamic shared memory
  int runtime_version = 0, driver_version = 0;
  std::string Describe() const;  // e.g. "NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB)"
};

// The device at index, or why none can be used ("no CUDA driver", "no CUDA device", ...).
Result<DeviceInfo> FindDevice(int index = 0);

// Makes device index the calling thread's (CUDA keeps the choice per thread).
Status UseDevice(int index);
// Device memory free now on the calling thread's device.
Result<int64_t> FreeDeviceBytes();

// Status of the last CUDA runtime call (code is a cudaError_t); what names the operation.
Status CudaStatus(int code, const std::string& what);

// Device memory of a fixed size, zeroed when allocated.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  static Result<DeviceBuffer> Allocate(size_t bytes, const std::string& what);
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  void* data() const { return data_; }
  float* floats() const { return static_cast<float*>(data_); }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Page-locked host memory of a fixed size: copies between it and the device run at the bus's rate
// and need no staging by the driver.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  static Result<PinnedBuffer> Allocate(size_t bytes, const std::string& what);
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer();
  char* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  char* data_ = nullptr;
  size_t bytes_ = 0;
};

// Device to pinned host memory and back, asynchronous on s (Synchronize before the host reads or reuses it).
Status CopyToHostAsync(void* host, const void* device, size_t bytes, Stream s);
Status CopyToDeviceAsync(void* device, const void* host, size_t bytes, Stream s);

// Host to device and back, synchronous (the stream is drained first).
Status CopyToDevice(void* device, const void* host, size_t bytes, Stream s);
Status CopyToHost(void* host, const void* device, size_t bytes, Stream s);
// Device to device, asynchronous on s.
Status CopyOnDevice(void* to, const void* from, size_t bytes, Stream s);
// Waits for s and reports the first error any launch on it raised.
Status Synchronize(Stream s, const std::string& what);

}  // namespace anchorage::cuda
