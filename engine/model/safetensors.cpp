#include "engine/model/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "engine/core/bf16.h"
#include "engine/core/fp8.h"

namespace anchorage {

namespace {

using json = nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100u << 20;

Result<DType> ParseDType(const std::string& s, const std::string& where) {
  if (s == "BF16") return DType::kBF16;
  if (s == "F16") return DType::kF16;
  if (s == "F32") return DType::kF32;
  if (s == "F8_E4M3") return DType::kF8E4M3;
  return Unsupported(where + ": dtype " + s + " is not supported (BF16, F16, F32, F8_E4M3)");
}

}  // namespace

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return "BF16";
    case DType::kF16: return "F16";
    case DType::kF32: return "F32";
    case DType::kF8E4M3: return "F8_E4M3";
  }
  return "?";
}

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kF8E4M3: return 1;
    case DType::kBF16:
    case DType::kF16: break;
  }
  return 2;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

float TensorView::At(int64_t i) const {
  switch (dtype) {
    case DType::kBF16: { uint16_t h; std::memcpy(&h, data + 2 * i, 2); return Bf16ToFloat(h); }
    case DType::kF16: { uint16_t h; std::memcpy(&h, data + 2 * i, 2); return Fp16ToFloat(h); }
    case DType::kF32: { float f; std::memcpy(&f, data + 4 * i, 4); return f; }
    case DType::kF8E4M3: return Fp8E4m3ToFloat(static_cast<uint8_t>(data[i]));
  }
  return 0.0f;
}

void TensorView::ToFloat(int64_t begin, int64_t count, float* out) const {
  if (dtype == DType::kBF16) {
    for (int64_t i = 0; i < count; ++i) {
      uint16_t h;
      std::memcpy(&h, data + 2 * (begin + i), 2);
      out[i] = Bf16ToFloat(h);
    }
    return;
  }
  for (int64_t i = 0; i < count; ++i) out[i] = At(begin + i);
}

void SafetensorsSet::DropResidentPages() const {
  for (const auto& map : maps_) map->DropResidentPages();
}

uint64_t SafetensorsSet::total_bytes() const {
  uint64_t n = 0;
  for (const auto& [name, t] : tensors_) n += t.bytes;
  return n;
}

const TensorView* SafetensorsSet::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

Status SafetensorsSet::AddFile(const std::string& path, const std::string& display_name) {
  ASSIGN_OR_RETURN(MappedFile map, MappedFile::Open(path));
  if (map.size() < 8) return Corrupt(path + ": file is " + std::to_string(map.size()) + " bytes, too short for a safetensors header");
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, map.data(), 8);
  if (header_bytes > kMaxHeaderBytes || header_bytes > map.size() - 8)
    return Corrupt(path + ": header length " + std::to_string(header_bytes) + " exceeds the file (" + std::to_string(map.size()) + " bytes)");
  std::string header_text(reinterpret_cast<const char*>(map.data()) + 8, header_bytes);
  json header = json::parse(header_text, nullptr, false);
  if (header.is_discarded() || !header.is_object()) return Corrupt(path + ": header is not a JSON object");

  const uint64_t data_start = 8 + header_bytes;
  const uint64_t data_bytes = map.size() - data_start;
  auto shared = std::make_shared<MappedFile>(std::move(map));
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  std::vector<std::string> range_names;

  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") continue;
    const std::string where = path + ": tensor '" + name + "'";
    const json& info = it.value();
    if (!info.is_object() || !info.contains("dtype") || !info.contains("shape") || !info.contains("data_offsets"))
      return Corrupt(where + " lacks dtype, shape or data_offsets");
    if (!info["dtype"].is_string() || !info["shape"].is_array() || !info["data_offsets"].is_array() || info["data_offsets"].size() != 2)
      return Corrupt(where + " has malformed dtype, shape or data_offsets");
    ASSIGN_OR_RETURN(DType dtype, ParseDType(info["dtype"].get<std::string>(), where));
    TensorView t;
    t.name = name;
    t.dtype = dtype;
    t.file = display_name;
    uint64_t numel = 1;
    for (const json& d : info["shape"]) {
      if (!d.is_number_unsigned() && !(d.is_number_integer() && d.get<int64_t>() >= 0)) return Corrupt(where + " has a negative or non-integer dimension");
      t.shape.push_back(d.get<int64_t>());
      numel *= static_cast<uint64_t>(d.get<int64_t>());
    }
    const json& off = info["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) return Corrupt(where + " has non-integer data_offsets");
    uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (begin > end || end > data_bytes)
      return Corrupt(where + " data [" + std::to_string(begin) + ", " + std::to_string(end) + ") lies outside the file's " + std::to_string(data_bytes) + " data bytes (truncated?)");
    if (end - begin != numel * DTypeSize(dtype))
      return Corrupt(where + " holds " + std::to_string(end - begin) + " bytes but its shape and dtype need " + std::to_string(numel * DTypeSize(dtype)));
    if (tensors_.count(name)) return Corrupt(where + " appears twice in the checkpoint");
    t.data = shared->data() + data_start + begin;
    t.bytes = end - begin;
    ranges.emplace_back(begin, end);
    range_names.push_back(name);
    tensors_.emplace(name, std::move(t));
  }

  std::vector<size_t> order(ranges.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ranges[a] < ranges[b]; });
  for (size_t i = 1; i < order.size(); ++i) {
    const auto& prev = ranges[order[i - 1]];
    const auto& cur = ranges[order[i]];
    if (cur.first < prev.second && cur.second > cur.first)
      return Corrupt(path + ": tensors '" + range_names[order[i - 1]] + "' and '" + range_names[order[i]] + "' overlap");
  }
  maps_.push_back(std::move(shared));
  file_paths_.push_back(path);
  return Status::Ok();
}

