#include "engine/server/draft_policy.h"

#include <algorithm>

namespace anchorage {

void RowCostModel::Record(int64_t rows, double ms) {
  const double x = static_cast<double>(rows);
  n_ = n_ * kDecay + 1.0;
  sx_ = sx_ * kDecay + x;
  sy_ = sy_ * kDecay + ms;
  sxx_ = sxx_ * kDecay + x * x;
  sxy_ = sxy_ * kDecay + x * ms;
  const double spread = n_ * sxx_ - sx_ * sx_;  // n^2 times the variance of the row counts
  if (n_ < 4.0 || spread < 0.25 * n_ * n_) return;
  per_row_ms_ = std::max(0.0, (n_ * sxy_ - sx_ * sy_) / spread);
  fixed_ms_ = std::max(0.0, (sy_ - per_row_ms_ * sx_) / n_);
  fitted_ = true;
}

bool RowCostModel::Fit(double* fixed_ms, double* per_row_ms) const {
  *fixed_ms = fixed_ms_;
  *per_row_ms = per_row_ms_;
  return fitted_;
}

double RowCostModel::BreakEven(int64_t decoding_rows) const {
  double a = 0, b = 0;
  if (!Fit(&a, &b)) return 1.0;
  const double r = static_cast<double>(std::max<int64_t>(1, decoding_rows));
  return a + b * r > 0 ? std::min(1.0, r * b / (a + b * r)) : 1.0;
}

}  // namespace anchorage
