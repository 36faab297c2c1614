// The fp32 attention product on every path equals its written-out order bit for bit (scores and
// values both run on it); a query row's attention output is the same whether it is decoded alone, prefilled in one
// call or in pieces, with any thread count; and it is within fp32 rounding of a double reference.
#include <QtTest>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "engine/compute/cpu/attention.h"
#include "engine/compute/cpu/fp32_block.h"
#include "engine/compute/cpu/matmul.h"
#include "engine/core/bf16.h"
#include "engine/core/fp8.h"

using namespace anchorage;

namespace {

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

bool SameBits(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * 4) == 0; }

const cpu::KernelPath kPaths[] = {cpu::KernelPath::kPortable, cpu::KernelPath::kAvx2Fma, cpu::KernelPath::kAvx512F,
                                  cpu::KernelPath::kEmulated16};

void AddPaths() {
  QTest::addColumn<int>("path");
  for (cpu::KernelPath p : kPaths) QTest::newRow(cpu::PathName(p)) << int(p);
}

#define FETCH_PATH_OR_SKIP(kp)                                                                              \
  QFETCH(int, path);                                                                                        \
  const auto kp = static_cast<cpu::KernelPath>(path);                                                       \
  if (!cpu::PathAvailable(kp)) QSKIP(qPrintable(QString("this CPU cannot run the %1 kernels").arg(cpu::PathName(kp))));

struct Problem {
  cpu::AttentionShape shape;
  int64_t length;  // keys
  std::vector<float> q, k, v;
  int64_t q_stride, kv_stride;
};

Problem Make(int64_t heads, int64_t kv_heads, int64_t hd, int64_t length, uint32_t seed) {
  Problem p;
  p.shape = {heads, kv_heads, hd, 1.0f / std::sqrt(float(hd))};
  p.length = length;
  p.q_stride = heads * hd;
  p.kv_stride = kv_heads * hd;
  p.q = Random(size_t(length * p.q_stride), seed);
  p.k = Random(size_t(length * p.kv_stride), seed + 1);
  p.v = Random(size_t(length * p.kv_stride), seed + 2);
  return p;
}

// Rows [t0, t0 + m) as one prefill call (positions t0..), on the active path.
std::vector<float> Prefill(ThreadPool& pool, const Problem& p, int64_t t0, int64_t m) {
  std::vector<float> out(size_t(m * p.q_stride), -9.0f);
  cpu::AttentionPrefill(pool, p.shape, p.q.data() + t0 * p.q_stride, p.q_stride, p.shape.head_dim, m, t0,
                        cpu::KvSource{p.k.data(), p.v.data(), p.kv_stride}, out.data(), p.q_stride);
  return out;
}

}  // namespace

class TestAttention : public QObject {
  Q_OBJECT
 private slots:
  void cleanup() { QVERIFY(cpu::SetActivePath(cpu::AvailablePaths().front()).ok()); }

