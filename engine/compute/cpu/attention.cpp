#include "engine/compute/cpu/attention.h"

#include <emmintrin.h>
#include <xmmintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "engine/compute/cpu/fp32_block.h"
#include "engine/core/bf16.h"
#include "engine/core/fp8.h"
#include "engine/compute/cpu/matmul.h"
#include "engine/compute/cpu/vec.h"

namespace anchorage::cpu {
namespace {

// A decode step's tasks: keys a scores task reads, and the fewest output columns a values task writes.
constexpr int64_t kDecodeKeySpan = 512;
constexpr int64_t kDecodeMinColumns = 16;

// Softmax of p[0..valid) in place (max, exp, sum, divide in index order).
void SoftmaxPrefix(float* p, int64_t valid) {
  float mx = p[0];
  for (int64_t l = 1; l < valid; ++l) mx = std::max(mx, p[l]);
  for (int64_t l = 0; l < valid; ++l) p[l] = Exp(p[l] - mx);
  float sum = 0.0f;
  for (int64_t l = 0; l < valid; ++l) sum += p[l];
  const float inv = 1.0f / sum;
  for (int64_t l = 0; l < valid; ++l) p[l] *= inv;
}

// Value e of a row of K/V values of type T (float, or uint16_t holding bf16), and four from e on, as fp32.
template <typename T>
float ValueAt(const T* row, int64_t e) {
  if constexpr (std::is_same_v<T, float>) return row[e];
  else return Bf16ToFloat(row[e]);
}
template <typename T>
__m128 Load4(const T* row, int64_t e) {
  if constexpr (std::is_same_v<T, float>) return _mm_loadu_ps(row + e);
  else return _mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + e))));
}
template <typename T>
const T* RowAt(const uint8_t* row, int64_t c0) { return reinterpret_cast<const T*>(row) + c0; }

// Keys [j0, j0 + width) (width <= kF32PanelColumns), dims [0, hd) from column c0 of each key row, into a
// panel: dim e of key j0 + j at panel[e * kF32PanelColumns + j]. Whole 4 x 4 squares go through SSE registers.
template <typename T>
void TransposeKeysOf(const KvSource& kv, int64_t c0, int64_t j0, int64_t width, int64_t hd, float* panel) {
  int64_t jb = 0;
  for (; jb + 4 <= width; jb += 4) {
    const T* k0 = RowAt<T>(kv.key(j0 + jb), c0);
    const T* k1 = RowAt<T>(kv.key(j0 + jb + 1), c0);
    const T* k2 = RowAt<T>(kv.key(j0 + jb + 2), c0);
    const T* k3 = RowAt<T>(kv.key(j0 + jb + 3), c0);
    int64_t e = 0;
    for (; e + 4 <= hd; e += 4) {
      __m128 r0 = Load4(k0, e), r1 = Load4(k1, e), r2 = Load4(k2, e), r3 = Load4(k3, e);
      _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
      _mm_storeu_ps(panel + e * kF32PanelColumns + jb, r0);
      _mm_storeu_ps(panel + (e + 1) * kF32PanelColumns + jb, r1);
      _mm_storeu_ps(panel + (e + 2) * kF32PanelColumns + jb, r2);
      _mm_storeu_ps(panel + (e + 3) * kF32PanelColumns + jb, r3);
    }
    for (; e < hd; ++e) {
      panel[e * kF32PanelColumns + jb] = ValueAt(k0, e);
      panel[e * kF32PanelColumns + jb + 1] = ValueAt(k1, e);
      panel[e * kF32PanelColumns + jb + 2] = ValueAt(k2, e);
      panel[e * kF32PanelColumns + jb + 3] = ValueAt(k3, e);
    }
  }
  for (; jb < width; ++jb) {
    const T* key = RowAt<T>(kv.key(j0 + jb), c0);
    for (int64_t e = 0; e < hd; ++e) panel[e * kF32PanelColumns + jb] = ValueAt(key, e);
  }
}

