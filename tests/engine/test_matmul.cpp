// MatMulBf16 on every kernel path: each output equals its arithmetic written out (the fp32 paths: the
// sequential fused multiply-add of its k products; the bf16 paths: activations split into bf16 parts,
// k in pairs as VDPBF16PS adds them, or 32 k at a time as TDPBF16PS does), bit for bit, whatever the row count, thread count and shape; the
// result is within that arithmetic's bound of a double product; paths the CPU lacks are skipped.
#include <QtTest>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <limits>
#include <random>

#include "engine/compute/cpu/bf16_split.h"
#include "engine/compute/cpu/gemm_block.h"
#include "engine/compute/cpu/matmul.h"
#include "engine/compute/cpu/vec.h"
#include "engine/core/bf16.h"
#include "tests/engine/matmul_test_util.h"

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

// Part `which` of v's bf16 split: x = p0 + p1 + ..., each part the bf16 rounding of what the ones before it left.
float PartOf(float v, int which) {
  float rest = v;
  for (int i = 0; i < which; ++i) rest = rest - Bf16ToFloat(FloatToBf16(rest));
  return Bf16ToFloat(FloatToBf16(rest));
}

// The bf16 arithmetic, written out: per pair of k the odd product and the even one of each of the first
// `parts` parts (fast precision: 1), in that order, each added in fp32.
std::vector<float> SequentialBf16(const Problem& p, int parts) {
  std::vector<float> y(static_cast<size_t>(p.m * p.n));
  for (int64_t r = 0; r < p.m; ++r)
    for (int64_t j = 0; j < p.n; ++j) {
      float acc = 0.0f;
      for (int64_t i = 0; i < p.k; i += 2)
        for (int which = 0; which < parts; ++which) {
          if (i + 1 < p.k) acc = acc + PartOf(p.x[r * p.k + i + 1], which) * Bf16ToFloat(p.w[j * p.k + i + 1]);
          acc = acc + PartOf(p.x[r * p.k + i], which) * Bf16ToFloat(p.w[j * p.k + i]);
        }
      y[r * p.n + j] = acc;
    }
  return y;
}

// The AMX arithmetic, written out: per 32 k from k = 0 and per part, the even k's products summed from
// 0 and the odd k's apart, then (even + odd) added to the output; every sum in fp32.
std::vector<float> SequentialAmx(const Problem& p, int parts) {
  std::vector<float> y(static_cast<size_t>(p.m * p.n));
  for (int64_t r = 0; r < p.m; ++r)
    for (int64_t j = 0; j < p.n; ++j) {
      float acc = 0.0f;
      for (int64_t i0 = 0; i0 < p.k; i0 += 32)
        for (int which = 0; which < parts; ++which) {
          float even = 0.0f, odd = 0.0f;
          for (int64_t i = i0; i < std::min(p.k, i0 + 32); ++i) {
            const float product = PartOf(p.x[r * p.k + i], which) * Bf16ToFloat(p.w[j * p.k + i]);
            if (i % 2 == 0) {
              even = even + product;
            } else {
              odd = odd + product;
            }
          }
          acc = acc + (even + odd);
        }
      y[r * p.n + j] = acc;
    }
  return y;
}

