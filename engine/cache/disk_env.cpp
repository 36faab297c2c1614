#include "engine/cache/disk_env.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "engine/core/file_util.h"

namespace anchorage {
namespace {

std::string Errno() { return std::strerror(errno); }

class PosixWritableFile : public WritableFile {
 public:
  PosixWritableFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
  }
  Status Append(std::string_view bytes) override {
    while (!bytes.empty()) {
      const ssize_t n = ::write(fd_, bytes.data(), bytes.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        return IoError("write " + path_ + ": " + Errno());
      }
      bytes.remove_prefix(static_cast<size_t>(n));
    }
    return Status::Ok();
  }
  Status Sync() override {
    if (::fdatasync(fd_) != 0) return IoError("fsync " + path_ + ": " + Errno());
    ::posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED);  // written through: keep the page cache for others
    return Status::Ok();
  }
  Status Close() override {
    const int fd = fd_;
    fd_ = -1;
    return ::close(fd) == 0 ? Status::Ok() : IoError("close " + path_ + ": " + Errno());
  }

 private:
  int fd_;
  std::string path_;
};

class PosixEnv : public DiskEnv {
 public:
  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return IoError("create " + path + ": " + Errno());
    return std::unique_ptr<WritableFile>(new PosixWritableFile(fd, path));
  }
  Status Rename(const std::string& from, const std::string& to) override {
    return ::rename(from.c_str(), to.c_str()) == 0 ? Status::Ok() : IoError("rename " + from + " to " + to + ": " + Errno());
  }
  Status Remove(const std::string& path) override {
    return ::unlink(path.c_str()) == 0 || errno == ENOENT ? Status::Ok() : IoError("remove " + path + ": " + Errno());
  }
  Status SyncDirectory(const std::string& dir) override {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return IoError("open " + dir + ": " + Errno());
    const bool ok = ::fsync(fd) == 0;
    const std::string error = ok ? "" : Errno();
    ::close(fd);
    return ok ? Status::Ok() : IoError("fsync " + dir + ": " + error);
  }
  Result<std::string> ReadFile(const std::string& path) override {
    std::string out;
    RETURN_IF_ERROR(Read(path, -1, &out));
    return out;
  }
  Result<std::string> ReadFilePrefix(const std::string& path, int64_t max_bytes) override {
    std::string out;
    RETURN_IF_ERROR(Read(path, max_bytes, &out));
    return out;
  }

  // The file's first max_bytes (all of it when negative), sized once and read straight into place.
  static Status Read(const std::string& path, int64_t max_bytes, std::string* out_string) {
    std::string& out = *out_string;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return IoError("open " + path + ": " + Errno());
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      ::close(fd);
      return IoError("stat " + path + ": " + Errno());
    }
    const int64_t size = max_bytes < 0 ? static_cast<int64_t>(st.st_size) : std::min<int64_t>(max_bytes, st.st_size);
    // A header read must not pull the rest of the file in behind it.
    ::posix_fadvise(fd, 0, size, max_bytes < 0 ? POSIX_FADV_SEQUENTIAL : POSIX_FADV_RANDOM);
    out.resize(static_cast<size_t>(size));
    size_t got = 0;
    while (got < out.size()) {
      const ssize_t n = ::read(fd, out.data() + got, out.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const std::string error = Errno();
        ::close(fd);
        return IoError("read " + path + ": " + error);
      }
      if (n == 0) break;
      got += static_cast<size_t>(n);
    }
    ::posix_fadvise(fd, 0, size, POSIX_FADV_DONTNEED);
    ::close(fd);
    out.resize(got);
    return Status::Ok();
  }
  // Page-aligned ranges come straight from the drive (O_DIRECT), each run of them that lies back to
  // back in the file in one call; the rest, or all where the file system refuses O_DIRECT, through
  // the page cache, dropped after.
  Status ReadRanges(const std::string& path, std::span<const ReadRange> all) override {
    std::vector<ReadRange> ranges;  // an empty range reads nothing (and would read as a short file)
    for (const ReadRange& r : all)
      if (r.size > 0) ranges.push_back(r);
    if (ranges.empty()) return Status::Ok();
    const int direct = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    int buffered = -1;
    Status s = Status::Ok();
    for (size_t i = 0; s.ok() && i < ranges.size();) {
      size_t end = i + 1;
      if (direct >= 0 && PageAligned(ranges[i])) {
        while (end < ranges.size() && end - i < kMaxRun && PageAligned(ranges[end]) &&
               ranges[end].offset == ranges[end - 1].offset + ranges[end - 1].size)
          ++end;
        s = ReadRun(direct, path, std::span(ranges).subspan(i, end - i));
        if (s.ok()) {
          i = end;
          continue;
        }
        if (s.code() != StatusCode::kUnsupported) break;
        s = Status::Ok();  // this file system takes O_DIRECT opens but not these reads
        end = i + 1;
      }
      if (buffered < 0) {
        buffered = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (buffered < 0) {
          s = IoError("open " + path + ": " + Errno());
          break;
        }
        ::posix_fadvise(buffered, 0, 0, POSIX_FADV_SEQUENTIAL);
      }
      s = ReadRun(buffered, path, std::span(ranges).subspan(i, 1));
      i = end;
    }
    if (buffered >= 0) {
      ::posix_fadvise(buffered, 0, 0, POSIX_FADV_DONTNEED);
      ::close(buffered);
    }
    if (direct >= 0) ::close(direct);
    return s;
  }

  static constexpr int64_t kDirectAlign = 4096;
  static constexpr size_t kMaxRun = 512;  // iovecs in one call, under IOV_MAX

  static bool PageAligned(const ReadRange& r) {
    return r.offset % kDirectAlign == 0 && r.size % kDirectAlign == 0 && reinterpret_cast<uintptr_t>(r.dest) % kDirectAlign == 0;
  }

  // Ranges that lie back to back in the file, read with as few calls as the kernel allows. A
  // refused read (EINVAL) is an Unsupported status, so the caller can read another way.
  static Status ReadRun(int fd, const std::string& path, std::span<const ReadRange> run) {
    std::vector<iovec> iov(run.size());
    for (size_t k = 0; k < run.size(); ++k) iov[k] = {run[k].dest, static_cast<size_t>(run[k].size)};
    int64_t offset = run.front().offset;
    size_t first = 0;
    while (first < iov.size()) {
      const ssize_t n = ::preadv(fd, iov.data() + first, static_cast<int>(iov.size() - first), offset);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EINVAL) return Unsupported("read " + path + ": " + Errno());
      if (n < 0) return IoError("read " + path + ": " + Errno());
      if (n == 0) return Corrupt(path + ": a section runs past the end of the file (truncated?)");
      offset += n;
      for (size_t left = static_cast<size_t>(n); left > 0;) {
        const size_t take = std::min(left, iov[first].iov_len);
        iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + take;
        iov[first].iov_len -= take;
        left -= take;
        if (iov[first].iov_len == 0) ++first;
      }
      while (first < iov.size() && iov[first].iov_len == 0) ++first;
    }
    return Status::Ok();
  }
  Result<std::vector<std::string>> ListFiles(const std::string& dir) override {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return IoError("list " + dir + ": " + Errno());
    std::vector<std::string> names;
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      struct stat st;
      if (::stat((dir + "/" + name).c_str(), &st) == 0 && S_ISREG(st.st_mode)) names.push_back(name);
    }
    ::closedir(d);
    return names;
  }
  Result<int64_t> FileSize(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return IoError("stat " + path + ": " + Errno());
    return static_cast<int64_t>(st.st_size);
  }
  Result<int64_t> ModifiedTimeMs(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return IoError("stat " + path + ": " + Errno());
    return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000 + st.st_mtim.tv_nsec / 1000000;
  }
  Status SetModifiedTimeMs(const std::string& path, int64_t ms) override {
    const timespec t{static_cast<time_t>(ms / 1000), static_cast<long>(ms % 1000) * 1000000};
    const timespec times[2] = {t, t};
    return ::utimensat(AT_FDCWD, path.c_str(), times, 0) == 0 ? Status::Ok() : IoError("touch " + path + ": " + Errno());
  }
  Result<int64_t> FreeBytes(const std::string& dir) override {
    struct statvfs s;
    if (::statvfs(dir.c_str(), &s) != 0) return IoError("statvfs " + dir + ": " + Errno());
    return static_cast<int64_t>(s.f_bavail) * static_cast<int64_t>(s.f_frsize);
  }
};

}  // namespace

