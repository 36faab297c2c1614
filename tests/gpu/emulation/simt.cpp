#include "simt.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define SIMT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SIMT_ASAN 1
#endif
#endif
#if defined(SIMT_ASAN)
#include <sanitizer/asan_interface.h>
#endif

#if !defined(__x86_64__)
#error "the SIMT emulator switches fibers with x86-64 code"
#endif

// Saves the callee-saved registers on the current stack, stores the stack pointer in *save_sp, and
// resumes the fiber whose stack pointer is load_sp. (Kernels never change MXCSR or the x87 control
// word, so those are not switched.)
extern "C" void simt_switch(void** save_sp, void* load_sp);
asm(R"(
  .text
  .globl simt_switch
  .type simt_switch,@function
simt_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size simt_switch, .-simt_switch
)");

namespace simt {
namespace {

enum class State { kReady, kWarpWait, kBlockWait, kDone };

struct Fiber {
  void* sp = nullptr;
  State state = State::kReady;
  unsigned tid = 0;
  dim3 idx;             // threadIdx
  unsigned shuffles = 0;  // shuffles done: their parity picks the slot buffer
};

constexpr size_t kStackBytes = 128 * 1024;

// The grid being run: one at a time (RunGrid holds the mutex).
struct Machine {
  std::mutex mutex;
  dim3 grid, block, block_idx;
  std::vector<Fiber> fibers;
  std::vector<std::unique_ptr<char[]>> stacks;
  std::vector<uint32_t> slots;        // each thread's shuffle word, two buffers of a word a thread
  std::vector<uint64_t> shared;       // dynamic shared memory, 8-byte aligned
  const std::function<void()>* body = nullptr;
  size_t current = 0;
  void* scheduler_sp = nullptr;
};

Machine machine;

Machine& M() { return machine; }

// The stream: every stream the host makes and the legacy one are this one queue.
struct Stream {
  std::mutex run_mutex;  // held while queued work runs, so it runs in the order it came
  std::mutex mutex;      // guards the fields below
  std::vector<std::function<void()>> pending;
  bool capturing = false;
  bool capture_failed = false;
  std::thread::id capturer;
  std::vector<std::function<void()>> captured;
  std::map<const void*, int> max_dynamic_shared;  // cudaFuncSetAttribute's, per kernel
};

Stream& S() {
  static Stream stream;
  return stream;
}

bool LastFirst() {
  static const bool reverse = [] {
    const char* order = std::getenv("SIMT_ORDER");
    return order != nullptr && std::strcmp(order, "reverse") == 0;
  }();
  return reverse;
}

[[noreturn]] void Refuse(const char* what) {
  std::fprintf(stderr, "simt: %s\n", what);
  std::abort();
}

void Yield(State state) {
  Machine& m = M();
  Fiber& f = m.fibers[m.current];
  f.state = state;
  simt_switch(&f.sp, m.scheduler_sp);
}

extern "C" [[noreturn]] void simt_fiber_entry() {
  Machine& m = M();
  (*m.body)();
  m.fibers[m.current].state = State::kDone;
  void* finished = nullptr;
  simt_switch(&finished, m.scheduler_sp);
  std::abort();  // a finished fiber is never resumed
}

// A fresh fiber's stack: a frame simt_switch pops into simt_fiber_entry, entered as if called.
void* FreshStack(char* stack) {
#if defined(SIMT_ASAN)
  __asan_unpoison_memory_region(stack, kStackBytes);  // a finished fiber's frames never returned to clear their redzones
#endif
  auto top = (reinterpret_cast<uintptr_t>(stack + kStackBytes)) & ~uintptr_t{15};
  auto* sp = reinterpret_cast<uint64_t*>(top);
  *--sp = 0;  // so that simt_fiber_entry starts with rsp = 8 (mod 16), as after a call
  *--sp = reinterpret_cast<uint64_t>(&simt_fiber_entry);
  for (int i = 0; i < 6; ++i) *--sp = 0;  // rbp, rbx, r12..r15
  return sp;
}

void RunBlock(Machine& m, size_t threads) {
  for (size_t i = 0; i < threads; ++i) {
    const auto tid = static_cast<unsigned>(i);
    m.fibers[i] = Fiber{FreshStack(m.stacks[i].get()), State::kReady, tid,
                        dim3(tid % m.block.x, tid / m.block.x % m.block.y, tid / (m.block.x * m.block.y)), 0};
  }
  std::fill(m.shared.begin(), m.shared.end(), ~uint64_t{0});
  for (;;) {
    bool ran = false;
    for (size_t k = 0; k < threads; ++k) {
      const size_t i = LastFirst() ? threads - 1 - k : k;
      if (m.fibers[i].state != State::kReady) continue;
      m.current = i;
      simt_switch(&m.scheduler_sp, m.fibers[i].sp);
      ran = true;
    }
    size_t done = 0, at_block = 0;
    for (size_t i = 0; i < threads; ++i) {
      done += m.fibers[i].state == State::kDone;
      at_block += m.fibers[i].state == State::kBlockWait;
    }
    if (done == threads) return;
    bool released = false;
    for (size_t w = 0; w < threads; w += 32) {  // a warp barrier opens when every live lane is at it
      size_t live = 0, waiting = 0;
      for (size_t i = w; i < w + 32; ++i) {
        live += m.fibers[i].state != State::kDone;
        waiting += m.fibers[i].state == State::kWarpWait;
      }
      if (live > 0 && waiting == live) {
        if (live < 32) {  // every shuffle and __syncwarp here names the whole warp, which a GPU then waits for
          std::fprintf(stderr, "simt: block (%u, %u): a warp-wide shuffle or __syncwarp reached by %zu lanes; the others exited\n",
                       m.block_idx.x, m.block_idx.y, live);
          std::abort();
        }
        for (size_t i = w; i < w + 32; ++i)
          if (m.fibers[i].state == State::kWarpWait) m.fibers[i].state = State::kReady;
        released = true;
      }
    }
    if (!released && at_block == threads - done) {
      for (size_t i = 0; i < threads; ++i)
        if (m.fibers[i].state == State::kBlockWait) m.fibers[i].state = State::kReady;
      released = true;
    }
    if (!released && !ran) {
      std::fprintf(stderr, "simt: block (%u, %u) deadlocked: threads wait at different barriers\n", m.block_idx.x, m.block_idx.y);
      std::abort();
    }
  }
}

}  // namespace

void RunGrid(dim3 grid, dim3 block, size_t shared_bytes, const std::function<void()>& body) {
  Machine& m = M();
  std::lock_guard lock(m.mutex);
  const size_t threads = static_cast<size_t>(block.x) * block.y * block.z;
  if (threads == 0 || threads % 32 != 0) {
    std::fprintf(stderr, "simt: a block of %zu threads (the emulator runs whole warps)\n", threads);
    std::abort();
  }
  while (m.stacks.size() < threads) m.stacks.push_back(std::make_unique<char[]>(kStackBytes));
  m.fibers.resize(threads);
  m.slots.assign(2 * threads, 0);
  m.shared.assign((shared_bytes + 7) / 8, 0);
  m.grid = grid;
  m.block = block;
  m.body = &body;
  const uint64_t blocks = uint64_t{grid.x} * grid.y * grid.z;
  for (uint64_t k = 0; k < blocks; ++k) {
    const uint64_t b = LastFirst() ? blocks - 1 - k : k;
    m.block_idx = dim3(static_cast<unsigned>(b % grid.x), static_cast<unsigned>(b / grid.x % grid.y),
                       static_cast<unsigned>(b / (uint64_t{grid.x} * grid.y)));
    RunBlock(m, threads);
  }
  m.body = nullptr;
}

void CheckLaunch(const void* kernel, dim3 grid, dim3 block, size_t shared_bytes) {
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  if (threads == 0 || threads > 1024 || block.z > 64) Refuse("a block of more than 1024 threads (or none), which a GPU refuses");
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) Refuse("a launch of an empty grid, which a GPU refuses");
  if (grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535) Refuse("a grid past 2^31 - 1 blocks in x or 65535 in y or z");
  if (shared_bytes <= 48 * 1024) return;
  Stream& s = S();
  std::lock_guard lock(s.mutex);
  auto it = s.max_dynamic_shared.find(kernel);
  if (it == s.max_dynamic_shared.end() || static_cast<size_t>(it->second) < shared_bytes)
    Refuse("dynamic shared memory past 48 KiB without cudaFuncSetAttribute(MaxDynamicSharedMemorySize) that high");
}

