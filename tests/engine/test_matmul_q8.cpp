// 8-bit weights (block-scaled FP8 e4m3, int8 per row and 32 inputs) on every kernel path: each output
// equals its arithmetic written out (FP8: fp32 over the weights code x scale; int8: exact integer dots of
// int16 activation codes, block by block), bit for bit, whatever the rows, threads and shape; the codecs
// are exact; malformed blocks are refused.
#include <QtTest>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "engine/compute/cpu/cpu_features.h"
#include "engine/compute/cpu/matmul.h"
#include "engine/compute/cpu/packed_q8.h"
#include "engine/core/bf16.h"
#include "tests/engine/matmul_test_util.h"

using namespace anchorage;

namespace {

struct Problem {
  int64_t m = 0, n = 0, k = 0;
  std::vector<float> x;
  cpu::PackedQ8 packed;
};

// Random non-NaN e4m3 codes with positive scales; power_of_two_scales makes every weight a bf16 value.
Problem MakeFp8(int64_t m, int64_t n, int64_t k, int64_t block_n, int64_t block_k, uint32_t seed,
                bool power_of_two_scales = false) {
  Problem p;
  p.m = m, p.n = n, p.k = k;
  std::mt19937 rng(seed);
  p.x = testing::NormalValues(m * k, rng);
  std::vector<uint8_t> codes(static_cast<size_t>(n * k));
  for (auto& c : codes) {
    do c = static_cast<uint8_t>(rng() & 0xff);
    while ((c & 0x7f) == 0x7f);
  }
  const int64_t scale_count = ((n + block_n - 1) / block_n) * ((k + block_k - 1) / block_k);
  std::vector<float> scales(static_cast<size_t>(scale_count));
  std::uniform_real_distribution<float> u(1e-3f, 1e-1f);
  for (auto& s : scales) s = power_of_two_scales ? std::ldexp(1.0f, -static_cast<int>(rng() % 12)) : u(rng);
  auto packed = cpu::PackedQ8::FromFp8Blocks(n, k, codes.data(), scales.data(), block_n, block_k);
  if (!packed.ok()) qFatal("%s", packed.status().message().c_str());
  p.packed = std::move(*packed);
  return p;
}

Problem MakeInt8(int64_t m, int64_t n, int64_t k, uint32_t seed) {
  Problem p;
  p.m = m, p.n = n, p.k = k;
  std::mt19937 rng(seed);
  p.x = testing::NormalValues(m * k, rng);
  const std::vector<float> w = testing::NormalValues(n * k, rng);
  p.packed = cpu::PackedQ8::QuantizeInt8(n, k, [&](int64_t j, float* out) { std::copy_n(w.data() + j * k, k, out); });
  return p;
}

// The arithmetic written out. FP8: each weight code x scale rounded to fp32, k products in order, one fma each.
// int8: the activations' int16 codes times the weights' int8 codes summed exactly over each block of 32, then
// y = fma(float(sum), weight scale x activation scale, y) block by block.
std::vector<float> Sequential(const Problem& p) {
  std::vector<float> y(static_cast<size_t>(p.m * p.n));
  const bool int8 = p.packed.code() == cpu::Q8Code::kInt8;
  std::vector<int16_t> codes(static_cast<size_t>(p.m * cpu::ActivationCodesStride(p.k)));
  std::vector<float> scales(static_cast<size_t>(p.m * cpu::ActivationScalesStride(p.k)));
  if (int8) cpu::QuantizeActivations(p.x.data(), p.k, p.m, p.k, codes.data(), scales.data());
  for (int64_t r = 0; r < p.m; ++r)
    for (int64_t j = 0; j < p.n; ++j) {
      float acc = 0.0f;
      if (!int8) {
        for (int64_t i = 0; i < p.k; ++i) acc = std::fma(p.x[r * p.k + i], p.packed.At(j, i), acc);
      } else {
        for (int64_t b = 0; b * 32 < p.k; ++b) {
          int64_t dot = 0;
          for (int64_t i = b * 32; i < std::min(p.k, b * 32 + 32); ++i)
            dot += int64_t{codes[r * cpu::ActivationCodesStride(p.k) + i]} * static_cast<int8_t>(p.packed.Code(j, i));
          acc = std::fma(static_cast<float>(dot), p.packed.Scale(j, b) * scales[r * cpu::ActivationScalesStride(p.k) + b], acc);
        }
      }
      y[r * p.n + j] = acc;
    }
  return y;
}

// Rows [r0, r0 + m) into rows wider than n.
std::vector<float> Run(cpu::KernelPath path, ThreadPool& pool, const Problem& p, int64_t r0, int64_t m) {
  return testing::RunIntoWideRows(m, p.n, [&](float* y, int64_t ldy) {
    cpu::MatMulQ8On(path, pool, p.x.data() + r0 * p.k, m, p.k, p.packed, y, ldy);
  });
}

using testing::SameBits;

using testing::kPaths;

}  // namespace

