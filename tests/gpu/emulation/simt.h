// A SIMT emulator for the tests: runs the CUDA backend's kernels (kernels.cu compiled as C++) on one
// CPU thread, one block after another, each of a block's threads a fiber that yields at barriers and
// warp shuffles. Slow, deterministic, and enough to check the kernels' logic where no GPU is.
// Like a GPU's stream, work waits in a queue until the host synchronizes, so a host read that forgot
// to wait sees stale bits; SIMT_ORDER=reverse runs threads and blocks last first, so a missing barrier
// shows either way round; a warp-wide shuffle some lanes exited before, and launches a GPU would refuse (too many threads, too large a grid, dynamic
// shared memory past 48 KiB without the kernel's attribute) stop the process.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

namespace simt {

// Runs body once for every thread of every block of grid. Block sizes must be multiples of 32.
void RunGrid(dim3 grid, dim3 block, size_t shared_bytes, const std::function<void()>& body);
// Stops the process, naming the launch, where a GPU would refuse it.
void CheckLaunch(const void* kernel, dim3 grid, dim3 block, size_t shared_bytes);
// cudaFuncSetAttribute(kernel, MaxDynamicSharedMemorySize, bytes): false past the device's opt-in most.
bool SetMaxDynamicShared(const void* kernel, int bytes);

// What the running thread sees.
dim3 ThreadIdx();
dim3 BlockIdx();
dim3 BlockDim();
dim3 GridDim();
void* DynamicShared();  // the block's dynamic shared memory, filled with 0xff bytes (NaN) at its start
void SyncThreads();
void SyncWarp();
// A warp shuffle of a 32-bit word: from lane `lane` (is_xor false) or from this lane ^ lane.
uint32_t ShuffleWord(uint32_t word, int lane, bool is_xor);

// Queues work on the stream, or records it while a stream capture is open (a graph replays it).
void Submit(std::function<void()> work);
// Runs the queued work (the host waits for the stream); false during a capture, which that ends.
bool Flush();
// True while the calling thread captures; another thread's stream work during a capture stops the process.
bool Capturing();
void BeginCapture();
// The captured work, or nullopt where something the capture cannot hold happened during it.
std::optional<std::vector<std::function<void()>>> EndCapture();
// Something a capture cannot hold (a synchronous copy, a wait, an allocation): the capture fails.
void InvalidateCapture();

template <typename... P>
struct Launcher {
  void (*kernel)(P...);
  dim3 grid, block;
  size_t shared;
  template <typename... A>
  void operator()(A&&... args) const {
    CheckLaunch(reinterpret_cast<const void*>(kernel), grid, block, shared);
    auto bound = std::make_shared<const std::tuple<P...>>(std::forward<A>(args)...);
    Submit([kernel = kernel, grid = grid, block = block, shared = shared, bound] {
      RunGrid(grid, block, shared, [&] { std::apply(kernel, *bound); });
    });
  }
};

template <typename... P>
Launcher<P...> Launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t shared) {
  return Launcher<P...>{kernel, grid, block, shared};
}

}  // namespace simt
