// The engine's forward against a double-precision scalar model written from the math, and
// prefill/decode consistency, on the generated tiny model.
#include <QTemporaryDir>
#include <QtTest>

#include "tests/kernel_path_env.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>

#include "engine/compute/cpu/matmul.h"
#include "engine/core/bf16.h"
#include "engine/model/safetensors.h"

#include "engine/runtime/forward.h"
#include "engine/runtime/generator.h"
#include "reference_forward.h"
#include "test_runtime_util.h"

using namespace anchorage;

namespace {

using testing::RandomIds;

// Max |a - b| over one logits row; b is double.
double RowDiff(const float* a, const double* b, int64_t n, double* max_ref) {
  double m = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    m = std::max(m, std::abs(double(a[i]) - b[i]));
    *max_ref = std::max(*max_ref, std::abs(b[i]));
  }
  return m;
}

int32_t Argmax(const float* p, int64_t n) { return static_cast<int32_t>(std::max_element(p, p + n) - p); }

// A state's recurrent part and its K/V rows, as bytes: two states with equal bits compare equal.
std::pair<std::vector<float>, std::vector<uint8_t>> StateBits(const SequenceState& s) {
  auto rows = s.CopyRows(0, s.length());
  return {s.SaveAnchor().data, rows.ok() ? rows->data : std::vector<uint8_t>()};
}

}  // namespace

class TestForward : public QObject {
  Q_OBJECT
  QTemporaryDir dir_;
  std::unique_ptr<testing::LoadedWeights> model_;
  std::unique_ptr<Forward> forward_;

  // A forward of the tiny model whose states keep K/V rows of dtype, on grid, with 2 threads; *config its config.
  std::unique_ptr<Forward> ForwardWith(KvDtype dtype, int64_t grid, ModelConfig* config) {
    *config = model_->config;
    config->kv_dtype = dtype;
    auto created = Forward::Create(*config, model_->weights, ForwardOptions{grid, 2});
    return created.ok() ? std::move(created).value() : nullptr;
  }

  // fp32 activations with bf16-exact weights: every op rounds at ~6e-8 relative; over 4 layers of
  // widths <= 128 the accumulated error stays below ~1e-5 relative to the largest logit. We allow
  // 1e-4 of max(1, max |logit|), ten times that, as the bound.
  static double Tolerance(double max_ref) { return 1e-4 * std::max(1.0, max_ref); }

 private slots:
  void initTestCase() {
    ANCHORAGE_SKIP_UNLESS_KERNEL_PATH_RUNS();
    QVERIFY(dir_.isValid());
    auto m = testing::MakeModel(TinyModelSize::kTiny, 42, dir_.path().toStdString());
    QVERIFY2(m.ok(), m.ok() ? "" : m.status().ToString().c_str());
    model_ = std::move(m).value();
    auto f = Forward::Create(model_->config, model_->weights, ForwardOptions{64, 2});
    QVERIFY2(f.ok(), f.ok() ? "" : f.status().ToString().c_str());
    forward_ = std::move(f).value();
  }

