// CRC-32C (Castagnoli), as iSCSI, ext4 and LevelDB use it; the SSE4.2 instruction where the CPU has it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace anchorage {

// The CRC of data continuing from crc (0 for a fresh one).
uint32_t Crc32c(const void* data, size_t size, uint32_t crc = 0);
inline uint32_t Crc32c(std::string_view s, uint32_t crc = 0) { return Crc32c(s.data(), s.size(), crc); }
// The table-driven computation alone (tests compare the two).
uint32_t Crc32cPortable(const void* data, size_t size, uint32_t crc = 0);

}  // namespace anchorage
