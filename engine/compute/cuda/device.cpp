#include "engine/compute/cuda/device.h"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <utility>

namespace anchorage::cuda {

std::string DeviceInfo::Describe() const {
  char text[256];
  std::snprintf(text, sizeof text, "%s (sm_%d%d, %d SMs, %.1f GiB)", name.c_str(), sm_major, sm_minor, multiprocessors,
                static_cast<double>(memory_bytes) / (1 << 30));
  return text;
}

Status CudaStatus(int code, const std::string& what) {
  if (code == cudaSuccess) return Status::Ok();
  const auto error = static_cast<cudaError_t>(code);
  return Internal("CUDA: " + what + ": " + cudaGetErrorName(error) + " (" + cudaGetErrorString(error) + ")");
}

Status UseDevice(int index) { return CudaStatus(cudaSetDevice(index), "selecting device " + std::to_string(index)); }

Result<int64_t> FreeDeviceBytes() {
  size_t free = 0, total = 0;
  RETURN_IF_ERROR(CudaStatus(cudaMemGetInfo(&free, &total), "reading the device's free memory"));
  return static_cast<int64_t>(free);
}

Result<DeviceInfo> FindDevice(int index) {
  int count = 0;
  const cudaError_t found = cudaGetDeviceCount(&count);
  if (found != cudaSuccess) {
    cudaGetLastError();  // clear it: the CPU path goes on
    return Unsupported(std::string("no usable CUDA device: ") + cudaGetErrorName(found) + " (" + cudaGetErrorString(found) + ")");
  }
  if (index < 0 || index >= count)
    return Unsupported("no CUDA device " + std::to_string(index) + " (" + std::to_string(count) + " found)");
  cudaDeviceProp prop{};
  RETURN_IF_ERROR(CudaStatus(cudaGetDeviceProperties(&prop, index), "reading the device's properties"));
  DeviceInfo info;
  info.index = index;
  info.name = prop.name;
  info.sm_major = prop.major;
  info.sm_minor = prop.minor;
  info.multiprocessors = prop.multiProcessorCount;
  info.memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
  info.shared_bytes_per_block = static_cast<int64_t>(prop.sharedMemPerBlockOptin);
  cudaRuntimeGetVersion(&info.runtime_version);
  cudaDriverGetVersion(&info.driver_version);
  return info;
}

Result<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes, const std::string& what) {
  DeviceBuffer buffer;
  if (bytes == 0) return buffer;
  const cudaError_t done = cudaMalloc(&buffer.data_, bytes);
  if (done != cudaSuccess) {
    cudaGetLastError();
    return ResourceExhausted("CUDA: cannot allocate " + std::to_string(bytes) + " bytes of device memory for " + what + ": " +
                             cudaGetErrorString(done));
  }
  buffer.bytes_ = bytes;
  RETURN_IF_ERROR(CudaStatus(cudaMemset(buffer.data_, 0, bytes), "zeroing " + what));
  return buffer;
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) cudaFree(data_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) cudaFree(data_);
}

Result<PinnedBuffer> PinnedBuffer::Allocate(size_t bytes, const std::string& what) {
  PinnedBuffer buffer;
  if (bytes == 0) return buffer;
  void* p = nullptr;
  const cudaError_t done = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
  if (done != cudaSuccess) {
    cudaGetLastError();
    return ResourceExhausted("CUDA: cannot allocate " + std::to_string(bytes) + " bytes of pinned host memory for " + what + ": " +
                             cudaGetErrorString(done));
  }
  buffer.data_ = static_cast<char*>(p);
  buffer.bytes_ = bytes;
  return buffer;
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) cudaFreeHost(data_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

PinnedBuffer::~PinnedBuffer() {
  if (data_ != nullptr) cudaFreeHost(data_);
}

Status CopyToHostAsync(void* host, const void* device, size_t bytes, Stream s) {
  if (bytes == 0) return Status::Ok();
  return CudaStatus(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, s), "copying to the host");
}

Status CopyToDeviceAsync(void* device, const void* host, size_t bytes, Stream s) {
  if (bytes == 0) return Status::Ok();
  return CudaStatus(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, s), "copying to the device");
}

Status CopyToDevice(void* device, const void* host, size_t bytes, Stream s) {
  if (bytes == 0) return Status::Ok();
  RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(s), "waiting before a copy to the device"));
  return CudaStatus(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice), "copying to the device");
}

Status CopyToHost(void* host, const void* device, size_t bytes, Stream s) {
  if (bytes == 0) return Status::Ok();
  RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(s), "waiting before a copy to the host"));
  return CudaStatus(cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost), "copying to the host");
}

Status CopyOnDevice(void* to, const void* from, size_t bytes, Stream s) {
  if (bytes == 0) return Status::Ok();
  return CudaStatus(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, s), "copying on the device");
}

Status Synchronize(Stream s, const std::string& what) {
  RETURN_IF_ERROR(CudaStatus(cudaGetLastError(), what));
  return CudaStatus(cudaStreamSynchronize(s), what);
}

}  // namespace anchorage::cuda
