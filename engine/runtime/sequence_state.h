// One sequence's state: K/V rows of every attention layer, recurrent state and conv tail of every
// GDN layer, and the length. Not thread-safe; the engine thread owns it.
#pragma once

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <vector>

#include "engine/core/page_buffer.h"
#include "engine/core/status.h"
#include "engine/model/model_config.h"
#include "engine/runtime/prompt_images.h"

namespace anchorage {

// The recurrent part of a state at one length: every GDN layer's fp32 state and conv tail.
struct Anchor {
  int64_t length = 0;
  std::vector<float> data;  // per GDN layer: state fp32 [Nv, dk, dv] then tail fp32 [K-1, conv_dim]
  int64_t bytes() const { return static_cast<int64_t>(data.size() * sizeof(float)); }
};

// K and V rows [begin, end) of every attention layer (for stash and park), in the state's dtype.
struct KvRows {
  int64_t begin = 0;
  int64_t end = 0;
  KvDtype dtype = KvDtype::kF32;
  std::vector<uint8_t> data;  // per attention layer: K [end-begin, Nkv*hd] then V the same
  int64_t bytes() const { return static_cast<int64_t>(data.size()); }
};

class SequenceState;

// A copy of a state in a compute device's memory (the CUDA backend's), owned by the state. The host
// state stays the one the caches read: the backend writes every K/V row a forward makes back at once,
// and the recurrent part only when the host reads it (PullRecurrent).
class StateMirror {
 public:
  virtual ~StateMirror() = default;
  // Which backend made it: another backend's forward drops it and starts anew from the host.
  virtual const void* owner() const = 0;
  // Copies the device's recurrent states and conv tails into host's.
  virtual Status PullRecurrent(SequenceState& host) = 0;
};

// Where the newest recurrent part is, between a state and its mirror.
enum class NewestRecurrent { kBoth, kHost, kMirror };

class SequenceState {
 public:
  // K/V capacity grows in whole steps of this many rows.
  static constexpr int64_t kKvRowStep = 1024;

  explicit SequenceState(const ModelConfig& config);
  // A copy holds the host state only (the source's recurrent part pulled first), never the mirror.
  SequenceState(const SequenceState& other);
  SequenceState& operator=(const SequenceState& other);
  SequenceState(SequenceState&&) noexcept = default;
  SequenceState& operator=(SequenceState&&) noexcept = default;
  ~SequenceState();

  int64_t length() const { return length_; }
  int64_t capacity() const { return capacity_; }
  int64_t num_attention_layers() const { return static_cast<int64_t>(k_.size()); }
  int64_t num_gdn_layers() const { return static_cast<int64_t>(recurrent_.size()); }
  int64_t kv_width() const { return kv_width_; }  // Nkv*head_dim values per K (or V) row
  KvDtype kv_dtype() const { return kv_dtype_; }
  int64_t kv_row_bytes() const { return KvRowBytes(kv_dtype_, kv_width_); }

  // [capacity, Nkv*head_dim] K (V) rows of attention layer a (0-based among attention layers), in kv_dtype().
  // The writable ones tell a mirror that every row may change.
  uint8_t* k_bytes(int64_t a) {
    HostWritesRows();
    return k_[a].data();
  }
  uint8_t* v_bytes(int64_t a) {
    HostWritesRows();
    return v_[a].data();
  }
  const uint8_t* k_bytes(int64_t a) const { return k_[a].data(); }
  const uint8_t* v_bytes(int64_t a) const { return v_[a].data(); }
  // The same as fp32 rows, for a state whose kv_dtype() is f32.
  float* k_rows(int64_t a) { return AsF32(k_bytes(a)); }
  float* v_rows(int64_t a) { return AsF32(v_bytes(a)); }
  const float* k_rows(int64_t a) const { return AsF32(k_bytes(a)); }
  const float* v_rows(int64_t a) const { return AsF32(v_bytes(a)); }
  // fp32 [Nv, dk, dv] recurrent state of GDN layer g (0-based among GDN layers).
  float* recurrent(int64_t g) {
    HostWritesRecurrent();
    return recurrent_[g].data();
  }
  const float* recurrent(int64_t g) const {
    PullFromMirror();
    return recurrent_[g].data();
  }
  // fp32 [K-1, conv_dim] pre-conv qkv rows of the last K-1 positions, oldest first (zeros at start).
  float* conv_tail(int64_t g) {
    HostWritesRecurrent();
    return tail_[g].data();
  }
  const float* conv_tail(int64_t g) const {
    PullFromMirror();
    return tail_[g].data();
  }
  int64_t recurrent_floats() const { return recurrent_floats_; }
  int64_t tail_floats() const { return tail_floats_; }

  // The images among its rows (where they are, their tower rows): the forward reads their rows' inputs and
  // every row's rotary position from them. Whoever forwards a prompt sets them from its ids; copies share them.
  const std::shared_ptr<const PromptImages>& images() const { return images_; }
  void set_images(std::shared_ptr<const PromptImages> images) { images_ = std::move(images); }

