// 8-bit weights through the whole forward: the generated FP8 checkpoint in Hugging Face's format, its
// forward against a BF16 copy holding the dequantized weights, malformed FP8 checkpoints refused with
// the tensor named, and --weights int8 (the same bits on every path; the loader's report holds).
#include <QTemporaryDir>
#include <QtTest>

#include <cmath>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "engine/compute/cpu/matmul.h"
#include "engine/core/bf16.h"
#include "engine/core/file_util.h"
#include "engine/runtime/forward.h"
#include "engine/runtime/weights_report.h"
#include "tests/engine/test_runtime_util.h"

using namespace anchorage;

namespace {

// Every tensor of a model folder as bytes to write.
std::vector<TensorToWrite> ReadTensors(const SafetensorsSet& set) {
  std::vector<TensorToWrite> out;
  for (const auto& [name, t] : set.tensors())
    out.push_back({name, t.dtype, t.shape, std::string(reinterpret_cast<const char*>(t.data), t.bytes)});
  return out;
}

TensorToWrite* Named(std::vector<TensorToWrite>& tensors, const std::string& name) {
  for (TensorToWrite& t : tensors)
    if (t.name == name) return &t;
  qFatal("no tensor %s", name.c_str());
}

// Writes config (as json) and tensors into dir as a model folder.
void WriteModel(const std::string& dir, const nlohmann::json& config, const std::vector<TensorToWrite>& tensors) {
  QVERIFY(MakeDirectories(dir).ok());
  QVERIFY(WriteFileAtomic(dir + "/config.json", config.dump(2)).ok());
  QVERIFY(WriteSafetensors(dir + "/model.safetensors", tensors).ok());
}

nlohmann::json ReadConfig(const std::string& dir) { return nlohmann::json::parse(*ReadFile(dir + "/config.json")); }

std::unique_ptr<Forward> Create(const testing::LoadedWeights& m, bool int8 = false) {
  ForwardOptions options;
  options.grid_tokens = 128;
  options.threads = 2;
  options.int8_weights = int8;
  auto f = Forward::Create(m.config, m.weights, options);
  if (!f.ok()) qFatal("%s", f.status().message().c_str());
  return std::move(*f);
}

// All rows' logits of a prefill of ids, then three decodes' logits.
std::vector<float> Logits(Forward& f, const std::vector<int32_t>& ids) {
  SequenceState state(f.config());
  std::vector<float> out = *f.Prefill(state, ids, LogitsRows::kAll);
  for (int32_t id : {3, 5, 7}) {
    const std::vector<float> step = *f.Decode(state, id);
    out.insert(out.end(), step.begin(), step.end());
  }
  return out;
}

double MaxDifference(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - b[i]));
  return worst;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

// The error of loading dir, whether mapping the weights or building the forward refuses it.
std::string LoadError(const std::string& dir) {
  auto m = testing::OpenModel(dir);
  if (!m.ok()) return m.status().message();
  ForwardOptions options;
  auto f = Forward::Create((*m)->config, (*m)->weights, options);
  return f.ok() ? std::string() : f.status().message();
}

}  // namespace

class TestQuantizedModel : public QObject {
  Q_OBJECT
 private slots:
  void initTestCase() {
    QVERIFY(dir_.isValid());
    qInfo("kernel path %s", cpu::PathName(cpu::ActivePath()));
    auto fp8 = testing::MakeModel(TinyModelSize::kTiny, 4, Path("fp8"), GeneratedDtype::kFp8);
    QVERIFY2(fp8.ok(), fp8.ok() ? "" : fp8.status().message().c_str());
    fp8_ = std::move(*fp8);
    auto bf16 = testing::MakeModel(TinyModelSize::kTiny, 4, Path("bf16"));
    QVERIFY(bf16.ok());
    bf16_ = std::move(*bf16);
  }

  void generatorWritesHuggingFaceFp8() {
    const nlohmann::json q = ReadConfig(Path("fp8"))["quantization_config"];
    QCOMPARE(q["quant_method"], "fp8");
    QCOMPARE(q["fmt"], "e4m3");
    QCOMPARE(q["weight_block_size"], nlohmann::json({128, 128}));
    QCOMPARE(fp8_->config.fp8_block_n, 128);
    const TensorView* embed = fp8_->set->Find("model.embed_tokens.weight");
    QCOMPARE(embed->dtype, DType::kBF16);
    const TensorView* up = fp8_->set->Find("model.layers.0.mlp.up_proj.weight");
    QCOMPARE(up->dtype, DType::kF8E4M3);
    const TensorView* scales = fp8_->set->Find("model.layers.0.mlp.up_proj.weight_scale_inv");
    QCOMPARE(scales->dtype, DType::kF32);
    QCOMPARE(scales->shape, (std::vector<int64_t>{(up->shape[0] + 127) / 128, (up->shape[1] + 127) / 128}));
    for (const auto& [name, t] : fp8_->set->tensors())
      if (t.dtype == DType::kF8E4M3) {
        QVERIFY2(t.shape.size() == 2, name.c_str());
        const TensorView* s = fp8_->set->Find(name + "_scale_inv");
        QVERIFY2(s != nullptr, name.c_str());
        for (int64_t i = 0; i < s->numel(); ++i) {
          int e = 0;
          QCOMPARE(std::frexp(s->At(i), &e), 0.5f);  // a power of two
        }
      }
  }

