// Safetensors checkpoints through mmap: one file or shards listed by model.safetensors.index.json.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/file_util.h"
#include "engine/core/status.h"

namespace anchorage {

enum class DType { kBF16, kF16, kF32, kF8E4M3 };

const char* DTypeName(DType dtype);
size_t DTypeSize(DType dtype);

// A tensor inside a mapped file; valid while its SafetensorsSet lives.
struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;
  size_t bytes = 0;
  std::string file;  // shard file name
  // An F8_E4M3 matrix's block scales (its name + "_scale_inv", weight = code x scale) and the rows and
  // columns a scale covers, set by MapWeights.
  const TensorView* scale_inv = nullptr;
  int64_t scale_block_rows = 0, scale_block_cols = 0;

  int64_t numel() const;
  bool empty() const { return data == nullptr; }
  // Element i converted to fp32 (an F8_E4M3 element without its scale).
  float At(int64_t i) const;
  // Elements [begin, begin + count) converted to fp32.
  void ToFloat(int64_t begin, int64_t count, float* out) const;
};

class SafetensorsSet {
 public:
  // Opens dir/model.safetensors.index.json when present, else every dir/*.safetensors.
  static Result<SafetensorsSet> OpenDirectory(const std::string& dir);
  // Opens one file.
  static Result<SafetensorsSet> OpenFile(const std::string& path);

  const TensorView* Find(const std::string& name) const;
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::vector<std::string>& files() const { return file_paths_; }
  uint64_t total_bytes() const;
  // Drops the mapped files' resident pages (once the weights have been copied elsewhere).
  void DropResidentPages() const;

 private:
  Status AddFile(const std::string& path, const std::string& display_name);

  std::vector<std::shared_ptr<MappedFile>> maps_;
  std::vector<std::string> file_paths_;
  std::map<std::string, TensorView> tensors_;
};

// Writes tensors to one safetensors file (header sorted by name, data 8-byte aligned as the format wants).
struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::string data;  // raw little-endian bytes
};
Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors);

}  // namespace anchorage
