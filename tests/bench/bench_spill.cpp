// The session spill on the model. Default: the codec on real K/V rows (a prompt of N tokens
// prefilled cold, its rows cut into blocks of 1,024 rows a layer, each block encoded and decoded:
// bytes raw and encoded, encode and decode rates). --restart: a conversation of N tokens and a
// reply, written by a planned stop, read back by a new engine, and its next turn's TTFT against the
// same turn read cold; save and restore times and rates, bytes raw and stored, the tokens equal.
// anchorage-bench-spill [--model-dir DIR] [--tokens 4096] [--level 1] [--threads 2] [--restart] [--dir D] [--json]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "engine/cache/plane_codec.h"
#include "engine/cache/resident_prefix.h"
#include "engine/cache/session_spill.h"
#include "engine/compute/cpu/matmul.h"
#include "engine/core/thread_pool.h"
#include "engine/model/model.h"
#include "engine/runtime/forward.h"

using namespace anchorage;

namespace {

// A planned stop and a restart: see the header.
int Restart(Forward& forward, const ModelConfig& c, int64_t tokens, const std::string& dir, bool as_json) {
  std::filesystem::remove_all(dir);
  SessionSpillOptions so;
  so.dir = dir;
  ResidentOptions ro;
  ro.store_enabled = false;
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_tokens = 8;
  const std::vector<int32_t> first = bench::PromptIds(c, tokens, 1);
  auto ttft = [&](ResidentPrefix& rp, const std::vector<int32_t>& prompt, std::vector<int32_t>* out, ResumeInfo* info) -> Status {
    const double start = bench::NowMs();
    double first_ms = 0;
    ASSIGN_OR_RETURN(CachedGeneration g, rp.Generate(CacheRequest{prompt, "bench", 8, 0}, greedy, [&](const GeneratedToken&) {
                       if (first_ms == 0) first_ms = bench::NowMs() - start;
                       return true;
                     }));
    *out = g.generation.tokens;
    *info = g.resume;
    return first_ms > 0 ? Status::Ok() : Internal("no token");
  };
  std::vector<int32_t> reply, second;
  double save_ms = 0;
  SpillSaveReport saved;
  {
    auto spill = SessionSpill::Open(DiskEnv::Posix(), c, "bench", so);
    if (!spill.ok()) return bench::Fail(spill.status());
    ResidentPrefix rp(forward, nullptr, ro);
    rp.set_session_spill(spill->get());
    ResumeInfo info;
    if (Status s = ttft(rp, first, &reply, &info); !s.ok()) return bench::Fail(s);
    const double t0 = bench::NowMs();
    if (Status s = rp.SpillResident("planned stop", true); !s.ok()) return bench::Fail(s);
    save_ms = bench::NowMs() - t0;
  }
  second = first;
  second.insert(second.end(), reply.begin(), reply.end());
  const std::vector<int32_t> user = bench::PromptIds(c, 100, 2);
  second.insert(second.end(), user.begin(), user.end());
  // The restart: a new spill and engine read the conversation back, then the next turn.
  auto spill = SessionSpill::Open(DiskEnv::Posix(), c, "bench", so);
  if (!spill.ok()) return bench::Fail(spill.status());
  ResidentPrefix warm(forward, nullptr, ro);
  warm.set_session_spill(spill->get());
  double t0 = bench::NowMs();
  auto resumed = warm.ResumeSpilledResident();
  const double restore_ms = bench::NowMs() - t0;
  if (!resumed.ok() || !*resumed) return bench::Fail(resumed.ok() ? Internal("nothing read back") : resumed.status());
  const SessionSpillStats st = (*spill)->stats();
  std::vector<int32_t> warm_tokens, cold_tokens;
  ResumeInfo warm_info, cold_info;
  t0 = bench::NowMs();
  if (Status s = ttft(warm, second, &warm_tokens, &warm_info); !s.ok()) return bench::Fail(s);
  const double warm_turn_ms = bench::NowMs() - t0;
  ResidentPrefix cold(forward, nullptr, ro);
  t0 = bench::NowMs();
  if (Status s = ttft(cold, second, &cold_tokens, &cold_info); !s.ok()) return bench::Fail(s);
  const double cold_ms = bench::NowMs() - t0;
  const double restart_ttft_ms = restore_ms + warm_turn_ms;
  const bool same = warm_tokens == cold_tokens;
  const nlohmann::json report = {{"tokens", tokens}, {"entry_tokens", first.size() + reply.size()}, {"save_ms", save_ms},
                                 {"restore_ms", restore_ms}, {"stored_bytes", st.bytes}, {"raw_bytes", st.raw_bytes},
                                 {"bytes_read", st.bytes_read}, {"restore_gbs", st.bytes_read / (restore_ms / 1e3) / 1e9},
                                 {"restart_ttft_ms", restart_ttft_ms}, {"cold_ttft_ms", cold_ms}, {"resumed_at", warm_info.cached_tokens},
                                 {"source", CacheSourceName(warm_info.source)}, {"same_tokens_as_cold", same},
                                 {"kernel_path", cpu::PathName(cpu::ActivePath())}};
  if (as_json) {
    std::printf("%s\n", report.dump(2).c_str());
  } else {
    std::printf("conversation of %lld tokens and an 8-token reply; kernel path %s\n", static_cast<long long>(tokens), cpu::PathName(cpu::ActivePath()));
    std::printf("planned stop: saved in %.0f ms (%.1f MiB raw, %.1f MiB stored, %.1f %% saved)\n", save_ms, st.raw_bytes / 1048576.0,
                st.bytes / 1048576.0, 100.0 * (1.0 - static_cast<double>(st.bytes) / std::max<double>(1, st.raw_bytes)));
    std::printf("restart: read back %.1f MiB (blocks as stored and 5 anchors) in %.0f ms (%.2f GB/s); next turn resumed at %lld (%s)\n",
                st.bytes_read / 1048576.0, restore_ms, st.bytes_read / (restore_ms / 1e3) / 1e9, static_cast<long long>(warm_info.cached_tokens),
                CacheSourceName(warm_info.source));
    std::printf("TTFT of the next turn: after the restart %.0f ms (read back + turn), cold re-read %.0f ms = %.1f %%\n", restart_ttft_ms, cold_ms,
                100.0 * restart_ttft_ms / cold_ms);
    std::printf("tokens equal to the cold re-read's: %s\n", same ? "yes" : "no (the greedy gate allows a near tie)");
  }
  std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_dir;
  int64_t tokens = 4096;
  int level = 1, threads = 2;
  bool as_json = false, restart = false;
  std::string dir = "/tmp/anchorage-bench/spill";
  KvDtype kv_dtype = KvDtype::kF32;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const std::string v = i + 1 < argc ? argv[i + 1] : "";
    if (a == "--json") as_json = true;
    else if (a == "--model-dir") model_dir = v, ++i;
    else if (a == "--tokens") tokens = std::atoll(v.c_str()), ++i;
    else if (a == "--level") level = std::atoi(v.c_str()), ++i;
    else if (a == "--threads") threads = std::max(1, std::atoi(v.c_str())), ++i;
    else if (a == "--restart") restart = true;
    else if (a == "--dir") dir = v, ++i;
    else if (a == "--kv-dtype" && ParseKvDtype(v).ok()) kv_dtype = *ParseKvDtype(v), ++i;
    else {
      std::fprintf(stderr, "usage: anchorage-bench-spill [--model-dir DIR] [--tokens N] [--level L] [--threads T] [--restart] [--dir D] [--kv-dtype f32|bf16|fp8] [--json]\n");
      return 2;
    }
  }
  if (model_dir.empty()) model_dir = bench::ModelFolder("small");
  auto model = LoadModel(model_dir);
  if (!model.ok()) return bench::Fail(model.status());
  ModelConfig c = (*model)->config;
  c.kv_dtype = kv_dtype;
  auto forward = Forward::Create(c, (*model)->weights, ForwardOptions{1024, 0});
  if (!forward.ok()) return bench::Fail(forward.status());
  if (restart) return Restart(**forward, c, tokens, dir, as_json);
  std::vector<int32_t> prompt(static_cast<size_t>(tokens));
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(3 + (i * 2654435761u) % static_cast<size_t>(c.vocab_size - 16));
  SequenceState state(c);
  const double t0 = bench::NowMs();
  if (auto logits = (*forward)->Prefill(state, prompt); !logits.ok()) return bench::Fail(logits.status());
  const double prefill_ms = bench::NowMs() - t0;