// Every e4m3 code's exact value.
const float* Fp8Values() {
  static const auto table = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[static_cast<size_t>(c)] = Fp8E4m3ToFloat(static_cast<uint8_t>(c));
    return t;
  }();
  return table.data();
}

// Columns [c0, c0 + n) of a K/V row into out, as fp32.
void WidenValues(const KvSource& kv, const uint8_t* row, int64_t c0, int64_t n, float* out) {
  if (kv.dtype == KvDtype::kF32) {
    std::copy_n(RowAt<float>(row, c0), n, out);
  } else if (kv.dtype == KvDtype::kBf16) {
    const uint16_t* from = RowAt<uint16_t>(row, c0);
    int64_t e = 0;
    for (; e + 4 <= n; e += 4) _mm_storeu_ps(out + e, Load4(from, e));
    for (; e < n; ++e) out[e] = Bf16ToFloat(from[e]);
  } else {
    const float* values = Fp8Values();
    for (int64_t e = 0; e < n;) {  // a block's factor at a time
      const int64_t block_end = std::min(n, (c0 + e) / kKvFp8Block * kKvFp8Block + kKvFp8Block - c0);
      const float scale = kv.fp8_scale(row, c0 + e);
      for (; e < block_end; ++e) out[e] = values[row[c0 + e]] * scale;
    }
  }
}

void TransposeKeys(const KvSource& kv, int64_t c0, int64_t j0, int64_t width, int64_t hd, float* panel) {
  if (kv.dtype == KvDtype::kBf16) return TransposeKeysOf<uint16_t>(kv, c0, j0, width, hd, panel);
  if (kv.dtype == KvDtype::kF32) return TransposeKeysOf<float>(kv, c0, j0, width, hd, panel);
  thread_local std::vector<float> widened_buf;  // fp8 keys widened first, then transposed as fp32 rows
  float* widened = Sized(widened_buf, width * hd);
  for (int64_t j = 0; j < width; ++j) WidenValues(kv, kv.key(j0 + j), c0, hd, widened + j * hd);
  TransposeKeysOf<float>(KvSource(widened, widened, hd), 0, 0, width, hd, panel);
}

