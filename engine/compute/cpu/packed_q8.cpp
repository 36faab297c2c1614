#include "engine/compute/cpu/packed_q8.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "engine/core/fp8.h"

namespace anchorage::cpu {

namespace {

// Scales past this would make the kernels' exact rescalings (by 2^8) overflow.
constexpr float kLargestScale = 0x1p100f;

}  // namespace

void PackedQ8::Free::operator()(void* p) const { std::free(p); }

PackedQ8 PackedQ8::Allocate(Q8Code code, int64_t n, int64_t k, int64_t block_k) {
  PackedQ8 m;
  m.code_ = code;
  m.n_ = n;
  m.k_ = k;
  m.block_k_ = block_k;
  auto zeroed = [](size_t bytes) {
    bytes = std::max<size_t>(64, (bytes + 63) / 64 * 64);
    void* p = std::aligned_alloc(64, bytes);
    std::memset(p, 0, bytes);
    return p;
  };
  m.codes_.reset(static_cast<uint8_t*>(zeroed(static_cast<size_t>(m.panels() * kPanelColumns * k))));
  m.scales_.reset(static_cast<float*>(zeroed(static_cast<size_t>(m.panels() * kPanelColumns * m.k_blocks()) * 4)));
  return m;
}

size_t PackedQ8::CodeIndex(int64_t j, int64_t i) const {
  return static_cast<size_t>((j / kPanelColumns) * kPanelColumns * k_ + i * kPanelColumns + SlotOf(j % kPanelColumns));
}

size_t PackedQ8::ScaleIndex(int64_t j, int64_t block) const {
  return static_cast<size_t>(((j / kPanelColumns) * k_blocks() + block) * kPanelColumns + j % kPanelColumns);
}

uint8_t& PackedQ8::CodeAt(int64_t j, int64_t i) { return codes_[CodeIndex(j, i)]; }

float& PackedQ8::ScaleAt(int64_t j, int64_t block) { return scales_[ScaleIndex(j, block)]; }

Result<PackedQ8> PackedQ8::FromFp8Blocks(int64_t n, int64_t k, const uint8_t* codes, const float* scales, int64_t block_n,
                                         int64_t block_k, ThreadPool* pool) {
  if (block_n <= 0 || block_k <= 0) return InvalidArgument("FP8 block size must be positive");
  const int64_t scale_rows = (n + block_n - 1) / block_n, scale_cols = (k + block_k - 1) / block_k;
  for (int64_t b = 0; b < scale_rows * scale_cols; ++b) {
    const float s = scales[b];
    if (!(s > 0.0f) || !(s <= kLargestScale))
      return InvalidArgument("scale [" + std::to_string(b / scale_cols) + ", " + std::to_string(b % scale_cols) + "] is " +
                             std::to_string(s) + "; FP8 block scales must be finite, positive and at most 2^100");
  }
  if (const uint8_t* nan = std::find_if(codes, codes + n * k, Fp8E4m3IsNan); nan != codes + n * k)
    return InvalidArgument("element [" + std::to_string((nan - codes) / k) + ", " + std::to_string((nan - codes) % k) +
                           "] is an FP8 NaN");
  PackedQ8 m = Allocate(Q8Code::kFp8E4m3, n, k, block_k);
  ForEachPanel(m.panels(), pool, [&](int64_t p) {
    for (int64_t j = p * kPanelColumns; j < std::min(n, (p + 1) * kPanelColumns); ++j) {
      for (int64_t i = 0; i < k; ++i) m.CodeAt(j, i) = codes[j * k + i];
      for (int64_t b = 0; b < scale_cols; ++b) m.ScaleAt(j, b) = scales[(j / block_n) * scale_cols + b];
    }
  });
  return m;
}

PackedQ8 PackedQ8::QuantizeInt8(int64_t n, int64_t k, const std::function<void(int64_t, float*)>& row_of, ThreadPool* pool) {
  PackedQ8 m = Allocate(Q8Code::kInt8, n, k, kInt8Block);
  ForEachPanel(m.panels(), pool, [&](int64_t p) {
    std::vector<float> row(static_cast<size_t>(k));
    for (int64_t j = p * kPanelColumns; j < std::min(n, (p + 1) * kPanelColumns); ++j) {
      row_of(j, row.data());
      for (int64_t b = 0; b < m.k_blocks(); ++b) {
        const int64_t i0 = b * kInt8Block, i1 = std::min(k, i0 + kInt8Block);
        float largest = 0.0f;
        for (int64_t i = i0; i < i1; ++i) largest = std::max(largest, std::fabs(row[i]));
        const float scale = largest / 127.0f;
        m.ScaleAt(j, b) = scale;
        if (scale == 0.0f) continue;
        for (int64_t i = i0; i < i1; ++i) {
          const float q = std::clamp(std::nearbyint(row[i] / scale), -127.0f, 127.0f);
          m.CodeAt(j, i) = static_cast<uint8_t>(static_cast<int8_t>(q));
        }
      }
    }
  });
  return m;
}

float PackedQ8::At(int64_t j, int64_t i) const {
  const uint8_t c = codes_[CodeIndex(j, i)];
  const float value = code_ == Q8Code::kInt8 ? static_cast<float>(static_cast<int8_t>(c)) : Fp8E4m3ToFloat(c);
  return value * scales_[ScaleIndex(j, i / block_k_)];
}

void PackedQ8::RowToFloat(int64_t j, float* out) const {
  for (int64_t i = 0; i < k_; ++i) out[i] = At(j, i);
}

const char* WeightFormatName(WeightFormat format) {
  switch (format) {
    case WeightFormat::kFp8E4m3: return "fp8-e4m3";
    case WeightFormat::kInt8: return "int8";
    case WeightFormat::kBf16: break;
  }
  return "bf16";
}

Result<WeightFormat> WeightFormatFromName(const std::string& name) {
  for (WeightFormat f : {WeightFormat::kBf16, WeightFormat::kFp8E4m3, WeightFormat::kInt8})
    if (name == WeightFormatName(f)) return f;
  return InvalidArgument("unknown weight format '" + name + "' (bf16, fp8-e4m3, int8)");
}

WeightFormat PackedMatrix::format() const {
  if (const PackedQ8* q = q8()) return q->code() == Q8Code::kInt8 ? WeightFormat::kInt8 : WeightFormat::kFp8E4m3;
  return WeightFormat::kBf16;
}

int64_t PackedMatrix::rows() const { return std::visit([](const auto& m) { return m.rows(); }, m_); }
int64_t PackedMatrix::cols() const { return std::visit([](const auto& m) { return m.cols(); }, m_); }
int64_t PackedMatrix::bytes() const { return std::visit([](const auto& m) { return m.bytes(); }, m_); }
void PackedMatrix::RowToFloat(int64_t j, float* out) const {
  std::visit([&](const auto& m) { m.RowToFloat(j, out); }, m_);
}

}  // namespace anchorage::cpu
