// The vision tower behind a cache: an image's patches in, its PromptImage out (key ids and tower rows),
// encoded once a digest while the cache holds it. Thread-safe: callers wait for one encode at a time.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "engine/core/status.h"
#include "engine/core/thread_pool.h"
#include "engine/image/image_patches.h"
#include "engine/runtime/compute_backend.h"
#include "engine/runtime/prompt_images.h"
#include "engine/runtime/vision_tower.h"

namespace anchorage {

struct ImageEncoderStats {
  int64_t encoded = 0, hits = 0;  // tower runs and cache hits
  int64_t entries = 0, bytes = 0, capacity_bytes = 0;
  double encode_ms_total = 0.0;
};

class ImageEncoder {
 public:
  // The tower of config's vision_config: the backend's where it has one (it must outlive the encoder),
  // else on the CPU on a pool of its own of `threads` (0: the machine's cores).
  static Result<std::unique_ptr<ImageEncoder>> Create(const ModelConfig& config, const ModelWeights& weights, int threads, int64_t cache_bytes,
                                                      ComputeBackend* backend = nullptr);

  // The image's rows: from the cache when its digest is there, else from the tower.
  Result<std::shared_ptr<const PromptImage>> Encode(const ImagePatches& patches);
  // Patch and merge sizes the tower wants; the pixel limits are the caller's.
  ImageProcessing Processing() const { return VisionProcessing(*config_.vision); }
  // Where the tower runs: "cpu" or the backend's device name.
  const char* device_name() const { return backend_ != nullptr ? backend_->device_name() : "cpu"; }
  int64_t image_token_id() const { return config_.vision->image_token_id; }
  ImageEncoderStats Stats() const;
  void Clear();

 private:
  ImageEncoder(const ModelConfig& config, int64_t cache_bytes);
  void Insert(const std::string& digest, std::shared_ptr<const PromptImage> image);

  ModelConfig config_;
  std::unique_ptr<ThreadPool> pool_;    // the CPU tower's
  std::unique_ptr<VisionTower> tower_;  // null where the backend runs it
  ComputeBackend* backend_ = nullptr;
  mutable std::mutex mu_;
  std::mutex encode_mu_;  // one tower run at a time
  int64_t capacity_bytes_;
  std::list<std::string> recency_;  // most recent first
  struct Entry {
    std::shared_ptr<const PromptImage> image;
    std::list<std::string>::iterator at;
    int64_t bytes = 0;
  };
  std::map<std::string, Entry> entries_;
  ImageEncoderStats stats_;
};

}  // namespace anchorage
