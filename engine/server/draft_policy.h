// When a slot's draft window pays beside other slots' rows: a forward of R rows costs about a + b R
// (fitted to the engine's own recent steps), so k window rows of which a fraction p is accepted add
// p k tokens for b k more time, and raise the step's tokens per second only where p > R b / (a + b R).
// Where extra rows are nearly free (a GPU, a CPU whose step is bound by reading the weights) the
// break-even is near 0; where the products are bound by the FMA rate it is high.
#pragma once

#include <cstdint>

namespace anchorage {

class RowCostModel {
 public:
  // A forward of rows rows (decodes and window rows together) took ms.
  void Record(int64_t rows, double ms);
  // The acceptance a window beside others' rows must beat to pay, for a step of decoding_rows rows;
  // 1 (never) until the steps seen have fitted a line (they need rows of at least two counts).
  double BreakEven(int64_t decoding_rows) const;
  // The newest fitted cost: ms = fixed_ms + per_row_ms x rows (kept while later steps, all of one row
  // count, fit no line); false before there is one.
  bool Fit(double* fixed_ms, double* per_row_ms) const;

 private:
  static constexpr double kDecay = 0.98;  // each step's weight in the sums fades by this a step
  double n_ = 0, sx_ = 0, sy_ = 0, sxx_ = 0, sxy_ = 0;
  bool fitted_ = false;
  double fixed_ms_ = 0, per_row_ms_ = 0;
};

}  // namespace anchorage
