// A fixed pool of worker threads for data-parallel kernels; the caller thread takes part.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace anchorage {

class ThreadPool {
 public:
  // threads <= 0 means the machine's hardware concurrency.
  explicit ThreadPool(int threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(task) for task in [0, tasks), spread over the pool; returns when all are done.
  // Which thread runs a task never changes what a task computes, so results do not depend on size().
  void Run(size_t tasks, const std::function<void(size_t task)>& fn);

  // Splits [0, n) into size() contiguous ranges and runs fn(begin, end) on each.
  void ParallelFor(size_t n, const std::function<void(size_t begin, size_t end)>& fn);

 private:
  void WorkerLoop();
  void Drain();

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  const std::function<void(size_t)>* job_ = nullptr;
  size_t job_tasks_ = 0;
  size_t next_task_ = 0;
  size_t finished_tasks_ = 0;
  size_t generation_ = 0;
  bool stop_ = false;
  // Mirrors of generation_ and finished_tasks_ (written under mu_) that a waiting thread polls for a
  // moment before it sleeps: a forward's calls come microseconds apart, and a wake-up costs more.
  std::atomic<size_t> generation_seen_{0};
  std::atomic<size_t> finished_seen_{0};
};

}  // namespace anchorage
