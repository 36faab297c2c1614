// The one small file interface every disk cache goes through, so tests can fail any step (LevelDB's
// Env is the model), and the crash-safe write built on it: NAME.tmp, fsync, rename, fsync the folder.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/status.h"

namespace anchorage {

class WritableFile {
 public:
  virtual ~WritableFile() = default;
  virtual Status Append(std::string_view bytes) = 0;
  virtual Status Sync() = 0;
  virtual Status Close() = 0;
};

// Bytes [offset, offset + size) of a file, read into dest.
struct ReadRange {
  int64_t offset = 0;
  int64_t size = 0;
  char* dest = nullptr;
};

class DiskEnv {
 public:
  virtual ~DiskEnv() = default;
  // Creates or truncates path, mode 0600.
  virtual Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) = 0;
  virtual Status Rename(const std::string& from, const std::string& to) = 0;
  virtual Status Remove(const std::string& path) = 0;
  virtual Status SyncDirectory(const std::string& dir) = 0;
  virtual Result<std::string> ReadFile(const std::string& path) = 0;
  // Reads each range straight into its destination; a range past the end is a Corrupt status.
  virtual Status ReadRanges(const std::string& path, std::span<const ReadRange> ranges) {
    ASSIGN_OR_RETURN(std::string all, ReadFile(path));
    for (const ReadRange& r : ranges) {
      if (r.offset < 0 || r.size < 0 || r.offset > static_cast<int64_t>(all.size()) || r.size > static_cast<int64_t>(all.size()) - r.offset)
        return Corrupt(path + ": a section runs past the end of the file (truncated?)");
      std::copy_n(all.data() + r.offset, r.size, r.dest);
    }
    return Status::Ok();
  }
  // Up to max_bytes from the start of the file (a header).
  virtual Result<std::string> ReadFilePrefix(const std::string& path, int64_t max_bytes) = 0;
  // Names (not paths) of the regular files in dir.
  virtual Result<std::vector<std::string>> ListFiles(const std::string& dir) = 0;
  virtual Result<int64_t> FreeBytes(const std::string& dir) = 0;
  virtual Result<int64_t> FileSize(const std::string& path) = 0;
  // When the file was last used (written, or marked by TouchFile), in ms since the epoch.
  virtual Result<int64_t> ModifiedTimeMs(const std::string& path) = 0;
  virtual Status SetModifiedTimeMs(const std::string& path, int64_t ms) = 0;

  // The real file system.
  static DiskEnv& Posix();
};

inline constexpr std::string_view kTemporarySuffix = ".tmp";

// Writes the pieces to path + ".tmp", fsyncs it, renames it over path and fsyncs the folder. On any
// failure the .tmp is removed (where the env still lets us) and path is untouched.
Status WriteFileCrashSafe(DiskEnv& env, const std::string& path, std::span<const std::string_view> pieces);
inline Status WriteFileCrashSafe(DiskEnv& env, const std::string& path, std::string_view bytes) {
  return WriteFileCrashSafe(env, path, std::span(&bytes, 1));
}

// Removes every *.tmp in dir (a write a crash cut short); returns how many.
Result<int> SweepTemporaries(DiskEnv& env, const std::string& dir);

}  // namespace anchorage
