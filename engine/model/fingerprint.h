// The model fingerprint: what every cache file records, so rows of another model are never served.
#pragma once

#include <string>
#include <vector>

#include "engine/core/status.h"

namespace anchorage {

// Hex sha256 over each weight file (name, size, and its bytes: whole up to 64 MiB, else the first
// and last MiB and 16 MiB-reads spread between), then config.json and tokenizer.json of dir.
Result<std::string> ComputeModelFingerprint(const std::string& dir, const std::vector<std::string>& weight_files);

}  // namespace anchorage