class TestMatmulQ8 : public QObject {
  Q_OBJECT
 private slots:
  void initTestCase() {
    const auto& f = cpu::DetectCpu();
    if (!(f.avx512f && f.avx512bw)) qInfo("no AVX-512F/BW on this CPU: its int8 kernels are skipped");
    else if (!f.avx512_vnni) qInfo("no AVX-512 VNNI on this CPU: the VPDPWSSD int8 kernel is skipped");
    else qInfo("int8 on AVX-512: the VPDPWSSD and VPMADDWD kernels are both checked");
  }

  void fp8CodecIsExact() {
    QCOMPARE(Fp8E4m3ToFloat(0x38), 1.0f);
    QCOMPARE(Fp8E4m3ToFloat(0x7e), 448.0f);
    QCOMPARE(Fp8E4m3ToFloat(0xfe), -448.0f);
    QCOMPARE(Fp8E4m3ToFloat(0x01), std::ldexp(1.0f, -9));
    QCOMPARE(Fp8E4m3ToFloat(0x08), std::ldexp(1.0f, -6));
    QCOMPARE(Fp8E4m3ToFloat(0x3c), 1.5f);
    QVERIFY(std::isnan(Fp8E4m3ToFloat(0x7f)) && std::isnan(Fp8E4m3ToFloat(0xff)));
    for (int b = 0; b < 256; ++b) {
      if ((b & 0x7f) == 0x7f) continue;
      QCOMPARE(int(FloatToFp8E4m3(Fp8E4m3ToFloat(static_cast<uint8_t>(b)))), b);
    }
    QCOMPARE(int(FloatToFp8E4m3(1.0625f)), 0x38);  // halfway between 1 and 1.125: to the even code
    QCOMPARE(int(FloatToFp8E4m3(1.1875f)), 0x3a);  // halfway between 1.125 and 1.25: to the even code
    QCOMPARE(int(FloatToFp8E4m3(1000.0f)), 0x7e);  // saturates
    QCOMPARE(int(FloatToFp8E4m3(-1e-9f)), 0x80);
  }

  void packedHoldsEveryWeight() {
    const int64_t n = 70, k = 300, bn = 128, bk = 96;
    std::vector<uint8_t> codes(static_cast<size_t>(n * k));
    for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>((i * 37) % 0x7f);
    std::vector<float> scales{0.5f, 0.25f, 3.0f, 0.1f};
    auto p = cpu::PackedQ8::FromFp8Blocks(n, k, codes.data(), scales.data(), bn, bk);
    QVERIFY(p.ok());
    QCOMPARE(p->panels(), 3);
    QCOMPARE(p->k_blocks(), 4);
    std::vector<float> row(static_cast<size_t>(k));
    for (int64_t j = 0; j < n; ++j) {
      p->RowToFloat(j, row.data());
      for (int64_t i = 0; i < k; ++i) {
        const float want = Fp8E4m3ToFloat(codes[j * k + i]) * scales[i / bk];
        QCOMPARE(p->At(j, i), want);
        QCOMPARE(row[i], want);
      }
    }
  }

