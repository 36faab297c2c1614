// The vision tower against a double-precision model written here from the math (Qwen3-VL's tower without
// deepstack), its bits across thread counts and kernel paths, and the image preprocessing it reads.
#include <QTemporaryDir>
#include <QtTest>

#include "tests/kernel_path_env.h"

#include <cmath>
#include <random>

#include "engine/compute/cpu/matmul.h"
#include "engine/image/image_patches.h"
#include "engine/runtime/forward.h"
#include "engine/runtime/vision_tower.h"
#include "reference_forward.h"
#include "test_runtime_util.h"

using namespace anchorage;

namespace {

using Matrix = std::vector<double>;  // row-major

std::vector<double> Values(const TensorView& t) {
  std::vector<double> out(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) out[static_cast<size_t>(i)] = t.At(i);
  return out;
}

// y [n, rows] = x [n, cols] · Wᵀ + b.
Matrix Affine(const Matrix& x, int64_t n, const TensorView& w, const TensorView& b) {
  const std::vector<double> wv = Values(w), bv = Values(b);
  const int64_t rows = static_cast<int64_t>(bv.size()), cols = static_cast<int64_t>(wv.size()) / rows;
  Matrix y(static_cast<size_t>(n * rows));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < rows; ++j) {
      double s = bv[j];
      for (int64_t i = 0; i < cols; ++i) s += x[r * cols + i] * wv[j * cols + i];
      y[r * rows + j] = s;
    }
  return y;
}

Matrix Norm(const Matrix& x, int64_t n, const TensorView& w, const TensorView& b) {
  const std::vector<double> wv = Values(w), bv = Values(b);
  const int64_t d = static_cast<int64_t>(wv.size());
  Matrix y(x.size());
  for (int64_t r = 0; r < n; ++r) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < d; ++i) mean += x[r * d + i] / d;
    for (int64_t i = 0; i < d; ++i) var += (x[r * d + i] - mean) * (x[r * d + i] - mean) / d;
    for (int64_t i = 0; i < d; ++i) y[r * d + i] = (x[r * d + i] - mean) / std::sqrt(var + 1e-6) * wv[i] + bv[i];
  }
  return y;
}

