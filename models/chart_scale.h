// Axes a person reads at a glance: round ticks (1, 2, 2.5 or 5 times a power of ten) and, where
// values span decades, a log scale.
#pragma once

#include <QString>

struct ChartScale {
  double min = 0, max = 1;  // the axis' range, on ticks
  double step = 0.2;        // between ticks
  int decimals = 1;         // the labels' decimals: enough to tell ticks apart, no more
  // The label format for QValueAxis ("%.1f").
  QString labelFormat() const { return QString("%.%1f").arg(decimals); }
};

// The range from lo to hi (lo <= hi) on round ticks, at most maxTicks intervals; an empty range
// grows to one step around its value.
ChartScale RoundScale(double lo, double hi, int maxTicks = 5);
// Whether positive values from lo to hi span at least two decades (a log axis reads them better).
bool SpansDecades(double lo, double hi);