  void malformedBlocksRefused() {
    const int64_t n = 4, k = 4;
    std::vector<uint8_t> codes(16, 0x38);
    for (float bad : {0.0f, -1.0f, INFINITY, NAN, 1e38f}) {
      const float scale = bad;
      auto p = cpu::PackedQ8::FromFp8Blocks(n, k, codes.data(), &scale, 128, 128);
      QVERIFY(!p.ok());
      QVERIFY2(p.status().message().find("scale [0, 0]") != std::string::npos, p.status().message().c_str());
    }
    codes[6] = 0xff;
    const float one = 1.0f;
    auto p = cpu::PackedQ8::FromFp8Blocks(n, k, codes.data(), &one, 128, 128);
    QVERIFY(!p.ok());
    QVERIFY2(p.status().message().find("[1, 2]") != std::string::npos, p.status().message().c_str());
  }

  void int8KeepsHalfAStep() {
    const int64_t n = 37, k = 100;
    std::mt19937 rng(3);
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> w(static_cast<size_t>(n * k));
    for (auto& v : w) v = d(rng);
    for (int64_t i = 0; i < k; ++i) w[5 * k + i] = 0.0f;  // an all-zero row keeps zeros
    const auto p = cpu::PackedQ8::QuantizeInt8(n, k, [&](int64_t j, float* out) { std::copy_n(w.data() + j * k, k, out); });
    QCOMPARE(p.block_k(), 32);
    for (int64_t j = 0; j < n; ++j)
      for (int64_t b = 0; b * 32 < k; ++b) {
        float largest = 0.0f;
        for (int64_t i = b * 32; i < std::min(k, b * 32 + 32); ++i) largest = std::max(largest, std::fabs(w[j * k + i]));
        const float step = largest / 127.0f;
        for (int64_t i = b * 32; i < std::min(k, b * 32 + 32); ++i)
          QVERIFY(std::fabs(p.At(j, i) - w[j * k + i]) <= 0.5f * step * (1.0f + 1e-5f));
      }
    for (int64_t i = 0; i < k; ++i) QCOMPARE(p.At(5, i), 0.0f);
  }

