#include "engine/runtime/image_encoder.h"

#include <chrono>

namespace anchorage {

ImageEncoder::ImageEncoder(const ModelConfig& config, int64_t cache_bytes) : config_(config), capacity_bytes_(cache_bytes) {}

Result<std::unique_ptr<ImageEncoder>> ImageEncoder::Create(const ModelConfig& config, const ModelWeights& weights, int threads,
                                                           int64_t cache_bytes, ComputeBackend* backend) {
  if (!config.vision || !weights.vision) return Unsupported("the model has no vision tower (" + weights.vision_note + ")");
  std::unique_ptr<ImageEncoder> encoder(new ImageEncoder(config, cache_bytes));
  if (backend != nullptr && backend->has_vision_tower()) {
    encoder->backend_ = backend;
  } else {
    encoder->pool_ = std::make_unique<ThreadPool>(threads);
    ASSIGN_OR_RETURN(encoder->tower_, VisionTower::Create(*config.vision, *weights.vision, *encoder->pool_));
  }
  encoder->stats_.capacity_bytes = cache_bytes;
  return encoder;
}

Result<std::shared_ptr<const PromptImage>> ImageEncoder::Encode(const ImagePatches& patches) {
  const auto cached = [&]() -> std::shared_ptr<const PromptImage> {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(patches.digest);
    if (it == entries_.end()) return nullptr;
    recency_.splice(recency_.begin(), recency_, it->second.at);
    ++stats_.hits;
    return it->second.image;
  };
  if (auto image = cached()) return image;
  std::lock_guard<std::mutex> encoding(encode_mu_);
  if (auto image = cached()) return image;  // encoded while this one waited
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(std::vector<float> rows, tower_ != nullptr ? tower_->Encode(patches.grid, patches.values)
                                                               : backend_->EncodeImage(patches.grid, patches.values));
  auto image = std::make_shared<PromptImage>();
  const int64_t merge = config_.vision->spatial_merge_size;
  image->digest = patches.digest;
  image->rows = patches.grid.t * (patches.grid.h / merge);
  image->columns = patches.grid.w / merge;
  image->key_ids = ImageKeyIds(image->digest, image->tokens());
  image->embeddings = std::make_shared<const std::vector<float>>(std::move(rows));
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::shared_ptr<const PromptImage> shared = image;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.encoded;
    stats_.encode_ms_total += ms;
  }
  Insert(image->digest, shared);
  return shared;
}

void ImageEncoder::Insert(const std::string& digest, std::shared_ptr<const PromptImage> image) {
  const int64_t bytes = static_cast<int64_t>(image->embeddings->size() * sizeof(float) + image->key_ids.size() * sizeof(int32_t));
  std::lock_guard<std::mutex> lock(mu_);
  if (bytes > capacity_bytes_ || entries_.count(digest) != 0) return;
  while (stats_.bytes + bytes > capacity_bytes_ && !recency_.empty()) {
    auto oldest = entries_.find(recency_.back());
    stats_.bytes -= oldest->second.bytes;
    entries_.erase(oldest);
    recency_.pop_back();
  }
  recency_.push_front(digest);
  entries_[digest] = Entry{std::move(image), recency_.begin(), bytes};
  stats_.bytes += bytes;
}

ImageEncoderStats ImageEncoder::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  ImageEncoderStats s = stats_;
  s.entries = static_cast<int64_t>(entries_.size());
  return s;
}

void ImageEncoder::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.clear();
  recency_.clear();
  stats_.bytes = 0;
}

}  // namespace anchorage