  // F32 and F16 checkpoints load: their matrices are rounded to BF16 once. An F32 copy of a BF16
  // model holds the same values, so its logits are the same bits; F16 rounds small weights.
  void f32AndF16WeightFilesLoad() {
    QTemporaryDir out;
    const std::vector<int32_t> ids = RandomIds(40, model_->config.vocab_size, 5);
    SequenceState base_state(model_->config);
    auto base = forward_->Prefill(base_state, ids);
    QVERIFY(base.ok());
    for (DType dtype : {DType::kF32, DType::kF16}) {
      std::vector<TensorToWrite> tensors;
      for (const auto& [name, t] : model_->set->tensors()) {
        std::string bytes;
        for (int64_t i = 0; i < t.numel(); ++i) {
          const float v = t.At(i);
          if (dtype == DType::kF32) {
            bytes.append(reinterpret_cast<const char*>(&v), 4);
          } else {
            const uint16_t h = FloatToFp16(v);
            bytes.append(reinterpret_cast<const char*>(&h), 2);
          }
        }
        tensors.push_back({name, dtype, t.shape, std::move(bytes)});
      }
      const std::string dir = out.path().toStdString() + "/" + DTypeName(dtype);
      QVERIFY(std::filesystem::create_directories(dir));
      QVERIFY(WriteSafetensors(dir + "/model.safetensors", tensors).ok());
      auto set = SafetensorsSet::OpenDirectory(dir);
      QVERIFY2(set.ok(), set.status().ToString().c_str());
      auto weights = MapWeights(model_->config, *set);
      QVERIFY2(weights.ok(), weights.status().ToString().c_str());
      auto f = Forward::Create(model_->config, *weights, ForwardOptions{64, 2});
      QVERIFY2(f.ok(), f.status().ToString().c_str());
      QVERIFY((*f)->converted_matrices() > 0);
      SequenceState state(model_->config);
      auto logits = (*f)->Prefill(state, ids);
      QVERIFY(logits.ok());
      double worst = 0, largest = 0;
      for (size_t i = 0; i < base->size(); ++i) {
        worst = std::max(worst, std::abs(double((*logits)[i]) - double((*base)[i])));
        largest = std::max(largest, std::abs(double((*base)[i])));
      }
      if (dtype == DType::kF32) QVERIFY2(worst == 0.0, std::to_string(worst).c_str());
      else QVERIFY2(worst <= 1e-2 * std::max(1.0, largest), std::to_string(worst).c_str());
    }
  }

  void prefillMatchesReference_data() {
    QTest::addColumn<int>("n");
    for (int n : {1, 3, 8, 9, 64, 65, 150}) QTest::newRow(QByteArray::number(n)) << n;
  }
  // All rows of a prefill (grid 64: several grid chunks, GDN chunks and a partial tail).
  void prefillMatchesReference() {
    QFETCH(int, n);
    const int64_t V = model_->config.vocab_size;
    const auto ids = RandomIds(n, V, 17u + static_cast<uint32_t>(n));
    const auto ref = reference::Logits(model_->config, model_->weights, ids);
    SequenceState state(model_->config);
    auto logits = forward_->Prefill(state, ids, LogitsRows::kAll);
    QVERIFY(logits.ok());
    QCOMPARE(state.length(), int64_t(n));
    double worst = 0.0, max_ref = 0.0;
    for (int64_t t = 0; t < n; ++t) worst = std::max(worst, RowDiff(&(*logits)[t * V], &ref[t * V], V, &max_ref));
    qInfo("n=%d max |engine - reference| = %.3g (max |logit| %.3g)", n, worst, max_ref);
    QVERIFY(max_ref > 0.1);  // the model is not degenerate
    QVERIFY2(worst < Tolerance(max_ref), "prefill logits disagree with the double reference");
    // kLast returns exactly the last row of kAll.
    SequenceState s2(model_->config);
    auto last = forward_->Prefill(s2, ids, LogitsRows::kLast);
    QVERIFY(last.ok());
    QVERIFY(std::equal(last->begin(), last->end(), logits->begin() + (n - 1) * V));
  }

  // K/V rows kept in bf16 (each value rounded once, relative error <= 2^-9) or fp8 (e4m3 over a power-of-two
  // scale a block of 32: relative error <= 2^-4 of the block's largest): the logits stay within the bounds
  // docs/engine.md names for them, a fraction of max(1, max |logit|).
  void narrowRowsStayNearTheReference_data() {
    QTest::addColumn<int>("dtype");
    QTest::addColumn<double>("bound");
    QTest::addColumn<int64_t>("row_bytes_per_f32_kilobyte");
    QTest::newRow("bf16") << int(KvDtype::kBf16) << 2e-3 << int64_t{512};
    QTest::newRow("fp8") << int(KvDtype::kFp8) << 2e-2 << int64_t{264};
  }
  void narrowRowsStayNearTheReference() {
    QFETCH(int, dtype);
    QFETCH(double, bound);
    QFETCH(int64_t, row_bytes_per_f32_kilobyte);
    const int64_t V = model_->config.vocab_size, n = 150;
    ModelConfig config = model_->config;
    config.kv_dtype = static_cast<KvDtype>(dtype);
    auto f = Forward::Create(config, model_->weights, ForwardOptions{64, 2});
    QVERIFY(f.ok());
    const auto ids = RandomIds(n, V, 91u);
    const auto ref = reference::Logits(model_->config, model_->weights, ids);
    SequenceState state(config);
    QCOMPARE(state.kv_bytes_per_token() * 1024, SequenceState(model_->config).kv_bytes_per_token() * row_bytes_per_f32_kilobyte);
    auto logits = (*f)->Prefill(state, ids, LogitsRows::kAll);
    QVERIFY(logits.ok());
    double worst = 0.0, max_ref = 0.0;
    for (int64_t t = 0; t < n; ++t) worst = std::max(worst, RowDiff(&(*logits)[t * V], &ref[t * V], V, &max_ref));
    qInfo("%s K/V rows, n=%lld: max |engine - reference| = %.3g (max |logit| %.3g)", KvDtypeName(config.kv_dtype), static_cast<long long>(n),
          worst, max_ref);
    QVERIFY2(worst < bound * std::max(1.0, max_ref), "narrow K/V rows moved the logits past their bound");
    QVERIFY2(worst > 0.0, "the rows rounded nothing: the state kept fp32 rows");
  }

