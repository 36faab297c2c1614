// Steps the console's tests share.
#pragma once

#include <QDoubleSpinBox>
#include <QPushButton>
#include <QTabWidget>
#include <QtTest>

#include <algorithm>
#include <cmath>

#include "app/main_window.h"
#include "models/settings_model.h"
#include "widgets/memory_screen.h"

// Sets memory.ceiling_gb on the Memory screen half a GiB under its whole part, applies it and waits
// for the next settings version; *wanted is the value set. Callers check QTest::currentTestFailed().
inline void applyCeilingEdit(MainWindow& window, double* wanted) {
  MemoryScreen* memory = window.memoryScreen();
  window.tabs()->setCurrentWidget(memory);
  SettingsModel* settings = window.settingsModel();
  const qint64 version = settings->version();
  QDoubleSpinBox* ceiling = memory->limitEditor("memory.ceiling_gb");
  QVERIFY(ceiling && ceiling->isEnabled());
  *wanted = std::max(0.5, std::floor(ceiling->value()) - 0.5);
  ceiling->setValue(*wanted);
  QTest::mouseClick(memory->findChild<QPushButton*>("applyLimitsButton"), Qt::LeftButton);
  QTRY_COMPARE_WITH_TIMEOUT(settings->version(), version + 1, 10000);
  QCOMPARE(settings->value("memory.ceiling_gb").toDouble(), *wanted);
}
