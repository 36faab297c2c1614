// The exactness contract: grid-sized calls, thread counts, and anchors restore give bit-equal results.
#include <QTemporaryDir>
#include <QtTest>

#include <cstring>
#include <random>

#include "engine/compute/cpu/matmul.h"
#include "engine/runtime/forward.h"
#include "test_runtime_util.h"

using namespace anchorage;

namespace {

using testing::RandomIds;

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

class TestGrid : public QObject {
  Q_OBJECT
  QTemporaryDir dir_, fp8_dir_;
  std::unique_ptr<testing::LoadedWeights> model_, fp8_model_;

  // weights: "bf16" (the generated model), "fp8" (its FP8 variant) or "int8" (the BF16 one made int8).
  std::unique_ptr<Forward> Make(int64_t grid, int threads, const QString& weights = "bf16", KvDtype kv = KvDtype::kF32) {
    ForwardOptions options{grid, threads};
    options.int8_weights = weights == "int8";
    const testing::LoadedWeights& m = weights == "fp8" ? *fp8_model_ : *model_;
    ModelConfig config = m.config;
    config.kv_dtype = kv;
    auto f = Forward::Create(config, m.weights, options);
    return f.ok() ? std::move(f).value() : nullptr;
  }

 private slots:
  void initTestCase() {
    QVERIFY(dir_.isValid());
    auto m = testing::MakeModel(TinyModelSize::kTiny, 7, dir_.path().toStdString());
    QVERIFY2(m.ok(), m.ok() ? "" : m.status().ToString().c_str());
    model_ = std::move(m).value();
    QVERIFY(fp8_dir_.isValid());
    auto fp8 = testing::MakeModel(TinyModelSize::kTiny, 7, fp8_dir_.path().toStdString(), GeneratedDtype::kFp8);
    QVERIFY2(fp8.ok(), fp8.ok() ? "" : fp8.status().ToString().c_str());
    fp8_model_ = std::move(fp8).value();
  }

  void oneCallEqualsGridCalls_data() {
    QTest::addColumn<int>("grid");
    QTest::addColumn<int>("n");
    QTest::newRow("G64 n200") << 64 << 200;
    QTest::newRow("G128 n300") << 128 << 300;
    QTest::newRow("G128 n128") << 128 << 128;
  }
  // One Prefill call vs one call per grid chunk: logits (all rows), K/V rows, states, tails bit-equal.
  void oneCallEqualsGridCalls() {
    QFETCH(int, grid);
    QFETCH(int, n);
    auto f = Make(grid, 2);
    QVERIFY(f);
    const int64_t V = model_->config.vocab_size;
    const auto ids = RandomIds(n, V, 3u);
    SequenceState one(model_->config), many(model_->config);
    auto all = f->Prefill(one, ids, LogitsRows::kAll);
    QVERIFY(all.ok());
    std::vector<float> pieces;
    for (int64_t b = 0; b < n; b += grid) {
      const int64_t e = std::min<int64_t>(n, b + grid);
      auto part = f->Prefill(many, std::span(ids.data() + b, size_t(e - b)), LogitsRows::kAll);
      QVERIFY(part.ok());
      pieces.insert(pieces.end(), part->begin(), part->end());
    }
    QVERIFY(BitEqual(*all, pieces));
    QVERIFY(one.BitEqual(many));
    // Sanity: the comparison can fail: a different prompt gives a different state.
    SequenceState other(model_->config);
    auto ids2 = ids;
    ids2[0] = (ids2[0] + 1) % int32_t(V);
    QVERIFY(f->Prefill(other, ids2).ok());
    QVERIFY(!one.BitEqual(other));
  }

