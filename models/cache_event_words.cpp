#include "models/cache_event_words.h"

#include <QHash>
#include <QObject>
#include <QRegularExpression>

CacheEventWords DescribeCacheEvent(const QString& kind, const QString& reason) {
  static const QHash<QString, const char*> kWhat = {
      {"write", "written"},     {"hit", "restored"},       {"drop", "not written"}, {"failed_restore", "not restored"},
      {"refused", "not used"},  {"eviction", "evicted"},   {"expired", "expired"},  {"clear", "cleared"},
      {"shed", "shed"},         {"swept", "swept"},
  };
  // The spill's refusals name their cause as why=...; the rest of the note is figures.
  static const QHash<QString, const char*> kRefusal = {
      {"end_no_align", "the copy did not reach the saved end, and the prompt could not be aligned to it"},
      {"anchors_below", "its saved anchors sit below what memory already serves"},
      {"slow", "reading it back would take longer than prefilling what it serves"},
      {"short", "it serves too few tokens beyond what memory holds to be worth reading"},
  };
  CacheEventWords w;
  w.what = kWhat.contains(kind) ? QObject::tr(kWhat.value(kind)) : kind;
  w.why = reason;
  const QRegularExpressionMatch cause = QRegularExpression("\\bwhy=(\\w+)").match(reason);
  if (kind == "refused" && cause.hasMatch() && kRefusal.contains(cause.captured(1))) {
    w.what = QObject::tr("not restored");
    w.why = QObject::tr(kRefusal.value(cause.captured(1)));
  }
  return w;
}
