// The disk tier's store against a cold prefill: a head of N tokens prefilled cold, put on the disk,
// dropped from the page cache and restored, with the machine's sequential read rate beside it.
// anchorage-bench-disk [--model-dir DIR] [--tokens 8192] [--dir /tmp/anchorage-bench/disk] [--repeats N] [--json]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "engine/cache/disk_tier.h"
#include "engine/model/model.h"
#include "engine/runtime/forward.h"

using namespace anchorage;
namespace fs = std::filesystem;

namespace {

// Asks the kernel to forget a file's cached pages, so the next read comes from the drive.
void DropCachedPages(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

void DropFolder(const std::string& dir) {
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) DropCachedPages(e.path().string());
}

// Sequential read rate of a fresh file of `bytes`, out of the page cache, in GB/s.
double SequentialReadGBs(const std::string& dir, int64_t bytes) {
  const std::string path = dir + "/read-rate.bin";
  {
    std::vector<char> block(size_t(8) << 20, 'x');
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    for (int64_t done = 0; done < bytes; done += static_cast<int64_t>(block.size()))
      if (::write(fd, block.data(), block.size()) < 0) break;
    ::close(fd);
  }
  DropCachedPages(path);
  std::vector<char> block(size_t(8) << 20);
  const double t0 = bench::NowMs();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  int64_t got = 0;
  for (ssize_t n; (n = ::read(fd, block.data(), block.size())) > 0;) got += n;
  ::close(fd);
  const double ms = bench::NowMs() - t0;
  fs::remove(path);
  return static_cast<double>(got) / (ms / 1e3) / 1e9;
}

int Fail(const Status& s) {
  std::fprintf(stderr, "%s\n", s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_dir, dir = "/tmp/anchorage-bench/disk";
  int64_t tokens = 8192;
  int repeats = 1;
  bool as_json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const std::string v = i + 1 < argc ? argv[i + 1] : "";
    if (a == "--json") as_json = true;
    else if (a == "--model-dir") model_dir = v, ++i;
    else if (a == "--tokens") tokens = std::atoll(v.c_str()), ++i;
    else if (a == "--dir") dir = v, ++i;
    else if (a == "--repeats") repeats = std::max(1, std::atoi(v.c_str())), ++i;
    else {
      std::fprintf(stderr, "usage: anchorage-bench-disk [--model-dir DIR] [--tokens N] [--dir DIR] [--repeats N] [--json]\n");
      return 2;
    }
  }
  if (model_dir.empty()) model_dir = bench::ModelFolder("small");
  auto model = LoadModel(model_dir);
  if (!model.ok()) return Fail(model.status());
  const ModelConfig& c = (*model)->config;
  auto forward = Forward::Create(c, (*model)->weights, ForwardOptions{1024, 0});
  if (!forward.ok()) return Fail(forward.status());
  const int64_t line = tokens / 1024 * 1024;
  if (line <= 0) return Fail(InvalidArgument("--tokens must be at least 1024"));
  std::vector<int32_t> prompt(static_cast<size_t>(line + 64));
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(3 + (i * 2654435761u) % static_cast<size_t>(c.vocab_size - 16));
  fs::remove_all(dir);

  SequenceState cold(c);
  double t0 = bench::NowMs();
  if (auto r = (*forward)->Prefill(cold, std::span(prompt.data(), size_t(line))); !r.ok()) return Fail(r.status());
  const double prefill_ms = bench::NowMs() - t0;

  auto tier = DiskTier::Open(DiskEnv::Posix(), c, Forward::StateFingerprint((*model)->fingerprint), DiskTierOptions{dir, 1024, int64_t(1) << 40});
  if (!tier.ok()) return Fail(tier.status());
  t0 = bench::NowMs();
  if (Status s = (*tier)->Put(prompt, cold); !s.ok()) return Fail(s);
  const double write_ms = bench::NowMs() - t0;
  const int64_t bytes = (*tier)->stats().bytes;
  DropFolder(dir);

  SequenceState warm(c);
  t0 = bench::NowMs();
  if (Status s = (*tier)->Restore(prompt, line, warm); !s.ok()) return Fail(s);
  const double restore_ms = bench::NowMs() - t0;
  const bool exact = warm.BitEqual(cold);
  SequenceState again(c);
  double cached_restore_ms = 1e300;
  for (int r = 0; r < repeats; ++r) {  // the best of repeats, the files in the page cache
    t0 = bench::NowMs();
    if (Status s = (*tier)->Restore(prompt, line, again); !s.ok()) return Fail(s);
    cached_restore_ms = std::min(cached_restore_ms, bench::NowMs() - t0);
  }
  const double read_gbs = SequentialReadGBs(dir, std::max<int64_t>(bytes, int64_t(1) << 30));
  const double restore_gbs = static_cast<double>(bytes) / (restore_ms / 1e3) / 1e9;

  nlohmann::json report = {{"tokens", line}, {"bytes", bytes}, {"cold_prefill_ms", prefill_ms}, {"write_ms", write_ms},
                           {"restore_ms", restore_ms}, {"restore_from_page_cache_ms", cached_restore_ms}, {"restore_gbs", restore_gbs}, {"sequential_read_gbs", read_gbs},
                           {"restore_fraction_of_read_rate", restore_gbs / read_gbs}, {"bit_equal", exact}, {"threads", (*forward)->threads()}};
  if (as_json) {
    std::printf("%s\n", report.dump(2).c_str());
  } else {
    std::printf("head of %lld tokens: %.1f MiB on disk (%lld files)\n", static_cast<long long>(line),
                static_cast<double>(bytes) / (1 << 20), static_cast<long long>((*tier)->stats().files));
    std::printf("cold prefill %.0f ms (%d threads); write %.0f ms; restore from the drive %.0f ms (%.2f GB/s)\n", prefill_ms,
                (*forward)->threads(), write_ms, restore_ms, restore_gbs);
    std::printf("restore again, files in the page cache: %.0f ms (the part that is not the drive)\n", cached_restore_ms);
    std::printf("machine: sequential read %.2f GB/s; the restore ran at %.0f %% of it; restore / cold prefill = %.1f %%\n",
                read_gbs, 100.0 * restore_gbs / read_gbs, 100.0 * restore_ms / prefill_ms);
    std::printf("restored state bit-equal to the cold prefill: %s\n", exact ? "yes" : "NO");
  }
  fs::remove_all(dir);
  return exact ? 0 : 1;
}