  // Fast precision on the bf16 arithmetics (their emulations, and the CPU's units where it has them):
  // a row's logits lie within 0.197 of the fp64 reference at the median over the rows (llama.cpp BF16's
  // distance on this model) and within 1 at worst, every row whose reference top two lie further apart
  // than twice its distance keeps its argmax, and a resume at a 64-line gives the cold prefill's bits.
  void fastPrecisionStaysNearTheReferenceAndResumesExactly_data() {
    QTest::addColumn<int>("path");
    for (cpu::KernelPath path : {cpu::KernelPath::kEmulatedBf16, cpu::KernelPath::kEmulatedAmx, cpu::KernelPath::kAvx512Bf16,
                                 cpu::KernelPath::kAmxBf16})
      QTest::newRow(cpu::PathName(path)) << int(path);
  }
  void fastPrecisionStaysNearTheReferenceAndResumesExactly() {
    QFETCH(int, path);
    const auto kp = static_cast<cpu::KernelPath>(path);
    if (!cpu::PathAvailable(kp)) QSKIP(qPrintable(QString("this CPU cannot run the %1 kernels").arg(cpu::PathName(kp))));
    const cpu::KernelPath before = cpu::ActivePath();
    struct Restore {
      cpu::KernelPath path;
      ~Restore() {
        cpu::SetPrecision(cpu::Precision::kExact);
        (void)cpu::SetActivePath(path);
      }
    } restore{before};
    cpu::SetPrecision(cpu::Precision::kFast);
    QVERIFY(cpu::SetActivePath(kp).ok());
    const int64_t V = model_->config.vocab_size, n = 150;
    auto f = Forward::Create(model_->config, model_->weights, ForwardOptions{64, 2});
    QVERIFY(f.ok());
    const auto ids = RandomIds(n, V, 91u);
    const auto ref = reference::Logits(model_->config, model_->weights, ids);
    SequenceState cold(model_->config);
    auto logits = (*f)->Prefill(cold, ids, LogitsRows::kAll);
    QVERIFY(logits.ok());
    double worst = 0.0, max_ref = 0.0;
    std::vector<double> distances;
    for (int64_t t = 0; t < n; ++t) distances.push_back(RowDiff(&(*logits)[t * V], &ref[t * V], V, &max_ref));
    worst = *std::max_element(distances.begin(), distances.end());
    std::vector<double> sorted = distances;
    std::nth_element(sorted.begin(), sorted.begin() + n / 2, sorted.end());
    const double median = sorted[size_t(n / 2)];
    int clear_rows = 0;
    for (int64_t t = 0; t < n; ++t) {
      std::vector<double> row(ref.begin() + t * V, ref.begin() + (t + 1) * V);
      std::partial_sort(row.begin(), row.begin() + 2, row.end(), std::greater<>());
      if (row[0] - row[1] <= 2 * distances[size_t(t)]) continue;
      ++clear_rows;
      const int32_t want = static_cast<int32_t>(std::max_element(ref.begin() + t * V, ref.begin() + (t + 1) * V) - (ref.begin() + t * V));
      QCOMPARE(Argmax(&(*logits)[t * V], V), want);
    }
    qInfo("fast precision on %s, n=%lld: |engine - reference| median %.3g, max %.3g (max |logit| %.3g); %d rows with a clear argmax kept it",
          cpu::PathName(kp), static_cast<long long>(n), median, worst, max_ref, clear_rows);
    QVERIFY2(median <= 0.197, "fast precision moved the logits further than llama.cpp BF16's");
    QVERIFY2(worst <= 1.0, "fast precision moved a row's logits by more than 1");
    QVERIFY2(worst > 1e-3, "fast precision rounded nothing: the products ran exact");
    SequenceState head(model_->config);
    QVERIFY((*f)->Prefill(head, std::span(ids.data(), size_t(64))).ok());
    auto warm = (*f)->Prefill(head, std::span(ids.data() + 64, ids.size() - 64), LogitsRows::kAll);
    QVERIFY(warm.ok());
    QVERIFY(head.BitEqual(cold));
    QVERIFY(std::equal(warm->begin(), warm->end(), logits->begin() + 64 * V));
  }