  // The generator's scales are powers of two, so a BF16 copy holds every weight exactly; on the fp32
  // paths the two forwards give the same bits, on the bf16-split paths they differ by that split only
  // (the copy's matrices take the split; FP8 matrices are multiplied in fp32 on every path).
  void fp8ForwardEqualsDequantizedCopy() {
    std::vector<TensorToWrite> tensors;
    for (const auto& [name, t] : fp8_->set->tensors()) {
      if (name.size() > 10 && name.substr(name.size() - 10) == "_scale_inv") continue;
      if (t.dtype != DType::kF8E4M3) {
        tensors.push_back({name, t.dtype, t.shape, std::string(reinterpret_cast<const char*>(t.data), t.bytes)});
        continue;
      }
      const TensorView& s = *fp8_->set->Find(name + "_scale_inv");
      const int64_t n = t.shape[0], k = t.shape[1];
      std::string data(static_cast<size_t>(n * k) * 2, '\0');
      for (int64_t j = 0; j < n; ++j)
        for (int64_t i = 0; i < k; ++i) {
          const float w = t.At(j * k + i) * s.At((j / 128) * s.shape[1] + i / 128);
          const uint16_t h = FloatToBf16(w);
          QCOMPARE(Bf16ToFloat(h), w);
          std::memcpy(&data[static_cast<size_t>(j * k + i) * 2], &h, 2);
        }
      tensors.push_back({name, DType::kBF16, t.shape, std::move(data)});
    }
    nlohmann::json config = ReadConfig(Path("fp8"));
    config.erase("quantization_config");
    WriteModel(Path("dequantized"), config, tensors);
    auto copy = testing::OpenModel(Path("dequantized"));
    QVERIFY(copy.ok());

    const auto ids = testing::RandomIds(150, fp8_->config.vocab_size, 8);
    const auto fp8 = Logits(*Create(*fp8_), ids);
    const auto want = Logits(*Create(**copy), ids);
    const double difference = MaxDifference(fp8, want);
    qInfo("FP8 forward vs its BF16 copy: max |logit difference| %.3g", difference);
    if (!cpu::SplitsIntoBf16(cpu::ActivePath())) QVERIFY(SameBits(fp8, want));
    else QVERIFY(difference <= 1e-3);  // the split's fp32-level differences, amplified as below
    // The generated models' random weights amplify any change of a weight a thousandfold, so how far
    // FP8 moves their logits says nothing of a trained model's: it is printed, not asserted.
    qInfo("FP8 forward vs the BF16 original: max |logit difference| %.3g", MaxDifference(fp8, Logits(*Create(*bf16_), ids)));
  }

  // A prefill split at a grid line writes the bits of one whole prefill, for 8-bit weights too.
  void eightBitPrefillSplitsExactly() {
    const auto ids = testing::RandomIds(200, fp8_->config.vocab_size, 9);
    for (bool int8 : {false, true}) {
      auto f = int8 ? Create(*bf16_, true) : Create(*fp8_);
      SequenceState whole(f->config()), split(f->config());
      const auto once = *f->Prefill(whole, ids);
      (void)*f->Prefill(split, std::span(ids).first(128));
      const auto resumed = *f->Prefill(split, std::span(ids).subspan(128));
      QVERIFY2(SameBits(once, resumed), int8 ? "int8" : "fp8");
    }
  }

