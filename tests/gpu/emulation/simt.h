// A SIMT emulator for the tests: runs the CUDA backend's kernels (kernels.cu compiled as C++) on one
// CPU thread, one block after another, each of a block's threads a fiber that yields at barriers and
// warp shuffles. Slow, deterministic, and enough to check the kernels' logic where no GPU is.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
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

// Runs work now, or records it while a stream capture is open (a graph replays it).
void Submit(std::function<void()> work);
void BeginCapture();
std::vector<std::function<void()>> EndCapture();

template <typename... P>
struct Launcher {
  void (*kernel)(P...);
  dim3 grid, block;
  size_t shared;
  template <typename... A>
  void operator()(A&&... args) const {
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
