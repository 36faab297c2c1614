#include "engine/cache/parked_session.h"
#include "engine/cache/pinned_head.h"

namespace anchorage {

int64_t PinnedHead::bytes() const {
  int64_t b = static_cast<int64_t>(rows.data.size() * sizeof(float));
  for (const Anchor& a : anchors) b += a.bytes();
  return b;
}

int64_t ParkedSession::bytes() const {
  int64_t b = static_cast<int64_t>(rows.data.size() * sizeof(float));
  for (const Anchor& a : anchors) b += a.bytes();
  if (end) b += end->anchor.bytes();
  return b;
}

}  // namespace anchorage
