// The portable GEMM path, and the 16-lane kernel's arithmetic emulated for tests: arrays of lanes,
// one std::fma each.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/compute/cpu/attention_decode_tile.h"
#include "engine/compute/cpu/bf16_split.h"
#include "engine/compute/cpu/fp32_tile.h"
#include "engine/compute/cpu/gemm_int8_tile.h"
#include "engine/compute/cpu/gemm_tile.h"
#include "engine/core/bf16.h"
#include "engine/core/fp8.h"

namespace anchorage::cpu {
namespace {

// A vector pair of L lanes over 2L slots: word i (slots 2i, 2i + 1) gives lane i of lo and of hi.
template <int L, int RowTile, int FewRowsSegments>
struct LaneArrays {
  static constexpr int kLanes = L;
  static constexpr int kRowTile = RowTile;
  static constexpr int kFewRowsSegments = FewRowsSegments;
  struct F {
    float v[L];
  };
  // Slot 2i of the segment is column LoColumn(i), slot 2i + 1 is HiColumn(i) (see PackedBf16).
  static int LoColumn(int i) { return (i / 8) * 16 + i % 8; }
  static int HiColumn(int i) { return (i / 8) * 16 + 8 + i % 8; }
  static F Zero() { return F{}; }
  static F Broadcast(float s) {
    F f;
    for (int l = 0; l < L; ++l) f.v[l] = s;
    return f;
  }
  static F Fma(const F& a, const F& b, F c) {
    for (int l = 0; l < L; ++l) c.v[l] = std::fma(a.v[l], b.v[l], c.v[l]);
    return c;
  }
  static F Mul(const F& a, F b) {
    for (int l = 0; l < L; ++l) b.v[l] *= a.v[l];
    return b;
  }
  // The e4m3 codes' exact values, in PackedQ8's order: a segment's lo lanes are its bytes 0.., its hi lanes bytes 16..
  static constexpr float kFp8CodeFactor = 1.0f;
  static void LoadFp8(const uint8_t* p, F& lo, F& hi) {
    for (int i = 0; i < L; ++i) {
      lo.v[i] = Fp8E4m3ToFloat(p[i]);
      hi.v[i] = Fp8E4m3ToFloat(p[16 + i]);
    }
  }
  static void LoadW(const uint16_t* p, F& lo, F& hi) {
    for (int i = 0; i < L; ++i) {
      lo.v[i] = Bf16ToFloat(p[2 * i]);
      hi.v[i] = Bf16ToFloat(p[2 * i + 1]);
    }
  }
  static void LoadOut(const float* y, int cols, F& lo, F& hi) {
    for (int i = 0; i < L; ++i) {
      lo.v[i] = LoColumn(i) < cols ? y[LoColumn(i)] : 0.0f;
      hi.v[i] = HiColumn(i) < cols ? y[HiColumn(i)] : 0.0f;
    }
  }
  static void StoreOut(float* y, int cols, const F& lo, const F& hi) {
    for (int i = 0; i < L; ++i) {
      if (LoColumn(i) < cols) y[LoColumn(i)] = lo.v[i];
      if (HiColumn(i) < cols) y[HiColumn(i)] = hi.v[i];
    }
  }
  // fp32 rows in natural order: lo is columns 0..L-1, hi columns L..2L-1.
  static void LoadF(const float* p, int cols, F& lo, F& hi) {
    for (int i = 0; i < L; ++i) {
      lo.v[i] = i < cols ? p[i] : 0.0f;
      hi.v[i] = L + i < cols ? p[L + i] : 0.0f;
    }
  }
  static void LoadFullF(const float* p, F& lo, F& hi) { LoadF(p, 2 * L, lo, hi); }
  static void StoreF(float* p, int cols, const F& lo, const F& hi) {
    for (int i = 0; i < L && i < cols; ++i) p[i] = lo.v[i];
    for (int i = 0; i < L && L + i < cols; ++i) p[L + i] = hi.v[i];
  }
};

using Portable = LaneArrays<8, 4, 2>;

// The int8 tile's arithmetic in plain integers: L output columns, each lane one column's int32 dot, in tiles of
// the given shapes (Int8Emulated16 takes the AVX-512 kernel's, so its group offsets are checked on any CPU); the
// fp32 operations are LaneArrays'.
template <int L, int OneRowGroups, int TwoRowsGroups, int RowTile, int ManyRowsGroups>
struct Int8LaneArrays : LaneArrays<L, RowTile, 1> {
  using F = typename LaneArrays<L, RowTile, 1>::F;
  static constexpr int kCols = L;
  static constexpr int kOneRowGroups = OneRowGroups;
  static constexpr int kTwoRowsGroups = TwoRowsGroups;
  static constexpr int kRowTile = RowTile;
  static constexpr int kManyRowsGroups = ManyRowsGroups;
  struct I {
    int32_t v[L];
  };
  struct Codes {
    int8_t v[2 * L];
  };
  static I ZeroI() { return I{}; }
  static Codes LoadCodes(const uint8_t* p) {
    Codes c;
    std::memcpy(c.v, p, sizeof c.v);
    return c;
  }
  static I Dot(I acc, const Codes& w, int32_t pair) {
    const int32_t first = static_cast<int16_t>(pair & 0xffff), second = static_cast<int16_t>(static_cast<uint32_t>(pair) >> 16);
    for (int c = 0; c < L; ++c) acc.v[c] += first * w.v[2 * c] + second * w.v[2 * c + 1];
    return acc;
  }
  static F ToFloat(const I& d) {
    F f;
    for (int c = 0; c < L; ++c) f.v[c] = static_cast<float>(d.v[c]);
    return f;
  }
  static F LoadScales(const float* p) {
    F f;
    std::memcpy(f.v, p, sizeof f.v);
    return f;
  }
  static F LoadOut(const float* y, int cols) {
    F f{};
    std::memcpy(f.v, y, static_cast<size_t>(cols) * sizeof(float));
    return f;
  }
  static void StoreOut(float* y, int cols, const F& f) { std::memcpy(y, f.v, static_cast<size_t>(cols) * sizeof(float)); }
};

using PortableInt8 = Int8LaneArrays<8, 2, 2, 2, 2>;
using Int8Emulated16 = Int8LaneArrays<16, 8, 4, 6, 2>;
using Emulated16 = LaneArrays<16, 12, 4>;

// The bf16 path's arithmetic one output at a time: pairs of k in order, each part used in order, DotPair each.
void RunEmulatedBf16(const GemmBlock& b) {
  for (int64_t c = 0; c < b.cols; ++c) {
    const uint16_t* column = b.panels + (c / kPanelColumns) * b.k * kPanelColumns + PackedBf16::SlotOf(c % kPanelColumns);
    for (int64_t r = 0; r < b.rows; ++r) {
      float acc = b.accumulate ? b.y[r * b.ldy + c] : 0.0f;
      for (int64_t i = b.k0; i < b.k1; i += 2) {
        const uint32_t w_pair = column[i * kPanelColumns] | (i + 1 < b.k ? uint32_t{column[(i + 1) * kPanelColumns]} << 16 : 0u);
        for (int p = 0; p < b.parts; ++p)
          acc = DotPair(acc, b.x_pairs[(r * kBf16Parts + p) * b.pair_stride + i / 2], w_pair);
      }
      b.y[r * b.ldy + c] = acc;
    }
  }
}

// The AMX path's arithmetic one output at a time: chunks of 32 k from k = 0, each part's even and
// odd sums apart (AmxStep), then added (AmxAdd).
void RunEmulatedAmx(const GemmBlock& b) {
  for (int64_t c = 0; c < b.cols; ++c) {
    const uint16_t* column = b.panels + (c / kPanelColumns) * b.k * kPanelColumns + PackedBf16::SlotOf(c % kPanelColumns);
    for (int64_t r = 0; r < b.rows; ++r) {
      float acc = b.accumulate ? b.y[r * b.ldy + c] : 0.0f;
      for (int64_t i0 = b.k0; i0 < b.k1; i0 += kAmxChunk) {
        const int64_t i1 = std::min(b.k1, i0 + kAmxChunk);
        for (int p = 0; p < b.parts; ++p) {
          AmxSums sums;
          for (int64_t i = i0; i < i1; i += 2) {
            const uint32_t w_pair = column[i * kPanelColumns] | (i + 1 < b.k ? uint32_t{column[(i + 1) * kPanelColumns]} << 16 : 0u);
            AmxStep(sums, b.x_pairs[(r * kBf16Parts + p) * b.pair_stride + i / 2], w_pair);
          }
          acc = AmxAdd(acc, sums);
        }
      }
      b.y[r * b.ldy + c] = acc;
    }
  }
}

// The vector paths' decode kernels on L lanes of arrays: the same chains, a transpose by index.
template <int L>
struct LaneArraysDecode : LaneArrays<L, 1, 1> {
  using F = typename LaneArrays<L, 1, 1>::F;
  static void Store(float* p, const F& v) { std::memcpy(p, v.v, sizeof(v.v)); }
  static F LoadKv(const uint8_t* p, KvDtype dtype) {
    F f;
    if (dtype == KvDtype::kBf16)
      for (int l = 0; l < L; ++l) f.v[l] = Bf16ToFloat(static_cast<uint16_t>(p[2 * l] | p[2 * l + 1] << 8));
    else
      std::memcpy(f.v, p, sizeof(f.v));
    return f;
  }
  static F LoadFp8Kv(const uint8_t* codes, float scale) {
    F f;
    for (int l = 0; l < L; ++l) f.v[l] = Fp8E4m3ToFloat(codes[l]) * scale;
    return f;
  }
  static void Transpose(F (&r)[L]) {
    F t[L];
    for (int i = 0; i < L; ++i)
      for (int c = 0; c < L; ++c) t[c].v[i] = r[i].v[c];
    for (int i = 0; i < L; ++i) r[i] = t[i];
  }
};

}  // namespace

void GemmBlockPortable(const GemmBlock& b) { RunGemmBlock<Portable>(b); }
void GemmBlockEmulated16(const GemmBlock& b) { RunGemmBlock<Emulated16>(b); }
void GemmBlockEmulatedBf16(const GemmBlock& b) { RunEmulatedBf16(b); }
void GemmBlockEmulatedAmx(const GemmBlock& b) { RunEmulatedAmx(b); }

const Fp32Kernels kFp32Portable{RunRowsTimes<Portable>};
const Q8Kernels kQ8Portable{RunGemmBlock<Portable, Fp8Weights>, RunInt8Block<PortableInt8>};
const Q8Kernels kQ8Emulated16{RunGemmBlock<Emulated16, Fp8Weights>, RunInt8Block<Int8Emulated16>};
const Fp32Kernels kFp32Emulated16{RunRowsTimes<Emulated16>, RunDecodeScores<LaneArraysDecode<16>>, RunDecodeValues<LaneArraysDecode<16>>};

}  // namespace anchorage::cpu