bool SetMaxDynamicShared(const void* kernel, int bytes) {
  if (bytes < 0 || bytes > 227 * 1024) return false;
  Stream& s = S();
  std::lock_guard lock(s.mutex);
  s.max_dynamic_shared[kernel] = bytes;
  return true;
}

void Submit(std::function<void()> work) {
  Stream& s = S();
  std::lock_guard lock(s.mutex);
  if (!s.capturing) {
    s.pending.push_back(std::move(work));
    return;
  }
  if (s.capturer != std::this_thread::get_id()) Refuse("stream work from another host thread during a stream capture");
  s.captured.push_back(std::move(work));
}

bool Flush() {
  Stream& s = S();
  std::lock_guard run(s.run_mutex);
  std::vector<std::function<void()>> work;
  {
    std::lock_guard lock(s.mutex);
    if (s.capturing) {
      if (s.capturer != std::this_thread::get_id()) Refuse("a host thread waits for the stream during another's stream capture");
      s.capture_failed = true;
      return false;
    }
    work.swap(s.pending);
  }
  for (const auto& w : work) w();
  return true;
}

bool Capturing() {
  Stream& s = S();
  std::lock_guard lock(s.mutex);
  if (s.capturing && s.capturer != std::this_thread::get_id()) Refuse("a host thread uses the device during another's stream capture");
  return s.capturing;
}