// Query rows stacked per block: stacked row i = r * group + g is query row r of head g of the group.
// Every stacked row's bits depend only on its own query, its position and the keys it sees.
// every_key > 0: each row sees keys 0..every_key - 1 (no mask) instead of the causal ones.
void AttendBlock(const Fp32Kernels& kernels, const AttentionShape& shape, const float* q, int64_t q_stride,
                 int64_t q_head_stride, int64_t t0, int64_t m, int64_t pos0, int64_t kvh, const KvSource& kv,
                 float* out, int64_t out_stride, int64_t every_key = 0) {
  const int64_t group = shape.num_heads / shape.num_kv_heads;
  const int64_t hd = shape.head_dim;
  const bool causal = every_key <= 0;
  const int64_t first = pos0 + t0;    // position of the block's first row
  const int64_t len = causal ? first + m : every_key;  // keys the last row sees
  const int64_t stacked = group * m;
  const int64_t ld = SpreadStride(len);  // row stride of the scores
  thread_local std::vector<float> qs_buf, scores_buf, os_buf;
  float* qs = Sized(qs_buf, stacked * hd);
  float* os = Sized(os_buf, stacked * hd);
  float* scores = Sized(scores_buf, stacked * ld);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t g = 0; g < group; ++g)
      std::copy_n(q + (t0 + r) * q_stride + (kvh * group + g) * q_head_stride, hd, qs + (r * group + g) * hd);
  // Keys go in blocks that stay in cache. Query row r sees keys 0..first + r: in a block [l0, l1)
  // the rows from full_row on see every key, the rows from band_row to full_row some of them.
  const auto rows_of = [&](int64_t l0, int64_t l1) {
    if (!causal) return std::pair<int64_t, int64_t>{0, 0};
    const int64_t band_row = std::clamp<int64_t>(l0 - first, 0, m), full_row = std::clamp<int64_t>(l1 - 1 - first, 0, m);
    return std::pair<int64_t, int64_t>{band_row, full_row};
  };
  // The block's keys transposed and its values, both in panels of 32 columns (see RowsTimesArgs).
  const int64_t key_panels = (kAttentionKeyBlock + kF32PanelColumns - 1) / kF32PanelColumns;
  const int64_t value_panels = (hd + kF32PanelColumns - 1) / kF32PanelColumns;
  thread_local std::vector<float> kt_buf, vp_buf;
  float* kt = Sized(kt_buf, key_panels * hd * kF32PanelColumns);
  float* vp = Sized(vp_buf, value_panels * kAttentionKeyBlock * kF32PanelColumns);
  for (int64_t l0 = 0; l0 < len; l0 += kAttentionKeyBlock) {
    const int64_t l1 = std::min(len, l0 + kAttentionKeyBlock);
    const auto [band_row, full_row] = rows_of(l0, l1);
    for (int64_t j0 = l0; j0 < l1; j0 += kF32PanelColumns) {
      float* panel = kt + ((j0 - l0) / kF32PanelColumns) * hd * kF32PanelColumns;
      const int64_t width = std::min(kF32PanelColumns, l1 - j0);
      TransposeKeys(kv, kvh * hd, j0, width, hd, panel);
    }
    const auto score = [&](int64_t i, int64_t rows, int64_t keys) {
      RowsTimes(kernels, qs + i * hd, hd, rows, kt, kF32PanelColumns, hd * kF32PanelColumns, hd, keys,
                   scores + i * ld + l0, ld, false);
    };
    if (full_row < m) score(full_row * group, stacked - full_row * group, l1 - l0);
    for (int64_t r = band_row; r < full_row; ++r) score(r * group, group, first + r + 1 - l0);
  }
  for (int64_t i = 0; i < stacked; ++i) {
    float* row = scores + i * ld;
    const int64_t valid = causal ? first + i / group + 1 : len;
    for (int64_t l = 0; l < valid; ++l) row[l] *= shape.scale;
    SoftmaxPrefix(row, valid);
  }
  // Values, block by block: each row's sum goes on from its partial sums, keys in index order.
  for (int64_t l0 = 0; l0 < len; l0 += kAttentionKeyBlock) {
    const int64_t l1 = std::min(len, l0 + kAttentionKeyBlock);
    const auto [band_row, full_row] = rows_of(l0, l1);
    // Many rows read each value row many times: the rows are copied into panels (a sequential read, then the tile
    // reads consecutive lines). One query row's heads read them once, in place, where the block has one source.
    const bool in_place = m == 1 && kv.dtype == KvDtype::kF32 && (l1 <= kv.split || l0 >= kv.split);
    const float* values_at = in_place ? RowAt<float>(kv.value(l0), kvh * hd) : vp;
    const int64_t values_stride = in_place ? kv.stride : kF32PanelColumns;
    const int64_t values_panel_stride = in_place ? 0 : kAttentionKeyBlock * kF32PanelColumns;
    for (int64_t l = l0; l < l1 && !in_place; ++l) {
      const uint8_t* value = kv.value(l);
      for (int64_t c0 = 0; c0 < hd; c0 += kF32PanelColumns)
        WidenValues(kv, value, kvh * hd + c0, std::min(kF32PanelColumns, hd - c0),
                   vp + (c0 / kF32PanelColumns) * kAttentionKeyBlock * kF32PanelColumns + (l - l0) * kF32PanelColumns);
    }
    const auto values = [&](int64_t i, int64_t rows, int64_t keys) {
      RowsTimes(kernels, scores + i * ld + l0, ld, rows, values_at, values_stride, values_panel_stride, keys, hd,
                os + i * hd, hd, l0 > 0);
    };
    if (full_row < m) values(full_row * group, stacked - full_row * group, l1 - l0);
    for (int64_t r = band_row; r < full_row; ++r) values(r * group, group, first + r + 1 - l0);
  }
  for (int64_t r = 0; r < m; ++r)
    for (int64_t g = 0; g < group; ++g)
      std::copy_n(os + (r * group + g) * hd, hd, out + (t0 + r) * out_stride + (kvh * group + g) * hd);
}

}  // namespace

