// The disk tier's two files. A chunk holds the K/V rows [begin, end) of every attention layer and
// those token ids; an anchor holds every GDN layer's recurrent state and conv tail at one line and
// names the chunks below it. Both are keyed by the hash of the whole prefix up to where they end.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/cache/disk_format.h"
#include "engine/model/model_config.h"
#include "engine/runtime/sequence_state.h"

namespace anchorage {

// The hash of tokens[0, line * (i + 1)) for each whole line of the prompt, chained: each one hashes
// the one before it and its line's tokens. Hex, 32 characters.
std::vector<std::string> PrefixHashes(std::span<const int32_t> tokens, int64_t line_tokens);

std::string ChunkFileName(const std::string& prefix_hash);   // "<hash>.chunk"
std::string AnchorFileName(const std::string& prefix_hash);  // "<hash>.anchor"

struct ChunkFile {
  std::vector<int32_t> tokens;  // ids of rows [rows.begin, rows.end)
  KvRows rows;
};

struct AnchorFile {
  Anchor anchor;
  std::vector<std::string> chunks;  // file names of the chunks below it, in order
};

// Encodings keep views into the arguments: they must outlive the write.
Result<EncodedCacheFile> EncodeChunk(const ModelConfig& config, const std::string& fingerprint, const ChunkFile& chunk);
Result<EncodedCacheFile> EncodeAnchor(const ModelConfig& config, const std::string& fingerprint, const AnchorFile& anchor);

// Decoding checks the file (disk_format.h) and that its layout is this model's.
Result<ChunkFile> DecodeChunk(const ModelConfig& config, const std::string& fingerprint, std::string data);
Result<AnchorFile> DecodeAnchor(const ModelConfig& config, const std::string& fingerprint, std::string data);

}  // namespace anchorage