  // One thread and two threads write the same bits; so do two runs.
  void threadCountDoesNotChangeBits() {
    auto f1 = Make(64, 1), f2 = Make(64, 2);
    QVERIFY(f1 && f2);
    QCOMPARE(f1->threads(), 1);
    QCOMPARE(f2->threads(), 2);
    const auto ids = RandomIds(150, model_->config.vocab_size, 11u);
    SequenceState a(model_->config), b(model_->config), c(model_->config);
    auto la = f1->Prefill(a, ids, LogitsRows::kAll);
    auto lb = f2->Prefill(b, ids, LogitsRows::kAll);
    auto lc = f2->Prefill(c, ids, LogitsRows::kAll);
    QVERIFY(la.ok() && lb.ok() && lc.ok());
    QVERIFY(BitEqual(*la, *lb));
    QVERIFY(BitEqual(*lb, *lc));
    QVERIFY(a.BitEqual(b));
    // Decode and verify too.
    for (int i = 0; i < 3; ++i) {
      auto da = f1->Decode(a, ids[i]);
      auto db = f2->Decode(b, ids[i]);
      QVERIFY(da.ok() && db.ok());
      QVERIFY(BitEqual(*da, *db));
    }
    auto va = f1->Verify(a, std::span(ids.data(), 5));
    auto vb = f2->Verify(b, std::span(ids.data(), 5));
    QVERIFY(va.ok() && vb.ok());
    QVERIFY(BitEqual(*va, *vb));
    QVERIFY(a.BitEqual(b));
  }

  // A state copied after chunk k (anchor + K/V rows) and restored into a fresh state gives bit-equal
  // results for chunk k+1.
  void anchorRestoreResumesBitExactly() {
    auto f = Make(64, 2);
    QVERIFY(f);
    const auto ids = RandomIds(200, model_->config.vocab_size, 19u);
    SequenceState cold(model_->config);
    QVERIFY(f->Prefill(cold, std::span(ids.data(), 128)).ok());
    const Anchor anchor = cold.SaveAnchor();
    QCOMPARE(anchor.length, int64_t(128));
    QCOMPARE(anchor.bytes(), cold.anchor_bytes());
    auto rows = cold.CopyRows(0, 128);
    QVERIFY(rows.ok());
    auto cold_next = f->Prefill(cold, std::span(ids.data() + 128, 72), LogitsRows::kAll);
    QVERIFY(cold_next.ok());

    SequenceState warm(model_->config);
    QVERIFY(warm.WriteRows(*rows).ok());
    QVERIFY(warm.RestoreAnchor(anchor).ok());
    QCOMPARE(warm.length(), int64_t(128));
    auto warm_next = f->Prefill(warm, std::span(ids.data() + 128, 72), LogitsRows::kAll);
    QVERIFY(warm_next.ok());
    QVERIFY(BitEqual(*cold_next, *warm_next));
    QVERIFY(cold.BitEqual(warm));

    // Restoring the anchor into the advanced state rewinds it: the same chunk again, same bits.
    QVERIFY(cold.RestoreAnchor(anchor).ok());
    auto again = f->Prefill(cold, std::span(ids.data() + 128, 72), LogitsRows::kAll);
    QVERIFY(again.ok());
    QVERIFY(BitEqual(*cold_next, *again));

    // A malformed anchor is refused and changes nothing.
    Anchor bad = anchor;
    bad.data.pop_back();
    QVERIFY(!warm.RestoreAnchor(bad).ok());
    QVERIFY(cold.BitEqual(warm));
  }

  // Growing the K/V buffers (a step boundary crossed by decode) keeps every row: the result equals a
  // state reserved up front, bit for bit.
  void growthKeepsRows() {
    auto f = Make(64, 2);
    QVERIFY(f);
    const auto ids = RandomIds(SequenceState::kKvRowStep + 40, model_->config.vocab_size, 29u);
    const size_t pre = SequenceState::kKvRowStep - 10;
    SequenceState grown(model_->config), reserved(model_->config);
    QVERIFY(reserved.Reserve(2 * SequenceState::kKvRowStep).ok());
    QVERIFY(f->Prefill(grown, std::span(ids.data(), pre)).ok());
    QVERIFY(f->Prefill(reserved, std::span(ids.data(), pre)).ok());
    QCOMPARE(grown.capacity(), SequenceState::kKvRowStep);
    for (size_t i = pre; i < ids.size(); ++i) {
      auto a = f->Decode(grown, ids[i]);
      auto b = f->Decode(reserved, ids[i]);
      QVERIFY(a.ok() && b.ok());
      QVERIFY(BitEqual(*a, *b));
    }
    QCOMPARE(grown.capacity(), 2 * SequenceState::kKvRowStep);
    QVERIFY(grown.BitEqual(reserved));
    QVERIFY(!grown.CopyRows(0, grown.length() + 1).ok());
    KvRows wrong;
    wrong.begin = 0;
    wrong.end = 2;
    QVERIFY(!grown.WriteRows(wrong).ok());
  }