  // Packing on a pool's threads writes the same codes and scales as packing on one.
  void packingOnAPoolIsTheSame() {
    ThreadPool pool(3);
    std::mt19937 rng(5);
    const int64_t n = 1000, k = 77;
    const std::vector<float> w = testing::NormalValues(n * k, rng);
    auto row_of = [&](int64_t j, float* out) { std::copy_n(w.data() + j * k, k, out); };
    const auto one = cpu::PackedQ8::QuantizeInt8(n, k, row_of), pooled = cpu::PackedQ8::QuantizeInt8(n, k, row_of, &pool);
    std::vector<uint8_t> codes(static_cast<size_t>(n * k));
    for (auto& c : codes) c = static_cast<uint8_t>(rng() % 0x7f);
    const std::vector<float> scales(static_cast<size_t>(8), 0.25f);
    const auto fp8 = *cpu::PackedQ8::FromFp8Blocks(n, k, codes.data(), scales.data(), 128, 128);
    const auto fp8_pooled = *cpu::PackedQ8::FromFp8Blocks(n, k, codes.data(), scales.data(), 128, 128, &pool);
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < k; ++i) {
        QCOMPARE(pooled.At(j, i), one.At(j, i));
        QCOMPARE(fp8_pooled.At(j, i), fp8.At(j, i));
      }
  }

  void equalsWrittenOutArithmetic_data() {
    QTest::addColumn<int>("path");
    QTest::addColumn<bool>("int8");
    QTest::addColumn<int>("m");
    QTest::addColumn<int>("n");
    QTest::addColumn<int>("k");
    const int shapes[][3] = {{1, 1, 1}, {1, 70, 300}, {2, 33, 7}, {3, 31, 257}, {17, 129, 600}, {100, 40, 260}};
    for (cpu::KernelPath path : kPaths)
      for (bool int8 : {false, true})
        for (const auto& s : shapes)
          QTest::addRow("%s %s %dx%dx%d", cpu::PathName(path), int8 ? "int8" : "fp8", s[0], s[1], s[2])
              << int(path) << int8 << s[0] << s[1] << s[2];
  }
  void equalsWrittenOutArithmetic() {
    QFETCH(int, path);
    QFETCH(bool, int8);
    QFETCH(int, m);
    QFETCH(int, n);
    QFETCH(int, k);
    const auto kp = static_cast<cpu::KernelPath>(path);
    if (!cpu::PathAvailable(kp)) QSKIP(qPrintable(QString("this CPU cannot run the %1 kernels").arg(cpu::PathName(kp))));
    ThreadPool pool(2);
    const uint32_t seed = 1u + static_cast<uint32_t>(m * n + k);
    // Blocks of 96 inputs straddle the kernels' k blocks of 256.
    const Problem p = int8 ? MakeInt8(m, n, k, seed) : MakeFp8(m, n, k, 128, 96, seed);
    const auto want = Sequential(p);
    QVERIFY(SameBits(Run(kp, pool, p, 0, m).data(), want.data(), want.size()));
    // The AVX-512 paths' int8 kernel without VPDPWSSD (the one a CPU without AVX-512 VNNI runs).
    cpu::AllowAvx512Vnni(false);
    const auto without_vnni = Run(kp, pool, p, 0, m);
    cpu::AllowAvx512Vnni(true);
    QVERIFY(SameBits(without_vnni.data(), want.data(), want.size()));
  }

  // Each block of 32 activations: codes within half a step (and 2^-8) of x / scale, scale = max |x| / 32767; zero, NaN and
  // infinite blocks, and the pad past k, as documented.
  void activationsQuantizeWithinHalfAStep() {
    const int64_t rows = 3, k = 77, stride = cpu::ActivationCodesStride(k), blocks = cpu::ActivationScalesStride(k);
    QCOMPARE(stride, 96);
    QCOMPARE(blocks, 3);
    std::mt19937 rng(11);
    std::vector<float> x = testing::NormalValues(rows * k, rng);
    for (int64_t i = 0; i < 32; ++i) x[i] *= 1e30f;      // row 0, block 0: huge
    for (int64_t i = 32; i < 64; ++i) x[i] *= 1e-36f;    // row 0, block 1: below FLT_MIN * 32767, counts as zero
    for (int64_t i = 64; i < k; ++i) x[i] = 0.0f;        // row 0, block 2: zero
    x[k + 40] = NAN;                                     // row 1, block 1
    x[2 * k + 70] = -INFINITY;                           // row 2, block 2
    std::vector<int16_t> codes(static_cast<size_t>(rows * stride), 7);
    std::vector<float> scales(static_cast<size_t>(rows * blocks), -1.0f);
    cpu::QuantizeActivations(x.data(), k, rows, k, codes.data(), scales.data());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t b = 0; b < blocks; ++b) {
        const float scale = scales[r * blocks + b];
        const int16_t* block_codes = codes.data() + r * stride + b * 32;
        const bool bad = (r == 1 && b == 1) || (r == 2 && b == 2);
        const bool zero = r == 0 && b >= 1;
        if (bad) QVERIFY(std::isnan(scale));
        if (zero) QCOMPARE(scale, 0.0f);
        float largest = 0.0f;
        for (int64_t i = b * 32; i < std::min(k, b * 32 + 32); ++i) largest = std::max(largest, std::fabs(x[r * k + i]));
        if (!bad && !zero) QCOMPARE(scale, largest / 32767.0f);
        for (int64_t i = 0; i < 32; ++i) {
          const int64_t column = b * 32 + i;
          if (bad || zero || column >= k) {
            QCOMPARE(int(block_codes[i]), 0);
            continue;
          }
          QVERIFY(std::abs(int(block_codes[i])) <= 32767);
          const double error = std::fabs(double(x[r * k + column]) - double(block_codes[i]) * scale);
          // x times fp32(1 / scale) rounds within 2^-8 of a step of x / scale's rounding.
          QVERIFY2(error <= (0.5 + 1.0 / 256) * scale, qPrintable(QString("row %1 column %2").arg(r).arg(column)));
        }
      }
    // A row with a NaN or an infinity gives NaN outputs on every path; the other rows stay finite.
    ThreadPool pool(2);
    Problem p = MakeInt8(rows, 40, k, 12u);
    p.x = x;
    for (cpu::KernelPath kp : cpu::AvailablePaths()) {
      const auto y = Run(kp, pool, p, 0, rows);
      for (int64_t j = 0; j < p.n; ++j) {
        QVERIFY(std::isfinite(y[j]));
        QVERIFY(std::isnan(y[p.n + j]) && std::isnan(y[2 * p.n + j]));
      }
    }
  }

  void rowsIndependentOfBatchAndThreads() {
    ThreadPool one(1), two(2), three(3);
    for (bool int8 : {false, true}) {
      const Problem p = int8 ? MakeInt8(110, 200, 300, 5u) : MakeFp8(110, 200, 300, 128, 128, 5u);
      for (cpu::KernelPath kp : cpu::AvailablePaths()) {
        const auto all = Run(kp, two, p, 0, p.m);
        QVERIFY(SameBits(all.data(), Run(kp, one, p, 0, p.m).data(), all.size()));
        QVERIFY(SameBits(all.data(), Run(kp, three, p, 0, p.m).data(), all.size()));
        QVERIFY(SameBits(all.data(), Run(cpu::KernelPath::kPortable, two, p, 0, p.m).data(), all.size()));
        cpu::AllowAvx512Vnni(false);
        const auto without_vnni = Run(kp, two, p, 0, p.m);
        cpu::AllowAvx512Vnni(true);
        QVERIFY(SameBits(all.data(), without_vnni.data(), all.size()));
        for (int64_t r : {0, 1, 2, 16, 95, 96, 109}) {
          const auto single = Run(kp, one, p, r, 1);
          QVERIFY2(SameBits(all.data() + r * p.n, single.data(), static_cast<size_t>(p.n)),
                   qPrintable(QString("%1 row %2").arg(cpu::PathName(kp)).arg(r)));
        }
        for (auto [r0, m] : {std::pair<int64_t, int64_t>{0, 2}, {3, 3}, {10, 17}, {50, 60}}) {
          const auto part = Run(kp, two, p, r0, m);
          QVERIFY(SameBits(all.data() + r0 * p.n, part.data(), part.size()));
        }
      }
    }
  }

  // Products sharing one input in one call (mixed formats, more than fit one call, an odd k, and one product
  // reading fewer columns) give each product's own bits.
  void sharedInputGivesEachProductsBits() {
    ThreadPool pool(2);
    std::mt19937 rng(21);
    std::vector<cpu::PackedMatrix> matrices;
    for (int i = 0; i < 11; ++i) {
      const int64_t n = 1 + (i * 37) % 150, k = i == 10 ? 77 : 301;
      if (i % 3 == 0 || i == 10) matrices.emplace_back(MakeInt8(1, n, k, 30u + i).packed);
      else if (i % 3 == 1) matrices.emplace_back(MakeFp8(1, n, k, 128, 128, 30u + i).packed);
      else {
        const std::vector<float> w = testing::NormalValues(n * k, rng);
        matrices.emplace_back(cpu::PackedBf16::Pack(n, k, [&](int64_t j, int64_t t) { return FloatToBf16(w[j * k + t]); }));
      }
    }
    const int64_t k = 301;
    // Matrices [first, last) as the products of one call: 0..9 share k (and are more than one call holds);
    // 9 and 10, both int8, do not.
    const auto check = [&](size_t first, size_t last) {
      for (int64_t m : {1, 2, 17, 100}) {
        const std::vector<float> x = testing::NormalValues(m * k, rng);
        for (cpu::KernelPath kp : cpu::AvailablePaths()) {
          std::vector<std::vector<float>> shared, alone;
          std::vector<cpu::Product> products;
          shared.reserve(last - first);
          alone.reserve(last - first);
          for (size_t i = first; i < last; ++i) {
            const cpu::PackedMatrix& w = matrices[i];
            shared.emplace_back(static_cast<size_t>(m * w.rows()), -1.0f);
            alone.emplace_back(static_cast<size_t>(m * w.rows()), -2.0f);
            products.emplace_back(w, shared.back().data(), w.rows());
            cpu::MatMulOn(kp, pool, x.data(), m, k, w, alone.back().data(), w.rows());
          }
          cpu::MatMulSharedOn(kp, pool, x.data(), m, k, products);
          for (size_t i = 0; i < shared.size(); ++i)
            QVERIFY2(SameBits(shared[i].data(), alone[i].data(), shared[i].size()),
                     qPrintable(QString("%1, %2 rows, matrix %3").arg(cpu::PathName(kp)).arg(m).arg(first + i)));
        }
      }
    };
    check(0, 10);
    check(9, 11);
  }

  // With power-of-two scales every weight is a bf16 value, so the fp32 paths give the bf16 product's bits.
  void fp8EqualsItsBf16CopyOnFp32Paths() {
    ThreadPool pool(2);
    const Problem p = MakeFp8(20, 100, 400, 128, 128, 9u, true);
    std::vector<uint16_t> copy(static_cast<size_t>(p.n * p.k));
    for (int64_t j = 0; j < p.n; ++j)
      for (int64_t i = 0; i < p.k; ++i) {
        const float w = p.packed.At(j, i);
        copy[j * p.k + i] = FloatToBf16(w);
        QCOMPARE(Bf16ToFloat(copy[j * p.k + i]), w);
      }
    const auto bf16 = cpu::PackedBf16::FromRowMajor(copy.data(), p.n, p.k);
    for (cpu::KernelPath kp : cpu::AvailablePaths()) {
      if (cpu::SplitsIntoBf16(kp)) continue;
      std::vector<float> want(static_cast<size_t>(p.m * p.n));
      cpu::MatMulBf16On(kp, pool, p.x.data(), p.m, p.k, bf16, want.data(), p.n);
      const auto y = Run(kp, pool, p, 0, p.m);
      QVERIFY2(SameBits(y.data(), want.data(), y.size()), cpu::PathName(kp));
    }
  }

  void formatNamesRoundTrip() {
    for (auto f : {cpu::WeightFormat::kBf16, cpu::WeightFormat::kFp8E4m3, cpu::WeightFormat::kInt8})
      QCOMPARE(*cpu::WeightFormatFromName(cpu::WeightFormatName(f)), f);
    QVERIFY(!cpu::WeightFormatFromName("int4").ok());
    const std::string bf16 = cpu::ArithmeticNameOf(cpu::KernelPath::kAvx512F, cpu::WeightFormat::kBf16);
    const std::string fp8 = cpu::ArithmeticNameOf(cpu::KernelPath::kAvx512F, cpu::WeightFormat::kFp8E4m3);
    const std::string int8 = cpu::ArithmeticNameOf(cpu::KernelPath::kAmxBf16, cpu::WeightFormat::kInt8);
    QVERIFY(bf16 != fp8 && fp8 != int8 && bf16 != int8);
  }
};

QTEST_APPLESS_MAIN(TestMatmulQ8)
#include "test_matmul_q8.moc"
