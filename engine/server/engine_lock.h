// The engine lock with two ranks: a request always goes before idle work (disk writes, shadow reads).
#pragma once

#include <condition_variable>
#include <mutex>

namespace anchorage {

class EngineLock {
 public:
  // Blocks until the engine is free; idle work holding it is asked to yield (ShouldYield()).
  void LockForRequest();
  void UnlockRequest();
  // Held for a request: lets the requests waiting now go first, then takes the lock back.
  void YieldToWaiting();

  // Takes the lock for idle work only when it is free and no request waits; never blocks.
  bool TryLockForIdle();
  void UnlockIdle();

  // Idle work polls this between steps and releases the lock when it is true.
  bool ShouldYield() const;
  int waiting_requests() const;
  // A request (a job, a command, a decide) holds it now; idle work does not count.
  bool held_for_request() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool held_ = false;
  bool for_request_ = false;
  int waiting_requests_ = 0;
  unsigned long long acquisitions_ = 0;  // LockForRequest's, so a yield knows another went first
};

}  // namespace anchorage
