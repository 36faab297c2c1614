#include "engine/server/metrics.h"

#include <cstdio>

namespace anchorage {

namespace {
std::string Num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}
}  // namespace

void Metrics::Histogram::Observe(double v) {
  size_t i = 0;
  while (i < bounds.size() && v > bounds[i]) ++i;
  ++counts[i];
  sum += v;
  ++count;
}

Metrics::Histogram Metrics::Make(std::vector<double> bounds) {
  Histogram h;
  h.counts.assign(bounds.size() + 1, 0);
  h.bounds = std::move(bounds);
  return h;
}

void Metrics::CountRequest(const std::string& route, int status) {
  std::lock_guard lock(mu_);
  ++requests_[{route, status}];
}

void Metrics::CountTokens(int64_t prompt, int64_t cached, int64_t output) {
  std::lock_guard lock(mu_);
  prompt_tokens_ += static_cast<uint64_t>(prompt);
  cached_tokens_ += static_cast<uint64_t>(cached);
  output_tokens_ += static_cast<uint64_t>(output);
}

void Metrics::CountDrafts(int64_t drafted, int64_t accepted) {
  std::lock_guard lock(mu_);
  drafted_tokens_ += static_cast<uint64_t>(drafted);
  accepted_tokens_ += static_cast<uint64_t>(accepted);
}

void Metrics::ObserveTtftMs(double ms) { std::lock_guard lock(mu_); ttft_.Observe(ms); }
void Metrics::ObservePrefillTokensPerS(double rate) { std::lock_guard lock(mu_); prefill_rate_.Observe(rate); }
void Metrics::ObserveDecodeTokensPerS(double rate) {
  std::lock_guard lock(mu_);
  decode_rate_.Observe(rate);
  last_decode_rate_ = rate;
}
void Metrics::CountCancelled() { std::lock_guard lock(mu_); ++cancelled_; }

void Metrics::RenderHistogram(std::string& out, const std::string& name, const std::string& help, const Histogram& h) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  uint64_t cumulative = 0;
  for (size_t i = 0; i < h.bounds.size(); ++i) {
    cumulative += h.counts[i];
    out += name + "_bucket{le=\"" + Num(h.bounds[i]) + "\"} " + std::to_string(cumulative) + "\n";
  }
  cumulative += h.counts.back();
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(cumulative) + "\n";
  out += name + "_sum " + Num(h.sum) + "\n" + name + "_count " + std::to_string(h.count) + "\n";
}

std::string Metrics::Render(size_t queue_depth, bool busy) const {
  std::lock_guard lock(mu_);
  std::string out;
  out += "# HELP anchorage_requests_total HTTP requests by route and status.\n# TYPE anchorage_requests_total counter\n";
  for (const auto& [key, n] : requests_)
    out += "anchorage_requests_total{route=\"" + key.first + "\",status=\"" + std::to_string(key.second) + "\"} " + std::to_string(n) + "\n";
  out += "# HELP anchorage_prompt_tokens_total Prompt tokens of finished requests.\n# TYPE anchorage_prompt_tokens_total counter\n";
  out += "anchorage_prompt_tokens_total " + std::to_string(prompt_tokens_) + "\n";
  out += "# HELP anchorage_cached_tokens_total Prompt tokens served from a cache.\n# TYPE anchorage_cached_tokens_total counter\n";
  out += "anchorage_cached_tokens_total " + std::to_string(cached_tokens_) + "\n";
  out += "# HELP anchorage_output_tokens_total Generated tokens.\n# TYPE anchorage_output_tokens_total counter\n";
  out += "anchorage_output_tokens_total " + std::to_string(output_tokens_) + "\n";
  out += "# HELP anchorage_drafted_tokens_total Speculative drafts proposed.\n# TYPE anchorage_drafted_tokens_total counter\n";
  out += "anchorage_drafted_tokens_total " + std::to_string(drafted_tokens_) + "\n";
  out += "# HELP anchorage_accepted_tokens_total Speculative drafts the model picked too.\n# TYPE anchorage_accepted_tokens_total counter\n";
  out += "anchorage_accepted_tokens_total " + std::to_string(accepted_tokens_) + "\n";
  out += "# HELP anchorage_cancelled_requests_total Requests whose client went away.\n# TYPE anchorage_cancelled_requests_total counter\n";
  out += "anchorage_cancelled_requests_total " + std::to_string(cancelled_) + "\n";
  RenderHistogram(out, "anchorage_ttft_ms", "Time to first token in milliseconds.", ttft_);
  RenderHistogram(out, "anchorage_prefill_tokens_per_second", "Prefill rate of each request.", prefill_rate_);
  RenderHistogram(out, "anchorage_decode_tokens_per_second", "Decode rate of each request.", decode_rate_);
  out += "# HELP anchorage_decode_rate Decode tokens per second of the last request.\n# TYPE anchorage_decode_rate gauge\n";
  out += "anchorage_decode_rate " + Num(last_decode_rate_) + "\n";
  out += "# HELP anchorage_queue_depth Requests waiting for the engine.\n# TYPE anchorage_queue_depth gauge\n";
  out += "anchorage_queue_depth " + std::to_string(queue_depth) + "\n";
  out += "# HELP anchorage_engine_busy 1 while the engine runs a request.\n# TYPE anchorage_engine_busy gauge\n";
  out += "anchorage_engine_busy " + std::string(busy ? "1" : "0") + "\n";
  return out;
}

