// MatMulBf16 on every kernel path: each output equals the sequential fp32 fused multiply-add of its k
// products (the arithmetic all paths share), bit for bit, whatever the row count, thread count and
// shape; the result is within the fp32 bound of a double product; paths the CPU lacks are skipped.
#include <QtTest>

#include <cmath>
#include <cstring>
#include <random>

#include "engine/compute/cpu/matmul.h"
#include "engine/core/bf16.h"

using namespace anchorage;

namespace {

struct Problem {
  int64_t m, n, k;
  std::vector<float> x;
  std::vector<uint16_t> w;
  cpu::PackedBf16 packed;
};

Problem Make(int64_t m, int64_t n, int64_t k, uint32_t seed) {
  Problem p{m, n, k, {}, {}, {}};
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  p.x.resize(static_cast<size_t>(m * k));
  p.w.resize(static_cast<size_t>(n * k));
  for (auto& v : p.x) v = d(rng);
  for (auto& v : p.w) v = FloatToBf16(d(rng));
  p.packed = cpu::PackedBf16::FromRowMajor(p.w.data(), n, k);
  return p;
}

// The shared arithmetic, written out: start at 0, one fma per k in index order.
std::vector<float> Sequential(const Problem& p) {
  std::vector<float> y(static_cast<size_t>(p.m * p.n));
  for (int64_t r = 0; r < p.m; ++r)
    for (int64_t j = 0; j < p.n; ++j) {
      float acc = 0.0f;
      for (int64_t i = 0; i < p.k; ++i) acc = std::fma(p.x[r * p.k + i], Bf16ToFloat(p.w[j * p.k + i]), acc);
      y[r * p.n + j] = acc;
    }
  return y;
}

// Max |y - exact| / (sum_i |x_i w_i|): the error relative to the condition of each dot product.
double WorstRelative(const Problem& p, const std::vector<float>& y) {
  double worst = 0.0;
  for (int64_t r = 0; r < p.m; ++r)
    for (int64_t j = 0; j < p.n; ++j) {
      double exact = 0.0, mag = 0.0;
      for (int64_t i = 0; i < p.k; ++i) {
        const double t = double(p.x[r * p.k + i]) * Bf16ToFloat(p.w[j * p.k + i]);
        exact += t;
        mag += std::abs(t);
      }
      worst = std::max(worst, mag == 0.0 ? 0.0 : std::abs(y[r * p.n + j] - exact) / mag);
    }
  return worst;
}

// Runs rows [r0, r0 + m) of p; the output has a wider row stride than n, whose extra columns must stay untouched.
std::vector<float> Run(cpu::KernelPath path, ThreadPool& pool, const Problem& p, int64_t r0, int64_t m) {
  const int64_t ldy = p.n + 3;
  std::vector<float> y(static_cast<size_t>(m * ldy), -7.0f);
  cpu::MatMulBf16On(path, pool, p.x.data() + r0 * p.k, m, p.k, p.packed, y.data(), ldy);
  std::vector<float> out(static_cast<size_t>(m * p.n));
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t j = p.n; j < ldy; ++j)
      if (y[r * ldy + j] != -7.0f) qFatal("column %lld of row %lld was written past n", (long long)j, (long long)r);
    std::memcpy(out.data() + r * p.n, y.data() + r * ldy, static_cast<size_t>(p.n) * 4);
  }
  return out;
}

bool SameBits(const float* a, const float* b, size_t count) { return std::memcmp(a, b, count * 4) == 0; }

const cpu::KernelPath kPaths[] = {cpu::KernelPath::kPortable, cpu::KernelPath::kAvx2Fma, cpu::KernelPath::kAvx512F,
                                  cpu::KernelPath::kEmulated16};

void AddPathRows(const std::function<void(cpu::KernelPath, const char*)>& add) {
  for (cpu::KernelPath path : kPaths) add(path, cpu::PathName(path));
}

#define SKIP_UNLESS_AVAILABLE(path)                                                                       \
  if (!cpu::PathAvailable(path))                                                                          \
    QSKIP(qPrintable(QString("this CPU cannot run the %1 kernels").arg(cpu::PathName(path))));

}  // namespace

class TestMatmul : public QObject {
  Q_OBJECT
 private slots:
  void initTestCase() {
    QString paths;
    for (cpu::KernelPath p : cpu::AvailablePaths()) paths += QString(" ") + cpu::PathName(p);
    qInfo("paths this CPU runs:%s; active %s", qPrintable(paths), cpu::PathName(cpu::ActivePath()));
  }

