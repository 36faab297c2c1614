#include "engine/compute/cpu/packed_q8.h"

#include <emmintrin.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <vector>

#include "engine/core/fp8.h"

namespace anchorage::cpu {

namespace {

// Scales past this would make the kernels' exact rescalings (by 2^8) overflow.
constexpr float kLargestScale = 0x1p100f;

}  // namespace

PackedQ8 PackedQ8::Allocate(Q8Code code, int64_t n, int64_t k, int64_t block_k) {
  PackedQ8 m;
  m.code_ = code;
  m.n_ = n;
  m.k_ = k;
  m.block_k_ = block_k;
  m.codes_ = PageArray<uint8_t>(static_cast<size_t>(m.panels() * m.panel_bytes()));
  m.scales_ = PageArray<float>(static_cast<size_t>(m.panels() * kPanelColumns * m.k_blocks()));
  return m;
}

size_t PackedQ8::CodeIndex(int64_t j, int64_t i) const {
  const int64_t panel_start = (j / kPanelColumns) * panel_bytes(), c = j % kPanelColumns;
  if (code_ == Q8Code::kInt8) return static_cast<size_t>(panel_start + (i / 2) * 2 * kPanelColumns + 2 * c + i % 2);
  return static_cast<size_t>(panel_start + i * kPanelColumns + SlotOf(c));
}

size_t PackedQ8::ScaleIndex(int64_t j, int64_t block) const {
  return static_cast<size_t>(((j / kPanelColumns) * k_blocks() + block) * kPanelColumns + j % kPanelColumns);
}

uint8_t& PackedQ8::CodeAt(int64_t j, int64_t i) { return codes_.data()[CodeIndex(j, i)]; }

float& PackedQ8::ScaleAt(int64_t j, int64_t block) { return scales_.data()[ScaleIndex(j, block)]; }

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

void QuantizeInt8Row(const float* row, int64_t k, int8_t* codes, float* scales) {
  constexpr int64_t kBlock = PackedQ8::kInt8Block;
  for (int64_t b = 0; b * kBlock < k; ++b) {
    const int64_t i0 = b * kBlock, i1 = std::min(k, i0 + kBlock);
    float largest = 0.0f;
    for (int64_t i = i0; i < i1; ++i) largest = std::max(largest, std::fabs(row[i]));
    const float scale = largest / 127.0f;
    scales[b] = scale;
    for (int64_t i = i0; i < i1; ++i)
      codes[i] = scale == 0.0f ? 0 : static_cast<int8_t>(std::clamp(std::nearbyint(row[i] / scale), -127.0f, 127.0f));
  }
}

PackedQ8 PackedQ8::QuantizeInt8(int64_t n, int64_t k, const std::function<void(int64_t, float*)>& row_of, ThreadPool* pool) {
  PackedQ8 m = Allocate(Q8Code::kInt8, n, k, kInt8Block);
  ForEachPanel(m.panels(), pool, [&](int64_t p) {
    std::vector<float> row(static_cast<size_t>(k)), scales(static_cast<size_t>(m.k_blocks()));
    std::vector<int8_t> codes(static_cast<size_t>(k));
    for (int64_t j = p * kPanelColumns; j < std::min(n, (p + 1) * kPanelColumns); ++j) {
      row_of(j, row.data());
      QuantizeInt8Row(row.data(), k, codes.data(), scales.data());
      for (int64_t b = 0; b < m.k_blocks(); ++b) m.ScaleAt(j, b) = scales[static_cast<size_t>(b)];
      for (int64_t i = 0; i < k; ++i) m.CodeAt(j, i) = static_cast<uint8_t>(codes[static_cast<size_t>(i)]);
    }
  });
  return m;
}

float PackedQ8::At(int64_t j, int64_t i) const {
  const uint8_t c = Code(j, i);
  const float value = code_ == Q8Code::kInt8 ? static_cast<float>(static_cast<int8_t>(c)) : Fp8E4m3ToFloat(c);
  return value * Scale(j, i / block_k_);
}

void PackedQ8::RowToFloat(int64_t j, float* out) const {
  for (int64_t i = 0; i < k_; ++i) out[i] = At(j, i);
}

int64_t ActivationCodesStride(int64_t k) { return ActivationScalesStride(k) * PackedQ8::kInt8Block; }
int64_t ActivationScalesStride(int64_t k) { return (k + PackedQ8::kInt8Block - 1) / PackedQ8::kInt8Block; }

void QuantizeActivations(const float* x, int64_t ldx, int64_t rows, int64_t k, int16_t* codes, float* scales) {
  constexpr int64_t kBlock = PackedQ8::kInt8Block;
  static_assert(kBlock % 8 == 0, "a block is whole SSE2 steps");
  const __m128 magnitude = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
  const __m128 largest_finite = _mm_set1_ps(FLT_MAX);
  alignas(16) float block[kBlock];
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * ldx;
    int16_t* row_codes = codes + r * ActivationCodesStride(k);
    float* row_scales = scales + r * ActivationScalesStride(k);
    for (int64_t i0 = 0; i0 < k; i0 += kBlock) {
      const int64_t n = std::min(kBlock, k - i0);
      std::fill_n(block, kBlock, 0.0f);
      std::copy_n(row + i0, n, block);
      __m128 largest = _mm_setzero_ps(), bad = _mm_setzero_ps();
      for (int64_t i = 0; i < kBlock; i += 4) {
        const __m128 v = _mm_and_ps(_mm_load_ps(block + i), magnitude);
        largest = _mm_max_ps(largest, v);
        bad = _mm_or_ps(bad, _mm_or_ps(_mm_cmpunord_ps(v, v), _mm_cmpgt_ps(v, largest_finite)));
      }
      largest = _mm_max_ps(largest, _mm_shuffle_ps(largest, largest, _MM_SHUFFLE(1, 0, 3, 2)));
      largest = _mm_max_ps(largest, _mm_shuffle_ps(largest, largest, _MM_SHUFFLE(2, 3, 0, 1)));
      const float scale = _mm_cvtss_f32(largest) / 32767.0f;
      int16_t* out = row_codes + i0;
      // Blocks below FLT_MIN * 32767 count as zero, so 1 / scale stays finite.
      if (_mm_movemask_ps(bad) != 0 || !(scale >= FLT_MIN)) {
        row_scales[i0 / kBlock] = _mm_movemask_ps(bad) != 0 ? NAN : 0.0f;
        std::fill_n(out, kBlock, int16_t{0});
        continue;
      }
      row_scales[i0 / kBlock] = scale;
      const __m128 inverse = _mm_set1_ps(1.0f / scale);
      for (int64_t i = 0; i < kBlock; i += 8) {
        const __m128i a = _mm_cvtps_epi32(_mm_mul_ps(_mm_load_ps(block + i), inverse));
        const __m128i b = _mm_cvtps_epi32(_mm_mul_ps(_mm_load_ps(block + i + 4), inverse));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm_max_epi16(_mm_packs_epi32(a, b), _mm_set1_epi16(-32767)));
      }
    }
  }
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
