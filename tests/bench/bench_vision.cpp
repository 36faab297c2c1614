// The vision tower's time per image on `small`'s tower (Qwen3.5-0.8B's shape), with the path and the machine's
// FMA peak, and the TTFT of a second turn that shows the same image (the tower's cache and the rows hit)
// against the first's.
// usage: anchorage-bench-vision [--threads N] [--sizes 448,1024]
#include <cstdio>
#include <cstring>
#include <sstream>

#include "engine/compute/cpu/cpu_features.h"
#include "engine/compute/cpu/matmul.h"
#include "engine/runtime/forward.h"
#include "engine/runtime/image_encoder.h"
#include "tests/bench/bench_util.h"
#include "tests/bench/machine_limits.h"

using namespace anchorage;

namespace {

RgbImage Photo(int64_t side, int seed) {
  RgbImage image{side, side, std::vector<uint8_t>(static_cast<size_t>(side * side * 3))};
  for (int64_t i = 0; i < side * side * 3; ++i) image.rgb[static_cast<size_t>(i)] = static_cast<uint8_t>((i * 2654435761u + seed) >> 13);
  return image;
}

// Multiply-adds x 2 of one tower run over n patches.
double TowerGflop(const VisionConfig& v, int64_t n) {
  const double D = double(v.hidden_size), I = double(v.intermediate_size), M = double(v.merged_width()), N = double(n);
  const double block = 2 * N * (4 * D * D + 2 * D * I) + 4 * N * N * D;
  return (2 * N * double(v.patch_values()) * D + double(v.depth) * block + 2 * (N / 4) * (M * M + M * double(v.out_hidden_size))) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2;
  std::vector<int64_t> sides = {448, 1024};
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--threads") == 0) threads = std::atoi(argv[i + 1]);
    else if (std::strcmp(argv[i], "--sizes") == 0) {
      sides.clear();
      std::stringstream list(argv[i + 1]);
      for (std::string item; std::getline(list, item, ',');) sides.push_back(std::stoll(item));
    } else {
      std::fprintf(stderr, "usage: anchorage-bench-vision [--threads N] [--sizes 448,1024]\n");
      return 2;
    }
  }
  const std::string dir = "/tmp/anchorage-bench/small-vision-seed1";
  if (!std::filesystem::exists(dir + "/model.safetensors"))
    if (Status s = GenerateTinyModel(TinyModelSize::kSmall, 1, dir); !s.ok()) return bench::Fail(s);
  auto config = LoadModelConfig(dir + "/config.json");
  if (!config.ok()) return bench::Fail(config.status());
  auto set = SafetensorsSet::OpenDirectory(dir);
  if (!set.ok()) return bench::Fail(set.status());
  auto weights = MapWeights(*config, *set);
  if (!weights.ok()) return bench::Fail(weights.status());
  const cpu::CpuFeatures& f = cpu::DetectCpu();
  const bench::Peaks peaks = bench::MeasurePeaks(f);
  const double peak = peaks.Of(cpu::ActivePath()) * threads;
  std::printf("path %s, %d threads, measured peak %.1f GFLOP/s (%.1f a core)\n", cpu::PathName(cpu::ActivePath()), threads, peak,
              peaks.Of(cpu::ActivePath()));
  const VisionConfig& v = *config->vision;
  std::printf("tower: depth %lld, width %lld, MLP %lld, %lld heads\n", (long long)v.depth, (long long)v.hidden_size,
              (long long)v.intermediate_size, (long long)v.num_heads);
  auto encoder = ImageEncoder::Create(*config, *weights, threads, 512ll << 20);
  if (!encoder.ok()) return bench::Fail(encoder.status());
  ImageProcessing processing = (*encoder)->Processing();
  processing.max_pixels = 1 << 22;
  std::printf("%-10s %8s %8s %12s %10s %9s %8s\n", "image", "patches", "rows", "preprocess", "tower", "GFLOP/s", "of peak");
  for (int64_t side : sides) {
    double t0 = bench::NowMs();
    auto patches = PreprocessImage(Photo(side, 1), processing);
    if (!patches.ok()) return bench::Fail(patches.status());
    const double prep = bench::NowMs() - t0;
    t0 = bench::NowMs();
    auto image = (*encoder)->Encode(*patches);
    if (!image.ok()) return bench::Fail(image.status());
    const double tower = bench::NowMs() - t0;
    const double rate = TowerGflop(v, patches->grid.patches()) / (tower / 1000.0);
    std::printf("%4lldx%-5lld %8lld %8lld %9.1f ms %7.0f ms %9.1f %7.0f %%\n", (long long)side, (long long)side, (long long)patches->grid.patches(),
                (long long)(*image)->tokens(), prep, tower, rate, 100.0 * rate / peak);
  }

  // TTFT: a prompt of 300 tokens, a 448 x 448 image and 20 more; then the same image again with 20 new tokens.
  auto forward = Forward::Create(*config, *weights, ForwardOptions{1024, threads});
  if (!forward.ok()) return bench::Fail(forward.status());
  const auto turn = [&](SequenceState& state, std::vector<int32_t>& ids, int seed, int64_t resume_at) -> Result<double> {
    const double start = bench::NowMs();
    ASSIGN_OR_RETURN(ImagePatches patches, PreprocessImage(Photo(448, seed), processing));
    ASSIGN_OR_RETURN(std::shared_ptr<const PromptImage> image, (*encoder)->Encode(patches));
    if (resume_at == 0) {
      ids = bench::PromptIds(*config, 300, 3);
      ids.insert(ids.end(), image->key_ids.begin(), image->key_ids.end());
    }
    const std::vector<int32_t> more = bench::PromptIds(*config, 20, 5 + static_cast<uint32_t>(resume_at));
    ids.insert(ids.end(), more.begin(), more.end());
    const std::vector<std::shared_ptr<const PromptImage>> catalog = {image};
    ASSIGN_OR_RETURN(auto located, PromptImages::Locate(ids, catalog));
    state.set_images(located);
    ASSIGN_OR_RETURN(auto logits, (*forward)->Prefill(state, std::span(ids).subspan(static_cast<size_t>(resume_at))));
    (void)logits;
    return bench::NowMs() - start;
  };
  (*encoder)->Clear();
  SequenceState state(*config);
  std::vector<int32_t> ids;
  auto first = turn(state, ids, 7, 0);
  if (!first.ok()) return bench::Fail(first.status());
  auto second = turn(state, ids, 7, static_cast<int64_t>(ids.size()));
  if (!second.ok()) return bench::Fail(second.status());
  std::printf("TTFT with a 448x448 image: first turn %.0f ms (tower and %zu-row prefill); second turn, same image: %.0f ms (%.1f%%)\n", *first,
              ids.size() - 20, *second, 100.0 * *second / *first);
  return 0;
}
