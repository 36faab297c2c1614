// The disk tier against a cold prefill: a request of N + 200 tokens prefilled cold through the
// engine's caches (its writer puts the head on disk), the files dropped from the page cache, then
// the same request from a fresh engine: TTFT both ways, the restore's rate against the machine's
// sequential read rate, and the restored state against the cold one, bit for bit. With
// --restore-only the state is made of pseudo-random rows instead of a prefill (any length, quickly),
// and only the restore is measured.
// anchorage-bench-disk [--model-dir DIR] [--tokens 8192] [--dir /tmp/anchorage-bench/disk] [--repeats N] [--restore-only] [--json]
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
#include "engine/cache/disk_cache.h"
#include "engine/cache/disk_tier.h"
#include "engine/cache/resident_prefix.h"
#include "engine/compute/cpu/matmul.h"
#include "engine/core/page_buffer.h"
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

// A state of `length` rows of pseudo-random floats, the same for the same seed.
SequenceState RandomState(const ModelConfig& c, int64_t length, uint32_t seed) {
  SequenceState s(c);
  (void)s.Reserve(length);
  uint32_t x = seed * 2654435761u + 1;
  auto fill = [&](float* p, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      x ^= x << 13, x ^= x >> 17, x ^= x << 5;
      p[i] = static_cast<float>(static_cast<int32_t>(x)) * 0x1p-31f;
    }
  };
  for (int64_t a = 0; a < s.num_attention_layers(); ++a) {
    fill(s.k_rows(a), length * s.kv_width());
    fill(s.v_rows(a), length * s.kv_width());
  }
  for (int64_t g = 0; g < s.num_gdn_layers(); ++g) {
    fill(s.recurrent(g), s.recurrent_floats());
    fill(s.conv_tail(g), s.tail_floats());
  }
  s.SetLength(length);
  return s;
}

// How fast this machine hands out fresh memory: bytes of a new mapping touched once a page, in
// GB/s (a restore into a new state pays it; in a VM each first touch can cost a trip to the host).
double FirstTouchGBs(int64_t bytes) {
  PageBuffer buffer(static_cast<size_t>(bytes));
  volatile char* p = static_cast<char*>(buffer.data());
  const double t0 = bench::NowMs();
  for (int64_t i = 0; i < bytes; i += 4096) p[i] = 1;
  return static_cast<double>(bytes) / ((bench::NowMs() - t0) / 1e3) / 1e9;
}