  // Prefill some tokens, then decode one at a time; each decode row matches the reference row.
  void decodeMatchesReference() {
    const int64_t V = model_->config.vocab_size;
    const auto ids = RandomIds(80, V, 5u);
    const auto ref = reference::Logits(model_->config, model_->weights, ids);
    for (int64_t prefill : {int64_t(1), int64_t(63), int64_t(64)}) {
      SequenceState state(model_->config);
      QVERIFY(forward_->Prefill(state, std::span(ids.data(), size_t(prefill))).ok());
      double worst = 0.0, max_ref = 0.0;
      for (int64_t t = prefill; t < int64_t(ids.size()); ++t) {
        auto logits = forward_->Decode(state, ids[t]);
        QVERIFY(logits.ok());
        worst = std::max(worst, RowDiff(logits->data(), &ref[t * V], V, &max_ref));
      }
      qInfo("prefill %lld then decode: max diff %.3g", static_cast<long long>(prefill), worst);
      QVERIFY2(worst < Tolerance(max_ref), "decode logits disagree with the double reference");
    }
  }

  // Verify(k ids) returns the same rows as the reference for those positions.
  void verifyMatchesReference() {
    const int64_t V = model_->config.vocab_size;
    const auto ids = RandomIds(40, V, 8u);
    const auto ref = reference::Logits(model_->config, model_->weights, ids);
    SequenceState state(model_->config);
    QVERIFY(forward_->Prefill(state, std::span(ids.data(), 36)).ok());
    auto rows = forward_->Verify(state, std::span(ids.data() + 36, 4));
    QVERIFY(rows.ok());
    QCOMPARE(int64_t(rows->size()), 4 * V);
    double worst = 0.0, max_ref = 0.0;
    for (int64_t r = 0; r < 4; ++r) worst = std::max(worst, RowDiff(&(*rows)[r * V], &ref[(36 + r) * V], V, &max_ref));
    QVERIFY2(worst < Tolerance(max_ref), "verify rows disagree with the double reference");
  }

  // Prefill n then decode 1 agrees with prefill n+1 (two arithmetic orders, same math).
  void prefillThenDecodeMatchesLongerPrefill() {
    const int64_t V = model_->config.vocab_size;
    const auto ids = RandomIds(130, V, 23u);
    for (int64_t n : {int64_t(1), int64_t(64), int64_t(100), int64_t(129)}) {
      SequenceState a(model_->config), b(model_->config);
      QVERIFY(forward_->Prefill(a, std::span(ids.data(), size_t(n))).ok());
      auto dec = forward_->Decode(a, ids[n]);
      auto pre = forward_->Prefill(b, std::span(ids.data(), size_t(n + 1)));
      QVERIFY(dec.ok() && pre.ok());
      double worst = 0.0, max_ref = 0.0;
      for (int64_t i = 0; i < V; ++i) {
        worst = std::max(worst, double(std::abs((*dec)[i] - (*pre)[i])));
        max_ref = std::max(max_ref, double(std::abs((*pre)[i])));
      }
      QVERIFY2(worst < Tolerance(max_ref), "prefill n + decode 1 differs from prefill n+1");
    }
  }

