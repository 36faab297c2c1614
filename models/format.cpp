#include "models/format.h"

#include <QDateTime>

namespace fmt {

QString bytes(qint64 bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (std::abs(v) >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  if (u == 0) return QString("%1 B").arg(bytes);
  return QString("%1 %2").arg(v, 0, 'f', v < 10 ? 2 : 1).arg(units[u]);
}

QString timeOfDay(qint64 epochMs) { return QDateTime::fromMSecsSinceEpoch(epochMs).toString("HH:mm:ss.zzz"); }

QString dateAndTime(qint64 epochMs, bool milliseconds) {
  return QDateTime::fromMSecsSinceEpoch(epochMs).toString(milliseconds ? "yyyy-MM-dd HH:mm:ss.zzz" : "yyyy-MM-dd HH:mm:ss");
}

}  // namespace fmt
