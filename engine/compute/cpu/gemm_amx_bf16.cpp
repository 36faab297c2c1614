// The AMX-BF16 GEMM path: the activations' bf16 parts (bf16_split.h) are split straight into A tiles; a
// super-panel's 32 columns, interleaved into k-pair rows once a block (bf16_lanes.h), are two B tiles;
// two row tiles by the two column tiles sum in four C tiles over the whole k, one TDPBF16PS a part and
// 32 k. Up to two rows (decode) run the same arithmetic in AVX-512F (FewRows), so each output gets
// kBf16Amx's bits whatever the row count.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cassert>
#include <vector>

#include "engine/compute/cpu/bf16_split.h"
#include "engine/compute/cpu/gemm_block.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,amx-tile,amx-bf16")

#include "engine/compute/cpu/bf16_lanes.h"

namespace anchorage::cpu {
namespace {

constexpr int kTileRows = 16;
constexpr int64_t kChunkPairs = kAmxChunk / 2;  // k pairs one TDPBF16PS reads
constexpr int64_t kTileWords = kTileRows * 16;  // 32-bit words of one tile (16 rows of 64 bytes)

// Tile registers (the intrinsics take them as literals): C of row tile 0's lo and hi columns 0 and 1,
// of row tile 1's 2 and 3; A of row tiles 0 and 1 4 and 5; B of the lo and hi columns 6 and 7.
enum : int { kC00 = 0, kC01 = 1, kC10 = 2, kC11 = 3, kA0 = 4, kA1 = 5, kBLo = 6, kBHi = 7 };

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_a_row[16] = {};
  uint8_t rows[16] = {};
};

// Row tile 0 has rows0 rows, row tile 1 rows1 (0: unused).
void Configure(int rows0, int rows1) {
  TileConfig c;
  const auto set = [&](int tile, int rows) {
    c.rows[tile] = static_cast<uint8_t>(rows);
    c.bytes_a_row[tile] = rows > 0 ? 64 : 0;
  };
  for (int t : {kC00, kC01, kA0}) set(t, rows0);
  for (int t : {kC10, kC11, kA1}) set(t, rows1);
  for (int t : {kBLo, kBHi}) set(t, kTileRows);
  _tile_loadconfig(&c);
}

// B tiles of chunk `chunk` of a super-panel whose k rows start at w (k_len of them): the lo tile then
// the hi tile, row i holding the k pair chunk * 16 + i; pairs past k_len are 0.
void InterleaveChunk(const uint16_t* w, int64_t k_len, int64_t chunk, uint32_t* out) {
  for (int64_t i = 0; i < kChunkPairs; ++i) {
    const int64_t even_k = 2 * (chunk * kChunkPairs + i);
    const __m512i even = even_k < k_len ? _mm512_loadu_si512(w + even_k * kPanelColumns) : _mm512_setzero_si512();
    const __m512i odd = even_k + 1 < k_len ? _mm512_loadu_si512(w + (even_k + 1) * kPanelColumns) : _mm512_setzero_si512();
    __m512i lo, hi;
    InterleavePairs(even, odd, lo, hi);
    _mm512_storeu_si512(out + i * 16, lo);
    _mm512_storeu_si512(out + kTileWords + i * 16, hi);
  }
}

// Up to two row tiles of the block, against one super-panel.
struct RowPair {
  const uint32_t* a;     // row tile 0's A tiles (SplitRowsAmxBf16's layout)
  int64_t second_tile;   // words from row tile 0's A tiles to row tile 1's
  int rows0, rows1;
};

// The C tiles' rows to and from y in column order, through a scratch of 4 tiles.
template <bool kTwo>
void LoadC(float* const y, int64_t ldy, int cols, const RowPair& rp, float* scratch) {
  for (int tile = 0; tile < (kTwo ? 2 : 1); ++tile) {
    const int rows = tile == 0 ? rp.rows0 : rp.rows1;
    for (int r = 0; r < rows; ++r) {
      __m512 lo, hi;
      LoadOut(y + (tile * kTileRows + r) * ldy, cols, lo, hi);
      _mm512_store_ps(scratch + (2 * tile) * kTileWords + r * 16, lo);
      _mm512_store_ps(scratch + (2 * tile + 1) * kTileWords + r * 16, hi);
    }
  }
  _tile_loadd(0, scratch, 64);
  _tile_loadd(1, scratch + kTileWords, 64);
  if constexpr (kTwo) {
    _tile_loadd(2, scratch + 2 * kTileWords, 64);
    _tile_loadd(3, scratch + 3 * kTileWords, 64);
  }
}

template <bool kTwo>
void StoreC(float* const y, int64_t ldy, int cols, const RowPair& rp, float* scratch) {
  _tile_stored(0, scratch, 64);
  _tile_stored(1, scratch + kTileWords, 64);
  if constexpr (kTwo) {
    _tile_stored(2, scratch + 2 * kTileWords, 64);
    _tile_stored(3, scratch + 3 * kTileWords, 64);
  }
  for (int tile = 0; tile < (kTwo ? 2 : 1); ++tile) {
    const int rows = tile == 0 ? rp.rows0 : rp.rows1;
    for (int r = 0; r < rows; ++r)
      StoreOut(y + (tile * kTileRows + r) * ldy, cols, _mm512_load_ps(scratch + (2 * tile) * kTileWords + r * 16),
               _mm512_load_ps(scratch + (2 * tile + 1) * kTileWords + r * 16));
  }
}

// Chunks [0, chunks) of the whole k for one row pair; b_tiles holds the interleaved chunks below
// `ready`, and the rest are interleaved from w one chunk ahead of their use.
template <bool kTwo>
void RowPairTimesPanel(const RowPair& rp, const uint16_t* w, int64_t k, int64_t chunks, uint32_t* b_tiles, int64_t& ready,
                       float* y, int64_t ldy, int cols, bool accumulate, float* scratch, int parts) {
  if (accumulate) {
    LoadC<kTwo>(y, ldy, cols, rp, scratch);
  } else {
    _tile_zero(0);
    _tile_zero(1);
    if constexpr (kTwo) {
      _tile_zero(2);
      _tile_zero(3);
    }
  }
  if (ready == 0 && chunks > 0) InterleaveChunk(w, k, ready++, b_tiles);
  for (int64_t c = 0; c < chunks; ++c) {
    const uint32_t* b = b_tiles + c * 2 * kTileWords;
    _tile_loadd(6, b, 64);
    _tile_loadd(7, b + kTileWords, 64);
    for (int p = 0; p < parts; ++p) {
      const uint32_t* a = rp.a + (c * kBf16Parts + p) * kTileWords;
      _tile_loadd(4, a, 64);
      if constexpr (kTwo) _tile_loadd(5, a + rp.second_tile, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      if constexpr (kTwo) {
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
    }
    // The next chunk is interleaved while this one's tiles compute, so its stores have landed when it is loaded.
    if (c + 1 < chunks && c + 1 >= ready) InterleaveChunk(w, k, ready++, b_tiles + (c + 1) * 2 * kTileWords);
  }
  StoreC<kTwo>(y, ldy, cols, rp, scratch);
}

// Up to kFewRows rows (decode) in AVX-512F with the same arithmetic: a tile's time is the same for one
// row as for 16, so decode sums each chunk's even and odd products in fused multiply-adds instead,
// with MXCSR's flush-to-zero and denormals-are-zero as TDPBF16PS has them. The k rows are widened
// into Avx512Lanes' lo and hi, as on the avx512f path.
// R rows by S super-panels over chunks [0, chunks) and parts [0, P); x[r]: row r's first A tile row (SplitRowsAmxBf16's layout).
template <int R, int S, int P>
void FewRows(const uint32_t* const* x, const uint16_t* const* w, float* const* y, const int* cols, int64_t ldy, int64_t k,
             bool accumulate) {
  __m512 acc[R][S][2];
  for (int r = 0; r < R; ++r)
    for (int s = 0; s < S; ++s) {
      if (accumulate) {
        Avx512Lanes::LoadOut(y[s] + r * ldy, cols[s], acc[r][s][0], acc[r][s][1]);
      } else {
        acc[r][s][0] = acc[r][s][1] = _mm512_setzero_ps();
      }
    }
  const int64_t pairs = PairCount(k);
  for (int64_t c = 0; c * kChunkPairs < pairs; ++c) {
    __m512 even[R][S][P][2], odd[R][S][P][2];
    for (int r = 0; r < R; ++r)
      for (int s = 0; s < S; ++s)
        for (int p = 0; p < P; ++p)
          for (int h = 0; h < 2; ++h) even[r][s][p][h] = odd[r][s][p][h] = _mm512_setzero_ps();
    const int64_t last = std::min(pairs, (c + 1) * kChunkPairs);
    for (int64_t t = c * kChunkPairs; t < last; ++t) {
      __m512 we[S][2], wo[S][2];
      for (int s = 0; s < S; ++s) {
        Avx512Lanes::LoadW(w[s] + 2 * t * kPanelColumns, we[s][0], we[s][1]);
        if (2 * t + 1 < k) {
          Avx512Lanes::LoadW(w[s] + (2 * t + 1) * kPanelColumns, wo[s][0], wo[s][1]);
        } else {
          wo[s][0] = wo[s][1] = _mm512_setzero_ps();
        }
      }
      for (int r = 0; r < R; ++r)
        for (int p = 0; p < P; ++p) {
          const uint32_t word = x[r][(c * kBf16Parts + p) * kTileWords + t % kChunkPairs];
          const __m512 xe = _mm512_set1_ps(std::bit_cast<float>(word << 16));
          const __m512 xo = _mm512_set1_ps(std::bit_cast<float>(word & 0xffff0000u));
          for (int s = 0; s < S; ++s)
            for (int h = 0; h < 2; ++h) {
              even[r][s][p][h] = _mm512_fmadd_ps(xe, we[s][h], even[r][s][p][h]);
              odd[r][s][p][h] = _mm512_fmadd_ps(xo, wo[s][h], odd[r][s][p][h]);
            }
        }
    }
    for (int r = 0; r < R; ++r)
      for (int s = 0; s < S; ++s)
        for (int p = 0; p < P; ++p)
          for (int h = 0; h < 2; ++h)
            acc[r][s][h] = _mm512_add_ps(acc[r][s][h], _mm512_add_ps(even[r][s][p][h], odd[r][s][p][h]));
  }
  for (int r = 0; r < R; ++r)
    for (int s = 0; s < S; ++s) Avx512Lanes::StoreOut(y[s] + r * ldy, cols[s], acc[r][s][0], acc[r][s][1]);
}

template <int P>
void RunFewRows(const GemmBlock& b) {
  constexpr unsigned kFlushToZero = 0x8000, kDenormalsAreZero = 0x40;
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | kFlushToZero | kDenormalsAreZero);
  const uint32_t* x[2] = {b.x_pairs, b.x_pairs + 16};
  for (int64_t p = 0; p < b.panel_count;) {
    const int64_t first = p * kPanelColumns;
    const uint16_t* w[2] = {b.panels + p * b.k * kPanelColumns, b.panels + (p + 1) * b.k * kPanelColumns};
    float* y[2] = {b.y + first, b.y + first + kPanelColumns};
    const int cols[2] = {static_cast<int>(std::min<int64_t>(kPanelColumns, b.cols - first)),
                         static_cast<int>(std::min<int64_t>(kPanelColumns, b.cols - first - kPanelColumns))};
    if (b.rows == 2) {
      FewRows<2, 1, P>(x, w, y, cols, b.ldy, b.k, b.accumulate);
      p += 1;
    } else if (p + 1 < b.panel_count) {
      FewRows<1, 2, P>(x, w, y, cols, b.ldy, b.k, b.accumulate);
      p += 2;
    } else {
      FewRows<1, 1, P>(x, w, y, cols, b.ldy, b.k, b.accumulate);
      p += 1;
    }
  }
  _mm_setcsr(saved);
}

void Run(const GemmBlock& b) {
  assert(b.k0 == 0 && b.k1 == b.k);  // the A tiles hold the whole k
  if (b.rows <= kFewRows) return b.parts == 1 ? RunFewRows<1>(b) : RunFewRows<kBf16Parts>(b);
  const int64_t chunks = (b.k + kAmxChunk - 1) / kAmxChunk;
  thread_local std::vector<uint32_t> b_tiles;
  b_tiles.resize(static_cast<size_t>(chunks * 2 * kTileWords));
  alignas(64) float scratch[4 * kTileWords];
  const int64_t row_words = kBf16Parts * b.pair_stride;
  int configured0 = -1, configured1 = -1;
  for (int64_t p = 0; p < b.panel_count; ++p) {
    const uint16_t* w = b.panels + p * b.k * kPanelColumns;
    float* y = b.y + p * kPanelColumns;
    const int cols = static_cast<int>(b.cols - p * kPanelColumns < kPanelColumns ? b.cols - p * kPanelColumns : kPanelColumns);
    int64_t ready = 0;
    for (int64_t r0 = 0; r0 < b.rows; r0 += 2 * kTileRows) {
      RowPair rp;
      rp.a = b.x_pairs + r0 * row_words;
      rp.second_tile = kTileRows * row_words;
      rp.rows0 = static_cast<int>(std::min<int64_t>(kTileRows, b.rows - r0));
      rp.rows1 = static_cast<int>(std::clamp<int64_t>(b.rows - r0 - kTileRows, 0, kTileRows));
      if (rp.rows0 != configured0 || rp.rows1 != configured1) {
        Configure(rp.rows0, rp.rows1);
        configured0 = rp.rows0;
        configured1 = rp.rows1;
      }
      float* yr = y + r0 * b.ldy;
      if (rp.rows1 > 0) {
        RowPairTimesPanel<true>(rp, w, b.k, chunks, b_tiles.data(), ready, yr, b.ldy, cols, b.accumulate, scratch, b.parts);
      } else {
        RowPairTimesPanel<false>(rp, w, b.k, chunks, b_tiles.data(), ready, yr, b.ldy, cols, b.accumulate, scratch, b.parts);
      }
    }
  }
  _tile_release();
}

void Split(const float* x, int64_t ldx, int64_t rows, int64_t k, int64_t pair_stride, uint32_t* out, int parts) {
  const int64_t chunks = pair_stride / kChunkPairs;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * ldx;
    uint32_t* tile_row = out + (r / kTileRows) * kTileRows * kBf16Parts * pair_stride + (r % kTileRows) * 16;
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t k0 = c * kAmxChunk;
      const __m512 first16 = _mm512_maskz_loadu_ps(Mask(static_cast<int>(std::clamp<int64_t>(k - k0, 0, 16))), row + std::min(k0, k));
      const __m512 next16 =
          _mm512_maskz_loadu_ps(Mask(static_cast<int>(std::clamp<int64_t>(k - k0 - 16, 0, 16))), row + std::min(k0 + 16, k));
      SplitSixteenPairs(first16, next16, tile_row + c * kBf16Parts * kTileWords, kTileWords, parts);
    }
  }
}

}  // namespace

#pragma GCC pop_options

void GemmBlockAmxBf16(const GemmBlock& b) { Run(b); }
void SplitRowsAmxBf16(const float* x, int64_t ldx, int64_t rows, int64_t k, int64_t pair_stride, uint32_t* out, int parts) {
  Split(x, ldx, rows, k, pair_stride, out, parts);
}

}  // namespace anchorage::cpu
