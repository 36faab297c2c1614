// What the Journal screen's charts plot: each request row's time, TTFT and re-read tokens by its
// cache source, and the share of requests per source.
#pragma once

#include <QList>
#include <QMap>
#include <QString>

#include "app/snapshots.h"

struct RequestPoint {
  qint64 timeMs = 0;
  double ttftMs = 0;
  qint64 rereadTokens = 0;
  QString source;  // the row's cache_source ("cold", "end", ...); "unknown" when it has none
};

// The request rows among rows (any order), oldest first; cache events and shadow rows are skipped.
QList<RequestPoint> RequestPoints(const QList<JournalRowSnapshot>& rows);
// Requests per source.
QMap<QString, int> SourceShares(const QList<RequestPoint>& points);