// The tower on one frame of h x w patches given in raster order (row-major over the patch grid); returns the
// merged rows in raster order of merged patches. Everything is indexed by (row, column), not by merge order.
Matrix ReferenceTower(const VisionConfig& c, const VisionWeights& w, int64_t gh, int64_t gw, const Matrix& raster_patches) {
  const int64_t n = gh * gw, D = c.hidden_size, hd = c.head_dim(), G = c.grid_per_side(), m = c.spatial_merge_size;
  Matrix x = Affine(raster_patches, n, w.patch_embed_weight, w.patch_embed_bias);
  const std::vector<double> table = Values(w.pos_embed);
  for (int64_t r = 0; r < gh; ++r)
    for (int64_t col = 0; col < gw; ++col) {
      const double fy = gh == 1 ? 0 : double(r) * (G - 1) / (gh - 1), fx = gw == 1 ? 0 : double(col) * (G - 1) / (gw - 1);
      for (int64_t i = 0; i < D; ++i) {
        double v = 0;
        for (int64_t above = 0; above < 2; ++above)
          for (int64_t right = 0; right < 2; ++right) {
            const int64_t yy = std::min<int64_t>(int64_t(std::floor(fy)) + above, G - 1);
            const int64_t xx = std::min<int64_t>(int64_t(std::floor(fx)) + right, G - 1);
            const double wy = above ? fy - std::floor(fy) : 1 - (fy - std::floor(fy));
            const double wx = right ? fx - std::floor(fx) : 1 - (fx - std::floor(fx));
            v += wy * wx * table[(yy * G + xx) * D + i];
          }
        x[(r * gw + col) * D + i] += v;
      }
    }
  // Rotary: dimension i < hd/2 turns with i's pair i + hd/2 by the row (first quarter) or column angle.
  const auto rotate = [&](Matrix& q) {
    for (int64_t p = 0; p < n; ++p)
      for (int64_t h = 0; h < c.num_heads; ++h)
        for (int64_t i = 0; i < hd / 2; ++i) {
          const int64_t quarter = hd / 4, pos = i < quarter ? p / gw : p % gw;
          const double angle = pos * std::pow(10000.0, -2.0 * double(i % quarter) / double(hd / 2));
          double& a = q[p * D + h * hd + i];
          double& b = q[p * D + h * hd + i + hd / 2];
          const double na = a * std::cos(angle) - b * std::sin(angle), nb = b * std::cos(angle) + a * std::sin(angle);
          a = na, b = nb;
        }
  };
  for (const VisionBlockWeights& b : w.blocks) {
    const Matrix qkv = Affine(Norm(x, n, b.norm1_weight, b.norm1_bias), n, b.qkv_weight, b.qkv_bias);
    Matrix q(static_cast<size_t>(n * D)), k(q.size()), v(q.size());
    for (int64_t p = 0; p < n; ++p)
      for (int64_t i = 0; i < D; ++i) q[p * D + i] = qkv[p * 3 * D + i], k[p * D + i] = qkv[p * 3 * D + D + i], v[p * D + i] = qkv[p * 3 * D + 2 * D + i];
    rotate(q), rotate(k);
    Matrix o(q.size(), 0.0);
    for (int64_t h = 0; h < c.num_heads; ++h)
      for (int64_t p = 0; p < n; ++p) {
        std::vector<double> s(static_cast<size_t>(n));
        double top = -1e300, total = 0;
        for (int64_t j = 0; j < n; ++j) {
          double dot = 0;
          for (int64_t i = 0; i < hd; ++i) dot += q[p * D + h * hd + i] * k[j * D + h * hd + i];
          s[j] = dot / std::sqrt(double(hd));
          top = std::max(top, s[j]);
        }
        for (double& e : s) total += (e = std::exp(e - top));
        for (int64_t j = 0; j < n; ++j)
          for (int64_t i = 0; i < hd; ++i) o[p * D + h * hd + i] += s[j] / total * v[j * D + h * hd + i];
      }
    const Matrix attended = Affine(o, n, b.proj_weight, b.proj_bias);
    for (size_t i = 0; i < x.size(); ++i) x[i] += attended[i];
    Matrix up = Affine(Norm(x, n, b.norm2_weight, b.norm2_bias), n, b.fc1_weight, b.fc1_bias);
    for (double& e : up) e = 0.5 * e * (1 + std::tanh(std::sqrt(2 / M_PI) * (e + 0.044715 * e * e * e)));
    const Matrix down = Affine(up, n, b.fc2_weight, b.fc2_bias);
    for (size_t i = 0; i < x.size(); ++i) x[i] += down[i];
  }
  const Matrix normed = Norm(x, n, w.merger_norm_weight, w.merger_norm_bias);
  // Each merged row: its m x m patches (row-major within the block) side by side.
  const int64_t rows = n / (m * m);
  Matrix merged(static_cast<size_t>(rows * D * m * m));
  for (int64_t br = 0; br < gh / m; ++br)
    for (int64_t bc = 0; bc < gw / m; ++bc)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < m; ++j)
          for (int64_t e = 0; e < D; ++e)
            merged[((br * (gw / m) + bc) * m * m + i * m + j) * D + e] = normed[((br * m + i) * gw + bc * m + j) * D + e];
  Matrix up = Affine(merged, rows, w.merger_fc1_weight, w.merger_fc1_bias);
  for (double& e : up) e = 0.5 * e * (1 + std::erf(e / std::sqrt(2.0)));
  return Affine(up, rows, w.merger_fc2_weight, w.merger_fc2_bias);
}

