// A bf16 weight matrix W [n, k] repacked once for y = x · Wᵀ: super-panels of 32 output columns.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>

#include "engine/core/page_buffer.h"
#include "engine/core/thread_pool.h"

namespace anchorage::cpu {

// Output columns in one super-panel; every kernel path reads this one layout.
inline constexpr int64_t kPanelColumns = 32;

// fill(p) for each super-panel p in [0, panels): on the pool's threads in runs of 16 when there is one.
template <typename Fill>
void ForEachPanel(int64_t panels, ThreadPool* pool, const Fill& fill) {
  constexpr int64_t kPanelsATask = 16;
  if (pool == nullptr) {
    for (int64_t p = 0; p < panels; ++p) fill(p);
    return;
  }
  pool->Run(static_cast<size_t>((panels + kPanelsATask - 1) / kPanelsATask), [&](size_t t) {
    const int64_t first = static_cast<int64_t>(t) * kPanelsATask;
    for (int64_t p = first; p < std::min(panels, first + kPanelsATask); ++p) fill(p);
  });
}

// Super-panel p holds columns [32p, 32p + 32) as k rows of 32 slots (64 bytes, one cache line):
// slots [16h, 16h + 16) hold the columns 32p + 16h + c; slot 2i is column i, slot 2i + 1 column 8 + i,
// so one 32-bit word carries columns i and 8 + i and a shift or a mask turns either into fp32.
// Columns past n are zero.
class PackedBf16 {
 public:
  PackedBf16() = default;
  PackedBf16(PackedBf16&&) = default;
  PackedBf16& operator=(PackedBf16&&) = default;
  PackedBf16(const PackedBf16&) = delete;  // hundreds of MB: never copied by accident
  PackedBf16& operator=(const PackedBf16&) = delete;
  // element(j, i) gives W[j][i] as bf16 bits for j < n, i < k; with a pool, super-panels are filled on
  // its threads (element is then called from several at once).
  static PackedBf16 Pack(int64_t n, int64_t k, const std::function<uint16_t(int64_t j, int64_t i)>& element,
                         ThreadPool* pool = nullptr);
  static PackedBf16 FromRowMajor(const uint16_t* w, int64_t n, int64_t k, ThreadPool* pool = nullptr);

  int64_t rows() const { return n_; }  // output columns of the product
  int64_t cols() const { return k_; }  // the reduction length
  int64_t panels() const { return (n_ + kPanelColumns - 1) / kPanelColumns; }
  int64_t bytes() const { return panels() * kPanelColumns * k_ * 2; }
  const uint16_t* panel(int64_t p) const { return data_.data() + p * kPanelColumns * k_; }
  // W[j][i] as bf16 bits, and row j of W widened to fp32 (the embedding lookup).
  uint16_t At(int64_t j, int64_t i) const;
  void RowToFloat(int64_t j, float* out) const;
  bool empty() const { return n_ == 0; }

  static int64_t SlotOf(int64_t column_in_panel);

 private:
  static PackedBf16 Allocate(int64_t n, int64_t k);
  int64_t n_ = 0, k_ = 0;
  PageArray<uint16_t> data_;  // huge pages where it is large: decode streams it every token
};

}  // namespace anchorage::cpu