  // Greedy generation through Generator (prefill + decodes) gives the tokens a full re-prefill
  // per step picks.
  void greedyGenerationMatchesRepeatedPrefill() {
    const int64_t V = model_->config.vocab_size;
    auto prompt = RandomIds(70, V, 31u);
    SamplingParams p;
    p.temperature = 0.0f;
    p.max_tokens = 12;
    Generator gen(*forward_, nullptr);
    SequenceState state(model_->config);
    int calls = 0;
    auto result = gen.Generate(state, prompt, p, [&](const GeneratedToken&) { ++calls; return true; });
    QVERIFY(result.ok());
    QCOMPARE(int64_t(result->tokens.size()), int64_t(12));
    QCOMPARE(calls, 12);
    QVERIFY(result->finish == FinishReason::kLength);
    QCOMPARE(state.length(), int64_t(70 + 11));
    std::vector<int32_t> seq = prompt;
    for (int i = 0; i < 12; ++i) {
      SequenceState s(model_->config);
      auto logits = forward_->Prefill(s, seq);
      QVERIFY(logits.ok());
      const int32_t next = Argmax(logits->data(), V);
      QCOMPARE(result->tokens[i], next);
      seq.push_back(next);
    }
  }

  // A decode batch over states of several lengths gives each logits row and each state the bits of its own
  // Decode, step after step, with each K/V dtype; a bad batch changes no state.
  void decodeBatchEqualsDecodeAlone() {
    const int64_t V = model_->config.vocab_size;
    for (KvDtype dtype : {KvDtype::kF32, KvDtype::kBf16, KvDtype::kFp8}) {
      ModelConfig config;
      const std::unique_ptr<Forward> created = ForwardWith(dtype, 64, &config);
      QVERIFY(created);
      Forward& forward = *created;
      std::vector<std::unique_ptr<SequenceState>> batched, alone;
      std::vector<SequenceState*> batch;
      for (int64_t length : {7, 1, 64, 130, 63}) {
        const auto prompt = RandomIds(length, V, uint32_t(length));
        batched.push_back(std::make_unique<SequenceState>(config));
        alone.push_back(std::make_unique<SequenceState>(config));
        QVERIFY(forward.Prefill(*batched.back(), prompt).ok());
        QVERIFY(forward.Prefill(*alone.back(), prompt).ok());
        batch.push_back(batched.back().get());
      }
      for (int step = 0; step < 3; ++step) {
        const auto ids = RandomIds(int64_t(batch.size()), V, uint32_t(100 + step));
        auto logits = forward.DecodeBatch(batch, ids);
        QVERIFY2(logits.ok(), logits.ok() ? "" : logits.status().ToString().c_str());
        for (size_t i = 0; i < batch.size(); ++i) {
          auto own = forward.Decode(*alone[i], ids[i]);
          QVERIFY(own.ok());
          QVERIFY2(std::memcmp(logits->data() + i * V, own->data(), size_t(V) * 4) == 0,
                   qPrintable(QString("%1 rows: logits of state %2 at step %3").arg(KvDtypeName(dtype)).arg(i).arg(step)));
          QCOMPARE(batched[i]->length(), alone[i]->length());
          QVERIFY2(StateBits(*batched[i]) == StateBits(*alone[i]), qPrintable(QString("state %1 at step %2").arg(i).arg(step)));
        }
      }
      const auto before = StateBits(*batch[0]);
      const int64_t length = batch[0]->length();
      const std::vector<SequenceState*> twice = {batch[0], batch[1], batch[0]};
      QVERIFY(!forward.DecodeBatch(twice, std::vector<int32_t>{1, 2, 3}).ok());
      QVERIFY(!forward.DecodeBatch(std::span(batch.data(), 2), std::vector<int32_t>{1, int32_t(V)}).ok());
      QVERIFY(!forward.DecodeBatch(std::span(batch.data(), 2), std::vector<int32_t>{1}).ok());
      QCOMPARE(batch[0]->length(), length);
      QVERIFY(StateBits(*batch[0]) == before);
    }
  }