// Raster-order patches reordered into merge order (the layout PreprocessImage writes).
std::vector<float> MergeOrder(const Matrix& raster, int64_t gh, int64_t gw, int64_t m, int64_t width) {
  std::vector<float> out;
  for (int64_t br = 0; br < gh / m; ++br)
    for (int64_t bc = 0; bc < gw / m; ++bc)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < m; ++j) {
          const int64_t p = (br * m + i) * gw + bc * m + j;
          for (int64_t e = 0; e < width; ++e) out.push_back(static_cast<float>(raster[p * width + e]));
        }
  return out;
}

RgbImage Gradient(int64_t width, int64_t height) {
  RgbImage image{width, height, std::vector<uint8_t>(static_cast<size_t>(width * height * 3))};
  for (int64_t y = 0; y < height; ++y)
    for (int64_t x = 0; x < width; ++x) {
      uint8_t* p = &image.rgb[static_cast<size_t>((y * width + x) * 3)];
      p[0] = static_cast<uint8_t>(x * 7 + y), p[1] = static_cast<uint8_t>(y * 5), p[2] = static_cast<uint8_t>((x ^ y) * 3);
    }
  return image;
}

// A prompt of text with two images: 3 x 5 rows at row 20 and 4 x 2 at row 60 (across the 64-row grid line).
struct ImagePrompt {
  std::vector<int32_t> ids;
  std::vector<std::shared_ptr<const PromptImage>> catalog;
  std::vector<reference::Image> reference;
};

ImagePrompt MakeImagePrompt(const ModelConfig& c, int64_t length, uint32_t seed) {
  ImagePrompt p;
  p.ids = testing::RandomIds(length, c.vocab_size, seed);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto [row, rows, columns] : {std::tuple<int64_t, int64_t, int64_t>{20, 3, 5}, {60, 4, 2}}) {
    auto image = std::make_shared<PromptImage>();
    image->digest = "image at " + std::to_string(row) + " of seed " + std::to_string(seed);
    image->rows = rows;
    image->columns = columns;
    image->key_ids = ImageKeyIds(image->digest, rows * columns);
    auto inputs = std::make_shared<std::vector<float>>(static_cast<size_t>(rows * columns * c.hidden_size));
    for (float& v : *inputs) v = u(rng);
    image->embeddings = inputs;
    std::copy(image->key_ids.begin(), image->key_ids.end(), p.ids.begin() + row);
    p.reference.push_back({row, rows, columns, inputs->data()});
    p.catalog.push_back(image);
  }
  return p;
}

}  // namespace

class TestVision : public QObject {
  Q_OBJECT
  QTemporaryDir dir_;
  std::unique_ptr<testing::LoadedWeights> model_;
  std::unique_ptr<Forward> forward_;  // the text model on a 64-row grid, 2 threads

  std::vector<float> Encode(int threads, const ImageGrid& grid, const std::vector<float>& patches) {
    ThreadPool pool(threads);
    auto tower = VisionTower::Create(*model_->config.vision, *model_->weights.vision, pool);
    if (!tower.ok()) return {};
    auto out = (*tower)->Encode(grid, patches);
    return out.ok() ? *out : std::vector<float>();
  }

 private slots:
  void initTestCase() {
    ANCHORAGE_SKIP_UNLESS_KERNEL_PATH_RUNS();
    auto m = testing::MakeModel(TinyModelSize::kTiny, 11, dir_.path().toStdString());
    QVERIFY2(m.ok(), m.status().ToString().c_str());
    model_ = std::move(*m);
    QVERIFY2(model_->weights.vision.has_value(), model_->weights.vision_note.c_str());
    auto forward = Forward::Create(model_->config, model_->weights, ForwardOptions{64, 2});
    QVERIFY2(forward.ok(), forward.status().ToString().c_str());
    forward_ = std::move(*forward);
  }