namespace {

// One metric line of a family: its HELP, TYPE and value.
void AppendMetric(std::string& out, const std::string& family, const char* name, const char* type, const char* help, double value) {
  out += "# HELP " + family + name + " " + help + "\n# TYPE " + family + name + " " + type + "\n";
  char number[64];
  std::snprintf(number, sizeof(number), "%.17g", value);
  out += family + name + " " + number + "\n";
}

}  // namespace

std::string RenderSpillMetrics(const SessionSpillStats& s) {
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help, double value) { AppendMetric(out, "anchorage_spill_", name, type, help, value); };
  metric("entries", "gauge", "Conversations in the session spill.", static_cast<double>(s.entries));
  metric("bytes", "gauge", "Bytes the spill's blocks hold as stored.", static_cast<double>(s.bytes));
  metric("raw_bytes", "gauge", "Bytes the spill's blocks hold before the codec.", static_cast<double>(s.raw_bytes));
  metric("saves_total", "counter", "Conversations written (evictions and planned stops).", static_cast<double>(s.saves));
  metric("restores_total", "counter", "Conversations read back.", static_cast<double>(s.restores));
  metric("failed_restores_total", "counter", "Restores refused by a check (the entry was deleted).", static_cast<double>(s.failed_restores));
  metric("written_bytes_total", "counter", "Bytes written.", static_cast<double>(s.bytes_written));
  metric("read_bytes_total", "counter", "Bytes read.", static_cast<double>(s.bytes_read));
  metric("evictions_total", "counter", "Entries evicted for the budget.", static_cast<double>(s.evictions));
  metric("expired_total", "counter", "Entries removed past the TTL.", static_cast<double>(s.expired));
  return out;
}

std::string RenderShadowMetrics(const ShadowStatus& s) {
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help, double value) { AppendMetric(out, "anchorage_shadow_", name, type, help, value); };
  int64_t backlog = 0;
  for (const ShadowSessionInfo& i : s.sessions) backlog += i.backlog;
  metric("sessions", "gauge", "Sessions the shadow reader holds, resident or on disk.", static_cast<double>(s.sessions.size()));
  metric("resident_bytes", "gauge", "Bytes of resident shadow states.", static_cast<double>(s.resident_bytes));
  metric("disk_bytes", "gauge", "Bytes of shadow session files.", static_cast<double>(s.disk_bytes));
  metric("backlog_tokens", "gauge", "Ids the reader has not read yet, over every resident session.", static_cast<double>(backlog));
  metric("tokens_read_total", "counter", "Ids read in whole grid chunks.", static_cast<double>(s.tokens_read));
  metric("read_seconds_total", "counter", "Seconds spent reading chunks.", s.read_ms / 1000.0);
  metric("rollbacks_total", "counter", "Prompts that parted from what was read (back to a checkpoint).", static_cast<double>(s.rollbacks));
  metric("evictions_total", "counter", "Sessions moved out of memory for the budget.", static_cast<double>(s.evictions));
  metric("asks_total", "counter", "Questions answered.", static_cast<double>(s.asks));
  metric("compared_total", "counter", "Turns both models answered the agreement question at.", static_cast<double>(s.compared));
  metric("agreed_total", "counter", "Turns where both gave the same answer.", static_cast<double>(s.agreed));
  return out;
}

std::string RenderDiskMetrics(const DiskCacheStats& d) {
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help, double value) { AppendMetric(out, "anchorage_disk_cache_", name, type, help, value); };
  const DiskTierStats& t = d.tier;
  metric("bytes", "gauge", "Bytes the disk tier's files hold.", static_cast<double>(t.bytes));
  metric("budget_bytes", "gauge", "The disk tier's budget.", static_cast<double>(d.budget_bytes));
  metric("free_bytes", "gauge", "Free bytes of the file system the tier is on (-1: unknown).", static_cast<double>(d.free_bytes));
  metric("files", "gauge", "Chunk and anchor files on disk.", static_cast<double>(t.files));
  metric("hits_total", "counter", "Requests resumed from the disk tier.", static_cast<double>(d.hits));
  metric("misses_total", "counter", "Requests that prefilled a whole line the disk tier did not serve.", static_cast<double>(d.misses));
  metric("failed_restores_total", "counter", "Restores refused by a check (the files were deleted).", static_cast<double>(t.failed_restores));
  metric("read_bytes_total", "counter", "Bytes read by restores.", static_cast<double>(t.bytes_read));
  metric("written_bytes_total", "counter", "Bytes written.", static_cast<double>(t.bytes_written));
  metric("anchors_written_total", "counter", "Anchor files written.", static_cast<double>(t.anchors_written));
  metric("chunks_written_total", "counter", "Chunk files written.", static_cast<double>(t.chunks_written));
  metric("dropped_jobs_total", "counter", "Write jobs given up (window closed, failed or refused write).", static_cast<double>(d.dropped_jobs));
  metric("evicted_files_total", "counter", "Files evicted for the budget or the free-space floor.", static_cast<double>(t.evicted_files));
  metric("expired_files_total", "counter", "Files removed past the TTL.", static_cast<double>(t.expired_files));
  return out;
}

}  // namespace anchorage
