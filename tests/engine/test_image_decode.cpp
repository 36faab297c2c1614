// PNG, JPEG and WebP decoding: pixels that survive an encode here, alpha over white, and clear errors for
// truncated, corrupt, oversized and unknown images.
#include <QtTest>

#include <csetjmp>
#include <cstdio>
#include <cstring>

#include <jpeglib.h>
#include <png.h>
#include <webp/encode.h>

#include "engine/image/image_decode.h"

using namespace anchorage;

namespace {

std::vector<uint8_t> Pattern(int width, int height, int channels) {
  std::vector<uint8_t> px(static_cast<size_t>(width * height * channels));
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x)
      for (int c = 0; c < channels; ++c) px[static_cast<size_t>((y * width + x) * channels + c)] = static_cast<uint8_t>(x * 11 + y * 3 + c * 60);
  return px;
}

std::string EncodePng(const std::vector<uint8_t>& px, int width, int height, bool alpha) {
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  image.width = width;
  image.height = height;
  image.format = alpha ? PNG_FORMAT_RGBA : PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  png_image_write_to_memory(&image, nullptr, &size, 0, px.data(), 0, nullptr);
  std::string out(size, '\0');
  if (!png_image_write_to_memory(&image, out.data(), &size, 0, px.data(), 0, nullptr)) return {};
  out.resize(size);
  return out;
}

std::string EncodeJpeg(const std::vector<uint8_t>& rgb, int width, int height, bool progressive = false) {
  jpeg_compress_struct info;
  jpeg_error_mgr error;
  info.err = jpeg_std_error(&error);
  jpeg_create_compress(&info);
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&info, &buffer, &size);
  info.image_width = width;
  info.image_height = height;
  info.input_components = 3;
  info.in_color_space = JCS_RGB;
  jpeg_set_defaults(&info);
  jpeg_set_quality(&info, 100, TRUE);
  if (progressive) jpeg_simple_progression(&info);  // 10 scans for a colour image
  jpeg_start_compress(&info, TRUE);
  while (info.next_scanline < info.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(rgb.data()) + info.next_scanline * width * 3;
    jpeg_write_scanlines(&info, &row, 1);
  }
  jpeg_finish_compress(&info);
  std::string out(reinterpret_cast<char*>(buffer), size);
  jpeg_destroy_compress(&info);
  std::free(buffer);
  return out;
}

std::string EncodeWebpLossless(const std::vector<uint8_t>& rgb, int width, int height) {
  uint8_t* out = nullptr;
  const size_t size = WebPEncodeLosslessRGB(rgb.data(), width, height, width * 3, &out);
  std::string bytes(reinterpret_cast<char*>(out), size);
  WebPFree(out);
  return bytes;
}

bool Says(const Status& s, const char* words) { return s.message().find(words) != std::string::npos; }

}  // namespace

class TestImageDecode : public QObject {
  Q_OBJECT

 private slots:
  void pngAndWebpKeepEveryPixel() {
    const std::vector<uint8_t> rgb = Pattern(37, 21, 3);
    for (const std::string& bytes : {EncodePng(rgb, 37, 21, false), EncodeWebpLossless(rgb, 37, 21)}) {
      QVERIFY(!bytes.empty());
      auto image = DecodeImage(bytes, 1 << 20);
      QVERIFY2(image.ok(), image.status().ToString().c_str());
      QCOMPARE(image->width, int64_t(37));
      QCOMPARE(image->height, int64_t(21));
      QVERIFY(image->rgb == rgb);
    }
  }

  void jpegDecodesCloseToItsPixels() {
    const std::vector<uint8_t> rgb(48 * 32 * 3, 200);
    auto image = DecodeImage(EncodeJpeg(rgb, 48, 32), 1 << 20);
    QVERIFY2(image.ok(), image.status().ToString().c_str());
    QCOMPARE(image->width, int64_t(48));
    for (uint8_t v : image->rgb) QVERIFY(std::abs(int(v) - 200) <= 2);
    QCOMPARE(SniffImageFormat(EncodeJpeg(rgb, 48, 32)), ImageFormat::kJpeg);
  }

