// The spill's byte-plane codec: planes round-trip bitwise for every word size, an encoding decodes
// to the bytes it was made of (one frame and many, on a pool or not, the same encoding either
// way), float rows shrink, and a flipped byte in a compressed frame, a cut frame or a wrong size
// is Corrupt.
#include <QtTest>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "engine/cache/plane_codec.h"
#include "engine/core/thread_pool.h"

using namespace anchorage;

namespace {

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

// Floats shaped like K/V rows: normal values of a few scales.
std::string FloatRows(size_t floats, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(floats);
  for (size_t i = 0; i < floats; ++i) v[i] = normal(rng) * (1.0f + static_cast<float>(i % 64) / 16.0f);
  return std::string(reinterpret_cast<const char*>(v.data()), floats * sizeof(float));
}

}  // namespace

class TestPlaneCodec : public QObject {
  Q_OBJECT

 private slots:
  void planesRoundTrip() {
    for (int w : {1, 2, 4, 8}) {
      const std::string data = RandomBytes(static_cast<size_t>(w) * 1001, static_cast<uint32_t>(w));
      std::string planes(data.size(), '\0'), back(data.size(), '\0');
      SplitPlanes(data, w, planes.data());
      const size_t n = data.size() / static_cast<size_t>(w);
      for (size_t i : {size_t(0), size_t(1), n / 2, n - 1})
        for (int p = 0; p < w; ++p) QCOMPARE(planes[static_cast<size_t>(p) * n + i], data[i * static_cast<size_t>(w) + static_cast<size_t>(p)]);
      JoinPlanes(planes, w, back.data());
      QVERIFY(back == data);
    }
  }

  void encodeDecodeIsBitwise() {
    ThreadPool pool(2);
    for (size_t floats : {size_t(0), size_t(1000), size_t(3) << 20}) {  // 12 MiB: two frames
      const std::string data = FloatRows(floats, 5);
      auto alone = EncodePlanes(data, PlaneCodecOptions{4, 1, nullptr});
      auto pooled = EncodePlanes(data, PlaneCodecOptions{4, 1, &pool});
      QVERIFY(alone.ok() && pooled.ok());
      QVERIFY(*alone == *pooled);
      QCOMPARE(*PlanesRawSize(*alone), static_cast<int64_t>(data.size()));
      std::string back(data.size(), '\x7f');
      QVERIFY(DecodePlanes(*alone, back, &pool).ok());
      QVERIFY(back == data);
      if (floats > 1000) QVERIFY2(alone->size() < data.size() * 9 / 10, "float rows shrink by their exponent planes");
    }
  }

  void damageIsCorrupt() {
    const std::string data = FloatRows(300000, 9);
    const std::string encoded = *EncodePlanes(data, PlaneCodecOptions{});
    std::string out(data.size(), '\0');
    QVERIFY2(encoded.size() < data.size(), "the exponent plane shrinks");
    std::string flipped = encoded;  // the last frame is the exponent plane's, compressed (a stored one is the block sums' to check)
    flipped[flipped.size() - 40] ^= 0x10;
    QCOMPARE(DecodePlanes(flipped, out).code(), StatusCode::kCorrupt);
    QCOMPARE(DecodePlanes(std::string_view(encoded).substr(0, encoded.size() - 100), out).code(), StatusCode::kCorrupt);
    QCOMPARE(DecodePlanes(std::string_view(encoded).substr(0, 10), out).code(), StatusCode::kCorrupt);
    std::string small(data.size() - 4, '\0');
    QCOMPARE(DecodePlanes(encoded, small).code(), StatusCode::kCorrupt);
    QCOMPARE(DecodePlanes(encoded + "x", out).code(), StatusCode::kCorrupt);
    QVERIFY(!EncodePlanes(std::string(7, 'a'), PlaneCodecOptions{}).ok());  // not whole fp32 words
  }
};

QTEST_APPLESS_MAIN(TestPlaneCodec)
#include "test_plane_codec.moc"