// The restore alone: a pseudo-random state of `tokens` rows put on disk, dropped from the page
// cache, and read back; its rate against the machine's sequential read rate.
int RestoreOnly(const ModelConfig& c, int64_t tokens, const std::string& dir, int repeats, bool as_json) {
  const int64_t G = 1024, line = tokens / G * G;
  if (line <= 0) return bench::Fail(InvalidArgument("--tokens must be at least 1024"));
  const std::vector<int32_t> prompt = bench::PromptIds(c, line);
  const SequenceState written = RandomState(c, line, 7);
  fs::remove_all(dir);
  auto tier = DiskTier::Open(DiskEnv::Posix(), c, "bench/grid-1024", DiskTierOptions{dir, G, int64_t(1) << 40, 0, 0, nullptr});
  if (!tier.ok()) return bench::Fail(tier.status());
  double t0 = bench::NowMs();
  if (Status s = (*tier)->Put(prompt, written); !s.ok()) return bench::Fail(s);
  const double write_ms = bench::NowMs() - t0;
  const int64_t bytes = (*tier)->stats().bytes, files = (*tier)->stats().files;
  // Into a fresh state (its memory mapped as the rows arrive), and into one that holds its memory.
  double best_ms = 1e300, sum_ms = 0, reused_best_ms = 1e300;
  bool exact = true;
  SequenceState reused(c);
  for (int r = 0; r < repeats; ++r) {
    DropFolder(dir);
    SequenceState read(c);
    t0 = bench::NowMs();
    if (Status s = (*tier)->Restore(prompt, line, read); !s.ok()) return bench::Fail(s);
    const double ms = bench::NowMs() - t0;
    best_ms = std::min(best_ms, ms);
    sum_ms += ms;
    exact = exact && read.BitEqual(written);
    DropFolder(dir);
    t0 = bench::NowMs();
    if (Status s = (*tier)->Restore(prompt, line, reused); !s.ok()) return bench::Fail(s);
    reused_best_ms = std::min(reused_best_ms, bench::NowMs() - t0);
    exact = exact && reused.BitEqual(written);
  }
  tier->reset();
  const double read_gbs = SequentialReadGBs(dir, std::max<int64_t>(bytes, int64_t(1) << 30));
  const double touch_gbs = FirstTouchGBs(bytes);
  fs::remove_all(dir);
  const double restore_gbs = static_cast<double>(bytes) / (best_ms / 1e3) / 1e9;
  const double reused_gbs = static_cast<double>(bytes) / (reused_best_ms / 1e3) / 1e9;
  if (as_json) {
    const nlohmann::json report = {{"tokens", line}, {"bytes", bytes}, {"files", files}, {"write_ms", write_ms},
                                   {"restore_best_ms", best_ms}, {"restore_mean_ms", sum_ms / repeats}, {"restore_gbs", restore_gbs},
                                   {"restore_reused_state_best_ms", reused_best_ms}, {"restore_reused_state_gbs", reused_gbs},
                                   {"sequential_read_gbs", read_gbs}, {"restore_fraction_of_read_rate", restore_gbs / read_gbs},
                                   {"reused_state_fraction_of_read_rate", reused_gbs / read_gbs}, {"first_touch_gbs", touch_gbs},
                                   {"bit_equal", exact}};
    std::printf("%s\n", report.dump(2).c_str());
  } else {
    std::printf("state of %lld rows: %.1f MiB on disk (%lld files), written in %.0f ms\n", static_cast<long long>(line),
                static_cast<double>(bytes) / (1 << 20), static_cast<long long>(files), write_ms);
    std::printf("restore from the drive into a new state: best %.0f ms, mean %.0f ms of %d (%.2f GB/s at best)\n", best_ms, sum_ms / repeats,
                repeats, restore_gbs);
    std::printf("into a state that holds its memory: best %.0f ms (%.2f GB/s)\n", reused_best_ms, reused_gbs);
    std::printf("machine: sequential read %.2f GB/s, first touch of fresh memory %.2f GB/s\n", read_gbs, touch_gbs);
    std::printf("the restore ran at %.0f %% of the read rate into a new state, %.0f %% into a held one\n", 100.0 * restore_gbs / read_gbs,
                100.0 * reused_gbs / read_gbs);
    std::printf("restored state bit-equal to the written one: %s\n", exact ? "yes" : "NO");
  }
  return exact ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_dir, dir = "/tmp/anchorage-bench/disk";
  int64_t tokens = 8192;
  int repeats = 1;
  bool as_json = false, restore_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const std::string v = i + 1 < argc ? argv[i + 1] : "";
    if (a == "--json") as_json = true;
    else if (a == "--restore-only") restore_only = true;
    else if (a == "--model-dir") model_dir = v, ++i;
    else if (a == "--tokens") tokens = std::atoll(v.c_str()), ++i;
    else if (a == "--dir") dir = v, ++i;
    else if (a == "--repeats") repeats = std::max(1, std::atoi(v.c_str())), ++i;
    else {
      std::fprintf(stderr, "usage: anchorage-bench-disk [--model-dir DIR] [--tokens N] [--dir DIR] [--repeats N] [--restore-only] [--json]\n");
      return 2;
    }
  }
  if (model_dir.empty()) model_dir = bench::ModelFolder("small");
  auto model = LoadModel(model_dir);
  if (!model.ok()) return bench::Fail(model.status());
  const ModelConfig& c = (*model)->config;
  if (restore_only) return RestoreOnly(c, tokens, dir, repeats, as_json);
  auto forward = Forward::Create(c, (*model)->weights, ForwardOptions{1024, 0});
  if (!forward.ok()) return bench::Fail(forward.status());
  const int64_t line = tokens / 1024 * 1024;
  if (line <= 0) return bench::Fail(InvalidArgument("--tokens must be at least 1024"));
  // A head of `line` tokens and a new user message of 200 after it.
  const std::vector<int32_t> prompt = bench::PromptIds(c, line + 200);
  fs::remove_all(dir);
  const std::string fingerprint = Forward::StateFingerprint((*model)->fingerprint) + "/grid-1024";
  DiskCacheSettings settings;
  settings.admit_after = 1;
  settings.min_tokens = 0;
  settings.min_free_bytes = 0;
  settings.budget_bytes = int64_t(1) << 40;
  // Time to the first token of a request through the engine's caches (RAM empty), and its token.
  auto first_token = [&](DiskCache& disk, double* ttft_ms, ResumeInfo* info, SequenceState* reference) -> Result<int32_t> {
    ResidentOptions options;
    options.disk = settings;
    ResidentPrefix rp(**forward, nullptr, options);
    rp.set_disk_cache(&disk);
    SamplingParams greedy;
    greedy.temperature = 0;
    greedy.max_tokens = 1;
    const double start = bench::NowMs();
    double first = 0;
    ASSIGN_OR_RETURN(CachedGeneration out, rp.Generate(CacheRequest{prompt, "bench", 1, 0}, greedy, [&](const GeneratedToken&) {
                       if (first == 0) first = bench::NowMs();
                       return true;
                     }));
    *ttft_ms = first - start;
    *info = out.resume;
    if (reference != nullptr) {  // the cold prefill's rows and state at the line
      const Anchor* a = rp.anchors().LargestAtOrBelow(line);
      if (a == nullptr || a->length != line) return Internal("no anchor at the line");
      ASSIGN_OR_RETURN(KvRows rows, rp.state().CopyRows(0, line));
      RETURN_IF_ERROR(reference->WriteRows(rows));
      RETURN_IF_ERROR(reference->RestoreAnchor(*a));
    }
    disk.WaitIdle();
    return out.generation.tokens.empty() ? -1 : out.generation.tokens[0];
  };

  double cold_ttft_ms = 0, disk_ttft_ms = 0;
  ResumeInfo cold_info, disk_info;
  SequenceState cold(c);
  int32_t cold_token = 0, disk_token = 0;
  double write_ms = 0;
  {
    auto disk = DiskCache::Open(DiskEnv::Posix(), c, fingerprint, dir, 1024, settings);
    if (!disk.ok()) return bench::Fail(disk.status());
    const double t0 = bench::NowMs();
    auto t = first_token(**disk, &cold_ttft_ms, &cold_info, &cold);
    if (!t.ok()) return bench::Fail(t.status());
    cold_token = *t;
    write_ms = bench::NowMs() - t0 - cold_ttft_ms;  // the writer's time after the first token (it ran while the request ended)
  }
  auto tier = DiskTier::Open(DiskEnv::Posix(), c, fingerprint, DiskTierOptions{dir, 1024, int64_t(1) << 40, 0, 0, nullptr});
  if (!tier.ok()) return bench::Fail(tier.status());
  const int64_t bytes = (*tier)->stats().bytes;
  const int64_t files = (*tier)->stats().files;
  DropFolder(dir);

  SequenceState warm(c);
  double t0 = bench::NowMs();
  if (Status s = (*tier)->Restore(prompt, line, warm); !s.ok()) return bench::Fail(s);
  const double restore_ms = bench::NowMs() - t0;
  const bool exact = warm.BitEqual(cold);
  SequenceState again(c);
  double cached_restore_ms = 1e300;
  for (int r = 0; r < repeats; ++r) {  // the best of repeats
    t0 = bench::NowMs();
    if (Status s = (*tier)->Restore(prompt, line, again); !s.ok()) return bench::Fail(s);
    cached_restore_ms = std::min(cached_restore_ms, bench::NowMs() - t0);
  }
  tier->reset();
  DropFolder(dir);
  {
    auto disk = DiskCache::Open(DiskEnv::Posix(), c, fingerprint, dir, 1024, settings);
    if (!disk.ok()) return bench::Fail(disk.status());
    auto t = first_token(**disk, &disk_ttft_ms, &disk_info, nullptr);
    if (!t.ok()) return bench::Fail(t.status());
    disk_token = *t;
  }
  const double read_gbs = SequentialReadGBs(dir, std::max<int64_t>(bytes, int64_t(1) << 30));
  const double touch_gbs = FirstTouchGBs(bytes);
  const double restore_gbs = static_cast<double>(bytes) / (restore_ms / 1e3) / 1e9;
  const double held_gbs = static_cast<double>(bytes) / (cached_restore_ms / 1e3) / 1e9;
  const bool same_token = cold_token == disk_token && disk_info.source == CacheSource::kDisk;

  nlohmann::json report = {{"tokens", line}, {"prompt_tokens", prompt.size()}, {"bytes", bytes}, {"files", files},
                           {"cold_ttft_ms", cold_ttft_ms}, {"disk_ttft_ms", disk_ttft_ms}, {"disk_cached_tokens", disk_info.cached_tokens},
                           {"write_after_first_token_ms", write_ms}, {"restore_ms", restore_ms}, {"restore_repeat_best_ms", cached_restore_ms},
                           {"restore_gbs", restore_gbs}, {"sequential_read_gbs", read_gbs}, {"restore_fraction_of_read_rate", restore_gbs / read_gbs},
                           {"held_state_fraction_of_read_rate", held_gbs / read_gbs}, {"first_touch_gbs", touch_gbs},
                           {"bit_equal", exact}, {"same_first_token", same_token}, {"threads", (*forward)->threads()},
                           {"kernel_path", cpu::PathName(cpu::ActivePath())}};
  if (as_json) {
    std::printf("%s\n", report.dump(2).c_str());
  } else {
    std::printf("head of %lld tokens and 200 more: %.1f MiB on disk (%lld files); kernel path %s, %d threads\n", static_cast<long long>(line),
                static_cast<double>(bytes) / (1 << 20), static_cast<long long>(files), cpu::PathName(cpu::ActivePath()), (*forward)->threads());
    std::printf("TTFT cold %.0f ms; from the disk %.0f ms (%lld tokens restored) = %.1f %% of cold\n", cold_ttft_ms, disk_ttft_ms,
                static_cast<long long>(disk_info.cached_tokens), 100.0 * disk_ttft_ms / cold_ttft_ms);
    std::printf("writer: %.0f ms after the first token\n", write_ms);
    std::printf("restore from the drive into a new state %.0f ms (%.2f GB/s); best of %d more into a held state %.0f ms (%.2f GB/s)\n",
                restore_ms, restore_gbs, repeats, cached_restore_ms, held_gbs);
    std::printf("machine: sequential read %.2f GB/s, first touch of fresh memory %.2f GB/s\n", read_gbs, touch_gbs);
    std::printf("the restore ran at %.0f %% of the read rate into a new state, %.0f %% into a held one\n", 100.0 * restore_gbs / read_gbs,
                100.0 * held_gbs / read_gbs);
    std::printf("restored state bit-equal to the cold prefill: %s; same first token: %s\n", exact ? "yes" : "NO", same_token ? "yes" : "NO");
  }
  fs::remove_all(dir);
  return exact && same_token ? 0 : 1;
}