  void rowProductsFollowTheirOrder_data() { AddPaths(); }
  void rowProductsFollowTheirOrder() {
    FETCH_PATH_OR_SKIP(kp);
    const cpu::Fp32Kernels& kernels = cpu::Fp32KernelsOf(kp);
    for (auto [rows, k, cols] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {3, 70, 64}, {13, 33, 17}, {4, 200, 256}, {6, 9, 40}}) {
      const auto a = Random(size_t(rows * k), 5), b = Random(size_t(k * (cols + 2)), 6);
      const int64_t ldy = cols + 1;
      std::vector<float> y(size_t(rows * ldy), -3.0f), start(y);
      cpu::RowsTimesArgs r{a.data(), k, rows, b.data(), cols + 2, k, cols, 0, y.data(), ldy, false};
      kernels.rows_times(r);
      // And the same product in two pieces: the first k/2 terms, then the rest accumulated.
      std::vector<float> z(start);
      cpu::RowsTimesArgs first = r, second = r;
      first.k = k / 2;
      first.y = z.data();
      second.a = a.data() + k / 2;
      second.b = b.data() + (k / 2) * (cols + 2);
      second.k = k - k / 2;
      second.y = z.data();
      second.accumulate = true;
      kernels.rows_times(first);
      kernels.rows_times(second);
      for (int64_t i = 0; i < rows; ++i) {
        QCOMPARE(y[i * ldy + cols], -3.0f);  // past cols untouched
        for (int64_t c = 0; c < cols; ++c) {
          float acc = 0.0f;
          for (int64_t t = 0; t < k; ++t) acc = std::fma(a[i * k + t], b[t * (cols + 2) + c], acc);
          QVERIFY2(SameBits(&y[i * ldy + c], &acc, 1), qPrintable(QString("y[%1][%2], %3x%4x%5").arg(i).arg(c).arg(rows).arg(k).arg(cols)));
          QVERIFY(SameBits(&z[i * ldy + c], &acc, 1));
        }
      }
    }
  }

  void rowsIndependentOfCallDecodeAndThreads_data() { AddPaths(); }
  void rowsIndependentOfCallDecodeAndThreads() {
    FETCH_PATH_OR_SKIP(kp);
    QVERIFY(cpu::SetActivePath(kp).ok());
    ThreadPool one(1), two(2);
    const Problem p = Make(8, 2, 64, 150, 9u);
    const auto all = Prefill(two, p, 0, p.length);
    QVERIFY(SameBits(all.data(), Prefill(one, p, 0, p.length).data(), all.size()));
    for (auto [t0, m] : {std::pair<int64_t, int64_t>{0, 1}, {5, 3}, {64, 64}, {70, 80}, {149, 1}}) {
      const auto part = Prefill(one, p, t0, m);
      QVERIFY2(SameBits(all.data() + t0 * p.q_stride, part.data(), part.size()), qPrintable(QString("rows %1..%2").arg(t0).arg(t0 + m)));
    }
    for (int64_t t : {0, 1, 63, 64, 100, 149}) {
      std::vector<float> out(size_t(p.q_stride));
      cpu::AttentionDecode(two, p.shape, p.q.data() + t * p.q_stride, p.shape.head_dim, t + 1, cpu::KvSource{p.k.data(), p.v.data(), p.kv_stride},
                           out.data());
      QVERIFY2(SameBits(all.data() + t * p.q_stride, out.data(), out.size()), qPrintable(QString("decode of row %1").arg(t)));
    }
  }

  // A branch of a batch: the rows from a 64-line on live in a buffer of their own; the bits stay.
  void rowsInTwoBuffersGiveTheSameBits_data() { AddPaths(); }
  void rowsInTwoBuffersGiveTheSameBits() {
    FETCH_PATH_OR_SKIP(kp);
    QVERIFY(cpu::SetActivePath(kp).ok());
    ThreadPool two(2);
    const Problem p = Make(8, 2, 64, 300, 11u);
    const auto whole = Prefill(two, p, 0, p.length);
    for (int64_t split : {64, 128, 256}) {
      const std::vector<float> k_tail(p.k.begin() + split * p.kv_stride, p.k.end()), v_tail(p.v.begin() + split * p.kv_stride, p.v.end());
      // The prefix buffers hold garbage from the split on: only the tail may be read there.
      std::vector<float> k_head = p.k, v_head = p.v;
      std::fill(k_head.begin() + split * p.kv_stride, k_head.end(), 1e30f);
      std::fill(v_head.begin() + split * p.kv_stride, v_head.end(), -1e30f);
      const cpu::KvSource kv{k_head.data(), v_head.data(), p.kv_stride, split, k_tail.data(), v_tail.data()};
      const int64_t m = p.length - split;
      std::vector<float> out(size_t(m * p.q_stride), -9.0f);
      cpu::AttentionPrefill(two, p.shape, p.q.data() + split * p.q_stride, p.q_stride, p.shape.head_dim, m, split, kv, out.data(), p.q_stride);
      QVERIFY2(SameBits(whole.data() + split * p.q_stride, out.data(), out.size()), qPrintable(QString("split at %1").arg(split)));
      // Decode reads one row's values in place: from the prefix below the split, from the tail above it.
      for (int64_t t : {split, split + 1, p.length - 1}) {
        std::vector<float> row(size_t(p.q_stride), -9.0f);
        cpu::AttentionDecode(two, p.shape, p.q.data() + t * p.q_stride, p.shape.head_dim, t + 1, kv, row.data());
        QVERIFY2(SameBits(whole.data() + t * p.q_stride, row.data(), row.size()),
                 qPrintable(QString("decode of row %1, split at %2").arg(t).arg(split)));
      }
    }
  }

  // bf16 rows are read widened: the output equals, bit for bit, the fp32 kernel's over the same values
  // widened beforehand, prefilled, decoded and split; StoreKvRows rounds each value to nearest even.
  void bf16RowsReadAsTheirFp32Values_data() { AddPaths(); }
  void bf16RowsReadAsTheirFp32Values() {
    FETCH_PATH_OR_SKIP(kp);
    QVERIFY(cpu::SetActivePath(kp).ok());
    ThreadPool two(2);
    Problem p = Make(8, 2, 72, 200, 13u);  // head_dim 72: columns past the whole 4- and 32-wide pieces
    std::vector<uint8_t> k16(p.k.size() * 2), v16(p.v.size() * 2);
    cpu::StoreKvRows(p.k.data(), p.length, p.kv_stride, KvDtype::kBf16, k16.data());
    cpu::StoreKvRows(p.v.data(), p.length, p.kv_stride, KvDtype::kBf16, v16.data());
    for (size_t i = 0; i < p.k.size(); ++i) {
      uint16_t h;
      std::memcpy(&h, k16.data() + 2 * i, 2);
      QCOMPARE(h, FloatToBf16(p.k[i]));
    }
    for (size_t i = 0; i < p.k.size(); ++i) {
      uint16_t hk, hv;
      std::memcpy(&hk, k16.data() + 2 * i, 2);
      std::memcpy(&hv, v16.data() + 2 * i, 2);
      p.k[i] = Bf16ToFloat(hk);
      p.v[i] = Bf16ToFloat(hv);
    }
    const auto widened = Prefill(two, p, 0, p.length);
    const cpu::KvSource kv(KvDtype::kBf16, k16.data(), v16.data(), p.kv_stride);
    std::vector<float> out(widened.size(), -9.0f);
    cpu::AttentionPrefill(two, p.shape, p.q.data(), p.q_stride, p.shape.head_dim, p.length, 0, kv, out.data(), p.q_stride);
    QVERIFY(SameBits(widened.data(), out.data(), out.size()));
    const int64_t split = 128;
    const cpu::KvSource two_buffers(KvDtype::kBf16, k16.data(), v16.data(), p.kv_stride, split, k16.data() + split * p.kv_stride * 2,
                                    v16.data() + split * p.kv_stride * 2);
    for (int64_t t : {0, 63, 127, 128, 199}) {
      std::vector<float> row(size_t(p.q_stride), -9.0f);
      cpu::AttentionDecode(two, p.shape, p.q.data() + t * p.q_stride, p.shape.head_dim, t + 1, t % 2 ? kv : two_buffers, row.data());
      QVERIFY2(SameBits(widened.data() + t * p.q_stride, row.data(), row.size()), qPrintable(QString("decode of row %1").arg(t)));
    }
  }

  // fp8 rows: each block of 32 values keeps the least power of two that brings its largest magnitude to 448 or
  // below, and each value over it as the nearest e4m3; read widened, the output equals the fp32 kernel's over
  // code x scale, bit for bit, prefilled, decoded and split.
  void fp8RowsReadAsTheirFp32Values_data() { AddPaths(); }
  void fp8RowsReadAsTheirFp32Values() {
    FETCH_PATH_OR_SKIP(kp);
    QVERIFY(cpu::SetActivePath(kp).ok());
    ThreadPool two(2);
    Problem p = Make(8, 2, 96, 200, 17u);
    for (size_t i = 0; i < p.k.size(); i += 97) p.k[i] *= 300.0f;  // blocks whose scale an outlier sets
    const int64_t width = p.kv_stride, row_bytes = KvRowBytes(KvDtype::kFp8, width);
    QCOMPARE(row_bytes, width + width / 32);
    std::vector<uint8_t> k8(size_t(p.length * row_bytes)), v8(k8.size());
    cpu::StoreKvRows(p.k.data(), p.length, width, KvDtype::kFp8, k8.data());
    cpu::StoreKvRows(p.v.data(), p.length, width, KvDtype::kFp8, v8.data());
    for (auto [values, rows] : {std::pair{&p.k, &k8}, std::pair{&p.v, &v8}})
      for (int64_t r = 0; r < p.length; ++r)
        for (int64_t b = 0; b < width / 32; ++b) {
          const float* block = values->data() + r * width + b * 32;
          const uint8_t* row = rows->data() + r * row_bytes;
          float amax = 0.0f;
          for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(block[i]));
          const int e = int(row[width + b]) - 127;
          QVERIFY2(std::ldexp(double(amax), -e) <= 448.0 && std::ldexp(double(amax), 1 - e) > 448.0, qPrintable(QString("row %1 block %2").arg(r).arg(b)));
          for (int i = 0; i < 32; ++i) {
            QCOMPARE(row[b * 32 + i], FloatToFp8E4m3(float(std::ldexp(double(block[i]), -e))));
            QVERIFY(std::fabs(double(Fp8E4m3ToFloat(row[b * 32 + i])) * std::ldexp(1.0, e) - block[i]) <= std::ldexp(amax, -3));
          }
        }
    const cpu::KvSource kv(KvDtype::kFp8, k8.data(), v8.data(), width);
    for (int64_t i = 0; i < p.length * width; ++i) {
      p.k[size_t(i)] = kv.ValueAt(k8.data() + i / width * row_bytes, i % width);
      p.v[size_t(i)] = kv.ValueAt(v8.data() + i / width * row_bytes, i % width);
    }
    const auto widened = Prefill(two, p, 0, p.length);
    std::vector<float> out(widened.size(), -9.0f);
    cpu::AttentionPrefill(two, p.shape, p.q.data(), p.q_stride, p.shape.head_dim, p.length, 0, kv, out.data(), p.q_stride);
    QVERIFY(SameBits(widened.data(), out.data(), out.size()));
    const int64_t split = 128;
    const cpu::KvSource two_buffers(KvDtype::kFp8, k8.data(), v8.data(), width, split, k8.data() + split * row_bytes, v8.data() + split * row_bytes);
    for (int64_t t : {0, 63, 127, 128, 199}) {
      std::vector<float> row(size_t(p.q_stride), -9.0f);
      cpu::AttentionDecode(two, p.shape, p.q.data() + t * p.q_stride, p.shape.head_dim, t + 1, t % 2 ? kv : two_buffers, row.data());
      QVERIFY2(SameBits(widened.data() + t * p.q_stride, row.data(), row.size()), qPrintable(QString("decode of row %1").arg(t)));
    }
  }

  // The fp8 scale at its edges: zeros, tiny and huge magnitudes, 448 itself, NaN and infinity keep normal factors.
  void fp8ScaleEdges() {
    QCOMPARE(cpu::KvFp8Exponent(448.0f), 0);
    QCOMPARE(cpu::KvFp8Exponent(448.5f), 1);
    QCOMPARE(cpu::KvFp8Exponent(449.0f), 1);
    QCOMPARE(cpu::KvFp8Exponent(224.0f), -1);
    QCOMPARE(cpu::KvFp8Exponent(256.0f), 0);
    QCOMPARE(cpu::KvFp8Exponent(1.0f), -8);
    QCOMPARE(cpu::KvFp8Exponent(0.0f), -100);
    QCOMPARE(cpu::KvFp8Exponent(1e-38f), -100);
    QCOMPARE(cpu::KvFp8Exponent(3e38f), 119);
    QCOMPARE(cpu::KvFp8Exponent(std::numeric_limits<float>::infinity()), 119);
    QCOMPARE(cpu::KvFp8Exponent(std::nanf("")), 119);
    for (float amax = 1e-27f; amax < 1e30f; amax *= 1.37f) {  // within the clamp
      const int e = cpu::KvFp8Exponent(amax);
      QVERIFY(std::ldexp(double(amax), -e) <= 448.0 && std::ldexp(double(amax), 1 - e) > 448.0);
    }
    std::vector<float> row(64, 0.0f);
    row[32] = std::nanf("");
    row[33] = 2.0f;
    std::vector<uint8_t> out(size_t(KvRowBytes(KvDtype::kFp8, 64)));
    cpu::StoreKvRows(row.data(), 1, 64, KvDtype::kFp8, out.data());
    QCOMPARE(int(out[64]), 127 - 100);  // all zeros: the least factor, codes 0
    QCOMPARE(int(out[0]), 0);
    QCOMPARE(int(out[65]), 127 - 7);  // NaN leaves the scale to 2.0
    QVERIFY(Fp8E4m3IsNan(out[32]));
    QCOMPARE(Fp8E4m3ToFloat(out[33]) * KvFp8Scale(out[65]), 2.0f);
  }

  // Decode reads keys in place, many lanes at a time, in spans of keys and columns over the pool: at model-sized heads,
  // groups of one to sixteen heads, lengths past a span and rows of either dtype, its bits are a one-row prefill's.
  void decodeAtModelShapesEqualsPrefill_data() { AddPaths(); }
  void decodeAtModelShapesEqualsPrefill() {
    FETCH_PATH_OR_SKIP(kp);
    QVERIFY(cpu::SetActivePath(kp).ok());
    ThreadPool one(1), three(3);
    for (auto [heads, kv_heads, hd, length] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{8, 2, 256, 1100}, {12, 2, 128, 530},
                                              {16, 1, 64, 77}, {3, 3, 32, 17}, {5, 1, 72, 40}, {2, 1, 36, 20}}) {
      Problem p = Make(heads, kv_heads, hd, length, uint32_t(heads * 131 + length));
      for (KvDtype dtype : {KvDtype::kF32, KvDtype::kBf16, KvDtype::kFp8}) {
        if (dtype == KvDtype::kFp8 && hd % kKvFp8Block != 0) continue;
        std::vector<uint8_t> k(p.k.size() * 4), v(p.v.size() * 4);
        cpu::StoreKvRows(p.k.data(), length, p.kv_stride, dtype, k.data());
        cpu::StoreKvRows(p.v.data(), length, p.kv_stride, dtype, v.data());
        const int64_t split = length / 2, row_bytes = KvRowBytes(dtype, p.kv_stride);
        const cpu::KvSource whole(dtype, k.data(), v.data(), p.kv_stride);
        const cpu::KvSource halves(dtype, k.data(), v.data(), p.kv_stride, split, k.data() + split * row_bytes, v.data() + split * row_bytes);
        for (int64_t t : {int64_t{0}, length / 3, length - 1}) {
          std::vector<float> want(size_t(p.q_stride), -9.0f), got(want), got_split(want);
          cpu::AttentionPrefill(one, p.shape, p.q.data() + t * p.q_stride, p.q_stride, hd, 1, t, whole, want.data(), p.q_stride);
          cpu::AttentionDecode(three, p.shape, p.q.data() + t * p.q_stride, hd, t + 1, whole, got.data());
          cpu::AttentionDecode(one, p.shape, p.q.data() + t * p.q_stride, hd, t + 1, halves, got_split.data());
          const QString what = QString("%1 heads, %2 kv heads, head_dim %3, row %4, %5").arg(heads).arg(kv_heads).arg(hd).arg(t).arg(KvDtypeName(dtype));
          QVERIFY2(SameBits(want.data(), got.data(), want.size()), qPrintable(what));
          QVERIFY2(SameBits(want.data(), got_split.data(), want.size()), qPrintable(what + ", split"));
        }
      }
    }
  }

  void matchesDoubleReference() {
    ThreadPool pool(2);
    const Problem p = Make(4, 2, 32, 90, 13u);
    const auto out = Prefill(pool, p, 0, p.length);
    const int64_t hd = p.shape.head_dim, group = 2;
    double worst = 0.0;
    for (int64_t t = 0; t < p.length; ++t)
      for (int64_t h = 0; h < 4; ++h) {
        const int64_t kvh = h / group;
        std::vector<double> s(size_t(t + 1));
        double mx = -1e300, sum = 0.0;
        for (int64_t l = 0; l <= t; ++l) {
          double dot = 0.0;
          for (int64_t e = 0; e < hd; ++e) dot += double(p.q[t * p.q_stride + h * hd + e]) * p.k[l * p.kv_stride + kvh * hd + e];
          s[l] = dot * p.shape.scale;
          mx = std::max(mx, s[l]);
        }
        for (auto& x : s) sum += (x = std::exp(x - mx));
        for (int64_t e = 0; e < hd; ++e) {
          double o = 0.0;
          for (int64_t l = 0; l <= t; ++l) o += s[l] / sum * p.v[l * p.kv_stride + kvh * hd + e];
          worst = std::max(worst, std::abs(o - out[t * p.q_stride + h * hd + e]));
        }
      }
    qInfo("worst |out - double| %.3g", worst);
    QVERIFY(worst < 1e-5);
  }
};

QTEST_APPLESS_MAIN(TestAttention)
#include "test_attention.moc"