  void towerMatchesTheDoubleReference_data() {
    QTest::addColumn<int>("rows");
    QTest::addColumn<int>("columns");
    QTest::newRow("2 x 2, one merged row") << 2 << 2;
    QTest::newRow("4 x 6") << 4 << 6;
    QTest::newRow("10 x 4, over the position table's side") << 10 << 4;
  }
  void towerMatchesTheDoubleReference() {
    QFETCH(int, rows);
    QFETCH(int, columns);
    const VisionConfig& c = *model_->config.vision;
    std::mt19937 rng(rows * 100 + columns);
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    Matrix raster(static_cast<size_t>(rows * columns * c.patch_values()));
    for (double& v : raster) v = u(rng);
    const Matrix want = ReferenceTower(c, *model_->weights.vision, rows, columns, raster);
    const ImageGrid grid{1, rows, columns};
    const std::vector<float> got = Encode(2, grid, MergeOrder(raster, rows, columns, c.spatial_merge_size, c.patch_values()));
    QCOMPARE(int64_t(got.size()), grid.tokens(c.spatial_merge_size) * c.out_hidden_size);
    double worst = 0, largest = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      worst = std::max(worst, std::fabs(got[i] - want[i]));
      largest = std::max(largest, std::fabs(want[i]));
    }
    qInfo("tower vs fp64: max |diff| %.3g over a largest |value| of %.3g", worst, largest);
    QVERIFY(largest > 0.1);
    QVERIFY2(worst < 1e-4 * std::max(1.0, largest), qPrintable(QString("max |diff| %1").arg(worst)));
  }

  void towerBitsDoNotDependOnThreadsOrPath() {
    const VisionConfig& c = *model_->config.vision;
    const ImageGrid grid{1, 6, 8};
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> patches(static_cast<size_t>(grid.patches() * c.patch_values()));
    for (float& v : patches) v = u(rng);
    const std::vector<float> one = Encode(1, grid, patches);
    QVERIFY(!one.empty());
    QVERIFY(one == Encode(2, grid, patches));
    QVERIFY(one == Encode(3, grid, patches));
    const cpu::KernelPath active = cpu::ActivePath();
    for (cpu::KernelPath path : cpu::AvailablePaths()) {
      if (cpu::ArithmeticOf(path) != cpu::ArithmeticOf(active)) continue;
      QVERIFY(cpu::SetActivePath(path).ok());
      QVERIFY2(one == Encode(2, grid, patches), cpu::PathName(path));
    }
    QVERIFY(cpu::SetActivePath(active).ok());
  }

  void towerRefusesAGridOfBrokenMergedPatches() {
    ThreadPool pool(1);
    auto tower = VisionTower::Create(*model_->config.vision, *model_->weights.vision, pool);
    QVERIFY(tower.ok());
    const int64_t width = model_->config.vision->patch_values();
    auto odd = (*tower)->Encode(ImageGrid{1, 3, 2}, std::vector<float>(static_cast<size_t>(6 * width)));
    QVERIFY(!odd.ok());
    QVERIFY(odd.status().message().find("merged patches") != std::string::npos);
    auto short_input = (*tower)->Encode(ImageGrid{1, 2, 2}, std::vector<float>(static_cast<size_t>(3 * width)));
    QVERIFY(!short_input.ok());
  }

  void promptWithImagesMatchesTheDoubleReference() {
    const ModelConfig& c = model_->config;
    const ImagePrompt p = MakeImagePrompt(c, 90, 5);
    SequenceState state(c);
    auto located = PromptImages::Locate(p.ids, p.catalog);
    QVERIFY2(located.ok(), located.status().ToString().c_str());
    QCOMPARE((*located)->image_rows(), int64_t(15 + 8));
    state.set_images(*located);
    auto logits = forward_->Prefill(state, p.ids, LogitsRows::kAll);
    QVERIFY2(logits.ok(), logits.status().ToString().c_str());
    const reference::Vec want = reference::Logits(c, model_->weights, p.ids, p.reference);
    double worst = 0, largest = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      worst = std::max(worst, std::fabs((*logits)[i] - want[i]));
      largest = std::max(largest, std::fabs(want[i]));
    }
    qInfo("prompt with images vs fp64: max |diff| %.3g over a largest logit of %.3g", worst, largest);
    QVERIFY2(worst < 1e-4 * std::max(1.0, largest), qPrintable(QString("max |diff| %1").arg(worst)));
    // Without the images' rotary positions (every row at itself) the logits after the first image move.
    const reference::Vec unmoved = reference::Logits(c, model_->weights, p.ids, {});
    double moved = 0;
    for (size_t i = 40 * c.vocab_size; i < want.size(); ++i) moved = std::max(moved, std::fabs(unmoved[i] - want[i]));
    QVERIFY(moved > 1e-2);
    // The next token decodes at its shifted position, as the reference's prompt one longer.
    std::vector<int32_t> longer = p.ids;
    longer.push_back(7);
    auto next = forward_->Decode(state, 7);
    QVERIFY(next.ok());
    const reference::Vec after = reference::Logits(c, model_->weights, longer, p.reference);
    for (int64_t i = 0; i < c.vocab_size; ++i) QVERIFY(std::fabs((*next)[i] - after[90 * c.vocab_size + i]) < 1e-4 * std::max(1.0, largest));
  }

  void promptWithImagesResumesAtEveryLineExactly() {
    const ModelConfig& c = model_->config;
    const ImagePrompt p = MakeImagePrompt(c, 150, 9);
    auto located = PromptImages::Locate(p.ids, p.catalog);
    QVERIFY(located.ok());
    SequenceState cold(c);
    cold.set_images(*located);
    auto want = forward_->Prefill(cold, p.ids);
    QVERIFY(want.ok());
    for (int64_t line : {64, 128}) {
      SequenceState warm(c);
      warm.set_images(*located);
      QVERIFY(forward_->Prefill(warm, std::span(p.ids).first(static_cast<size_t>(line))).ok());
      SequenceState resumed = warm;  // a copy, as the caches hand one back
      auto got = forward_->Prefill(resumed, std::span(p.ids).subspan(static_cast<size_t>(line)));
      QVERIFY(got.ok());
      QVERIFY2(*got == *want, qPrintable(QString("resumed at %1").arg(line)));
      QVERIFY(resumed.SaveAnchor().data == cold.SaveAnchor().data);
      QVERIFY(resumed.CopyRows(0, 150)->data == cold.CopyRows(0, 150)->data);
    }
  }

  void imageKeyIdsWithoutTheirImagesAreRefused() {
    const ModelConfig& c = model_->config;
    const ImagePrompt p = MakeImagePrompt(c, 90, 5);
    SequenceState state(c);
    auto refused = forward_->Prefill(state, p.ids);
    QVERIFY(!refused.ok());
    QVERIFY2(refused.status().message().find("row 20 holds an image key id") != std::string::npos, refused.status().ToString().c_str());
    QCOMPARE(state.length(), int64_t(0));
    // An image of the catalog missing: Locate names the row.
    auto partial = PromptImages::Locate(p.ids, std::span(p.catalog).first(1));
    QVERIFY(!partial.ok());
    QVERIFY(partial.status().message().find("row 60") != std::string::npos);
    // Another image's rows at this image's place are not taken for it.
    auto located = PromptImages::Locate(p.ids, p.catalog);
    QVERIFY(located.ok());
    // Holds: the images of these ids (and of any prefix of them), not of ids without an image or with another's.
    QVERIFY((*located)->Holds(p.ids));
    QVERIFY((*located)->Holds(std::span(p.ids).first(64)));  // the line cuts the second image
    std::vector<int32_t> text_only = p.ids;
    std::fill_n(text_only.begin() + 20, 15, 7);
    QVERIFY(!(*located)->Holds(text_only));
    QVERIFY(!(*located)->Holds(testing::RandomIds(90, model_->config.vocab_size, 2)));
    state.set_images(*located);
    std::vector<int32_t> swapped = p.ids;
    std::copy_n(p.catalog[1]->key_ids.begin(), 8, swapped.begin() + 20);
    QVERIFY(!forward_->Prefill(state, swapped).ok());
    QCOMPARE(state.length(), int64_t(0));
  }

  void smartResizeKeepsTheAreaInBounds() {
    auto hd = SmartResize(1080, 1920, 32, 65536, 1048576);
    QVERIFY(hd.ok());
    QCOMPARE(hd->first, int64_t(768));
    QCOMPARE(hd->second, int64_t(1344));
    auto small = SmartResize(10, 10, 32, 65536, 1048576);
    QVERIFY(small.ok());
    QCOMPARE(small->first, int64_t(256));
    QCOMPARE(small->second, int64_t(256));
    auto exact = SmartResize(448, 448, 32, 65536, 1048576);
    QVERIFY(exact.ok());
    QCOMPARE(exact->first, int64_t(448));
    auto rounded = SmartResize(300, 400, 32, 65536, 1048576);  // 9.375 and 12.5 factors: 12.5 rounds to even
    QVERIFY(rounded.ok());
    QCOMPARE(rounded->first, int64_t(288));
    QCOMPARE(rounded->second, int64_t(384));
    QVERIFY(!SmartResize(1, 201, 32, 65536, 1048576).ok());
    QVERIFY(!SmartResize(0, 10, 32, 65536, 1048576).ok());
  }

  void patchesFollowMergeOrder() {
    ImageProcessing p;
    const RgbImage image = Gradient(256, 320);  // whole merged patches, inside the area bounds: no resize
    auto patches = PreprocessImage(image, p);
    QVERIFY2(patches.ok(), patches.status().ToString().c_str());
    QCOMPARE(patches->grid, (ImageGrid{1, 20, 16}));
    const int64_t P = 16, width = 3 * 2 * P * P;
    QCOMPARE(int64_t(patches->values.size()), 320 * width);
    const auto pixel = [&](int64_t y, int64_t x, int64_t c) { return (image.rgb[static_cast<size_t>((y * 256 + x) * 3 + c)] / 255.0f - 0.5f) / 0.5f; };
    // Patch 5 in merge order: block 1 of row 0 (columns 2..3), its second patch: patch row 0, column 3.
    const float* row = patches->values.data() + 5 * width;
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t t = 0; t < 2; ++t)
        for (int64_t y : {0, 7, 15})
          for (int64_t x : {0, 9, 15}) QCOMPARE(row[((c * 2 + t) * P + y) * P + x], pixel(y, 3 * P + x, c));
    // Patch 8 + 2: the first block of the second block row (rows 2..3), its third patch: row 3, column 0.
    const float* later = patches->values.data() + (8 * 4 + 2) * width;
    QCOMPARE(later[(0 * P + 4) * P + 1], pixel(3 * P + 4, 1, 0));
  }

  void resizeKeepsFlatImagesFlatAndSizesExact() {
    RgbImage flat{97, 53, std::vector<uint8_t>(97 * 53 * 3, 77)};
    const RgbImage down = ResizeBicubic(flat, 32, 32), up = ResizeBicubic(flat, 200, 120);
    QCOMPARE(down.rgb.size(), size_t(32 * 32 * 3));
    QCOMPARE(up.rgb.size(), size_t(200 * 120 * 3));
    for (uint8_t v : down.rgb) QCOMPARE(int(v), 77);
    for (uint8_t v : up.rgb) QCOMPARE(int(v), 77);
    const RgbImage image = Gradient(64, 64);
    QVERIFY(ResizeBicubic(image, 64, 64).rgb == image.rgb);
  }

  void digestFollowsThePixelsNotTheirSource() {
    ImageProcessing p;
    RgbImage image = Gradient(300, 200);
    auto a = PreprocessImage(image, p), b = PreprocessImage(image, p);
    QVERIFY(a.ok() && b.ok());
    QCOMPARE(a->digest, b->digest);
    QCOMPARE(a->digest.size(), size_t(64));
    image.rgb[12345] ^= 0x40;
    auto changed = PreprocessImage(image, p);
    QVERIFY(changed.ok());
    QVERIFY(changed->digest != a->digest);
    // The same values on another grid are another image.
    QVERIFY(ImageDigest(ImageGrid{1, a->grid.w, a->grid.h}, a->values) != a->digest);
  }
};

QTEST_GUILESS_MAIN(TestVision)
#include "test_vision.moc"
