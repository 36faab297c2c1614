// Safetensors through mmap: good files and shards load; each malformed case names its tensor or file.
#include <QtTest>

#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "engine/core/file_util.h"
#include "engine/model/safetensors.h"

using namespace anchorage;
using json = nlohmann::json;

namespace {

// Writes a safetensors file from a header object and a data blob, byte for byte as given.
std::string WriteRaw(const std::string& path, const json& header, const std::string& data, int64_t header_len_override = -1) {
  std::string h = header.dump();
  uint64_t n = header_len_override >= 0 ? static_cast<uint64_t>(header_len_override) : h.size();
  std::string out(reinterpret_cast<const char*>(&n), 8);
  out += h + data;
  std::ofstream(path, std::ios::binary).write(out.data(), static_cast<std::streamsize>(out.size()));
  return path;
}

std::string Bytes(size_t n, char fill = 1) { return std::string(n, fill); }

}  // namespace

class TestSafetensors : public QObject {
  Q_OBJECT

 private:
  QTemporaryDir dir_;
  std::string Path(const std::string& name) { return (std::filesystem::path(dir_.path().toStdString()) / name).string(); }

  void ExpectError(const std::string& path, const std::string& expected) {
    auto set = SafetensorsSet::OpenFile(path);
    QVERIFY2(!set.ok(), ("expected an error for " + path).c_str());
    const std::string m = set.status().message();
    QVERIFY2(m.find(expected) != std::string::npos, m.c_str());
  }

 private slots:
  void writtenFileReadsBack() {
    std::vector<TensorToWrite> ts;
    std::string f32(4 * 6, '\0');
    for (int i = 0; i < 6; ++i) { float v = 0.5f * i; std::memcpy(&f32[4 * i], &v, 4); }
    ts.push_back({"b.weight", DType::kF32, {2, 3}, f32});
    ts.push_back({"a.weight", DType::kBF16, {4}, std::string("\x80\x3f\x00\x40\x40\x40\x80\x40", 8)});  // 1, 2, 3, 4
    ts.push_back({"c.half", DType::kF16, {1}, std::string("\x00\x3c", 2)});  // 1.0
    const std::string path = Path("ok.safetensors");
    QVERIFY(WriteSafetensors(path, ts).ok());
    auto set = SafetensorsSet::OpenFile(path);
    QVERIFY2(set.ok(), set.status().ToString().c_str());
    const TensorView* b = set->Find("b.weight");
    QVERIFY(b != nullptr);
    QCOMPARE(b->shape, (std::vector<int64_t>{2, 3}));
    QCOMPARE(b->At(5), 2.5f);
    QCOMPARE(set->Find("a.weight")->At(2), 3.0f);
    QCOMPARE(set->Find("c.half")->At(0), 1.0f);
    QCOMPARE(set->total_bytes(), uint64_t(24 + 8 + 2));
    // Data starts 8-byte aligned, as the format recommends.
    auto raw = ReadFile(path);
    QVERIFY(raw.ok());
    uint64_t header_len = 0;
    std::memcpy(&header_len, raw->data(), 8);
    QCOMPARE((8 + header_len) % 8, uint64_t(0));
  }

  void shortFile() {
    std::ofstream(Path("short.safetensors")) << "abc";
    ExpectError(Path("short.safetensors"), "too short for a safetensors header");
  }

  void headerLongerThanFile() {
    ExpectError(WriteRaw(Path("hl.safetensors"), json::object(), "", 1000), "header length 1000 exceeds the file");
  }

  void headerNotJson() {
    const std::string p = Path("nj.safetensors");
    std::string h = "{not json";
    uint64_t n = h.size();
    std::string out(reinterpret_cast<const char*>(&n), 8);
    std::ofstream(p, std::ios::binary) << out << h;
    ExpectError(p, "header is not a JSON object");
  }

