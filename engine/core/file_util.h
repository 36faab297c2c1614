// File helpers: whole-file reads, read-only mmap, crash-safe atomic writes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "engine/core/status.h"

namespace anchorage {

Result<std::string> ReadFile(const std::string& path);

// Writes path.tmp, fsyncs it, renames it over path and fsyncs the directory.
Status WriteFileAtomic(const std::string& path, std::string_view contents);

bool FileExists(const std::string& path);
bool IsDirectory(const std::string& path);
Status MakeDirectories(const std::string& path, int mode = 0755);

// A read-only memory map of a whole file; unmapped on destruction. Move-only.
class MappedFile {
 public:
  MappedFile() = default;
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  static Result<MappedFile> Open(const std::string& path);

  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Lets the kernel drop the mapping's resident pages; a later read faults them in from the file.
  void DropResidentPages() const;

 private:
  std::byte* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

}  // namespace anchorage