  // Ensures room for `tokens` rows; capacity rounds up to kKvRowStep. Fails if memory runs out.
  Status Reserve(int64_t tokens);
  // Sets the length after a forward wrote rows [length, new_length); rows must be reserved.
  void SetLength(int64_t new_length);
  // Back to length 0 with zero recurrent state and tails; keeps capacity.
  void Reset();
  // Reset, and gives back the K/V rows' memory and the mirror (the next Reserve allocates anew).
  void Release();

  // Bytes of one anchor and of one token's K/V rows over all attention layers (in the config's kv_dtype).
  int64_t anchor_bytes() const;
  // The same for a model, without a state.
  static int64_t AnchorBytes(const ModelConfig& config);
  static int64_t KvBytesPerToken(const ModelConfig& config);
  int64_t kv_bytes_per_token() const;
  // Bytes currently allocated.
  int64_t allocated_bytes() const;

  // Copies the recurrent part at the current length.
  Anchor SaveAnchor() const;
  // Restores an anchor: recurrent part and length; K/V rows below anchor.length must already be valid.
  // Fails without change if the anchor's size does not match or its length exceeds the capacity.
  Status RestoreAnchor(const Anchor& anchor);
  // Copies K/V rows [begin, end), end <= length().
  Result<KvRows> CopyRows(int64_t begin, int64_t end) const;
  // The same from another thread while the owner goes on: reads no length; the caller holds the
  // growth lock shared and knows rows [begin, end) are written and stay unchanged.
  KvRows CopyRowsFromReader(int64_t begin, int64_t end) const;
  // Reserve takes this lock exclusively while it moves the rows (a reader thread copies under it).
  void set_growth_lock(std::shared_mutex* lock) { growth_lock_ = lock; }
  // Writes rows back at rows.begin (reserving as needed); the length is not changed.
  Status WriteRows(const KvRows& rows);

  // True when length, K/V rows below the length, recurrent states and tails are bit-equal.
  bool BitEqual(const SequenceState& other) const;

  // The device copy a compute backend keeps (nullptr: none), and what of it equals the host state:
  // K/V rows [0, mirror_rows()) and the recurrent part as newest_recurrent() says. Only the backend
  // that owns the mirror sets these; every host write above lowers them.
  StateMirror* mirror() const { return mirror_.get(); }
  void set_mirror(std::unique_ptr<StateMirror> mirror);
  int64_t mirror_rows() const { return mirror_rows_; }
  NewestRecurrent newest_recurrent() const { return newest_recurrent_; }
  void set_mirror_sync(int64_t rows, NewestRecurrent newest) {
    mirror_rows_ = rows;
    newest_recurrent_ = newest;
  }
  // Before threads fill rows from from_row on and (with recurrent) the whole recurrent part: the
  // mirror is told here, on the owner's thread, and keeps its rows below from_row. The threads then
  // write through the *_to_fill pointers, which leave the flags alone.
  void PrepareHostWrites(bool recurrent, int64_t from_row = 0) {
    mirror_rows_ = std::min(mirror_rows_, std::max<int64_t>(from_row, 0));
    if (recurrent) newest_recurrent_ = NewestRecurrent::kHost;  // all of it is overwritten: nothing to pull
  }
  uint8_t* k_bytes_to_fill(int64_t a) { return k_[a].data(); }
  uint8_t* v_bytes_to_fill(int64_t a) { return v_[a].data(); }
  float* recurrent_to_fill(int64_t g) { return recurrent_[g].data(); }
  float* conv_tail_to_fill(int64_t g) { return tail_[g].data(); }
  // Gives up the mirror. Where the mirror held the newest recurrent part it is pulled first; where
  // that fails the state is reset (length 0) and the pull's error returned.
  Status DropMirror();

 private:
  // Before the host reads its recurrent part: the mirror's, when newer, is copied in. A device that
  // cannot give it back has lost the state; the process stops rather than serve other bits.
  void PullFromMirror() const;
  // Both only read the flags when they are already so (threads filling a prepared state).
  float* AsF32(uint8_t* rows) const {
    assert(kv_dtype_ == KvDtype::kF32);
    return reinterpret_cast<float*>(rows);
  }
  const float* AsF32(const uint8_t* rows) const {
    assert(kv_dtype_ == KvDtype::kF32);
    return reinterpret_cast<const float*>(rows);
  }
  void HostWritesRows() {
    if (mirror_ && mirror_rows_ != 0) mirror_rows_ = 0;
  }
  void HostWritesRecurrent() {
    if (!mirror_ || newest_recurrent_ == NewestRecurrent::kHost) return;
    PullFromMirror();
    newest_recurrent_ = NewestRecurrent::kHost;
  }

  int64_t kv_width_ = 0;
  KvDtype kv_dtype_ = KvDtype::kF32;
  int64_t recurrent_floats_ = 0;
  int64_t tail_floats_ = 0;
  int64_t length_ = 0;
  int64_t capacity_ = 0;
  std::shared_mutex* growth_lock_ = nullptr;
  std::shared_ptr<const PromptImages> images_;
  std::vector<PageArray<uint8_t>> k_, v_;  // page-aligned, so the disk tier reads rows straight in
  std::vector<PageArray<float>> recurrent_, tail_;
  std::unique_ptr<StateMirror> mirror_;
  int64_t mirror_rows_ = 0;
  NewestRecurrent newest_recurrent_ = NewestRecurrent::kHost;
};

}  // namespace anchorage