  void truncatedTensor() {
    json h = {{"w", {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {0, 16}}}}};
    ExpectError(WriteRaw(Path("trunc.safetensors"), h, Bytes(10)), "tensor 'w' data [0, 16) lies outside the file's 10 data bytes");
  }

  void misShapedTensor() {
    json h = {{"w", {{"dtype", "BF16"}, {"shape", {3, 3}}, {"data_offsets", {0, 16}}}}};
    ExpectError(WriteRaw(Path("shape.safetensors"), h, Bytes(16)), "tensor 'w' holds 16 bytes but its shape and dtype need 18");
  }

  void overlappingTensors() {
    json h = {{"x", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 8}}}},
              {"y", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {4, 12}}}}};
    ExpectError(WriteRaw(Path("overlap.safetensors"), h, Bytes(12)), "tensors 'x' and 'y' overlap");
  }

  void unsupportedDtype() {
    json h = {{"q", {{"dtype", "I8"}, {"shape", {2}}, {"data_offsets", {0, 2}}}}};
    ExpectError(WriteRaw(Path("dtype.safetensors"), h, Bytes(2)), "tensor 'q': dtype I8 is not supported");
  }

  void missingFields() {
    json h = {{"q", {{"dtype", "F32"}, {"shape", {2}}}}};
    ExpectError(WriteRaw(Path("fields.safetensors"), h, Bytes(8)), "tensor 'q' lacks dtype, shape or data_offsets");
  }

  void negativeDimension() {
    json h = {{"q", {{"dtype", "F32"}, {"shape", {-2}}, {"data_offsets", {0, 8}}}}};
    ExpectError(WriteRaw(Path("neg.safetensors"), h, Bytes(8)), "tensor 'q' has a negative or non-integer dimension");
  }

  void missingFileIsNotFound() {
    auto set = SafetensorsSet::OpenFile(Path("absent.safetensors"));
    QVERIFY(!set.ok());
    QVERIFY(set.status().code() == StatusCode::kNotFound);
  }

  void shardedCheckpoint() {
    namespace fs = std::filesystem;
    const std::string d = Path("sharded");
    fs::create_directories(d);
    QVERIFY(WriteSafetensors(d + "/model-00001-of-00002.safetensors", {{"a", DType::kF32, {1}, Bytes(4)}}).ok());
    QVERIFY(WriteSafetensors(d + "/model-00002-of-00002.safetensors", {{"b", DType::kF32, {2}, Bytes(8)}}).ok());
    json index = {{"metadata", {{"total_size", 12}}}, {"weight_map", {{"a", "model-00001-of-00002.safetensors"}, {"b", "model-00002-of-00002.safetensors"}}}};
    std::ofstream(d + "/model.safetensors.index.json") << index.dump();
    auto set = SafetensorsSet::OpenDirectory(d);
    QVERIFY2(set.ok(), set.status().ToString().c_str());
    QCOMPARE(set->files().size(), size_t(2));
    QCOMPARE(set->Find("b")->file, std::string("model-00002-of-00002.safetensors"));

    index["weight_map"]["c"] = "model-00003-of-00002.safetensors";
    std::ofstream(d + "/model.safetensors.index.json") << index.dump();
    auto missing = SafetensorsSet::OpenDirectory(d);
    QVERIFY(!missing.ok());
    QVERIFY2(missing.status().message().find("names shard model-00003-of-00002.safetensors, which is missing") != std::string::npos, missing.status().message().c_str());

    index["weight_map"].erase("c");
    index["weight_map"]["a"] = "model-00002-of-00002.safetensors";
    std::ofstream(d + "/model.safetensors.index.json") << index.dump();
    auto wrong = SafetensorsSet::OpenDirectory(d);
    QVERIFY(!wrong.ok());
    QVERIFY2(wrong.status().message().find("tensor 'a' is not in its shard") != std::string::npos, wrong.status().message().c_str());
  }

  void emptyFolder() {
    const std::string d = Path("empty");
    std::filesystem::create_directories(d);
    auto set = SafetensorsSet::OpenDirectory(d);
    QVERIFY(!set.ok());
    QVERIFY(set.status().message().find("no *.safetensors file") != std::string::npos);
  }
};

QTEST_APPLESS_MAIN(TestSafetensors)
#include "test_safetensors.moc"
