// The bf16 dot-product arithmetic: each fp32 activation split into bf16 parts, two k at a time in one
// 32-bit word, multiplied against bf16 weights the way VDPBF16PS does (see DotPair).
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace anchorage::cpu {

// Parts an activation is split into: the first rounds x to bf16, each next one rounds what is left.
inline constexpr int kBf16Parts = 3;

// Round to nearest even, on the bits; a subnormal result becomes +0 (the instruction reads those as 0).
inline uint32_t RoundToBf16Bits(uint32_t bits) {
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
  return (rounded & 0x7f800000u) == 0 ? 0u : rounded;
}

// parts[p] = the p-th bf16 part of x (high 16 bits of each word set, low bits 0).
inline void SplitToBf16Parts(float x, uint32_t (&parts)[kBf16Parts]) {
  float rest = x;
  for (int p = 0; p < kBf16Parts; ++p) {
    parts[p] = RoundToBf16Bits(std::bit_cast<uint32_t>(rest));
    rest = rest - std::bit_cast<float>(parts[p]);
  }
}

// Split rows of x [rows, k] (row stride ldx) into words: row r's part p is the words at
// out + (r * kBf16Parts + p) * pair_stride; word t < PairCount(k) holds x[2t] in its low half and
// x[2t + 1] (or 0) in its high, and the words from PairCount(k) to pair_stride are 0. The splits write
// parts [0, parts) and leave the others' words as they were (fast precision reads part 0 alone).
inline int64_t PairCount(int64_t k) { return (k + 1) / 2; }

// Pairs [first, pair_stride) of one row (row_out: that row's part 0).
inline void SplitPairsPortable(const float* row, int64_t k, int64_t first, int64_t pair_stride, uint32_t* row_out, int parts) {
  const int64_t pairs = PairCount(k);
  for (int64_t t = first; t < pairs; ++t) {
    uint32_t even[kBf16Parts], odd[kBf16Parts] = {};
    SplitToBf16Parts(row[2 * t], even);
    if (2 * t + 1 < k) SplitToBf16Parts(row[2 * t + 1], odd);
    for (int p = 0; p < parts; ++p) row_out[p * pair_stride + t] = (even[p] >> 16) | odd[p];
  }
  for (int p = 0; p < parts; ++p)
    for (int64_t t = std::max(first, pairs); t < pair_stride; ++t) row_out[p * pair_stride + t] = 0;
}

inline void SplitRowsPortable(const float* x, int64_t ldx, int64_t rows, int64_t k, int64_t pair_stride, uint32_t* out, int parts) {
  for (int64_t r = 0; r < rows; ++r) SplitPairsPortable(x + r * ldx, k, 0, pair_stride, out + r * kBf16Parts * pair_stride, parts);
}

// x == 0 for subnormals, as the instruction reads its inputs and writes its results.
inline float FlushSubnormal(float v) { return std::fpclassify(v) == FP_SUBNORMAL ? std::copysign(0.0f, v) : v; }

// The low (h = 0) or high (h = 1) bf16 of a word as fp32, a subnormal read as 0.
inline float HalfOf(uint32_t word, int h) { return FlushSubnormal(std::bit_cast<float>(h ? word & 0xffff0000u : word << 16)); }

// VDPBF16PS on one lane: the odd halves' product added first, then the even halves', each sum rounded
// to fp32 once (fused: a product too small for fp32 still gives the sum its sign).
inline float DotPair(float acc, uint32_t x_pair, uint32_t w_pair) {
  acc = FlushSubnormal(acc);
  acc = FlushSubnormal(std::fma(HalfOf(x_pair, 1), HalfOf(w_pair, 1), acc));
  return FlushSubnormal(std::fma(HalfOf(x_pair, 0), HalfOf(w_pair, 0), acc));
}

// The AMX arithmetic (TDPBF16PS): per 32 k from k = 0 and per part, the even halves' products and the
// odd halves' are summed apart from 0, then their sum is added to the output; every sum rounded to fp32.
inline constexpr int64_t kAmxChunk = 32;

struct AmxSums {
  float even = 0.0f, odd = 0.0f;
};

inline void AmxStep(AmxSums& sums, uint32_t x_pair, uint32_t w_pair) {
  sums.even = FlushSubnormal(std::fma(HalfOf(x_pair, 0), HalfOf(w_pair, 0), sums.even));
  sums.odd = FlushSubnormal(std::fma(HalfOf(x_pair, 1), HalfOf(w_pair, 1), sums.odd));
}

inline float AmxAdd(float acc, const AmxSums& sums) { return FlushSubnormal(FlushSubnormal(acc) + FlushSubnormal(sums.even + sums.odd)); }

}  // namespace anchorage::cpu
