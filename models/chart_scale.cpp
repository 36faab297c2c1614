#include "models/chart_scale.h"

#include <algorithm>
#include <cmath>

ChartScale RoundScale(double lo, double hi, int maxTicks) {
  if (hi < lo) std::swap(lo, hi);
  maxTicks = std::max(1, maxTicks);
  const double span = hi > lo ? hi - lo : std::max(1.0, std::abs(hi));
  const double raw = span / maxTicks;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  double step = 10 * power;
  for (const double m : {1.0, 2.0, 2.5, 5.0})
    if (m * power >= raw * (1 - 1e-9)) {
      step = m * power;
      break;
    }
  ChartScale s;
  s.step = step;
  s.min = std::floor(lo / step + 1e-9) * step;
  s.max = std::ceil(hi / step - 1e-9) * step;
  if (s.max <= s.min) s.max = s.min + step;
  // 2.5 x 10^k needs one decimal more than the power itself.
  const int powerDecimals = std::max(0, -static_cast<int>(std::floor(std::log10(step) + 1e-9)));
  const double scaled = step * std::pow(10.0, powerDecimals);
  s.decimals = powerDecimals + (std::abs(scaled - std::round(scaled)) > 1e-6 ? 1 : 0);
  return s;
}

bool SpansDecades(double lo, double hi) { return lo > 0 && hi / lo >= 100; }
