#include "engine/runtime/sequence_state.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <string>

namespace anchorage {

SequenceState::SequenceState(const ModelConfig& config) {
  kv_width_ = config.num_key_value_heads * config.head_dim;
  kv_dtype_ = config.kv_dtype;
  recurrent_floats_ = config.linear_num_value_heads * config.linear_key_head_dim * config.linear_value_head_dim;
  tail_floats_ = (config.linear_conv_kernel_dim - 1) * config.conv_dim();
  for (LayerKind kind : config.layer_types) {
    if (kind == LayerKind::kFullAttention) {
      k_.emplace_back();
      v_.emplace_back();
    } else {
      recurrent_.emplace_back(static_cast<size_t>(recurrent_floats_));
      tail_.emplace_back(static_cast<size_t>(tail_floats_));
    }
  }
}

SequenceState::SequenceState(const SequenceState& other)
    : kv_width_(other.kv_width_), kv_dtype_(other.kv_dtype_), recurrent_floats_(other.recurrent_floats_), tail_floats_(other.tail_floats_),
      length_(other.length_), capacity_(other.capacity_), growth_lock_(other.growth_lock_), images_(other.images_) {
  other.PullFromMirror();
  k_ = other.k_;
  v_ = other.v_;
  recurrent_ = other.recurrent_;
  tail_ = other.tail_;
}

SequenceState& SequenceState::operator=(const SequenceState& other) {
  if (this != &other) *this = SequenceState(other);
  return *this;
}

SequenceState::~SequenceState() = default;

void SequenceState::set_mirror(std::unique_ptr<StateMirror> mirror) {
  PullFromMirror();
  mirror_ = std::move(mirror);
  set_mirror_sync(0, NewestRecurrent::kHost);
}

Status SequenceState::DropMirror() {
  Status pulled = Status::Ok();
  if (mirror_ && newest_recurrent_ == NewestRecurrent::kMirror) {
    pulled = mirror_->PullRecurrent(*this);
    if (!pulled.ok()) Reset();
  }
  mirror_.reset();
  set_mirror_sync(0, NewestRecurrent::kHost);
  return pulled;
}

void SequenceState::PullFromMirror() const {
  if (!mirror_ || newest_recurrent_ != NewestRecurrent::kMirror) return;
  SequenceState& self = const_cast<SequenceState&>(*this);  // the same bits, now in host memory too
  if (Status s = mirror_->PullRecurrent(self); !s.ok()) {
    std::fprintf(stderr, "anchorage: a state's recurrent part could not be copied from the device: %s\n", s.message().c_str());
    std::abort();
  }
  self.newest_recurrent_ = NewestRecurrent::kBoth;
}

Status SequenceState::Reserve(int64_t tokens) {
  if (tokens <= capacity_) return Status::Ok();
  const int64_t rows = (tokens + kKvRowStep - 1) / kKvRowStep * kKvRowStep;
  const size_t bytes = static_cast<size_t>(rows * kv_row_bytes());
  // Allocate everything first so a failure leaves the state unchanged.
  std::vector<PageArray<uint8_t>> nk(k_.size()), nv(v_.size());
  try {
    for (size_t a = 0; a < k_.size(); ++a) {
      nk[a] = PageArray<uint8_t>(bytes);
      nv[a] = PageArray<uint8_t>(bytes);
    }
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("SequenceState::Reserve: cannot allocate " + std::to_string(rows) + " K/V rows (" +
                             std::to_string(rows * kv_bytes_per_token()) + " bytes)");
  }
  const size_t used = static_cast<size_t>(length_ * kv_row_bytes());
  std::unique_lock<std::shared_mutex> moving;
  if (growth_lock_ != nullptr) moving = std::unique_lock(*growth_lock_);
  for (size_t a = 0; a < k_.size(); ++a) {
    std::copy_n(k_[a].begin(), used, nk[a].begin());
    std::copy_n(v_[a].begin(), used, nv[a].begin());
  }
  k_ = std::move(nk);
  v_ = std::move(nv);
  capacity_ = rows;
  return Status::Ok();
}

void SequenceState::SetLength(int64_t new_length) {
  assert(new_length <= capacity_ || k_.empty());
  length_ = new_length;
}

void SequenceState::Reset() {
  length_ = 0;
  images_.reset();
  newest_recurrent_ = NewestRecurrent::kHost;
  for (auto& r : recurrent_) std::fill(r.begin(), r.end(), 0.0f);
  for (auto& t : tail_) std::fill(t.begin(), t.end(), 0.0f);
}

void SequenceState::Release() {
  mirror_.reset();
  mirror_rows_ = 0;
  Reset();
  std::unique_lock<std::shared_mutex> moving;
  if (growth_lock_ != nullptr) moving = std::unique_lock(*growth_lock_);
  for (size_t a = 0; a < k_.size(); ++a) {
    k_[a] = PageArray<uint8_t>(0);
    v_[a] = PageArray<uint8_t>(0);
  }
  capacity_ = 0;
}

int64_t SequenceState::AnchorBytes(const ModelConfig& c) {
  const int64_t recurrent = c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim;
  const int64_t tail = (c.linear_conv_kernel_dim - 1) * c.conv_dim();
  return c.num_linear_attention_layers() * (recurrent + tail) * static_cast<int64_t>(sizeof(float));
}

int64_t SequenceState::anchor_bytes() const {
  return num_gdn_layers() * (recurrent_floats_ + tail_floats_) * static_cast<int64_t>(sizeof(float));
}

int64_t SequenceState::KvBytesPerToken(const ModelConfig& config) {
  return config.num_full_attention_layers() * 2 * KvRowBytes(config.kv_dtype, config.num_key_value_heads * config.head_dim);
}

int64_t SequenceState::kv_bytes_per_token() const {
  return num_attention_layers() * 2 * kv_row_bytes();
}

int64_t SequenceState::allocated_bytes() const {
  return capacity_ * kv_bytes_per_token() + anchor_bytes();
}

Anchor SequenceState::SaveAnchor() const {
  PullFromMirror();
  Anchor anchor;
  anchor.length = length_;
  anchor.data.reserve(static_cast<size_t>(num_gdn_layers() * (recurrent_floats_ + tail_floats_)));
  for (size_t g = 0; g < recurrent_.size(); ++g) {
    anchor.data.insert(anchor.data.end(), recurrent_[g].begin(), recurrent_[g].end());
    anchor.data.insert(anchor.data.end(), tail_[g].begin(), tail_[g].end());
  }
  return anchor;
}

Status SequenceState::RestoreAnchor(const Anchor& anchor) {
  const size_t want = static_cast<size_t>(num_gdn_layers() * (recurrent_floats_ + tail_floats_));
  if (anchor.data.size() != want)
    return InvalidArgument("RestoreAnchor: anchor holds " + std::to_string(anchor.data.size()) + " floats, state wants " + std::to_string(want));
  if (anchor.length < 0 || (!k_.empty() && anchor.length > capacity_))
    return OutOfRange("RestoreAnchor: anchor length " + std::to_string(anchor.length) + " exceeds capacity " + std::to_string(capacity_));
  const float* p = anchor.data.data();
  for (size_t g = 0; g < recurrent_.size(); ++g) {
    std::copy_n(p, recurrent_floats_, recurrent_[g].begin());
    p += recurrent_floats_;
    std::copy_n(p, tail_floats_, tail_[g].begin());
    p += tail_floats_;
  }
  length_ = anchor.length;
  newest_recurrent_ = NewestRecurrent::kHost;
  return Status::Ok();
}

Result<KvRows> SequenceState::CopyRows(int64_t begin, int64_t end) const {
  if (begin < 0 || end < begin || end > length_)
    return OutOfRange("CopyRows: rows [" + std::to_string(begin) + ", " + std::to_string(end) +
                      ") outside length " + std::to_string(length_));
  return CopyRowsFromReader(begin, end);
}

KvRows SequenceState::CopyRowsFromReader(int64_t begin, int64_t end) const {
  KvRows rows;
  rows.begin = begin;
  rows.end = end;
  rows.dtype = kv_dtype_;
  const size_t n = static_cast<size_t>((end - begin) * kv_row_bytes());
  rows.data.reserve(n * 2 * k_.size());
  for (size_t a = 0; a < k_.size(); ++a) {
    const uint8_t* k = k_[a].data() + begin * kv_row_bytes();
    const uint8_t* v = v_[a].data() + begin * kv_row_bytes();
    rows.data.insert(rows.data.end(), k, k + n);
    rows.data.insert(rows.data.end(), v, v + n);
  }
  return rows;
}

Status SequenceState::WriteRows(const KvRows& rows) {
  const size_t n = static_cast<size_t>((rows.end - rows.begin) * kv_row_bytes());
  if (rows.dtype != kv_dtype_)
    return InvalidArgument(std::string("WriteRows: ") + KvDtypeName(rows.dtype) + " rows do not fit a state of " + KvDtypeName(kv_dtype_) + " rows");
  if (rows.begin < 0 || rows.end < rows.begin || rows.data.size() != n * 2 * k_.size())
    return InvalidArgument("WriteRows: rows [" + std::to_string(rows.begin) + ", " + std::to_string(rows.end) +
                           ") with " + std::to_string(rows.data.size()) + " bytes do not fit this model");
  RETURN_IF_ERROR(Reserve(rows.end));
  mirror_rows_ = std::min(mirror_rows_, rows.begin);
  const uint8_t* p = rows.data.data();
  for (size_t a = 0; a < k_.size(); ++a) {
    std::copy_n(p, n, k_[a].begin() + rows.begin * kv_row_bytes());
    p += n;
    std::copy_n(p, n, v_[a].begin() + rows.begin * kv_row_bytes());
    p += n;
  }
  return Status::Ok();
}

bool SequenceState::BitEqual(const SequenceState& other) const {
  if (length_ != other.length_ || kv_dtype_ != other.kv_dtype_ || k_.size() != other.k_.size() || recurrent_.size() != other.recurrent_.size())
    return false;
  PullFromMirror();
  other.PullFromMirror();
  const size_t used = static_cast<size_t>(length_ * kv_row_bytes());
  for (size_t a = 0; a < k_.size(); ++a) {
    if (used && (std::memcmp(k_[a].data(), other.k_[a].data(), used) != 0 ||
                 std::memcmp(v_[a].data(), other.v_[a].data(), used) != 0))
      return false;
  }
  for (size_t g = 0; g < recurrent_.size(); ++g) {
    if (std::memcmp(recurrent_[g].data(), other.recurrent_[g].data(), recurrent_[g].size() * sizeof(float)) != 0 ||
        std::memcmp(tail_[g].data(), other.tail_[g].data(), tail_[g].size() * sizeof(float)) != 0)
      return false;
  }
  return true;
}

}  // namespace anchorage
