#include "engine/server/engine_lock.h"

namespace anchorage {

void EngineLock::LockForRequest() {
  std::unique_lock lock(mu_);
  ++waiting_requests_;
  cv_.wait(lock, [&] { return !held_; });
  --waiting_requests_;
  held_ = true;
}

void EngineLock::UnlockRequest() {
  {
    std::lock_guard lock(mu_);
    held_ = false;
  }
  cv_.notify_all();
}

bool EngineLock::TryLockForIdle() {
  std::lock_guard lock(mu_);
  if (held_ || waiting_requests_ > 0) return false;
  held_ = true;
  return true;
}

void EngineLock::UnlockIdle() { UnlockRequest(); }

bool EngineLock::ShouldYield() const {
  std::lock_guard lock(mu_);
  return waiting_requests_ > 0;
}

int EngineLock::waiting_requests() const {
  std::lock_guard lock(mu_);
  return waiting_requests_;
}

}  // namespace anchorage
