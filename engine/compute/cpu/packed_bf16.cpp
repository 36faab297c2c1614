#include "engine/compute/cpu/packed_bf16.h"

#include "engine/core/bf16.h"

namespace anchorage::cpu {

int64_t PackedBf16::SlotOf(int64_t c) {
  const int64_t half = c / 16, within = c % 16;
  return half * 16 + (within < 8 ? 2 * within : 2 * (within - 8) + 1);
}

namespace {

// Fills the panels, reading element(j, i) for j < n; a pool takes runs of super-panels on its threads.
template <typename Element>
void FillPanels(int64_t n, int64_t k, uint16_t* data, const Element& element, ThreadPool* pool) {
  int64_t slot[kPanelColumns];
  for (int64_t c = 0; c < kPanelColumns; ++c) slot[c] = PackedBf16::SlotOf(c);
  const int64_t panels = (n + kPanelColumns - 1) / kPanelColumns;
  auto fill = [&](int64_t p) {
    const int64_t j0 = p * kPanelColumns;
    uint16_t* panel = data + j0 * k;
    const int64_t width = n - j0 < kPanelColumns ? n - j0 : kPanelColumns;
    for (int64_t i = 0; i < k; ++i)
      for (int64_t c = 0; c < width; ++c) panel[i * kPanelColumns + slot[c]] = element(j0 + c, i);
  };
  ForEachPanel(panels, pool, fill);
}

}  // namespace

PackedBf16 PackedBf16::Allocate(int64_t n, int64_t k) {
  PackedBf16 m;
  m.n_ = n;
  m.k_ = k;
  m.data_ = PageArray<uint16_t>(static_cast<size_t>(m.bytes()) / 2);
  return m;
}

PackedBf16 PackedBf16::Pack(int64_t n, int64_t k, const std::function<uint16_t(int64_t, int64_t)>& element, ThreadPool* pool) {
  PackedBf16 m = Allocate(n, k);
  FillPanels(n, k, m.data_.data(), element, pool);
  return m;
}

PackedBf16 PackedBf16::FromRowMajor(const uint16_t* w, int64_t n, int64_t k, ThreadPool* pool) {
  PackedBf16 m = Allocate(n, k);
  FillPanels(n, k, m.data_.data(), [w, k](int64_t j, int64_t i) { return w[j * k + i]; }, pool);
  return m;
}

uint16_t PackedBf16::At(int64_t j, int64_t i) const {
  return panel(j / kPanelColumns)[i * kPanelColumns + SlotOf(j % kPanelColumns)];
}

void PackedBf16::RowToFloat(int64_t j, float* out) const {
  const uint16_t* base = panel(j / kPanelColumns) + SlotOf(j % kPanelColumns);
  for (int64_t i = 0; i < k_; ++i) out[i] = Bf16ToFloat(base[i * kPanelColumns]);
}

}  // namespace anchorage::cpu
