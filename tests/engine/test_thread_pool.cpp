// The thread pool runs every task of every job exactly once, whatever the pool's size, the task counts and
// the pauses between jobs (long enough that workers fall asleep).
#include <QtTest>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "engine/core/thread_pool.h"

class TestThreadPool : public QObject {
  Q_OBJECT

  // Runs `jobs` jobs of varying task counts; every task of job j adds j + 1 to its own slot, once.
  static void RunJobs(anchorage::ThreadPool& pool, int jobs, std::chrono::microseconds pause_every_7th) {
    for (int j = 0; j < jobs; ++j) {
      const size_t tasks = 1 + static_cast<size_t>(j * 37 % 101);
      std::vector<std::atomic<int>> hits(tasks);
      for (auto& h : hits) h.store(0);
      std::atomic<int> out_of_range{0};
      pool.Run(tasks, [&](size_t t) {
        if (t >= tasks) {
          out_of_range.fetch_add(1);
          return;
        }
        hits[t].fetch_add(j + 1);
        if (t % 5 == 0) std::this_thread::yield();
      });
      QCOMPARE(out_of_range.load(), 0);
      for (size_t t = 0; t < tasks; ++t)
        if (hits[t].load() != j + 1) QFAIL(qPrintable(QStringLiteral("job %1 task %2 ran %3 times").arg(j).arg(t).arg(hits[t].load() / double(j + 1))));
      if (j % 7 == 6) std::this_thread::sleep_for(pause_every_7th);
    }
  }

 private slots:
  void everyTaskOnceBackToBack() {
    for (int threads : {1, 2, 3, 8}) {
      anchorage::ThreadPool pool(threads);
      QCOMPARE(pool.size(), threads);
      RunJobs(pool, 3000, std::chrono::microseconds(0));
    }
  }

  void everyTaskOnceAfterWorkersSleep() {
    for (int threads : {2, 4}) {
      anchorage::ThreadPool pool(threads);
      RunJobs(pool, 140, std::chrono::microseconds(400));
    }
  }

  void parallelForCoversTheRangeInOrderedParts() {
    anchorage::ThreadPool pool(3);
    for (size_t n : {size_t(0), size_t(1), size_t(2), size_t(3), size_t(10), size_t(1000)}) {
      std::vector<std::atomic<int>> seen(n);
      for (auto& s : seen) s.store(0);
      std::atomic<int> parts{0}, bad_ranges{0};
      pool.ParallelFor(n, [&](size_t begin, size_t end) {
        if (begin >= end || end > n) bad_ranges.fetch_add(1);
        for (size_t i = begin; i < end; ++i) seen[i].fetch_add(1);
        parts.fetch_add(1);
      });
      QCOMPARE(bad_ranges.load(), 0);
      for (size_t i = 0; i < n; ++i) QCOMPARE(seen[i].load(), 1);
      QCOMPARE(parts.load(), static_cast<int>(std::min<size_t>(n, 3)));
    }
  }
};

QTEST_GUILESS_MAIN(TestThreadPool)
#include "test_thread_pool.moc"