Result<SafetensorsSet> SafetensorsSet::OpenFile(const std::string& path) {
  SafetensorsSet set;
  RETURN_IF_ERROR(set.AddFile(path, std::filesystem::path(path).filename().string()));
  return set;
}

Result<SafetensorsSet> SafetensorsSet::OpenDirectory(const std::string& dir) {
  namespace fs = std::filesystem;
  SafetensorsSet set;
  const std::string index_path = (fs::path(dir) / "model.safetensors.index.json").string();
  if (FileExists(index_path)) {
    ASSIGN_OR_RETURN(std::string text, ReadFile(index_path));
    json index = json::parse(text, nullptr, false);
    if (index.is_discarded() || !index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
      return Corrupt(index_path + ": expected an object with a 'weight_map' object");
    std::vector<std::string> shards;
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
      if (!it.value().is_string()) return Corrupt(index_path + ": weight_map entry '" + it.key() + "' is not a file name");
      std::string shard = it.value().get<std::string>();
      if (shard.find('/') != std::string::npos) return Corrupt(index_path + ": shard name '" + shard + "' must be a plain file name");
      if (std::find(shards.begin(), shards.end(), shard) == shards.end()) shards.push_back(shard);
    }
    std::sort(shards.begin(), shards.end());
    for (const std::string& shard : shards) {
      const std::string shard_path = (fs::path(dir) / shard).string();
      if (!FileExists(shard_path)) return NotFound(index_path + " names shard " + shard + ", which is missing");
      RETURN_IF_ERROR(set.AddFile(shard_path, shard));
    }
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
      const TensorView* t = set.Find(it.key());
      if (t == nullptr) return NotFound(index_path + ": tensor '" + it.key() + "' is not in its shard " + it.value().get<std::string>());
      if (t->file != it.value().get<std::string>())
        return Corrupt(index_path + ": tensor '" + it.key() + "' is listed in " + it.value().get<std::string>() + " but found in " + t->file);
    }
    return set;
  }
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.path().extension() == ".safetensors") files.push_back(entry.path().string());
  if (ec) return IoError("list " + dir + ": " + ec.message());
  if (files.empty()) return NotFound(dir + ": no *.safetensors file and no model.safetensors.index.json");
  std::sort(files.begin(), files.end());
  for (const std::string& f : files) RETURN_IF_ERROR(set.AddFile(f, fs::path(f).filename().string()));
  return set;
}

Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors) {
  std::vector<const TensorToWrite*> sorted;
  for (const auto& t : tensors) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->name < b->name; });
  json header = json::object();
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const TensorToWrite* t : sorted) {
    header[t->name] = {{"dtype", DTypeName(t->dtype)}, {"shape", t->shape}, {"data_offsets", {offset, offset + t->data.size()}}};
    offset += t->data.size();
  }
  std::string header_text = header.dump();
  while ((8 + header_text.size()) % 8 != 0) header_text.push_back(' ');
  std::string out;
  out.reserve(8 + header_text.size() + offset);
  uint64_t n = header_text.size();
  out.append(reinterpret_cast<const char*>(&n), 8);
  out += header_text;
  for (const TensorToWrite* t : sorted) out += t->data;
  return WriteFileAtomic(path, out);
}

}  // namespace anchorage
