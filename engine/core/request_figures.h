// The figures of one request: what the endpoint's usage block, the journal and the console show.
#pragma once

#include <cstdint>
#include <string>

namespace anchorage {

// Tokens count tokens; times in milliseconds; rates in tokens a second.
struct RequestFigures {
  int64_t prompt_tokens = 0;         // the client's prompt
  int64_t image_tokens = 0;          // of those, rows of images
  int64_t cached_tokens = 0;         // rows reused from a cache
  int64_t reread_tokens = 0;         // forwarded by this request's prefill
  int64_t served_prompt_tokens = 0;  // what the engine ran: end alignment can serve more than the client sent
  int64_t completion_tokens = 0;
  double queue_ms = 0;
  int64_t queue_position = 0;        // its place among the requests waiting for a slot when it came (1: next); 0: a slot was free
  double prefill_ms = 0;
  double ttft_ms = 0;
  double decode_tokens_per_s = 0;
  int64_t drafted_tokens = 0;        // speculative drafts proposed
  int64_t accepted_tokens = 0;       // of those, picked by the model too
  std::string cache_source = "cold";  // cold, resident, end, pin, park, store

  double prefill_tokens_per_s() const { return prefill_ms > 0 ? 1000.0 * static_cast<double>(reread_tokens) / prefill_ms : 0.0; }
};

}  // namespace anchorage
