#include "engine/core/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <immintrin.h>

namespace anchorage {

namespace {

// How long a thread polls before it sleeps on the condition variable.
constexpr auto kSpin = std::chrono::microseconds(50);

// Polls done() until it holds or kSpin has passed; returns whether it holds.
template <typename Done>
bool SpinUntil(const Done& done) {
  const auto until = std::chrono::steady_clock::now() + kSpin;
  for (int i = 0;; ++i) {
    if (done()) return true;
    _mm_pause();
    if ((i & 63) == 63 && std::chrono::steady_clock::now() > until) return done();
  }
}

}  // namespace

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::Drain() {
  while (true) {
    size_t task;
    const std::function<void(size_t)>* job;
    {
      std::lock_guard lock(mu_);
      if (job_ == nullptr || next_task_ >= job_tasks_) return;
      task = next_task_++;
      job = job_;
    }
    (*job)(task);
    std::lock_guard lock(mu_);
    finished_seen_.store(++finished_tasks_, std::memory_order_release);
    if (finished_tasks_ == job_tasks_) done_cv_.notify_all();
  }
}

void ThreadPool::WorkerLoop() {
  size_t seen = 0;
  while (true) {
    SpinUntil([&] { return generation_seen_.load(std::memory_order_acquire) != seen; });
    {
      std::unique_lock lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    Drain();
  }
}

void ThreadPool::Run(size_t tasks, const std::function<void(size_t task)>& fn) {
  if (tasks == 0) return;
  if (workers_.empty() || tasks == 1) {
    for (size_t i = 0; i < tasks; ++i) fn(i);
    return;
  }
  {
    std::lock_guard lock(mu_);
    job_ = &fn;
    job_tasks_ = tasks;
    next_task_ = 0;
    finished_tasks_ = 0;
    finished_seen_.store(0, std::memory_order_relaxed);
    generation_seen_.store(++generation_, std::memory_order_release);
  }
  work_cv_.notify_all();
  Drain();
  SpinUntil([&] { return finished_seen_.load(std::memory_order_acquire) == tasks; });
  std::unique_lock lock(mu_);
  done_cv_.wait(lock, [&] { return finished_tasks_ == job_tasks_; });
  job_ = nullptr;
}

void ThreadPool::ParallelFor(size_t n, const std::function<void(size_t begin, size_t end)>& fn) {
  size_t parts = std::min(n, static_cast<size_t>(size()));
  if (parts == 0) return;
  Run(parts, [&](size_t p) { fn(n * p / parts, n * (p + 1) / parts); });
}

}  // namespace anchorage
