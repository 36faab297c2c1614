// What every RAM tier holds and has done, as the engine reports it; JSON only at the HTTP edge.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/cache/disk_cache.h"
#include "engine/cache/response_cache.h"
#include "engine/cache/session_spill.h"

namespace anchorage {

// Bytes in bytes; counters since the engine started.
struct CacheStats {
  struct Resident {
    int64_t rows = 0, row_bytes = 0, taint_row = -1;  // -1: no taint
    std::string session;
    int64_t requests = 0, cold = 0, cached_tokens = 0, reread_tokens = 0;
  } resident;
  struct Anchors {
    int64_t entries = 0, bytes = 0, budget_bytes = 0, hits = 0, evictions = 0;
    std::vector<int64_t> lengths;
  } anchors;
  struct End {
    int64_t entries = 0, bytes = 0, length = 0, hits = 0, aligned_hits = 0;
  } end;
  struct Stash {
    int64_t entries = 0, bytes = 0, budget_bytes = 0, guests = 0;
  } stash;
  struct Pin {
    int64_t entries = 0, tokens = 0, bytes = 0, budget_bytes = 0, pins = 0, hits = 0;
  } pin;
  struct Park {
    int64_t entries = 0, tokens = 0, bytes = 0, budget_bytes = 0, parks = 0, hits = 0;
    std::string session;
  } park;
  struct Store {
    int64_t entries = 0, bytes = 0, budget_bytes = 0, entry_cap_bytes = 0, hits = 0, misses = 0, puts = 0, evictions = 0, declined = 0;
  } store;
  bool disk_enabled = false;  // a disk tier is open (its mode may still be off); the scheduler reads it live
  DiskCacheStats disk;
  bool spill_enabled = false;  // a session spill is open; read live like the disk
  SessionSpillStats spill;
  std::vector<SpillEntryInfo> spill_entries;  // newest use first
  std::vector<CacheEvent> spill_events;       // newest last
  std::map<std::string, int64_t> spill_refused;  // offers not taken, by why (the resident prefix counts them)
  std::optional<WriteGuardStats> write_guard;  // the day's writes of the tier and the spill
  struct Suffix {
    bool open = false;
    int64_t bytes = 0, max_bytes = 0, ids = 0;
    bool read_only = false;
  } suffix;  // the lookup drafter's suffix store
  ResponseCacheStats response;  // identical greedy requests answered from memory
  PreparedStats prepared;       // the compaction written ahead
  struct Memory {
    int64_t engine_bytes = 0, state_bytes = 0, ceiling_bytes = 0, peak_bytes = 0, slack_bytes = 0, refused = 0;
    std::map<std::string, int64_t> sheds;  // by tier
    int64_t shadow_bytes = 0;  // the shadow reader's resident states, counted in engine_bytes
    std::string device = "cpu";  // what runs the model: "cpu" or "cuda"
    int64_t device_bytes = 0;    // GPU memory the backend holds (weights, workspace, state copies), beside engine_bytes
    int64_t shed_total() const {
      int64_t n = 0;
      for (const auto& [tier, count] : sheds) n += count;
      return n;
    }
  } memory;
};

// GET /v1/cache/stats's document.
nlohmann::json ToJson(const CacheStats& stats);
// Its "disk" object.
nlohmann::json ToJson(const DiskCacheStats& stats);
// /health's cache.disk_writes: today's GB, the budget, the level, the skips and 14 days.
nlohmann::json WriteGuardJson(const WriteGuardStats& stats);
// Its "spill" object: counters and the entries (token counts and sizes, never tokens).
nlohmann::json SpillJson(const SessionSpillStats& stats, const std::vector<SpillEntryInfo>& entries, const std::vector<CacheEvent>& events,
                         const std::map<std::string, int64_t>& refused);

}  // namespace anchorage