  void packedLayoutHoldsEveryElement() {
    const Problem p = Make(1, 70, 19, 3u);
    QCOMPARE(p.packed.rows(), 70);
    QCOMPARE(p.packed.panels(), 3);
    std::vector<float> row(19);
    for (int64_t j = 0; j < p.n; ++j) {
      p.packed.RowToFloat(j, row.data());
      for (int64_t i = 0; i < p.k; ++i) {
        QCOMPARE(p.packed.At(j, i), p.w[j * p.k + i]);
        QCOMPARE(row[i], Bf16ToFloat(p.w[j * p.k + i]));
      }
    }
    for (int64_t c = 70; c < 96; ++c) QCOMPARE(p.packed.panel(2)[5 * cpu::kPanelColumns + cpu::PackedBf16::SlotOf(c % 32)], 0);
  }

  void equalsSequentialFma_data() {
    QTest::addColumn<int>("path");
    QTest::addColumn<int>("m");
    QTest::addColumn<int>("n");
    QTest::addColumn<int>("k");
    const int shapes[][3] = {{1, 1, 1},    {1, 70, 100},  {2, 33, 7},    {3, 31, 257},  {17, 129, 300},
                             {1, 300, 600}, {5, 16, 513}, {100, 40, 260}, {13, 17, 33}, {7, 256, 64}};
    AddPathRows([&](cpu::KernelPath path, const char* name) {
      for (const auto& s : shapes)
        QTest::addRow("%s %dx%dx%d", name, s[0], s[1], s[2]) << int(path) << s[0] << s[1] << s[2];
    });
  }
  void equalsSequentialFma() {
    QFETCH(int, path);
    QFETCH(int, m);
    QFETCH(int, n);
    QFETCH(int, k);
    const auto kp = static_cast<cpu::KernelPath>(path);
    SKIP_UNLESS_AVAILABLE(kp);
    ThreadPool pool(2);
    const Problem p = Make(m, n, k, 1u + static_cast<uint32_t>(m * n + k));
    const auto y = Run(kp, pool, p, 0, m);
    const auto want = Sequential(p);
    QVERIFY(SameBits(y.data(), want.data(), y.size()));
    // fp32 accumulation over k terms: error <= k * 2^-24 relative to sum |x w|.
    QVERIFY(WorstRelative(p, y) <= k * std::ldexp(1.0, -24));
  }

  void rowsIndependentOfBatchAndThreads_data() {
    QTest::addColumn<int>("path");
    AddPathRows([](cpu::KernelPath path, const char* name) { QTest::newRow(name) << int(path); });
  }
  void rowsIndependentOfBatchAndThreads() {
    QFETCH(int, path);
    const auto kp = static_cast<cpu::KernelPath>(path);
    SKIP_UNLESS_AVAILABLE(kp);
    ThreadPool one(1), two(2), three(3);
    const Problem p = Make(110, 200, 300, 5u);
    const auto all = Run(kp, two, p, 0, p.m);
    QVERIFY(SameBits(all.data(), Run(kp, one, p, 0, p.m).data(), all.size()));
    QVERIFY(SameBits(all.data(), Run(kp, three, p, 0, p.m).data(), all.size()));
    for (int64_t r : {0, 1, 2, 16, 95, 96, 109}) {
      const auto single = Run(kp, one, p, r, 1);
      QVERIFY2(SameBits(all.data() + r * p.n, single.data(), static_cast<size_t>(p.n)), qPrintable(QString("row %1").arg(r)));
    }
    for (auto [r0, m] : {std::pair<int64_t, int64_t>{0, 2}, {3, 3}, {10, 17}, {50, 60}}) {
      const auto part = Run(kp, two, p, r0, m);
      QVERIFY(SameBits(all.data() + r0 * p.n, part.data(), part.size()));
    }
  }

  void everyPathAgrees() {
    ThreadPool pool(2);
    const Problem p = Make(9, 100, 777, 11u);
    const auto portable = Run(cpu::KernelPath::kPortable, pool, p, 0, p.m);
    for (cpu::KernelPath path : cpu::AvailablePaths()) {
      const auto y = Run(path, pool, p, 0, p.m);
      QVERIFY2(SameBits(y.data(), portable.data(), y.size()), cpu::PathName(path));
    }
  }

  void pathNamesRoundTrip() {
    for (cpu::KernelPath path : kPaths) QCOMPARE(*cpu::PathFromName(cpu::PathName(path)), path);
    QVERIFY(!cpu::PathFromName("sse3").ok());
    QVERIFY(cpu::PathAvailable(cpu::KernelPath::kPortable));
    QCOMPARE(cpu::AvailablePaths().back(), cpu::KernelPath::kPortable);
    QVERIFY(cpu::SetActivePath(cpu::KernelPath::kPortable).ok());
    QCOMPARE(cpu::ActivePath(), cpu::KernelPath::kPortable);
    QVERIFY(cpu::SetActivePath(cpu::AvailablePaths().front()).ok());
    if (!cpu::PathAvailable(cpu::KernelPath::kAvx512F)) QVERIFY(!cpu::SetActivePath(cpu::KernelPath::kAvx512F).ok());
  }
};

QTEST_APPLESS_MAIN(TestMatmul)
#include "test_matmul.moc"
