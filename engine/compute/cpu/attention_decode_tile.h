// Decode attention's two products on a path's vectors (instantiated in that path's file): key rows are read in
// place, kLanes at a time, transposed in registers (bf16 and fp8 widened exactly as loaded), so one vector holds one dim of kLanes
// keys; every score and output value is the same fma chain RowsTimes runs, so decode keeps prefill's bits.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "engine/compute/cpu/fp32_block.h"
#include "engine/core/bf16.h"

namespace anchorage::cpu {
namespace {

// Heads of a group that share one pass over the keys (their sums stay in registers).
inline constexpr int kDecodeHeadsAPass = 8;

// kLanes values of the row starting at row, from `column` on (within one fp8 block: kLanes divides it).
template <class D>
typename D::F LoadKvLanes(const KvSource& kv, const uint8_t* row, int64_t column) {
  if (kv.dtype == KvDtype::kFp8) return D::LoadFp8Kv(row + column, kv.fp8_scale(row, column));
  return D::LoadKv(row + kv.offset(column), kv.dtype);
}

template <class D, int G>
void DecodeScoresOfHeads(const DecodeScoresArgs& a, int64_t h0) {
  using F = typename D::F;
  constexpr int L = D::kLanes;
  const KvSource& kv = *a.kv;
  const int64_t hd = a.head_dim, hd_main = hd / L * L;
  const float* q = a.q + h0 * a.q_head_stride;
  for (int64_t j0 = a.j0; j0 < a.j1; j0 += L) {
    const int n = static_cast<int>(a.j1 - j0 < L ? a.j1 - j0 : L);
    const uint8_t* rows[L];  // where each row starts
    for (int i = 0; i < L; ++i) rows[i] = i < n ? kv.key(j0 + i) : a.zero_row;
    F acc[G];
    for (int h = 0; h < G; ++h) acc[h] = D::Zero();
    const int64_t ahead = j0 + 2 * L < a.j1 ? j0 + 2 * L : -1;  // the block after next, fetched while this one is summed
    for (int64_t e0 = 0; e0 < hd_main; e0 += L) {
      F t[L];
      if (ahead >= 0 && kv.offset(e0) % 64 == 0)
        for (int i = 0; i < L && ahead + i < a.j1; ++i) __builtin_prefetch(kv.key(ahead + i) + kv.offset(a.column + e0));
      for (int i = 0; i < L; ++i) t[i] = LoadKvLanes<D>(kv, rows[i], a.column + e0);
      D::Transpose(t);
      for (int e = 0; e < L; ++e)
        for (int h = 0; h < G; ++h) acc[h] = D::Fma(D::Broadcast(q[h * a.q_head_stride + e0 + e]), t[e], acc[h]);
    }
    for (int h = 0; h < G; ++h) {
      float sums[L];
      D::Store(sums, acc[h]);
      float* out = a.scores + (h0 + h) * a.ld + j0;
      for (int i = 0; i < n; ++i) {
        float s = sums[i];
        for (int64_t e = hd_main; e < hd; ++e) s = std::fma(q[h * a.q_head_stride + e], kv.ValueAt(rows[i], a.column + e), s);
        out[i] = s;
      }
    }
  }
}

// Keys a values pass reads before it moves to the next columns: their rows stay in cache meanwhile.
inline constexpr int64_t kDecodeValuesKeyBlock = 64;

// Output columns [c, c + CV*kLanes) of G heads over keys [j0, j1), from 0 at j0 == 0 or on from the partial sums in out.
template <class D, int G, int CV>
void DecodeValuesOfColumns(const DecodeValuesArgs& a, int64_t h0, int64_t c, int64_t j0, int64_t j1) {
  using F = typename D::F;
  constexpr int L = D::kLanes;
  const KvSource& kv = *a.kv;
  float* out = a.out + h0 * a.out_head_stride + c;
  F acc[G][CV];
  for (int h = 0; h < G; ++h)
    for (int v = 0; v < CV; ++v) acc[h][v] = j0 == 0 ? D::Zero() : D::LoadKv(reinterpret_cast<const uint8_t*>(out + h * a.out_head_stride + v * L), KvDtype::kF32);
  const float* p = a.p + h0 * a.ld;
  for (int64_t j = j0; j < j1; ++j) {
    const uint8_t* row = kv.value(j);
    if (j + kDecodeValuesKeyBlock < a.length)  // the same columns of the next block's rows
      for (int64_t at = 0; at < kv.offset(CV * L); at += 64) __builtin_prefetch(kv.value(j + kDecodeValuesKeyBlock) + kv.offset(a.column + c) + at);
    F x[CV];
    for (int v = 0; v < CV; ++v) x[v] = LoadKvLanes<D>(kv, row, a.column + c + v * L);
    for (int h = 0; h < G; ++h) {
      const F w = D::Broadcast(p[h * a.ld + j]);
      for (int v = 0; v < CV; ++v) acc[h][v] = D::Fma(w, x[v], acc[h][v]);
    }
  }
  for (int h = 0; h < G; ++h)
    for (int v = 0; v < CV; ++v) D::Store(out + h * a.out_head_stride + v * L, acc[h][v]);
}

template <class D, int G>
void DecodeValuesOfHeads(const DecodeValuesArgs& a, int64_t h0) {
  constexpr int L = D::kLanes;
  constexpr int kWide = G <= 2 ? 8 : G <= 4 ? 4 : 2;  // G * kWide sums in registers
  const int64_t main_end = a.c0 + (a.c1 - a.c0) / L * L;
  const KvSource& kv = *a.kv;
  for (int64_t j0 = 0; j0 < a.length; j0 += kDecodeValuesKeyBlock) {
    const int64_t j1 = j0 + kDecodeValuesKeyBlock < a.length ? j0 + kDecodeValuesKeyBlock : a.length;
    int64_t c = a.c0;
    for (; c + kWide * L <= main_end; c += kWide * L) DecodeValuesOfColumns<D, G, kWide>(a, h0, c, j0, j1);
    for (; c < main_end; c += L) DecodeValuesOfColumns<D, G, 1>(a, h0, c, j0, j1);
    for (; c < a.c1; ++c)
      for (int h = 0; h < G; ++h) {
        float& out = a.out[(h0 + h) * a.out_head_stride + c];
        float s = j0 == 0 ? 0.0f : out;
        for (int64_t j = j0; j < j1; ++j)
          s = std::fma(a.p[(h0 + h) * a.ld + j], kv.ValueAt(kv.value(j), a.column + c), s);
        out = s;
      }
  }
}

// Calls Of<D, G>(args, h0) for the heads in passes of at most kDecodeHeadsAPass, G a constant.
template <template <class, int> class Of, class D, class Args, int G = kDecodeHeadsAPass>
void ForHeadPasses(const Args& a, int64_t h0, int64_t heads) {
  if constexpr (G >= 1) {
    for (; heads - h0 >= G; h0 += G) Of<D, G>::Run(a, h0);
    ForHeadPasses<Of, D, Args, G - 1>(a, h0, heads);
  }
}

template <class D, int G>
struct ScoresPass {
  static void Run(const DecodeScoresArgs& a, int64_t h0) { DecodeScoresOfHeads<D, G>(a, h0); }
};
template <class D, int G>
struct ValuesPass {
  static void Run(const DecodeValuesArgs& a, int64_t h0) { DecodeValuesOfHeads<D, G>(a, h0); }
};

template <class D>
void RunDecodeScores(const DecodeScoresArgs& a) { ForHeadPasses<ScoresPass, D>(a, 0, a.heads); }
template <class D>
void RunDecodeValues(const DecodeValuesArgs& a) { ForHeadPasses<ValuesPass, D>(a, 0, a.heads); }

}  // namespace
}  // namespace anchorage::cpu