void BeginCapture() {
  Stream& s = S();
  std::lock_guard lock(s.mutex);
  if (s.capturing) Refuse("a stream capture begun inside another");
  s.capturing = true;
  s.capture_failed = false;
  s.capturer = std::this_thread::get_id();
  s.captured.clear();
}

std::optional<std::vector<std::function<void()>>> EndCapture() {
  Stream& s = S();
  std::lock_guard lock(s.mutex);
  if (!s.capturing || s.capturer != std::this_thread::get_id()) Refuse("a stream capture ended that this thread did not begin");
  s.capturing = false;
  if (s.capture_failed) return std::nullopt;
  return std::move(s.captured);
}

void InvalidateCapture() {
  Stream& s = S();
  std::lock_guard lock(s.mutex);
  s.capture_failed = true;
}

dim3 ThreadIdx() {
  const Machine& m = M();
  return m.fibers[m.current].idx;
}
dim3 BlockIdx() { return M().block_idx; }
dim3 BlockDim() { return M().block; }
dim3 GridDim() { return M().grid; }
void* DynamicShared() { return M().shared.data(); }
void SyncThreads() { Yield(State::kBlockWait); }
void SyncWarp() { Yield(State::kWarpWait); }

// Two buffers, chosen by how many shuffles a lane has done: a lane that has read this shuffle's word
// writes its next one into the other buffer, which every lane has finished reading. One barrier each.
uint32_t ShuffleWord(uint32_t word, int lane, bool is_xor) {
  Machine& m = M();
  Fiber& f = m.fibers[m.current];
  const unsigned tid = f.tid;
  const size_t buffer = (f.shuffles++ & 1u) * m.fibers.size();
  const unsigned base = tid - tid % 32;
  m.slots[buffer + tid] = word;
  Yield(State::kWarpWait);
  const unsigned from = base + (is_xor ? ((tid % 32) ^ static_cast<unsigned>(lane)) : static_cast<unsigned>(lane) % 32);
  return m.slots[buffer + from];
}

}  // namespace simt
