#include "engine/cache/response_cache.h"

#include <algorithm>
#include <cstring>

#include "engine/core/sha256.h"

namespace anchorage {

namespace {

class KeyWriter {
 public:
  template <typename T>
  void Put(const T& value) {
    static_assert(std::is_trivially_copyable_v<T>);
    h_.Update(std::string_view(reinterpret_cast<const char*>(&value), sizeof(T)));
  }
  void Put(const std::string& s) {
    Put(static_cast<uint64_t>(s.size()));
    h_.Update(s);
  }
  template <typename T>
  void Put(const std::vector<T>& v) {
    Put(static_cast<uint64_t>(v.size()));
    for (const T& x : v) Put(x);
  }
  template <typename A, typename B>
  void Put(const std::pair<A, B>& p) {
    Put(p.first);
    Put(p.second);
  }
  std::string Finish() { return h_.FinishHex(); }

 private:
  Sha256 h_;
};

}  // namespace

int64_t CachedResponse::bytes() const {
  int64_t n = static_cast<int64_t>(sizeof(CachedResponse) + result.text.size() + result.tokens.size() * sizeof(int32_t));
  for (const GeneratedToken& t : tokens) n += static_cast<int64_t>(sizeof(GeneratedToken) + t.text.size() + t.sampled.top.size() * sizeof(t.sampled.top[0]));
  return n;
}

std::optional<std::string> ResponseCache::KeyOf(std::span<const int32_t> prompt, const SamplingParams& s, const std::string& state_fingerprint) {
  if (s.temperature > 0) return std::nullopt;
  KeyWriter w;
  w.Put(std::string("anchorage-response-v1"));
  w.Put(state_fingerprint);
  w.Put(std::vector<int32_t>(prompt.begin(), prompt.end()));
  w.Put(s.temperature);
  w.Put(s.top_k);
  w.Put(s.top_p);
  w.Put(s.min_p);
  w.Put(s.seed);
  w.Put(s.presence_penalty);
  w.Put(s.frequency_penalty);
  w.Put(s.repetition_penalty);
  w.Put(s.logit_bias);
  w.Put(s.stop_token_ids);
  w.Put(s.stop_strings);
  w.Put(s.max_tokens);
  w.Put(s.logprobs);
  w.Put(s.forced_ids);
  return w.Finish();
}

bool PreparedAnswerServes(const PreparedAnswer& answer, std::span<const int32_t> prompt, const SamplingParams& sampling) {
  if (!std::equal(prompt.begin(), prompt.end(), answer.prompt.begin(), answer.prompt.end())) return false;
  SamplingParams same_limit = sampling;
  same_limit.max_tokens = answer.sampling.max_tokens;
  if (!(same_limit == answer.sampling)) return false;
  const GenerationResult& r = answer.response.result;
  if (r.finish == FinishReason::kStop) return static_cast<int64_t>(r.tokens.size()) <= sampling.max_tokens;
  return r.finish == FinishReason::kLength && sampling.max_tokens == answer.sampling.max_tokens;
}

std::shared_ptr<const CachedResponse> ResponseCache::Find(const std::string& key) {
  auto it = index_.find(key);
  if (it == index_.end()) {
    ++counters_.misses;
    return nullptr;
  }
  lru_.splice(lru_.begin(), lru_, it->second);
  ++counters_.hits;
  return it->second->response;
}

void ResponseCache::Insert(const std::string& key, CachedResponse response) {
  const int64_t bytes = response.bytes() + static_cast<int64_t>(key.size());
  if (bytes > max_bytes_) return;
  if (auto it = index_.find(key); it != index_.end()) {
    bytes_ -= it->second->bytes;
    lru_.erase(it->second);
    index_.erase(it);
  }
  EvictTo(max_bytes_ - bytes);
  lru_.push_front({key, std::make_shared<const CachedResponse>(std::move(response)), bytes});
  index_[key] = lru_.begin();
  bytes_ += bytes;
  ++counters_.puts;
}

void ResponseCache::EvictTo(int64_t max_bytes) {
  while (bytes_ > max_bytes && !lru_.empty()) {
    bytes_ -= lru_.back().bytes;
    index_.erase(lru_.back().key);
    lru_.pop_back();
    ++counters_.evictions;
  }
}

void ResponseCache::Clear() {
  lru_.clear();
  index_.clear();
  bytes_ = 0;
}

void ResponseCache::set_max_bytes(int64_t max_bytes) {
  max_bytes_ = max_bytes;
  EvictTo(max_bytes_);
}

ResponseCacheStats ResponseCache::Stats() const {
  ResponseCacheStats s = counters_;
  s.enabled = enabled_;
  s.entries = static_cast<int64_t>(lru_.size());
  s.bytes = bytes_;
  s.max_bytes = max_bytes_;
  return s;
}

}  // namespace anchorage
