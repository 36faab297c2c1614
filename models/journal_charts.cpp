#include "models/journal_charts.h"

#include <QJsonDocument>
#include <QJsonObject>

#include <algorithm>

QList<RequestPoint> RequestPoints(const QList<JournalRowSnapshot>& rows) {
  QList<RequestPoint> points;
  for (const JournalRowSnapshot& r : rows) {
    if (r.type != "request") continue;
    const QJsonObject o = QJsonDocument::fromJson(r.json).object();
    RequestPoint p;
    p.timeMs = r.timeMs;
    p.ttftMs = o.value("ttft_ms").toDouble();
    p.rereadTokens = o.value("reread_tokens").toInteger();
    p.source = o.value("cache_source").toString();
    if (p.source.isEmpty()) p.source = "unknown";
    points.append(p);
  }
  std::stable_sort(points.begin(), points.end(), [](const RequestPoint& a, const RequestPoint& b) { return a.timeMs < b.timeMs; });
  return points;
}

QMap<QString, int> SourceShares(const QList<RequestPoint>& points) {
  QMap<QString, int> shares;
  for (const RequestPoint& p : points) ++shares[p.source];
  return shares;
}