  void progressiveJpegsOverTheScanLimitAreRefused() {
    const std::vector<uint8_t> rgb(40 * 24 * 3, 90);
    const std::string progressive = EncodeJpeg(rgb, 40, 24, true);
    auto within = DecodeImage(progressive, 1 << 20, 10);
    QVERIFY2(within.ok(), within.status().ToString().c_str());
    for (uint8_t v : within->rgb) QVERIFY(std::abs(int(v) - 90) <= 2);
    auto over = DecodeImage(progressive, 1 << 20, 9);
    QVERIFY(!over.ok());
    QVERIFY2(Says(over.status(), "holds more than 9 scans"), over.status().ToString().c_str());
    QVERIFY(DecodeImage(EncodeJpeg(rgb, 40, 24), 1 << 20, 1).ok());  // a baseline JPEG is one scan
  }

  void alphaIsCompositedOverWhite() {
    std::vector<uint8_t> rgba = {0, 0, 0, 0, 0, 0, 0, 255, 100, 50, 0, 128, 255, 255, 255, 0};
    auto image = DecodeImage(EncodePng(rgba, 2, 2, true), 1 << 20);
    QVERIFY2(image.ok(), image.status().ToString().c_str());
    const std::vector<uint8_t> want = {255, 255, 255, 0, 0, 0, 177, 152, 127, 255, 255, 255};
    QVERIFY(image->rgb == want);
  }

  void truncatedImagesAreRefused_data() {
    QTest::addColumn<QByteArray>("bytes");
    const std::vector<uint8_t> rgb = Pattern(64, 64, 3);
    const auto cut = [](const std::string& s) { return QByteArray(s.data(), qsizetype(s.size() * 2 / 3)); };
    QTest::newRow("png") << cut(EncodePng(rgb, 64, 64, false));
    QTest::newRow("jpeg") << cut(EncodeJpeg(rgb, 64, 64));
    QTest::newRow("webp") << cut(EncodeWebpLossless(rgb, 64, 64));
  }
  void truncatedImagesAreRefused() {
    QFETCH(QByteArray, bytes);
    auto image = DecodeImage(std::string_view(bytes.data(), size_t(bytes.size())), 1 << 20);
    QVERIFY(!image.ok());
    QVERIFY2(Says(image.status(), "truncated or corrupt"), image.status().ToString().c_str());
  }

  void corruptAndUnknownBytesAreRefused() {
    std::string png = EncodePng(Pattern(16, 16, 3), 16, 16, false);
    png[20] ^= 0x55;  // inside IHDR: its CRC no longer matches
    auto broken = DecodeImage(png, 1 << 20);
    QVERIFY(!broken.ok());
    QVERIFY2(Says(broken.status(), "PNG"), broken.status().ToString().c_str());
    auto unknown = DecodeImage("GIF89a......", 1 << 20);
    QVERIFY(!unknown.ok());
    QVERIFY(Says(unknown.status(), "not PNG, JPEG or WebP"));
    QVERIFY(Says(DecodeImage("", 1 << 20).status(), "empty"));
  }

  void imagesOverThePixelLimitAreRefusedBeforeDecoding() {
    const std::vector<uint8_t> rgb = Pattern(100, 50, 3);
    for (const std::string& bytes : {EncodePng(rgb, 100, 50, false), EncodeJpeg(rgb, 100, 50), EncodeWebpLossless(rgb, 100, 50)}) {
      auto image = DecodeImage(bytes, 4999);
      QVERIFY(!image.ok());
      QVERIFY2(Says(image.status(), "100 x 50 pixels, over the limit of 4999"), image.status().ToString().c_str());
      QVERIFY(DecodeImage(bytes, 5000).ok());
    }
  }
};

QTEST_GUILESS_MAIN(TestImageDecode)
#include "test_image_decode.moc"