  // A prefill piece that carries other states' decodes (a mixed step) gives the piece's logits, its
  // state and its MTP head's rows, and every rider's logits and state, the bits each gets alone, with
  // each K/V dtype; a piece across a grid line leaves the riders to the caller.
  void prefillCarryingEqualsPrefillAndDecodes() {
    const int64_t V = model_->config.vocab_size;
    for (KvDtype dtype : {KvDtype::kF32, KvDtype::kBf16, KvDtype::kFp8}) {
      ModelConfig config;
      const std::unique_ptr<Forward> created = ForwardWith(dtype, 128, &config);
      QVERIFY(created);
      Forward& forward = *created;
      QVERIFY(forward.has_mtp());
      SequenceState carrier(config), carrier_alone(config);
      MtpState head, head_alone;
      const auto head_ids = RandomIds(64, V, 5);
      QVERIFY(forward.Prefill(carrier, head_ids, LogitsRows::kLast, &head).ok());
      QVERIFY(forward.Prefill(carrier_alone, head_ids, LogitsRows::kLast, &head_alone).ok());
      std::vector<std::unique_ptr<SequenceState>> riding, alone;
      std::vector<SequenceState*> riders_states;
      for (int64_t length : {7, 130, 63}) {
        const auto prompt = RandomIds(length, V, uint32_t(length));
        riding.push_back(std::make_unique<SequenceState>(config));
        alone.push_back(std::make_unique<SequenceState>(config));
        QVERIFY(forward.Prefill(*riding.back(), prompt).ok());
        QVERIFY(forward.Prefill(*alone.back(), prompt).ok());
        riders_states.push_back(riding.back().get());
      }
      for (int piece = 0; piece < 2; ++piece) {  // rows 64..127, then 128..191 (a chunk the grid starts)
        const auto ids = RandomIds(64, V, uint32_t(40 + piece));
        const auto next = RandomIds(int64_t(riders_states.size()), V, uint32_t(200 + piece));
        DecodeRiders riders{riders_states, next};
        auto logits = forward.PrefillCarrying(carrier, ids, &head, riders);
        QVERIFY2(logits.ok() && riders.taken, logits.ok() ? "not taken" : logits.status().ToString().c_str());
        auto own = forward.Prefill(carrier_alone, ids, LogitsRows::kLast, &head_alone);
        QVERIFY(own.ok());
        QVERIFY2(*logits == *own, qPrintable(QString("%1 rows: the piece's logits").arg(KvDtypeName(dtype))));
        QVERIFY(StateBits(carrier) == StateBits(carrier_alone));
        QVERIFY(head.rows == head_alone.rows && head.pending_rows == head_alone.pending_rows && head.k == head_alone.k && head.v == head_alone.v && head.pending == head_alone.pending);
        QCOMPARE(int64_t(riders.logits.size()), int64_t(riders_states.size()) * V);
        for (size_t i = 0; i < riders_states.size(); ++i) {
          auto decoded = forward.Decode(*alone[i], next[i]);
          QVERIFY(decoded.ok());
          QVERIFY2(std::memcmp(riders.logits.data() + i * V, decoded->data(), size_t(V) * 4) == 0, qPrintable(QString("rider %1's logits").arg(i)));
          QVERIFY2(StateBits(*riding[i]) == StateBits(*alone[i]), qPrintable(QString("rider %1's state").arg(i)));
        }
      }
      // Across a grid line (rows 192..319) the piece runs alone and the riders stay with the caller.
      DecodeRiders across{riders_states, RandomIds(int64_t(riders_states.size()), V, 9)};
      QVERIFY(forward.PrefillCarrying(carrier, RandomIds(128, V, 8), nullptr, across).ok());
      QVERIFY(!across.taken);
      QCOMPARE(riding[0]->length(), alone[0]->length());
    }
  }

  void rejectsBadIdsWithoutChangingState() {
    SequenceState state(model_->config);
    const std::vector<int32_t> ids = {1, 2, 3};
    QVERIFY(forward_->Prefill(state, ids).ok());
    const Anchor before = state.SaveAnchor();
    const std::vector<int32_t> bad = {4, int32_t(model_->config.vocab_size)};
    auto r = forward_->Prefill(state, bad);
    QVERIFY(!r.ok());
    QVERIFY(r.status().message().find("outside vocab") != std::string::npos);
    QCOMPARE(state.length(), int64_t(3));
    QVERIFY(state.SaveAnchor().data == before.data);
    QVERIFY(!forward_->Decode(state, -1).ok());
    QVERIFY(!Forward::Create(model_->config, model_->weights, ForwardOptions{100, 1}).ok());
  }
};

QTEST_APPLESS_MAIN(TestForward)
#include "test_forward.moc"
