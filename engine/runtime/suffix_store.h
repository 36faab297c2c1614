// The persistent suffix store: an append-only log of the token ids this engine read and wrote
// (ids only, never text), with a suffix array, so the lookup drafter finds copies of earlier
// conversations too. One file per tokenizer (its sha256 in the name and the header); capped, it
// forgets the oldest half at a document boundary. The engine thread owns it.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/core/status.h"

namespace anchorage {

struct SuffixStoreOptions {
  std::string dir;              // created 0700
  std::string tokenizer_sha256; // the ids' tokenizer; another one gets its own file
  int64_t max_bytes = 16ll << 20;
  bool read_only = false;       // drafts from what is there, appends nothing
};

class SuffixStore {
 public:
  // Opens or creates the log. A damaged header or an id outside [0, vocab) starts an empty log
  // (note() says why); a cut-short last id is dropped.
  static Result<std::unique_ptr<SuffixStore>> Open(const SuffixStoreOptions& options, int64_t vocab_size);

  // A request's ids (its served prompt and output): appends from where they part from the last
  // four requests, less 8 ids of overlap, as one document.
  Status Append(std::span<const int32_t> ids);
  // Up to max_draft ids that followed the newest stored match of ids' last n ids (n = 4, 3, 2).
  std::vector<int32_t> Draft(std::span<const int32_t> ids, int max_draft) const;

  // Settings that change while it runs (the engine thread applies them between requests).
  void Configure(int64_t max_bytes, bool read_only) {
    options_.max_bytes = max_bytes;
    options_.read_only = read_only;
  }
  const std::vector<int32_t>& log() const { return ids_; }  // documents separated by -1
  int64_t bytes() const { return static_cast<int64_t>(ids_.size() * sizeof(int32_t)); }
  int64_t max_bytes() const { return options_.max_bytes; }
  bool read_only() const { return options_.read_only; }
  const std::string& path() const { return path_; }
  const std::string& note() const { return note_; }

 private:
  SuffixStore() = default;
  void Index();
  Status Rewrite();
  // The newest position p with ids_[p, p + n) == pattern, or -1.
  int64_t Newest(std::span<const int32_t> pattern) const;

  SuffixStoreOptions options_;
  std::string path_;
  std::string note_;
  int64_t vocab_ = 0;
  std::vector<int32_t> ids_;
  std::vector<int32_t> suffixes_;  // positions [0, indexed_) sorted by their next kKeyIds ids, then position
  int64_t indexed_ = 0;            // ids_[indexed_, end) are searched by a scan until the next Index()
  std::deque<std::vector<int32_t>> recent_;  // the last four requests' ids
};

}  // namespace anchorage
