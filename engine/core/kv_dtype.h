// How a state stores attention K/V rows: fp32, or bf16 rounded (to nearest even) once, when the row is written.
#pragma once

#include <cstdint>

namespace anchorage {

enum class KvDtype { kF32, kBf16 };

inline const char* KvDtypeName(KvDtype dtype) { return dtype == KvDtype::kBf16 ? "bf16" : "f32"; }
inline int64_t KvDtypeBytes(KvDtype dtype) { return dtype == KvDtype::kBf16 ? 2 : 4; }

}  // namespace anchorage
