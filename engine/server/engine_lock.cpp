#include "engine/server/engine_lock.h"

namespace anchorage {

void EngineLock::LockForRequest() {
  std::unique_lock lock(mu_);
  ++waiting_requests_;
  cv_.wait(lock, [&] { return !held_; });
  --waiting_requests_;
  held_ = true;
  for_request_ = true;
  ++acquisitions_;
}

void EngineLock::YieldToWaiting() {
  std::unique_lock lock(mu_);
  if (waiting_requests_ == 0) return;
  const unsigned long long before = acquisitions_;
  held_ = false;
  cv_.notify_all();
  ++waiting_requests_;  // idle work stays out meanwhile
  cv_.wait(lock, [&] { return !held_ && acquisitions_ != before; });
  --waiting_requests_;
  held_ = true;
  for_request_ = true;
}

void EngineLock::UnlockRequest() {
  {
    std::lock_guard lock(mu_);
    held_ = false;
    for_request_ = false;
  }
  cv_.notify_all();
}

bool EngineLock::TryLockForIdle() {
  std::lock_guard lock(mu_);
  if (held_ || waiting_requests_ > 0) return false;
  held_ = true;
  for_request_ = false;
  return true;
}

void EngineLock::UnlockIdle() { UnlockRequest(); }

bool EngineLock::ShouldYield() const {
  std::lock_guard lock(mu_);
  return waiting_requests_ > 0;
}

bool EngineLock::held_for_request() const {
  std::lock_guard lock(mu_);
  return held_ && for_request_;
}

int EngineLock::waiting_requests() const {
  std::lock_guard lock(mu_);
  return waiting_requests_;
}

}  // namespace anchorage
