// A DiskEnv over the real file system that fails chosen operations, for the disk caches' tests.
#pragma once

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "engine/cache/disk_env.h"

namespace anchorage::testing {

// Fails the operation numbered fail_at (0-based; Append, Sync, Close, Rename, SyncDirectory count),
// with ENOSPC's message; with crash set, every later operation fails too, as if the process died.
class FaultEnv : public DiskEnv {
 public:
  int64_t fail_at = -1;
  bool crash = false;
  std::atomic<int64_t> ops = 0;
  int64_t free_bytes = -1;  // what FreeBytes says when set
  std::atomic<int> read_delay_ms = 0;  // every ReadRanges waits this long first: a slow drive

  bool Fails() {
    const int64_t n = ops++;
    return (fail_at >= 0 && n == fail_at) || (crash && fail_at >= 0 && n > fail_at);
  }
  Status Injected(const std::string& what) { return IoError(what + ": No space left on device (injected)"); }

  class File : public WritableFile {
   public:
    File(FaultEnv& env, std::unique_ptr<WritableFile> real) : env_(env), real_(std::move(real)) {}
    Status Append(std::string_view b) override { return env_.Fails() ? env_.Injected("write") : real_->Append(b); }
    Status Sync() override { return env_.Fails() ? env_.Injected("fsync") : real_->Sync(); }
    Status Close() override {
      Status s = real_->Close();
      return env_.Fails() ? env_.Injected("close") : s;
    }

   private:
    FaultEnv& env_;
    std::unique_ptr<WritableFile> real_;
  };

  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    if (Fails()) return Injected("create " + path);
    ASSIGN_OR_RETURN(auto real, Posix().NewWritableFile(path));
    return std::unique_ptr<WritableFile>(new File(*this, std::move(real)));
  }
  Status Rename(const std::string& a, const std::string& b) override { return Fails() ? Injected("rename") : Posix().Rename(a, b); }
  Status Remove(const std::string& p) override {
    if (crash && fail_at >= 0 && ops > fail_at) return Injected("remove");  // a dead process removes nothing
    return Posix().Remove(p);
  }
  Status SyncDirectory(const std::string& d) override { return Fails() ? Injected("fsync dir") : Posix().SyncDirectory(d); }
  Result<std::string> ReadFile(const std::string& p) override { return Posix().ReadFile(p); }
  Result<std::string> ReadFilePrefix(const std::string& p, int64_t n) override { return Posix().ReadFilePrefix(p, n); }
  Status ReadRanges(const std::string& p, std::span<const ReadRange> ranges) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(read_delay_ms.load()));
    return Posix().ReadRanges(p, ranges);
  }
  Result<std::vector<std::string>> ListFiles(const std::string& d) override { return Posix().ListFiles(d); }
  Result<int64_t> FreeBytes(const std::string& d) override { return free_bytes >= 0 ? free_bytes : Posix().FreeBytes(d); }
  Result<int64_t> FileSize(const std::string& p) override { return Posix().FileSize(p); }
  Result<int64_t> ModifiedTimeMs(const std::string& p) override { return Posix().ModifiedTimeMs(p); }
  Status SetModifiedTimeMs(const std::string& p, int64_t ms) override { return Posix().SetModifiedTimeMs(p, ms); }
};

}  // namespace anchorage::testing
