#include "engine/cache/parked_session.h"
#include "engine/cache/pinned_head.h"

namespace anchorage {

int64_t PinnedHead::bytes() const {
  int64_t b = rows.bytes();
  for (const Anchor& a : anchors) b += a.bytes();
  return b;
}

int64_t ParkedSession::bytes() const {
  int64_t b = rows.bytes();
  for (const Anchor& a : anchors) b += a.bytes();
  if (end) b += end->anchor.bytes();
  return b;
}

}  // namespace anchorage