  // The 64-line contract: a prefill resumed from the state at any multiple of 64 writes what a cold
  // prefill of the whole prompt writes (state, K/V rows, last logits), on every kernel path the CPU
  // has, with 1 and 2 threads, for bf16, FP8 and int8 weights, and decode then continues identically.
  void resumeAtEvery64LineEqualsCold_data() {
    QTest::addColumn<int>("path");
    QTest::addColumn<int>("threads");
    QTest::addColumn<QString>("weights");
    for (cpu::KernelPath path : {cpu::KernelPath::kPortable, cpu::KernelPath::kAvx2Fma, cpu::KernelPath::kAvx512F,
                                 cpu::KernelPath::kAvx512Bf16, cpu::KernelPath::kAmxBf16})
      for (int threads : {1, 2})
        for (const char* weights : {"bf16", "fp8", "int8", "bf16 weights, bf16 K/V rows", "bf16 weights, fp8 K/V rows"})
          QTest::addRow("%s, %d thread(s), %s", cpu::PathName(path), threads, weights) << int(path) << threads << QString(weights);
  }
  void resumeAtEvery64LineEqualsCold() {
    QFETCH(int, path);
    QFETCH(int, threads);
    QFETCH(QString, weights);
    const auto kernel = static_cast<cpu::KernelPath>(path);
    if (!cpu::PathAvailable(kernel)) QSKIP(qPrintable(QString("this CPU cannot run the %1 kernels").arg(cpu::PathName(kernel))));
    const cpu::KernelPath before = cpu::ActivePath();
    QVERIFY(cpu::SetActivePath(kernel).ok());
    const bool narrow_rows = weights.contains("K/V");
    auto f = Make(1024, threads, narrow_rows ? "bf16" : weights,
                  !narrow_rows ? KvDtype::kF32 : weights.contains("fp8 K/V") ? KvDtype::kFp8 : KvDtype::kBf16);
    QVERIFY(f);
    const ModelConfig& config = f->config();
    const auto ids = RandomIds(700, model_->config.vocab_size, 23u);
    SequenceState cold(config);
    auto cold_logits = f->Prefill(cold, ids);
    QVERIFY(cold_logits.ok());
    auto cold_next = f->Decode(cold, ids[5]);
    QVERIFY(cold_next.ok());
    for (int64_t line = 64; line < 700; line += 64) {
      SequenceState head(config);
      QVERIFY(f->Prefill(head, std::span(ids.data(), size_t(line))).ok());
      SequenceState warm(config);
      auto rows = head.CopyRows(0, line);
      QVERIFY(rows.ok());
      QVERIFY(warm.WriteRows(*rows).ok());
      QVERIFY(warm.RestoreAnchor(head.SaveAnchor()).ok());
      auto warm_logits = f->Prefill(warm, std::span(ids.data() + line, size_t(700 - line)));
      QVERIFY(warm_logits.ok());
      QVERIFY2(BitEqual(*cold_logits, *warm_logits), qPrintable(QString("logits differ after resuming at %1").arg(line)));
      auto warm_next = f->Decode(warm, ids[5]);
      QVERIFY(warm_next.ok());
      QVERIFY2(BitEqual(*cold_next, *warm_next), qPrintable(QString("decode differs after resuming at %1").arg(line)));
      QVERIFY2(cold.BitEqual(warm), qPrintable(QString("state differs after resuming at %1").arg(line)));
    }
    QVERIFY(cpu::SetActivePath(before).ok());
  }

  void byteCounts() {
    SequenceState s(model_->config);
    const ModelConfig& c = model_->config;
    const int64_t gdn = c.num_linear_attention_layers(), att = c.num_full_attention_layers();
    QCOMPARE(s.anchor_bytes(), gdn * 4 * (c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim +
                                          (c.linear_conv_kernel_dim - 1) * c.conv_dim()));
    QCOMPARE(s.kv_bytes_per_token(), att * 2 * c.num_key_value_heads * c.head_dim * 4);
    QCOMPARE(SequenceState::AnchorBytes(c), s.anchor_bytes());
    QVERIFY(s.Reserve(10).ok());
    QCOMPARE(s.capacity(), SequenceState::kKvRowStep);
  }
};

QTEST_APPLESS_MAIN(TestGrid)
#include "test_grid.moc"