  void malformedFp8Refused() {
    const std::string up = "model.layers.0.mlp.up_proj.weight";
    const nlohmann::json config = ReadConfig(Path("fp8"));
    struct Case {
      const char* name;
      std::function<void(std::vector<TensorToWrite>&, nlohmann::json&)> change;
      std::vector<std::string> expected;  // pieces of the error
    };
    const Case cases[] = {
        {"no scales",
         [&](auto& t, auto&) { std::erase_if(t, [&](const TensorToWrite& x) { return x.name == up + "_scale_inv"; }); },
         {up + "_scale_inv", "lacks"}},
        {"scales of the wrong shape", [&](auto& t, auto&) { Named(t, up + "_scale_inv")->shape = {2, 1}; Named(t, up + "_scale_inv")->data.resize(8); },
         {up + "_scale_inv", "expected [1, 1]"}},
        {"a negative scale",
         [&](auto& t, auto&) {
           const float bad = -0.5f;
           std::memcpy(Named(t, up + "_scale_inv")->data.data(), &bad, 4);
         },
         {up, "scale [0, 0]", "positive"}},
        {"a NaN code", [&](auto& t, auto&) { Named(t, up)->data[5] = static_cast<char>(0x7f); }, {up, "NaN"}},
        {"no quantization_config", [&](auto&, auto& c) { c.erase("quantization_config"); }, {"quantization_config", "F8_E4M3"}},
        {"another quant_method", [&](auto&, auto& c) { c["quantization_config"]["quant_method"] = "awq"; }, {"quant_method", "awq"}},
        {"an FP8 norm",
         [&](auto& t, auto&) {
           TensorToWrite* norm = Named(t, "model.layers.0.input_layernorm.weight");
           norm->dtype = DType::kF8E4M3;
           norm->data.resize(norm->data.size() / 2);
         },
         {"input_layernorm", "only matrices"}},
    };
    for (const Case& c : cases) {
      std::vector<TensorToWrite> tensors = ReadTensors(*fp8_->set);
      nlohmann::json changed = config;
      c.change(tensors, changed);
      const std::string dir = Path(std::string("bad-") + c.name);
      WriteModel(dir, changed, tensors);
      const std::string error = LoadError(dir);
      QVERIFY2(!error.empty(), c.name);
      for (const std::string& piece : c.expected)
        QVERIFY2(error.find(piece) != std::string::npos, qPrintable(QString("%1: %2").arg(c.name, error.c_str())));
    }
  }

  // Every matrix int8 and every other kernel in the fp32 order: each path gives the portable path's bits.
  void int8SameBitsOnEveryPath() {
    const auto ids = testing::RandomIds(90, bf16_->config.vocab_size, 10);
    const cpu::KernelPath active = cpu::ActivePath();
    QVERIFY(cpu::SetActivePath(cpu::KernelPath::kPortable).ok());
    const auto portable = Logits(*Create(*bf16_, true), ids);
    for (cpu::KernelPath path : cpu::AvailablePaths()) {
      QVERIFY(cpu::SetActivePath(path).ok());
      QVERIFY2(SameBits(Logits(*Create(*bf16_, true), ids), portable), cpu::PathName(path));
    }
    QVERIFY(cpu::SetActivePath(active).ok());
  }

  // The loader's report is what the two forwards give on its prompt (not how close: see above).
  void int8ReportHolds() {
    ForwardOptions options;
    options.grid_tokens = 128;
    options.threads = 2;
    auto baseline = MeasureStoredWeights(bf16_->config, bf16_->weights, options);
    QVERIFY(baseline.ok());
    auto int8 = Create(*bf16_, true);
    auto report = CompareWithStoredWeights(*baseline, *int8);
    QVERIFY(report.ok());
    qInfo("%s", report->Describe().c_str());
    const auto stored = *WeightsReportLogits(*Create(*bf16_));
    const auto quantized = *WeightsReportLogits(*int8);
    QCOMPARE(report->max_logit_error, MaxDifference(quantized, stored));
    QCOMPARE(report->prompt_tokens, 64);
    QCOMPARE(report->format, std::string("int8"));
    QVERIFY(report->max_logit_error > 0.0 && std::isfinite(report->max_logit_error));
    QVERIFY(report->bytes < 0.6 * report->stored_bytes);
  }

  void fingerprintsNameTheWeights() {
    const std::string stored = Create(*bf16_)->WeightsArithmetic();
    const std::string int8 = Create(*bf16_, true)->WeightsArithmetic();
    const std::string fp8 = Create(*fp8_)->WeightsArithmetic();
    QCOMPARE(stored, std::string());
    QVERIFY(!int8.empty() && !fp8.empty() && int8 != fp8);
    QVERIFY(Forward::StateFingerprint("m", int8) != Forward::StateFingerprint("m", stored));
    QVERIFY(Forward::StateFingerprint("m", fp8) != Forward::StateFingerprint("m", int8));
    QCOMPARE(Create(*fp8_)->WeightsDescription(), std::string("fp8-e4m3 + bf16"));
  }

 private:
  std::string Path(const std::string& name) const { return dir_.filePath(QString::fromStdString(name)).toStdString(); }

  QTemporaryDir dir_;
  std::unique_ptr<testing::LoadedWeights> fp8_, bf16_;
};

QTEST_APPLESS_MAIN(TestQuantizedModel)
#include "test_quantized_model.moc"
