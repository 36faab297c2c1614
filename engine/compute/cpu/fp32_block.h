// What the fp32 attention product of a path is called with, and the paths' entry points.
#pragma once

#include <cstdint>

namespace anchorage::cpu {

// Columns of a b panel: with b_panel_stride > 0, columns [32p, 32p + 32) of b are a [k, 32] block
// (row stride ldb) at b + p * b_panel_stride; consecutive rows then sit in consecutive lines.
inline constexpr int64_t kF32PanelColumns = 32;

// y [rows, cols] (row stride ldy) = (or +=) a [rows, k] (row stride lda) · b [k, cols] (row stride ldb).
struct RowsTimesArgs {
  const float* a = nullptr;
  int64_t lda = 0, rows = 0;
  const float* b = nullptr;
  int64_t ldb = 0, k = 0, cols = 0;
  int64_t b_panel_stride = 0;
  float* y = nullptr;
  int64_t ldy = 0;
  bool accumulate = false;
};

// A row stride of at least n floats whose rows start an odd number of cache lines apart, so rows
// a tile reads together fall in different L1 sets.
inline int64_t SpreadStride(int64_t n) {
  const int64_t lines = (n + 15) / 16;
  return (lines % 2 == 0 ? lines + 1 : lines) * 16;
}

struct Fp32Kernels {
  void (*rows_times)(const RowsTimesArgs&);
};

// y [rows, cols] (=|+=) a [rows, k] · b [k, cols] (row stride ldb; in 32-column panels when panel_stride > 0).
inline void RowsTimes(const Fp32Kernels& kernels, const float* a, int64_t lda, int64_t rows, const float* b, int64_t ldb,
                      int64_t panel_stride, int64_t k, int64_t cols, float* y, int64_t ldy, bool accumulate) {
  RowsTimesArgs p;
  p.a = a;
  p.lda = lda;
  p.rows = rows;
  p.b = b;
  p.ldb = ldb;
  p.k = k;
  p.cols = cols;
  p.b_panel_stride = panel_stride;
  p.y = y;
  p.ldy = ldy;
  p.accumulate = accumulate;
  kernels.rows_times(p);
}

extern const Fp32Kernels kFp32Portable, kFp32Emulated16, kFp32Avx2, kFp32Avx512;

}  // namespace anchorage::cpu
