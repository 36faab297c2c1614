// MatMulBf16 (mat-vec and GEMM paths) against a double product on odd shapes; the bits do not
// depend on the thread count or the run.
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
};

Problem Make(int64_t m, int64_t n, int64_t k, uint32_t seed) {
  Problem p{m, n, k, {}, {}};
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  p.x.resize(static_cast<size_t>(m * k));
  p.w.resize(static_cast<size_t>(n * k));
  for (auto& v : p.x) v = d(rng);
  for (auto& v : p.w) v = FloatToBf16(d(rng));
  return p;
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
      worst = std::max(worst, std::abs(y[r * p.n + j] - exact) / mag);
    }
  return worst;
}

std::vector<float> Run(ThreadPool& pool, const Problem& p, int64_t m) {
  std::vector<float> y(static_cast<size_t>(m * p.n), -1.0f);
  cpu::MatMulBf16(pool, p.x.data(), m, p.k, p.w.data(), p.n, p.k, y.data(), p.n);
  return y;
}

}  // namespace

class TestMatmul : public QObject {
  Q_OBJECT
 private slots:
  void matchesDouble_data() {
    QTest::addColumn<int>("m");
    QTest::addColumn<int>("n");
    QTest::addColumn<int>("k");
    QTest::newRow("matvec 1x70x100") << 1 << 70 << 100;
    QTest::newRow("matvec 8x300x33") << 8 << 300 << 33;
    QTest::newRow("gemm 9x17x7") << 9 << 17 << 7;
    QTest::newRow("gemm 13x70x100") << 13 << 70 << 100;
    QTest::newRow("gemm 50x513x300") << 50 << 513 << 300;
    QTest::newRow("gemm 25x40x600") << 25 << 40 << 600;
  }
  // fp32 accumulation over k terms: error <= k * 2^-24 relative to sum |x w| (a loose, standard bound).
  void matchesDouble() {
    QFETCH(int, m);
    QFETCH(int, n);
    QFETCH(int, k);
    ThreadPool pool(2);
    const Problem p = Make(m, n, k, 1u + static_cast<uint32_t>(m * n));
    const auto y = Run(pool, p, m);
    const double worst = WorstRelative(p, y), bound = k * std::ldexp(1.0, -24);
    qInfo("worst relative error %.3g (bound %.3g), path %s", worst, bound, cpu::MatVecPath());
    QVERIFY(worst <= bound);
  }
  void bitsIndependentOfThreadsAndRuns() {
    ThreadPool one(1), two(2);
    const Problem p = Make(40, 600, 520, 5u);
    const auto a = Run(one, p, 40), b = Run(two, p, 40);
    QVERIFY(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
    const auto c = Run(two, p, 40);
    QVERIFY(std::memcmp(a.data(), c.data(), c.size() * 4) == 0);
    // The mat-vec path: each row's bits do not depend on how many rows (<= 8) share the call.
    const auto d8 = Run(two, p, 8), d1 = Run(one, p, 1);
    QVERIFY(std::memcmp(d8.data(), d1.data(), d1.size() * 4) == 0);
  }
  void portableMatVecAgrees() {
    ThreadPool pool(2);
    const Problem p = Make(3, 130, 257, 9u);
    const auto y = Run(pool, p, 3);
    std::vector<float> z(y.size());
    cpu::MatVecBf16Portable(p.x.data(), 3, p.k, p.w.data(), p.n, p.k, z.data(), p.n);
    QVERIFY(WorstRelative(p, z) <= p.k * std::ldexp(1.0, -24));
    double d = 0.0;
    for (size_t i = 0; i < y.size(); ++i) d = std::max(d, double(std::abs(y[i] - z[i])));
    QVERIFY(d < 1e-3);
  }
};

QTEST_APPLESS_MAIN(TestMatmul)
#include "test_matmul.moc"
