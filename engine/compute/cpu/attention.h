// Causal attention of query rows over cached fp32 K/V rows (GQA), softmax in fp32. A row's bits
// depend only on its query, its position and its keys: not on the block, the call or decode vs prefill.
#pragma once

#include <cstdint>

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

// Where key and value row j live (row stride `stride`, kv head at kv_head*head_dim): rows below
// split at k and v, the rows from split on at k_tail and v_tail (their row 0 is row split). A branch
// of a batch reads its prefix's rows from the prefix and its own from its scratch.
struct KvSource {
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t stride = 0;
  int64_t split = INT64_MAX;
  const float* k_tail = nullptr;
  const float* v_tail = nullptr;

  const float* key(int64_t j) const { return j < split ? k + j * stride : k_tail + (j - split) * stride; }
  const float* value(int64_t j) const { return j < split ? v + j * stride : v_tail + (j - split) * stride; }
};

// Query row t (position pos0 + t) of head h is at q + t*q_stride + h*q_head_stride; it attends to
// key rows 0..pos0+t of kv. Writes out fp32 [T, Nh*head_dim] (row stride out_stride). Tasks are
// (kv head, block of query rows). Where the rows live does not change the bits.
void AttentionPrefill(ThreadPool& pool, const AttentionShape& shape, const float* q, int64_t q_stride,
                      int64_t q_head_stride, int64_t rows, int64_t pos0, const KvSource& kv, float* out, int64_t out_stride);

// One query row per head attending to key rows 0..length-1; tasks are kv heads.
void AttentionDecode(ThreadPool& pool, const AttentionShape& shape, const float* q, int64_t q_head_stride,
                     int64_t length, const KvSource& kv, float* out);

}  // namespace anchorage::cpu
