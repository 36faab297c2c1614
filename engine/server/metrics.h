// Prometheus counters and histograms of the endpoint; thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/cache/disk_cache.h"
#include "engine/cache/session_spill.h"
#include "engine/shadow/shadow_reader.h"

namespace anchorage {

// The disk tier's gauges and counters in the Prometheus text exposition.
std::string RenderDiskMetrics(const DiskCacheStats& disk);
// The session spill's counters, anchorage_spill_*.
std::string RenderSpillMetrics(const SessionSpillStats& spill);
// The shadow reader's gauges and counters, anchorage_shadow_*.
std::string RenderShadowMetrics(const ShadowStatus& shadow);

class Metrics {
 public:
  void CountRequest(const std::string& route, int status);
  void CountTokens(int64_t prompt, int64_t cached, int64_t output);
  void CountDrafts(int64_t drafted, int64_t accepted);
  void ObserveTtftMs(double ms);
  void ObservePrefillTokensPerS(double rate);
  void ObserveDecodeTokensPerS(double rate);
  void CountCancelled();

  // The Prometheus text exposition, with the queue depth and engine state given by the caller.
  std::string Render(size_t queue_depth, bool busy) const;

 private:
  struct Histogram {
    std::vector<double> bounds;
    std::vector<uint64_t> counts;  // per bound, non-cumulative; one more for +Inf
    double sum = 0;
    uint64_t count = 0;
    void Observe(double v);
  };
  static Histogram Make(std::vector<double> bounds);
  static void RenderHistogram(std::string& out, const std::string& name, const std::string& help, const Histogram& h);

  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  uint64_t prompt_tokens_ = 0, cached_tokens_ = 0, output_tokens_ = 0, cancelled_ = 0, drafted_tokens_ = 0, accepted_tokens_ = 0;
  double last_decode_rate_ = 0;
  Histogram ttft_ = Make({10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000});
  Histogram prefill_rate_ = Make({50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000});
  Histogram decode_rate_ = Make({5, 10, 20, 40, 80, 160, 320, 640});
};

}  // namespace anchorage
