// The guest stash: rows a short unrelated request may overwrite, copied aside and put back after it.
#pragma once

#include <cstdint>
#include <optional>

#include "engine/runtime/sequence_state.h"

namespace anchorage {

struct GuestStash {
  std::optional<KvRows> rows;  // set while a guest runs
  int64_t uses = 0;
  int64_t declined = 0;        // guests whose rows did not fit the stash budget
  int64_t bytes() const { return rows ? rows->bytes() : 0; }
};

}  // namespace anchorage