float KvSource::ValueAt(const uint8_t* row, int64_t column) const {
  float value;
  WidenValues(*this, row, column, 1, &value);
  return value;
}

int KvFp8Exponent(float amax) {
  uint32_t bits;
  std::memcpy(&bits, &amax, sizeof bits);
  bits &= 0x7fffffffu;
  if (bits >= 0x7f800000u) return 119;
  const int field = static_cast<int>(bits >> 23);
  if (field == 0) return -100;
  // amax = 1.m x 2^(field - 127) and 448 = 1.75 x 2^8.
  const int e = field - 127 - 8 + ((bits & 0x7fffffu) > 0x600000u ? 1 : 0);
  return std::clamp(e, -100, 119);
}

void StoreKvRows(const float* values, int64_t rows, int64_t width, KvDtype dtype, uint8_t* out) {
  const int64_t n = rows * width;
  if (dtype == KvDtype::kF32) {
    std::memcpy(out, values, static_cast<size_t>(n) * sizeof(float));
  } else if (dtype == KvDtype::kBf16) {
    uint16_t* to = reinterpret_cast<uint16_t*>(out);
    for (int64_t i = 0; i < n; ++i) to[i] = FloatToBf16(values[i]);
  } else {
    const int64_t row_bytes = KvRowBytes(dtype, width);
    for (int64_t r = 0; r < rows; ++r) {
      const float* from = values + r * width;
      uint8_t* row = out + r * row_bytes;
      for (int64_t b = 0; b < width / kKvFp8Block; ++b) {
        const float* block = from + b * kKvFp8Block;
        float amax = 0.0f;
        for (int64_t i = 0; i < kKvFp8Block; ++i) amax = std::fabs(block[i]) > amax ? std::fabs(block[i]) : amax;
        const int e = KvFp8Exponent(amax);
        const float inverse = KvFp8Scale(static_cast<uint8_t>(127 - e));
        for (int64_t i = 0; i < kKvFp8Block; ++i) row[b * kKvFp8Block + i] = FloatToFp8E4m3(block[i] * inverse);
        row[width + b] = static_cast<uint8_t>(127 + e);
      }
    }
  }
}

void AttentionPrefill(ThreadPool& pool, const AttentionShape& shape, const float* q, int64_t q_stride,
                      int64_t q_head_stride, int64_t rows, int64_t pos0, const KvSource& kv, float* out, int64_t out_stride) {
  const Fp32Kernels& kernels = Fp32KernelsOf(ActivePath());
  const int64_t blocks = (rows + kAttentionQueryBlock - 1) / kAttentionQueryBlock;
  pool.Run(static_cast<size_t>(shape.num_kv_heads * blocks), [&](size_t task) {
    const int64_t kvh = static_cast<int64_t>(task) / blocks;
    const int64_t t0 = static_cast<int64_t>(task) % blocks * kAttentionQueryBlock;
    AttendBlock(kernels, shape, q, q_stride, q_head_stride, t0, std::min(rows, t0 + kAttentionQueryBlock) - t0, pos0, kvh, kv, out,
                out_stride);
  });
}

