#include "engine/runtime/suffix_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "engine/core/common_prefix.h"
#include "engine/core/file_util.h"

namespace anchorage {
namespace {

constexpr char kMagic[8] = {'A', 'N', 'C', 'S', 'U', 'F', 'X', '1'};
constexpr int64_t kKeyIds = 8;       // the suffix array orders suffixes by this many ids
constexpr int64_t kOverlapIds = 8;   // ids a request appends before where it parts from the last ones
constexpr size_t kRecentRequests = 4;
constexpr int64_t kNgramMax = 4, kNgramMin = 2;
constexpr int64_t kScanCap = 4096;   // matches of one key looked at for the newest
constexpr int32_t kDocumentEnd = -1;

std::string Header(const std::string& sha) { return std::string(kMagic, 8) + sha + "\n"; }

}  // namespace

Result<std::unique_ptr<SuffixStore>> SuffixStore::Open(const SuffixStoreOptions& options, int64_t vocab_size) {
  if (options.tokenizer_sha256.size() < 12) return InvalidArgument("the suffix store needs the tokenizer's sha256");
  RETURN_IF_ERROR(MakeDirectories(options.dir, 0700));
  std::unique_ptr<SuffixStore> s(new SuffixStore());
  s->options_ = options;
  s->vocab_ = vocab_size;
  s->path_ = (std::filesystem::path(options.dir) / ("suffix-" + options.tokenizer_sha256.substr(0, 12) + ".log")).string();
  const std::string header = Header(options.tokenizer_sha256);
  if (FileExists(s->path_)) {
    ASSIGN_OR_RETURN(std::string data, ReadFile(s->path_));
    if (data.compare(0, header.size(), header) != 0) {
      s->note_ = "the suffix store's header is not this tokenizer's or is damaged: started empty";
    } else {
      const size_t count = (data.size() - header.size()) / sizeof(int32_t);
      s->ids_.resize(count);
      std::memcpy(s->ids_.data(), data.data() + header.size(), count * sizeof(int32_t));
      if (std::any_of(s->ids_.begin(), s->ids_.end(), [&](int32_t id) { return id != kDocumentEnd && (id < 0 || id >= vocab_size); })) {
        s->ids_.clear();
        s->note_ = "the suffix store held ids outside the vocabulary: started empty";
      } else if ((data.size() - header.size()) % sizeof(int32_t) != 0) {
        s->note_ = "the suffix store's last id was cut short: dropped";
      }
    }
    if (!s->note_.empty() && !options.read_only) RETURN_IF_ERROR(s->Rewrite());
  } else if (!options.read_only) {
    RETURN_IF_ERROR(s->Rewrite());
  }
  s->Index();
  return s;
}

Status SuffixStore::Rewrite() {
  std::string data = Header(options_.tokenizer_sha256);
  data.append(reinterpret_cast<const char*>(ids_.data()), ids_.size() * sizeof(int32_t));
  RETURN_IF_ERROR(WriteFileAtomic(path_, data));
  ::chmod(path_.c_str(), 0600);
  return Status::Ok();
}

void SuffixStore::Index() {
  const int64_t n = static_cast<int64_t>(ids_.size());
  suffixes_.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) suffixes_[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  const int32_t* ids = ids_.data();
  std::sort(suffixes_.begin(), suffixes_.end(), [&](int32_t a, int32_t b) {
    const int64_t la = std::min(kKeyIds, n - a), lb = std::min(kKeyIds, n - b);
    const bool less = std::lexicographical_compare(ids + a, ids + a + la, ids + b, ids + b + lb);
    const bool more = std::lexicographical_compare(ids + b, ids + b + lb, ids + a, ids + a + la);
    return less || (!more && a < b);
  });
  indexed_ = n;
}

int64_t SuffixStore::Newest(std::span<const int32_t> pattern) const {
  const int64_t n = static_cast<int64_t>(ids_.size()), m = static_cast<int64_t>(pattern.size());
  for (int64_t at = n - m; at >= indexed_ - m + 1 && at >= 0; --at)  // the unindexed tail first: it is the newest
    if (std::equal(pattern.begin(), pattern.end(), ids_.begin() + at)) return at;
  const int32_t* ids = ids_.data();
  auto prefix_less = [&](int32_t pos, std::span<const int32_t> p) {
    const int64_t l = std::min<int64_t>(m, n - pos);
    return std::lexicographical_compare(ids + pos, ids + pos + l, p.begin(), p.end());
  };
  auto first = std::lower_bound(suffixes_.begin(), suffixes_.end(), pattern, prefix_less);
  int64_t newest = -1, looked = 0;
  for (auto it = first; it != suffixes_.end() && looked < kScanCap; ++it, ++looked) {
    const int64_t pos = *it;
    if (pos + m > n || !std::equal(pattern.begin(), pattern.end(), ids + pos)) break;
    newest = std::max(newest, pos);
  }
  return newest;
}

std::vector<int32_t> SuffixStore::Draft(std::span<const int32_t> ids, int max_draft) const {
  const int64_t size = static_cast<int64_t>(ids.size());
  if (max_draft <= 0 || ids_.empty()) return {};
  for (int64_t m = std::min(kNgramMax, size); m >= kNgramMin; --m) {
    const int64_t at = Newest(ids.subspan(static_cast<size_t>(size - m)));
    if (at < 0) continue;
    std::vector<int32_t> draft;
    for (int64_t p = at + m; p < static_cast<int64_t>(ids_.size()) && static_cast<int>(draft.size()) < max_draft && ids_[static_cast<size_t>(p)] != kDocumentEnd; ++p)
      draft.push_back(ids_[static_cast<size_t>(p)]);
    if (!draft.empty()) return draft;
  }
  return {};
}

Status SuffixStore::Append(std::span<const int32_t> ids) {
  if (options_.read_only || ids.empty()) return Status::Ok();
  int64_t common = 0;
  for (const std::vector<int32_t>& r : recent_) common = std::max(common, CommonPrefixLength(ids, r));
  recent_.emplace_back(ids.begin(), ids.end());
  if (recent_.size() > kRecentRequests) recent_.pop_front();
  const int64_t from = std::max<int64_t>(0, common - kOverlapIds);
  if (from >= static_cast<int64_t>(ids.size())) return Status::Ok();
  std::vector<int32_t> document(ids.begin() + from, ids.end());
  document.push_back(kDocumentEnd);
  ids_.insert(ids_.end(), document.begin(), document.end());
  Status written;
  if (bytes() > options_.max_bytes) {  // forget the oldest half, from a document's start
    auto cut = std::find(ids_.begin() + static_cast<std::ptrdiff_t>(ids_.size() / 2), ids_.end(), kDocumentEnd);
    ids_.erase(ids_.begin(), cut == ids_.end() ? cut : cut + 1);
    while (bytes() > options_.max_bytes) {  // one document larger than the cap: keep its newest part
      ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(ids_.size() / 2));
    }
    written = Rewrite();
    Index();
  } else {
    const int fd = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
    if (fd < 0) return IoError("open " + path_ + " to append: " + std::strerror(errno));
    const size_t size = document.size() * sizeof(int32_t);
    const ssize_t wrote = ::write(fd, document.data(), size);
    ::close(fd);
    if (wrote != static_cast<ssize_t>(size)) written = IoError("append to " + path_ + " was cut short (a full disk?)");
    if (static_cast<int64_t>(ids_.size()) - indexed_ > std::max<int64_t>(65536, indexed_ / 4)) Index();
  }
  return written;
}

}  // namespace anchorage