std::vector<float> WrittenOut(cpu::KernelPath path, const Problem& p, int parts = cpu::kBf16Parts) {
  switch (cpu::ArithmeticOf(path)) {
    case cpu::Arithmetic::kBf16Dot: return SequentialBf16(p, parts);
    case cpu::Arithmetic::kBf16Amx: return SequentialAmx(p, parts);
    case cpu::Arithmetic::kFp32Fma: break;
  }
  return Sequential(p);
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

// Runs rows [r0, r0 + m) of p into rows wider than n.
std::vector<float> Run(cpu::KernelPath path, ThreadPool& pool, const Problem& p, int64_t r0, int64_t m) {
  return testing::RunIntoWideRows(m, p.n, [&](float* y, int64_t ldy) {
    cpu::MatMulBf16On(path, pool, p.x.data() + r0 * p.k, m, p.k, p.packed, y, ldy);
  });
}

using testing::SameBits;

// Fast precision for a test's scope; exact again after it.
struct FastPrecision {
  FastPrecision() { cpu::SetPrecision(cpu::Precision::kFast); }
  ~FastPrecision() { cpu::SetPrecision(cpu::Precision::kExact); }
};

using testing::kPaths;

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
  // The norms' dot product has one order whatever the build (AVX-512 or not) and the CPU: products rounded, lane
  // i mod 32 in index order, lane l + 16 onto lane l, then halving over 16 lanes.
  void dotHasOneOrderForEveryBuild() {
    std::mt19937 rng(17);
    for (int64_t n : {1, 2, 15, 16, 17, 31, 32, 33, 47, 48, 63, 64, 65, 100, 128, 1000, 1024, 3584}) {
      const std::vector<float> a = testing::NormalValues(n, rng), b = testing::NormalValues(n, rng);
      float lanes[32] = {};
      for (int64_t i = 0; i < n; ++i) {
        const float product = a[i] * b[i];
        lanes[i % 32] = lanes[i % 32] + product;
      }
      float v[16];
      for (int l = 0; l < 16; ++l) v[l] = lanes[l] + lanes[l + 16];
      for (int width = 8; width >= 1; width /= 2)
        for (int l = 0; l < width; ++l) v[l] = v[l] + v[l + width];
      const float want = v[0];
      QVERIFY2(SameBits(&want, std::vector<float>{cpu::Dot(a.data(), b.data(), n)}.data(), 1), qPrintable(QString("n %1").arg(n)));
      QVERIFY2(SameBits(&want, std::vector<float>{cpu::DotPortable(a.data(), b.data(), n)}.data(), 1),
               qPrintable(QString("portable, n %1").arg(n)));
    }
  }

  // cpu::Exp against e^x in double on every 97th float of its accurate range, its edges, and its bits in a
  // loop the compiler vectorises against one call at a time.
  void expIsWithinOneUlpWithTheSameBitsInLoops() {
    const float low = -86.0f, high = 88.72283935546875f;
    double worst = 0;
    int64_t checked = 0;
    for (uint64_t bits = 0; bits <= 0xffffffffu; bits += 97) {
      float x;
      const uint32_t b32 = static_cast<uint32_t>(bits);
      std::memcpy(&x, &b32, sizeof x);
      if (!(x >= low && x < high)) continue;
      const double want = std::exp(static_cast<double>(x));
      int exponent;
      std::frexp(want, &exponent);
      const double ulps = std::fabs(static_cast<double>(cpu::Exp(x)) - want) / std::ldexp(1.0, exponent - 24);
      worst = std::max(worst, ulps);
      ++checked;
      if (ulps > 1.0) QFAIL(qPrintable(QString("exp(%1) is %2 ulp off").arg(static_cast<double>(x), 0, 'a').arg(ulps)));
    }
    qInfo("cpu::Exp on %lld floats: worst %.3f ulp", static_cast<long long>(checked), worst);
    QVERIFY(checked > 20'000'000);
    const float inf = std::numeric_limits<float>::infinity();
    // Exact comparisons: QCOMPARE on floats is fuzzy.
    QVERIFY(cpu::Exp(0.0f) == 1.0f);
    QVERIFY(cpu::Exp(-0.0f) == 1.0f);
    for (float x : {-inf, -1e30f, -1000.0f, -87.0f, -86.5f}) QVERIFY2(cpu::Exp(x) == 0.0f, qPrintable(QString::number(x)));
    for (float x : {inf, 1e30f, 1000.0f, 89.0f, high}) QVERIFY2(cpu::Exp(x) == inf, qPrintable(QString::number(x)));
    QVERIFY(std::isfinite(cpu::Exp(std::nextafter(high, 0.0f))));
    QVERIFY(std::isnan(cpu::Exp(std::numeric_limits<float>::quiet_NaN())));
    QVERIFY(std::isnan(cpu::Exp(-std::numeric_limits<float>::quiet_NaN())));

    std::mt19937 rng(5);
    std::uniform_real_distribution<float> spread(-100.0f, 100.0f);
    std::vector<float> x(4099), looped(x.size()), one_by_one(x.size());
    for (float& v : x) v = spread(rng);
    x[7] = inf;
    x[8] = -inf;
    x[9] = std::numeric_limits<float>::quiet_NaN();
    for (size_t i = 0; i < x.size(); ++i) looped[i] = cpu::Exp(x[i]);
    float (*volatile scalar)(float) = [](float v) { return cpu::Exp(v); };
    for (size_t i = 0; i < x.size(); ++i) one_by_one[i] = scalar(x[i]);
    QVERIFY(SameBits(looped.data(), one_by_one.data(), x.size()));
  }

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

  // Packing on a pool's threads writes the same panels as packing on one.
  void packingOnAPoolIsTheSame() {
    const Problem p = Make(1, 1000, 77, 4u);
    ThreadPool pool(3);
    const auto pooled = cpu::PackedBf16::FromRowMajor(p.w.data(), p.n, p.k, &pool);
    QCOMPARE(pooled.bytes(), p.packed.bytes());
    QVERIFY(std::memcmp(pooled.panel(0), p.packed.panel(0), static_cast<size_t>(p.packed.bytes())) == 0);
  }

  void equalsWrittenOutArithmetic_data() {
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
  void equalsWrittenOutArithmetic() {
    QFETCH(int, path);
    QFETCH(int, m);
    QFETCH(int, n);
    QFETCH(int, k);
    const auto kp = static_cast<cpu::KernelPath>(path);
    SKIP_UNLESS_AVAILABLE(kp);
    ThreadPool pool(2);
    const Problem p = Make(m, n, k, 1u + static_cast<uint32_t>(m * n + k));
    const auto y = Run(kp, pool, p, 0, m);
    const auto want = WrittenOut(kp, p);
    QVERIFY(SameBits(y.data(), want.data(), y.size()));
    // fp32: k roundings of at most 2^-24 relative to sum |x w|; bf16: parts * k of them, and the
    // split leaves at most 2^(-8 parts) |x| of each activation out.
    const double bound = cpu::SplitsIntoBf16(kp) ? cpu::kBf16Parts * k * std::ldexp(1.0, -24) + std::ldexp(1.0, -8 * cpu::kBf16Parts)
                                    : k * std::ldexp(1.0, -24);
    QVERIFY(WorstRelative(p, y) <= bound);
  }

  // Subnormal inputs, products and sums are flushed to zero as VDPBF16PS and TDPBF16PS flush them, so
  // the emulations are exact there too.
  void bf16FlushesLikeTheInstruction_data() {
    QTest::addColumn<int>("path");
    QTest::addColumn<int>("emulation");
    QTest::newRow("avx512-bf16") << int(cpu::KernelPath::kAvx512Bf16) << int(cpu::KernelPath::kEmulatedBf16);
    QTest::newRow("amx-bf16") << int(cpu::KernelPath::kAmxBf16) << int(cpu::KernelPath::kEmulatedAmx);
  }
  void bf16FlushesLikeTheInstruction() {
    QFETCH(int, path);
    QFETCH(int, emulation);
    SKIP_UNLESS_AVAILABLE(static_cast<cpu::KernelPath>(path));
    ThreadPool pool(2);
    // Rows 0-1: mixed magnitudes; rows 2-3: every product subnormal (flushed results); rows 4-5:
    // large activations against subnormal weights in columns 0-9 (inputs read as 0).
    Problem p = Make(6, 70, 301, 9u);
    for (int64_t r = 0; r < p.m; ++r)
      for (int64_t i = 0; i < p.k; ++i) {
        float& v = p.x[r * p.k + i];
        v *= r < 2 ? (i % 3 == 0 ? 1e-38f : (i % 3 == 1 ? 1e-19f : 1.0f)) : r < 4 ? 1e-30f : 1e10f;
      }
    for (int64_t j = 0; j < p.n; ++j)
      for (int64_t i = 0; i < p.k; ++i) {
        uint16_t& w = p.w[j * p.k + i];
        if ((j * p.k + i) % 5 == 0) w = FloatToBf16(Bf16ToFloat(w) * 1e-20f);
        if (j < 10) w = static_cast<uint16_t>((w & 0x8000u) | (1 + (i % 100)));  // subnormal bf16
      }
    for (int64_t j = 10; j < p.n; ++j)
      for (int64_t i = 0; i < p.k; ++i) p.w[j * p.k + i] = FloatToBf16(Bf16ToFloat(p.w[j * p.k + i]) * (j % 2 ? 1e-9f : 1.0f));
    p.packed = cpu::PackedBf16::FromRowMajor(p.w.data(), p.n, p.k);
    const auto real = Run(static_cast<cpu::KernelPath>(path), pool, p, 0, p.m);
    const auto emulated = Run(static_cast<cpu::KernelPath>(emulation), pool, p, 0, p.m);
    QVERIFY(SameBits(real.data(), emulated.data(), real.size()));
    for (int64_t r0 : {0, 2, 4})
      for (int64_t rows : {1, 2}) {  // the few-rows (decode) kernels too
        const auto few = Run(static_cast<cpu::KernelPath>(path), pool, p, r0, rows);
        QVERIFY2(SameBits(few.data(), emulated.data() + r0 * p.n, few.size()), qPrintable(QString("rows %1 from %2").arg(rows).arg(r0)));
      }
  }

  // The vector split writes the portable split's words, specials included, and zeros up to the stride.
  void bf16SplitMatchesPortable() {
    SKIP_UNLESS_AVAILABLE(cpu::KernelPath::kAvx512Bf16);
    std::mt19937 rng(4u);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (int64_t k : {1, 2, 31, 32, 33, 64, 65, 300}) {
      const int64_t rows = 3, ldx = k + 5;
      std::vector<float> x(static_cast<size_t>(rows * ldx));
      for (auto& v : x) v = d(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 60) - 30);
      const float specials[] = {0.0f, -0.0f, 1e-40f, -1e-39f, 3.0e38f, -3.4e38f, INFINITY, -INFINITY, NAN, 1.00390625f};
      for (size_t i = 0; i < std::size(specials) && i < x.size(); ++i) x[i * 3 % x.size()] = specials[i];
      for (int64_t pad : {0, 5}) {
        const int64_t stride = cpu::PairCount(k) + pad;
        const size_t words = static_cast<size_t>(rows * cpu::kBf16Parts * stride);
        std::vector<uint32_t> vec(words, 0xdeadbeef), portable(words, 0xfeedface);
        cpu::SplitRowsAvx512Bf16(x.data(), ldx, rows, k, stride, vec.data(), cpu::kBf16Parts);
        cpu::SplitRowsPortable(x.data(), ldx, rows, k, stride, portable.data(), cpu::kBf16Parts);
        QVERIFY2(vec == portable, qPrintable(QString("k = %1, stride %2").arg(k).arg(stride)));
        for (int64_t part_row = 0; part_row < rows * cpu::kBf16Parts; ++part_row)
          for (int64_t t = cpu::PairCount(k); t < stride; ++t) QCOMPARE(portable[size_t(part_row * stride + t)], 0u);
        // Fast precision's split: part 0 alone, the other parts' words untouched.
        std::vector<uint32_t> first(words, 0xdeadbeef);
        cpu::SplitRowsAvx512Bf16(x.data(), ldx, rows, k, stride, first.data(), 1);
        for (int64_t part_row = 0; part_row < rows * cpu::kBf16Parts; ++part_row)
          for (int64_t t = 0; t < stride; ++t) {
            const size_t at = size_t(part_row * stride + t);
            QCOMPARE(first[at], part_row % cpu::kBf16Parts == 0 ? portable[at] : 0xdeadbeefu);
          }
      }
    }
  }

  // The AMX split writes the portable split's words (zeros past the row's end) in the A tiles' layout.
  void amxSplitMatchesPortable() {
    SKIP_UNLESS_AVAILABLE(cpu::KernelPath::kAmxBf16);
    std::mt19937 rng(6u);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (int64_t k : {1, 2, 31, 32, 33, 64, 65, 300}) {
      const int64_t rows = 20, ldx = k + 3, stride = (cpu::PairCount(k) + 15) / 16 * 16;
      std::vector<float> x(static_cast<size_t>(rows * ldx));
      for (auto& v : x) v = d(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 60) - 30);
      x[0] = NAN;
      x[x.size() / 2] = 1e-40f;
      const size_t words = static_cast<size_t>(rows * cpu::kBf16Parts * stride);
      std::vector<uint32_t> tiles(size_t(32 * cpu::kBf16Parts * stride), 0xdeadbeef), portable(words, 0xfeedface);
      cpu::SplitRowsPortable(x.data(), ldx, rows, k, stride, portable.data(), cpu::kBf16Parts);
      for (int parts : {cpu::kBf16Parts, 1}) {  // fast precision writes part 0 alone
        std::fill(tiles.begin(), tiles.end(), 0xdeadbeef);
        for (int64_t r0 = 0; r0 < rows; r0 += 16)
          cpu::SplitRowsAmxBf16(x.data() + r0 * ldx, ldx, std::min<int64_t>(16, rows - r0), k, stride,
                                tiles.data() + r0 * cpu::kBf16Parts * stride, parts);
        for (int64_t r = 0; r < rows; ++r)
          for (int p = 0; p < cpu::kBf16Parts; ++p)
            for (int64_t t = 0; t < stride; ++t) {
              const int64_t at = (r / 16) * 16 * cpu::kBf16Parts * stride + ((t / 16) * cpu::kBf16Parts + p) * 256 + (r % 16) * 16 + t % 16;
              const uint32_t want = p < parts ? portable[size_t((r * cpu::kBf16Parts + p) * stride + t)] : 0xdeadbeefu;
              QVERIFY2(tiles[size_t(at)] == want, qPrintable(QString("k %1 row %2 part %3 pair %4, %5 parts").arg(k).arg(r).arg(p).arg(t).arg(parts)));
            }
      }
    }
  }

  void rowsIndependentOfBatchAndThreads_data() {
    QTest::addColumn<int>("path");
    AddPathRows([](cpu::KernelPath path, const char* name) { QTest::newRow(name) << int(path); });
  }
  void rowsIndependentOfBatchAndThreads() {
    QFETCH(int, path);
    const auto kp = static_cast<cpu::KernelPath>(path);
    SKIP_UNLESS_AVAILABLE(kp);
    const Problem p = Make(110, 200, 300, 5u);
    ExpectRowsIndependentOfBatchAndThreads(kp, p);
  }
  // Every row of p on one, two and three threads, alone and in slices, gives the bits of all of them in one call.
  static void ExpectRowsIndependentOfBatchAndThreads(cpu::KernelPath kp, const Problem& p) {
    ThreadPool one(1), two(2), three(3);
    const auto all = Run(kp, two, p, 0, p.m);
    QVERIFY(SameBits(all.data(), Run(kp, one, p, 0, p.m).data(), all.size()));
    QVERIFY(SameBits(all.data(), Run(kp, three, p, 0, p.m).data(), all.size()));
    for (int64_t r : {0, 1, 2, 16, 95, 96, 109}) {
      const auto single = Run(kp, one, p, r, 1);
      QVERIFY2(SameBits(all.data() + r * p.n, single.data(), static_cast<size_t>(p.n)), qPrintable(QString("row %1").arg(r)));
    }
    for (auto [r0, m] : {std::pair<int64_t, int64_t>{0, 2}, {3, 3}, {20, 4}, {10, 17}, {50, 60}}) {
      const auto part = Run(kp, two, p, r0, m);
      QVERIFY2(SameBits(all.data() + r0 * p.n, part.data(), part.size()), qPrintable(QString("%1 rows from %2").arg(m).arg(r0)));
    }
  }

  // Fast precision: the bf16 paths multiply each activation rounded to bf16 once (part 0 alone), in
  // their arithmetic's order; the fp32 paths multiply as in exact. Rows stay independent of the batch
  // and the threads, and the error stays within the one rounding of each activation.
  void fastUsesOnePartInItsArithmeticsOrder_data() { rowsIndependentOfBatchAndThreads_data(); }
  void fastUsesOnePartInItsArithmeticsOrder() {
    QFETCH(int, path);
    const auto kp = static_cast<cpu::KernelPath>(path);
    SKIP_UNLESS_AVAILABLE(kp);
    ThreadPool two(2);
    const Problem p = Make(110, 70, 301, 7u);
    const auto exact = Run(kp, two, p, 0, p.m);
    const FastPrecision fast;
    QVERIFY(cpu::RunsFast(kp, cpu::Precision::kFast) == cpu::SplitsIntoBf16(kp));
    const auto all = Run(kp, two, p, 0, p.m);
    const int parts = cpu::SplitsIntoBf16(kp) ? 1 : cpu::kBf16Parts;
    QVERIFY(SameBits(all.data(), WrittenOut(kp, p, parts).data(), all.size()));
    QCOMPARE(SameBits(all.data(), exact.data(), all.size()), !cpu::SplitsIntoBf16(kp));
    ExpectRowsIndependentOfBatchAndThreads(kp, p);
    const double bound = cpu::SplitsIntoBf16(kp) ? std::ldexp(1.0, -8) + p.k * std::ldexp(1.0, -24) : p.k * std::ldexp(1.0, -24);
    QVERIFY(WorstRelative(p, all) <= bound);
    QVERIFY(std::string(cpu::ArithmeticNameOf(kp)) != cpu::ArithmeticNameOf(kp, cpu::Precision::kExact) || !cpu::SplitsIntoBf16(kp));
  }

  // Fast precision picks the CPU's bf16 path where it has one (exact again picks the start's path).
  void fastPicksTheBf16Units() {
    if (std::getenv("ANCHORAGE_KERNEL") != nullptr) QSKIP("ANCHORAGE_KERNEL names the path");
    const cpu::KernelPath before = cpu::ActivePath();
    {
      const FastPrecision fast;
      const bool has_units = cpu::PathAvailable(cpu::KernelPath::kAvx512Bf16) || cpu::PathAvailable(cpu::KernelPath::kAmxBf16);
      QCOMPARE(cpu::SplitsIntoBf16(cpu::ActivePath()), has_units);
      QCOMPARE(cpu::RunsFast(cpu::ActivePath(), cpu::ActivePrecision()), has_units);
    }
    QCOMPARE(cpu::ActivePath(), cpu::AvailablePaths().front());
    QVERIFY(cpu::SetActivePath(before).ok());
  }

  // Paths of one arithmetic agree bit for bit (the portable C++ of each is the reference).
  void everyPathAgreesWithinItsArithmetic() {
    ThreadPool pool(2);
    const Problem p = Make(9, 100, 777, 11u);
    const auto portable = Run(cpu::KernelPath::kPortable, pool, p, 0, p.m);
    const auto emulated_bf16 = Run(cpu::KernelPath::kEmulatedBf16, pool, p, 0, p.m);
    const auto emulated_amx = Run(cpu::KernelPath::kEmulatedAmx, pool, p, 0, p.m);
    QVERIFY(!SameBits(portable.data(), emulated_bf16.data(), portable.size()));
    QVERIFY(!SameBits(emulated_amx.data(), emulated_bf16.data(), portable.size()));
    for (cpu::KernelPath path : cpu::AvailablePaths()) {
      const auto y = Run(path, pool, p, 0, p.m);
      const auto arithmetic = cpu::ArithmeticOf(path);
      const auto& want = arithmetic == cpu::Arithmetic::kBf16Dot   ? emulated_bf16
                         : arithmetic == cpu::Arithmetic::kBf16Amx ? emulated_amx
                                                                   : portable;
      QVERIFY2(SameBits(y.data(), want.data(), y.size()), cpu::PathName(path));
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
    for (cpu::KernelPath path : {cpu::KernelPath::kAvx512F, cpu::KernelPath::kAvx512Bf16, cpu::KernelPath::kAmxBf16})
      if (!cpu::PathAvailable(path)) QVERIFY(!cpu::SetActivePath(path).ok());
    const std::string fp32 = cpu::ArithmeticNameOf(cpu::KernelPath::kAvx512F);
    const std::string dot = cpu::ArithmeticNameOf(cpu::KernelPath::kAvx512Bf16);
    const std::string amx = cpu::ArithmeticNameOf(cpu::KernelPath::kAmxBf16);
    QVERIFY(dot != fp32 && amx != fp32 && amx != dot);
    QCOMPARE(amx, std::string(cpu::ArithmeticNameOf(cpu::KernelPath::kEmulatedAmx)));
  }
};

QTEST_APPLESS_MAIN(TestMatmul)
#include "test_matmul.moc"
