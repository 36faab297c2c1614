// The gated delta rule of one value head in fp32: the chunked form for prefill, the recurrence for decode.
#pragma once

#include <cstdint>

namespace anchorage::cpu {

// Chunk length of the chunked form; chunks start at absolute positions that are multiples of it.
inline constexpr int64_t kDeltaChunkTokens = 64;

// Inputs of n tokens of one value head. Row i of q/k/v starts at q + i*q_stride (etc.);
// q is L2-normalised and scaled by 1/sqrt(dk), k is L2-normalised, beta in (0,1), g < 0.
struct DeltaInputs {
  const float* q = nullptr;  // fp32 [n, dk]
  const float* k = nullptr;  // fp32 [n, dk]
  const float* v = nullptr;  // fp32 [n, dv]
  int64_t q_stride = 0, k_stride = 0, v_stride = 0;
  const float* beta = nullptr;  // fp32 [n], stride beta_stride
  const float* g = nullptr;     // fp32 [n], stride g_stride
  int64_t beta_stride = 1, g_stride = 1;
};

// Runs one chunk of n <= kDeltaChunkTokens tokens: updates state fp32 [dk, dv] in place and writes
// n output rows (fp32 [n, dv], row stride out_stride). Uses only the calling thread.
void GatedDeltaChunk(const DeltaInputs& in, int64_t n, int64_t dk, int64_t dv, float* state, float* out,
                     int64_t out_stride);

// Runs n tokens one at a time with the recurrence (decay, predict, write, read).
void GatedDeltaRecurrent(const DeltaInputs& in, int64_t n, int64_t dk, int64_t dv, float* state, float* out,
                         int64_t out_stride);

}  // namespace anchorage::cpu
