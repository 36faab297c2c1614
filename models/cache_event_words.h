// A cache event as an operator reads it: what happened in a word or two, and why in a sentence,
// from the kind and the engine's raw reason (which the screens keep in a tooltip).
#pragma once

#include <QString>

struct CacheEventWords {
  QString what;  // "written", "restored", "not restored", ...
  QString why;   // the reason in words; the raw reason where no wording is known
};

CacheEventWords DescribeCacheEvent(const QString& kind, const QString& reason);