  ThreadPool pool(threads);
  const int64_t block_rows = 1024, row_bytes = state.kv_row_bytes();
  const int word_bytes = static_cast<int>(KvDtypeBytes(kv_dtype));
  int64_t raw = 0, encoded_bytes = 0;
  double encode_ms = 0, decode_ms = 0;
  bool exact = true;
  std::vector<char> back;
  for (int64_t begin = 0; begin + block_rows <= state.length(); begin += block_rows) {
    for (int64_t a = 0; a < state.num_attention_layers(); ++a) {
      for (const uint8_t* rows : {state.k_bytes(a), state.v_bytes(a)}) {
        const std::span<const char> block(reinterpret_cast<const char*>(rows + begin * row_bytes), static_cast<size_t>(block_rows * row_bytes));
        double t = bench::NowMs();
        auto enc = EncodePlanes(block, PlaneCodecOptions{word_bytes, level, &pool});
        encode_ms += bench::NowMs() - t;
        if (!enc.ok()) return bench::Fail(enc.status());
        back.resize(block.size());
        t = bench::NowMs();
        if (Status s = DecodePlanes(*enc, back, &pool); !s.ok()) return bench::Fail(s);
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
                                 {"bit_equal", exact}, {"kv_dtype", KvDtypeName(kv_dtype)}, {"kernel_path", cpu::PathName(cpu::ActivePath())}};
  if (as_json) {
    std::printf("%s\n", report.dump(2).c_str());
  } else {
    std::printf("%s K/V rows of %lld tokens (prefill %.0f ms, kernel path %s): %.1f MiB raw, %.1f MiB encoded: %.1f %% saved (zstd level %d)\n",
                KvDtypeName(kv_dtype), static_cast<long long>(tokens), prefill_ms, cpu::PathName(cpu::ActivePath()), raw / 1048576.0, encoded_bytes / 1048576.0,
                100 * saved, level);
    std::printf("encode %.2f GB/s, decode %.2f GB/s on %d threads; decoded rows bit-equal: %s\n", raw / (encode_ms / 1e3) / 1e9,
                raw / (decode_ms / 1e3) / 1e9, pool.size(), exact ? "yes" : "NO");
  }
  return exact ? 0 : 1;
}