void AttentionBidirectional(ThreadPool& pool, const AttentionShape& shape, const float* q, int64_t q_stride, int64_t q_head_stride,
                            int64_t rows, int64_t keys, const KvSource& kv, float* out, int64_t out_stride) {
  const Fp32Kernels& kernels = Fp32KernelsOf(ActivePath());
  const int64_t blocks = (rows + kAttentionQueryBlock - 1) / kAttentionQueryBlock;
  pool.Run(static_cast<size_t>(shape.num_kv_heads * blocks), [&](size_t task) {
    const int64_t kvh = static_cast<int64_t>(task) / blocks;
    const int64_t t0 = static_cast<int64_t>(task) % blocks * kAttentionQueryBlock;
    AttendBlock(kernels, shape, q, q_stride, q_head_stride, t0, std::min(rows, t0 + kAttentionQueryBlock) - t0, 0, kvh, kv, out,
                out_stride, keys);
  });
}

void AttentionDecode(ThreadPool& pool, const AttentionShape& shape, const float* q, int64_t q_head_stride,
                     int64_t length, const KvSource& kv, float* out) {
  const Fp32Kernels& kernels = Fp32KernelsOf(ActivePath());
  if (!kernels.decode_scores) return AttentionPrefill(pool, shape, q, 0, q_head_stride, 1, length - 1, kv, out, 0);
  const int64_t group = shape.num_heads / shape.num_kv_heads, hd = shape.head_dim;
  const int64_t ld = (length + 15) / 16 * 16;
  thread_local std::vector<float> scores_buf;
  thread_local std::vector<uint8_t> zero_row;
  float* scores = Sized(scores_buf, shape.num_heads * ld);
  if (static_cast<int64_t>(zero_row.size()) < kv.row_bytes()) zero_row.assign(static_cast<size_t>(kv.row_bytes()), 0);
  const uint8_t* zeros = zero_row.data();  // the tasks run on other threads, each with thread_locals of its own
  // Three passes, each spread over the pool: scores by spans of keys, the softmax by head, the values by columns.
  const int64_t spans = (length + kDecodeKeySpan - 1) / kDecodeKeySpan;
  pool.Run(static_cast<size_t>(shape.num_kv_heads * spans), [&](size_t task) {
    const int64_t kvh = static_cast<int64_t>(task) / spans, j0 = static_cast<int64_t>(task) % spans * kDecodeKeySpan;
    const DecodeScoresArgs a{.q = q + kvh * group * q_head_stride, .q_head_stride = q_head_stride, .heads = group, .head_dim = hd,
                             .kv = &kv, .column = kvh * hd, .j0 = j0, .j1 = std::min(length, j0 + kDecodeKeySpan),
                             .zero_row = zeros, .scores = scores + kvh * group * ld, .ld = ld};
    kernels.decode_scores(a);
    for (int64_t g = 0; g < group; ++g)
      for (int64_t l = a.j0; l < a.j1; ++l) a.scores[g * ld + l] *= shape.scale;
  });
  pool.Run(static_cast<size_t>(shape.num_heads), [&](size_t h) { SoftmaxPrefix(scores + static_cast<int64_t>(h) * ld, length); });
  // Columns split only as far as the pool needs tasks: a task reads its kv head's rows in wider pieces.
  const int64_t tasks_a_head = (pool.size() + shape.num_kv_heads - 1) / shape.num_kv_heads;
  const int64_t columns_a_task = (hd + tasks_a_head - 1) / tasks_a_head;
  const int64_t span_columns = (columns_a_task + kDecodeMinColumns - 1) / kDecodeMinColumns * kDecodeMinColumns;
  const int64_t column_spans = (hd + span_columns - 1) / span_columns;
  pool.Run(static_cast<size_t>(shape.num_kv_heads * column_spans), [&](size_t task) {
    const int64_t kvh = static_cast<int64_t>(task) / column_spans, span = static_cast<int64_t>(task) % column_spans;
    const int64_t c0 = span * span_columns;
    kernels.decode_values({.p = scores + kvh * group * ld, .ld = ld, .heads = group, .length = length, .kv = &kv, .column = kvh * hd,
                           .c0 = c0, .c1 = std::min(hd, c0 + span_columns), .out = out + kvh * group * hd, .out_head_stride = hd});
  });
}

}  // namespace anchorage::cpu
