// Causal attention of query rows over cached K/V rows (fp32, or bf16 and fp8 widened exactly as read; GQA), softmax in fp32. A row's bits
// depend only on its query, its position and its keys: not on the block, the call or decode vs prefill.
#pragma once

#include <cstdint>

#include "engine/core/kv_dtype.h"
#include "engine/core/thread_pool.h"

namespace anchorage::cpu {

// Query rows per prefill attention task, and keys a block of the task's loops.
inline constexpr int64_t kAttentionQueryBlock = 64;
inline constexpr int64_t kAttentionKeyBlock = 128;

struct AttentionShape {
  int64_t num_heads = 0;     // Nh
  int64_t num_kv_heads = 0;  // Nkv; query head h reads kv head h / (Nh / Nkv)
  int64_t head_dim = 0;
  float scale = 0.0f;        // score multiplier, 1/sqrt(head_dim)
};

// Where key and value row j live (`stride` values a row, of dtype, kv head at kv_head*head_dim): rows
// below split at k and v, the rows from split on at k_tail and v_tail (their row 0 is row split). A
// branch of a batch reads its prefix's rows from the prefix and its own from its scratch.
struct KvSource {
  const uint8_t* k = nullptr;
  const uint8_t* v = nullptr;
  int64_t stride = 0;
  int64_t split = INT64_MAX;
  const uint8_t* k_tail = nullptr;
  const uint8_t* v_tail = nullptr;
  KvDtype dtype = KvDtype::kF32;

  KvSource() = default;
  KvSource(KvDtype dtype, const uint8_t* k, const uint8_t* v, int64_t stride, int64_t split = INT64_MAX, const uint8_t* k_tail = nullptr,
           const uint8_t* v_tail = nullptr)
      : k(k), v(v), stride(stride), split(split), k_tail(k_tail), v_tail(v_tail), dtype(dtype) {}
  KvSource(const float* k, const float* v, int64_t stride, int64_t split = INT64_MAX, const float* k_tail = nullptr, const float* v_tail = nullptr)
      : KvSource(KvDtype::kF32, Bytes(k), Bytes(v), stride, split, Bytes(k_tail), Bytes(v_tail)) {}

  int64_t row_bytes() const { return KvRowBytes(dtype, stride); }
  // Where value `column` of a row starts, from the row's start.
  int64_t offset(int64_t column) const { return column * KvDtypeBytes(dtype); }
  // The factor of the fp8 block that holds `column` of the row starting at row.
  float fp8_scale(const uint8_t* row, int64_t column) const { return KvFp8Scale(row[stride + column / kKvFp8Block]); }
  // Value `column` of the row starting at row, as fp32 (exact).
  float ValueAt(const uint8_t* row, int64_t column) const;
  const uint8_t* key(int64_t j) const { return j < split ? k + j * row_bytes() : k_tail + (j - split) * row_bytes(); }
  const uint8_t* value(int64_t j) const { return j < split ? v + j * row_bytes() : v_tail + (j - split) * row_bytes(); }

 private:
  static const uint8_t* Bytes(const float* p) { return reinterpret_cast<const uint8_t*>(p); }
};

// Stores rows of width fp32 values as K/V rows of dtype, KvRowBytes(dtype, width) bytes each: bf16 rounded to
// nearest even; fp8 a block's scale the least power of two that brings its largest magnitude to 448 or below
// (KvFp8Exponent), then each value over it rounded to the nearest e4m3 (ties to even).
void StoreKvRows(const float* values, int64_t rows, int64_t width, KvDtype dtype, uint8_t* out);
// The scale exponent of an fp8 block whose largest magnitude is amax (NaN ignored): the least e with
// amax x 2^-e <= 448, kept within [-100, 119] so that every factor and widened value is a normal float.
int KvFp8Exponent(float amax);

// Query row t (position pos0 + t) of head h is at q + t*q_stride + h*q_head_stride; it attends to
// key rows 0..pos0+t of kv. Writes out fp32 [T, Nh*head_dim] (row stride out_stride). Tasks are
// (kv head, block of query rows). Where the rows live does not change the bits.
void AttentionPrefill(ThreadPool& pool, const AttentionShape& shape, const float* q, int64_t q_stride,
                      int64_t q_head_stride, int64_t rows, int64_t pos0, const KvSource& kv, float* out, int64_t out_stride);

// Every query row attends to key rows 0..keys-1 with no mask (a vision tower's attention); otherwise as AttentionPrefill.
void AttentionBidirectional(ThreadPool& pool, const AttentionShape& shape, const float* q, int64_t q_stride, int64_t q_head_stride,
                            int64_t rows, int64_t keys, const KvSource& kv, float* out, int64_t out_stride);
// One query row per head attending to key rows 0..length-1; tasks are kv heads.
void AttentionDecode(ThreadPool& pool, const AttentionShape& shape, const float* q, int64_t q_head_stride,
                     int64_t length, const KvSource& kv, float* out);

}  // namespace anchorage::cpu
