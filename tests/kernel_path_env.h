// For test runs registered once a kernel path (ANCHORAGE_KERNEL=<path>): skips the whole run, saying
// so, on a CPU that lacks the path, instead of running the fallback path under that name.
#pragma once

#include <QtTest>

#include <cstdlib>

#include "engine/compute/cpu/matmul.h"

#define ANCHORAGE_SKIP_UNLESS_KERNEL_PATH_RUNS()                                                              \
  do {                                                                                                        \
    const char* wanted = std::getenv("ANCHORAGE_KERNEL");                                                     \
    if (wanted != nullptr && *wanted != '\0') {                                                               \
      auto path = anchorage::cpu::PathFromName(wanted);                                                       \
      QVERIFY2(path.ok(), wanted);                                                                            \
      if (!anchorage::cpu::PathAvailable(*path)) QSKIP(qPrintable(QString("this CPU cannot run the %1 kernels").arg(wanted))); \
      QCOMPARE(anchorage::cpu::ActivePath(), *path);                                                          \
    }                                                                                                         \
  } while (false)
