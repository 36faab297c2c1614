// The session spill's codec on real K/V rows: a prompt of N tokens prefilled cold on the model, its
// rows cut into blocks of 1,024 rows a layer, each block encoded (byte planes, zstd) and decoded:
// bytes raw and encoded, and the encode and decode rates, on the pool's threads.
// anchorage-bench-spill [--model-dir DIR] [--tokens 4096] [--level 1] [--threads 2] [--json]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "engine/cache/plane_codec.h"
#include "engine/compute/cpu/matmul.h"
#include "engine/core/thread_pool.h"
#include "engine/model/model.h"
#include "engine/runtime/forward.h"

using namespace anchorage;

namespace {

int Fail(const Status& s) {
  std::fprintf(stderr, "%s\n", s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_dir;
  int64_t tokens = 4096;
  int level = 1, threads = 2;
  bool as_json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const std::string v = i + 1 < argc ? argv[i + 1] : "";
    if (a == "--json") as_json = true;
    else if (a == "--model-dir") model_dir = v, ++i;
    else if (a == "--tokens") tokens = std::atoll(v.c_str()), ++i;
    else if (a == "--level") level = std::atoi(v.c_str()), ++i;
    else if (a == "--threads") threads = std::max(1, std::atoi(v.c_str())), ++i;
    else {
      std::fprintf(stderr, "usage: anchorage-bench-spill [--model-dir DIR] [--tokens N] [--level L] [--threads T] [--json]\n");
      return 2;
    }
  }
  if (model_dir.empty()) model_dir = bench::ModelFolder("small");
  auto model = LoadModel(model_dir);
  if (!model.ok()) return Fail(model.status());
  const ModelConfig& c = (*model)->config;
  auto forward = Forward::Create(c, (*model)->weights, ForwardOptions{1024, 0});
  if (!forward.ok()) return Fail(forward.status());
  std::vector<int32_t> prompt(static_cast<size_t>(tokens));
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(3 + (i * 2654435761u) % static_cast<size_t>(c.vocab_size - 16));
  SequenceState state(c);
  const double t0 = bench::NowMs();
  if (auto logits = (*forward)->Prefill(state, prompt); !logits.ok()) return Fail(logits.status());
  const double prefill_ms = bench::NowMs() - t0;

  ThreadPool pool(threads);
  const int64_t block_rows = 1024, width = state.kv_width();
  int64_t raw = 0, encoded_bytes = 0;
  double encode_ms = 0, decode_ms = 0;
  bool exact = true;
  std::vector<char> back;
  for (int64_t begin = 0; begin + block_rows <= state.length(); begin += block_rows) {
    for (int64_t a = 0; a < state.num_attention_layers(); ++a) {
      for (const float* rows : {state.k_rows(a), state.v_rows(a)}) {
        const std::span<const char> block(reinterpret_cast<const char*>(rows + begin * width), static_cast<size_t>(block_rows * width * 4));
        double t = bench::NowMs();
        auto enc = EncodePlanes(block, PlaneCodecOptions{4, level, &pool});
        encode_ms += bench::NowMs() - t;
        if (!enc.ok()) return Fail(enc.status());
        back.resize(block.size());
        t = bench::NowMs();
        if (Status s = DecodePlanes(*enc, back, &pool); !s.ok()) return Fail(s);
        decode_ms += bench::NowMs() - t;
        exact = exact && std::equal(block.begin(), block.end(), back.begin());
        raw += static_cast<int64_t>(block.size());
        encoded_bytes += static_cast<int64_t>(enc->size());
      }
    }
  }
  const double saved = raw > 0 ? 1.0 - static_cast<double>(encoded_bytes) / static_cast<double>(raw) : 0;
  const nlohmann::json report = {{"tokens", tokens}, {"prefill_ms", prefill_ms}, {"raw_bytes", raw}, {"encoded_bytes", encoded_bytes},
                                 {"saved_fraction", saved}, {"encode_gbs", raw / (encode_ms / 1e3) / 1e9},
                                 {"decode_gbs", raw / (decode_ms / 1e3) / 1e9}, {"level", level}, {"threads", pool.size()},
                                 {"bit_equal", exact}, {"kernel_path", cpu::PathName(cpu::ActivePath())}};
  if (as_json) {
    std::printf("%s\n", report.dump(2).c_str());
  } else {
    std::printf("K/V rows of %lld tokens (prefill %.0f ms, kernel path %s): %.1f MiB raw, %.1f MiB encoded: %.1f %% saved (zstd level %d)\n",
                static_cast<long long>(tokens), prefill_ms, cpu::PathName(cpu::ActivePath()), raw / 1048576.0, encoded_bytes / 1048576.0,
                100 * saved, level);
    std::printf("encode %.2f GB/s, decode %.2f GB/s on %d threads; decoded rows bit-equal: %s\n", raw / (encode_ms / 1e3) / 1e9,
                raw / (decode_ms / 1e3) / 1e9, pool.size(), exact ? "yes" : "NO");
  }
  return exact ? 0 : 1;
}
