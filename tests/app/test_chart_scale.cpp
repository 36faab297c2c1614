// RoundScale: ranges on round ticks (1, 2, 2.5, 5 times a power of ten) with labels that tell the
// ticks apart; SpansDecades: when a log axis reads better.
#include <QtTest>

#include "models/chart_scale.h"

class TestChartScale : public QObject {
  Q_OBJECT

 private slots:
  void roundTicks_data() {
    QTest::addColumn<double>("lo");
    QTest::addColumn<double>("hi");
    QTest::addColumn<double>("min");
    QTest::addColumn<double>("max");
    QTest::addColumn<double>("step");
    QTest::addColumn<int>("decimals");
    QTest::newRow("TTFT of a millisecond") << 0.0 << 1.3 << 0.0 << 1.5 << 0.5 << 1;
    QTest::newRow("re-read tokens") << 0.0 << 31.0 << 0.0 << 40.0 << 10.0 << 0;
    QTest::newRow("seconds") << 0.0 << 4200.0 << 0.0 << 5000.0 << 1000.0 << 0;
    QTest::newRow("a rate") << 0.0 << 1.0 << 0.0 << 1.0 << 0.2 << 1;
    QTest::newRow("2.5 needs a decimal more") << 0.0 << 0.11 << 0.0 << 0.125 << 0.025 << 3;
    QTest::newRow("one value") << 3.0 << 3.0 << 3.0 << 4.0 << 1.0 << 0;
    QTest::newRow("minutes") << 0.0 << 11.0 << 0.0 << 12.5 << 2.5 << 1;
  }
  void roundTicks() {
    QFETCH(double, lo);
    QFETCH(double, hi);
    QFETCH(double, min);
    QFETCH(double, max);
    QFETCH(double, step);
    QFETCH(int, decimals);
    const ChartScale s = RoundScale(lo, hi, 5);
    QCOMPARE(s.min, min);
    QCOMPARE(s.max, max);
    QCOMPARE(s.step, step);
    QCOMPARE(s.decimals, decimals);
    QVERIFY(s.min <= lo && s.max >= hi);
    QVERIFY((s.max - s.min) / s.step <= 5 + 1e-9);
  }

  void logWhereValuesSpanDecades() {
    QVERIFY(SpansDecades(1.0, 5000.0));
    QVERIFY(!SpansDecades(20.0, 900.0));
    QVERIFY(!SpansDecades(0.0, 5000.0));  // no log of zero
  }
};

QTEST_APPLESS_MAIN(TestChartScale)
#include "test_chart_scale.moc"