DiskEnv& DiskEnv::Posix() {
  static PosixEnv env;
  return env;
}

Status WriteFileCrashSafe(DiskEnv& env, const std::string& path, std::span<const std::string_view> pieces) {
  const std::string tmp = path + std::string(kTemporarySuffix);
  auto file = env.NewWritableFile(tmp);
  if (!file.ok()) return file.status();
  Status s = Status::Ok();
  for (std::string_view piece : pieces)
    if (s = (*file)->Append(piece); !s.ok()) break;
  if (s.ok()) s = (*file)->Sync();
  if (Status closed = (*file)->Close(); s.ok()) s = closed;
  if (s.ok()) s = env.Rename(tmp, path);
  if (!s.ok()) {
    (void)env.Remove(tmp);
    return s;
  }
  std::string dir = std::filesystem::path(path).parent_path().string();
  return env.SyncDirectory(dir.empty() ? "." : dir);
}

Result<int> SweepTemporaries(DiskEnv& env, const std::string& dir) {
  ASSIGN_OR_RETURN(std::vector<std::string> names, env.ListFiles(dir));
  int removed = 0;
  for (const std::string& name : names) {
    if (!name.ends_with(kTemporarySuffix)) continue;
    RETURN_IF_ERROR(env.Remove(dir + "/" + name));
    ++removed;
  }
  return removed;
}

}  // namespace anchorage
