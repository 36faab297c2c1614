// The response cache: an identical greedy request (the same prompt ids, every sampling field the
// same, the same state fingerprint) answered from memory with the tokens the engine wrote for it.
// Greedy decoding is deterministic here, so the answer is the bytes a new run would write; sampled
// requests are never cached. LRU within a byte budget; the engine thread owns it.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/runtime/generator.h"

namespace anchorage {

struct CachedResponse {
  std::vector<GeneratedToken> tokens;  // as the generation released them
  GenerationResult result;
  int64_t bytes() const;
};

struct ResponseCacheStats {
  bool enabled = false;
  int64_t entries = 0, bytes = 0, max_bytes = 0, hits = 0, misses = 0, puts = 0, evictions = 0;
};

// A compaction's continuation written ahead while the engine was idle, with what it was written with.
struct PreparedAnswer {
  std::string session;
  std::vector<int32_t> prompt;  // the continuation's ids
  SamplingParams sampling;      // max_tokens as fitted to the context
  CachedResponse response;
};

// Whether a live run of prompt with sampling (max_tokens fitted) writes exactly answer's tokens: the same
// ids and every other field the same, and the answer stopped within max_tokens or ran to the same limit.
bool PreparedAnswerServes(const PreparedAnswer& answer, std::span<const int32_t> prompt, const SamplingParams& sampling);

struct PreparedStats {
  bool enabled = false;
  int64_t entries = 0, prompt_tokens = 0, tokens = 0, bytes = 0;
  std::string session;
  int64_t written = 0, served = 0, stopped = 0, refused = 0;
};

class ResponseCache {
 public:
  // The key of a request; nullopt when it samples (temperature above 0).
  static std::optional<std::string> KeyOf(std::span<const int32_t> prompt, const SamplingParams& sampling, const std::string& state_fingerprint);

  std::shared_ptr<const CachedResponse> Find(const std::string& key);  // counts a hit or a miss
  // Keeps a finished answer; one larger than the budget is not kept. Evicts the least recently used.
  void Insert(const std::string& key, CachedResponse response);
  void Clear();
  void set_enabled(bool enabled) { enabled_ = enabled; }
  bool enabled() const { return enabled_; }
  void set_max_bytes(int64_t max_bytes);
  ResponseCacheStats Stats() const;

 private:
  void EvictTo(int64_t max_bytes);

  struct Entry {
    std::string key;
    std::shared_ptr<const CachedResponse> response;
    int64_t bytes = 0;
  };
  bool enabled_ = false;
  int64_t max_bytes_ = 64ll << 20;
  int64_t bytes_ = 0;
  std::list<Entry> lru_;  // most recent first
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
  ResponseCacheStats counters_;
};

}  // namespace anchorage
