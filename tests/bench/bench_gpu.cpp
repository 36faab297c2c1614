// The CUDA backend's figures: prefill tok/s at 512 to 32k tokens, decode tok/s, draft windows, the
// MTP head, branches, memory and the vision tower (an image 448 and 1,024 pixels a side, where the
// model has one), beside the device's measured copy bandwidth and split-product rate, on a model
// folder or on random weights of Qwen3.5-0.8B's or 4B's shapes. Also compares logits with
// a file of reference logits (--compare), and greedy decoding with the CPU's (--greedy N: where the
// token streams part, and the logits' distance).
//   anchorage-bench-gpu [--model-dir DIR | --shape tiny|small|0.8b|4b] [--max-tokens N] [--decode N] [--grid G] [--weights int8]
//   anchorage-bench-gpu --model-dir DIR --compare IDS_FILE LOGITS_FILE
//   anchorage-bench-gpu --model-dir DIR --greedy N
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "engine/compute/cuda/device.h"
#include "engine/compute/cuda/gemm.h"
#include "engine/core/bf16.h"
#include "engine/runtime/cuda_forward.h"
#include "engine/runtime/cuda_vision_tower.h"
#include "engine/runtime/forward.h"
#include "bench_util.h"
#include "../engine/test_runtime_util.h"

namespace {

using namespace anchorage;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

// Random bf16 weights of a real model's shapes, held in host memory with TensorViews over them.
struct RandomWeights {
  ModelConfig config;
  std::vector<std::vector<uint16_t>> data;
  ModelWeights weights;

  TensorView Tensor(const std::string& name, std::vector<int64_t> shape, float center, float spread) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    data.emplace_back(static_cast<size_t>(n));
    std::vector<uint16_t>& v = data.back();
    const uint64_t salt = std::hash<std::string>{}(name);
    const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
    std::vector<std::thread> workers;
    for (unsigned w = 0; w < threads; ++w)
      workers.emplace_back([&, w] {
        for (int64_t i = w; i < n; i += threads) {
          uint64_t z = static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ull + salt;
          z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
          z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
          const float u = static_cast<float>((z ^ (z >> 31)) >> 40) * (1.0f / 16777216.0f);
          v[static_cast<size_t>(i)] = FloatToBf16(center + spread * (2.0f * u - 1.0f));
        }
      });
    for (auto& t : workers) t.join();
    TensorView t;
    t.name = name;
    t.dtype = DType::kBF16;
    t.shape = shape;
    t.data = reinterpret_cast<const std::byte*>(v.data());
    t.bytes = v.size() * 2;
    t.file = "random";
    return t;
  }
};

ModelConfig ShapeConfig(const std::string& shape) {
  ModelConfig c;
  c.model_type = "qwen3_5_text";
  c.vocab_size = 248320;
  c.head_dim = 256;
  c.linear_num_key_heads = 16;
  c.linear_key_head_dim = 128;
  c.linear_value_head_dim = 128;
  c.linear_conv_kernel_dim = 4;
  c.max_position_embeddings = 262144;
  c.tie_word_embeddings = true;
  if (shape == "0.8b") {
    c.hidden_size = 1024;
    c.num_hidden_layers = 24;
    c.intermediate_size = 3584;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 2;
    c.linear_num_value_heads = 16;
  } else {
    c.hidden_size = 2560;
    c.num_hidden_layers = 32;
    c.intermediate_size = 9216;
    c.num_attention_heads = 16;
    c.num_key_value_heads = 4;
    c.linear_num_value_heads = 32;
  }
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    c.layer_types.push_back((l + 1) % 4 == 0 ? LayerKind::kFullAttention : LayerKind::kLinearAttention);
  return c;
}

std::unique_ptr<RandomWeights> MakeRandomWeights(const std::string& shape) {
  auto r = std::make_unique<RandomWeights>();
  r->data.reserve(1024);  // the views point into these vectors: no reallocation of the list
  const ModelConfig c = r->config = ShapeConfig(shape);
  const int64_t H = c.hidden_size, I = c.intermediate_size, hd = c.head_dim;
  const float w = 0.02f;
  ModelWeights& mw = r->weights;
  mw.embed_tokens = r->Tensor("embed_tokens", {c.vocab_size, H}, 0.0f, 0.05f);
  mw.lm_head = mw.embed_tokens;
  mw.norm = r->Tensor("norm", {H}, 0.0f, 0.1f);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    LayerWeights lw;
    lw.kind = c.layer_types[static_cast<size_t>(l)];
    lw.input_layernorm = r->Tensor(p + "input_layernorm", {H}, 0.0f, 0.1f);
    lw.post_attention_layernorm = r->Tensor(p + "post_attention_layernorm", {H}, 0.0f, 0.1f);
    lw.gate_proj = r->Tensor(p + "gate_proj", {I, H}, 0.0f, w);
    lw.up_proj = r->Tensor(p + "up_proj", {I, H}, 0.0f, w);
    lw.down_proj = r->Tensor(p + "down_proj", {H, I}, 0.0f, w);
    if (lw.kind == LayerKind::kLinearAttention) {
      const int64_t Nv = c.linear_num_value_heads;
      lw.gdn.in_proj_qkv = r->Tensor(p + "in_proj_qkv", {c.conv_dim(), H}, 0.0f, w);
      lw.gdn.in_proj_z = r->Tensor(p + "in_proj_z", {c.value_dim(), H}, 0.0f, w);
      lw.gdn.in_proj_b = r->Tensor(p + "in_proj_b", {Nv, H}, 0.0f, w);
      lw.gdn.in_proj_a = r->Tensor(p + "in_proj_a", {Nv, H}, 0.0f, w);
      lw.gdn.out_proj = r->Tensor(p + "out_proj", {H, c.value_dim()}, 0.0f, w);
      lw.gdn.conv1d = r->Tensor(p + "conv1d", {c.conv_dim(), 1, c.linear_conv_kernel_dim}, 0.0f, 0.3f);
      lw.gdn.A_log = r->Tensor(p + "A_log", {Nv}, 1.0f, 0.5f);
      lw.gdn.dt_bias = r->Tensor(p + "dt_bias", {Nv}, 0.0f, 0.5f);
      lw.gdn.norm = r->Tensor(p + "linear_attn.norm", {c.linear_value_head_dim}, 1.0f, 0.1f);
    } else {
      lw.attn.q_proj = r->Tensor(p + "q_proj", {2 * c.num_attention_heads * hd, H}, 0.0f, w);
      lw.attn.k_proj = r->Tensor(p + "k_proj", {c.num_key_value_heads * hd, H}, 0.0f, w);
      lw.attn.v_proj = r->Tensor(p + "v_proj", {c.num_key_value_heads * hd, H}, 0.0f, w);
      lw.attn.o_proj = r->Tensor(p + "o_proj", {H, c.num_attention_heads * hd}, 0.0f, w);
      lw.attn.q_norm = r->Tensor(p + "q_norm", {hd}, 0.0f, 0.1f);
      lw.attn.k_norm = r->Tensor(p + "k_norm", {hd}, 0.0f, 0.1f);
    }
    mw.layers.push_back(std::move(lw));
  }
  return r;
}

// Device-to-device copy rate (bytes read plus bytes written a second) over 2 GiB.
double CopyBandwidth() {
  const size_t bytes = size_t{1} << 31;
  auto a = cuda::DeviceBuffer::Allocate(bytes, "bandwidth probe");
  auto b = cuda::DeviceBuffer::Allocate(bytes, "bandwidth probe");
  if (!a.ok() || !b.ok()) return 0.0;
  double best = 1e30;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = Clock::now();
    if (!cuda::CopyOnDevice(b->data(), a->data(), bytes, nullptr).ok() || !cuda::Synchronize(nullptr, "copy").ok()) return 0.0;
    best = std::min(best, Seconds(t0));
  }
  return 2.0 * static_cast<double>(bytes) / best;
}

// The split product's rate on 8192 x 8192 weights and 4096 activation rows, counting both halves.
double SplitProductRate() {
  const int64_t N = 8192, K = 8192, n = 4096;
  auto gemm = cuda::LtGemm::Create(n, K, N, nullptr);
  auto w = cuda::DeviceBuffer::Allocate(static_cast<size_t>(N * K) * 2, "weights");
  auto x = cuda::DeviceBuffer::Allocate(static_cast<size_t>(n * K) * 4, "rows");
  auto y = cuda::DeviceBuffer::Allocate(static_cast<size_t>(n * N) * 4, "out");
  if (!gemm.ok() || !w.ok() || !x.ok() || !y.ok() || !(*gemm)->Prepare(N, K, static_cast<const uint16_t*>(w->data())).ok()) return 0.0;
  double best = 1e30;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = Clock::now();
    if (!(*gemm)->Run(static_cast<const uint16_t*>(w->data()), N, K, x->floats(), n, y->floats(), N).ok() ||
        !cuda::Synchronize(nullptr, "product").ok())
      return 0.0;
    best = std::min(best, Seconds(t0));
  }
  return 2.0 * 2.0 * static_cast<double>(n) * static_cast<double>(N) * static_cast<double>(K) / best;
}

// Matrix products' FLOPs a token costs (both halves of the split), without the lm_head.
double MatrixFlopsPerToken(const ModelConfig& c) {
  const double H = static_cast<double>(c.hidden_size), I = static_cast<double>(c.intermediate_size);
  double params = 0.0;
  for (LayerKind kind : c.layer_types) {
    params += 3.0 * H * I;
    if (kind == LayerKind::kLinearAttention)
      params += H * static_cast<double>(c.conv_dim() + 2 * c.value_dim() + 2 * c.linear_num_value_heads);
    else
      params += H * static_cast<double>(3 * c.num_attention_heads * c.head_dim + 2 * c.num_key_value_heads * c.head_dim);
  }
  return 2.0 * 2.0 * params;
}

std::vector<float> ReadFloats(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<float> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), out.size() * 4);
  return out;
}

// The CPU forward and the GPU forward of one model, each with an empty state.
struct BothForwards {
  std::unique_ptr<Forward> cpu;
  std::unique_ptr<CudaForward> gpu;
  std::unique_ptr<SequenceState> cpu_state;
  std::unique_ptr<DeviceState> gpu_state;
};

Result<BothForwards> OpenBoth(const ModelConfig& c, const ModelWeights& w) {
  BothForwards both;
  ASSIGN_OR_RETURN(both.cpu, Forward::Create(c, w, ForwardOptions{}));
  ASSIGN_OR_RETURN(both.gpu, CudaForward::Create(c, w, CudaForwardOptions{}));
  both.cpu_state = std::make_unique<SequenceState>(c);
  ASSIGN_OR_RETURN(both.gpu_state, both.gpu->NewState());
  return both;
}

// worst = max(worst, |a - b|), a NaN counting as infinitely far.
void Worse(double& worst, double a, double b) {
  const double d = std::fabs(a - b);
  if (!(d <= worst)) worst = std::isnan(d) ? INFINITY : d;
}

int Compare(const ModelConfig& c, const ModelWeights& w, const std::string& ids_file, const std::string& logits_file) {
  std::vector<int32_t> ids;
  std::ifstream in(ids_file);
  for (int64_t id; in >> id;) ids.push_back(static_cast<int32_t>(id));
  const std::vector<float> reference = ReadFloats(logits_file);
  const size_t expected = ids.size() * static_cast<size_t>(c.vocab_size);
  if (ids.empty() || reference.size() != expected) {
    std::fprintf(stderr, "compare: %zu ids and %zu logits (want %zu)\n", ids.size(), reference.size(), expected);
    return 1;
  }
  auto both = OpenBoth(c, w);
  if (!both.ok()) return bench::Fail(both.status());
  auto cpu_logits = both->cpu->Prefill(*both->cpu_state, ids, LogitsRows::kAll);
  auto gpu_logits = both->gpu->Prefill(*both->gpu_state, ids, LogitsRows::kAll);
  if (!cpu_logits.ok()) return bench::Fail(cpu_logits.status());
  if (!gpu_logits.ok()) return bench::Fail(gpu_logits.status());
  double cpu_ref = 0.0, gpu_ref = 0.0, gpu_cpu = 0.0, rms = 0.0;
  for (size_t i = 0; i < expected; ++i) {
    Worse(cpu_ref, (*cpu_logits)[i], reference[i]);
    Worse(gpu_ref, (*gpu_logits)[i], reference[i]);
    Worse(gpu_cpu, (*gpu_logits)[i], (*cpu_logits)[i]);
    rms += static_cast<double>(reference[i]) * reference[i];
  }
  std::printf("compare over %zu tokens (reference logits rms %.4g): max |GPU - reference| %.3g, max |CPU - reference| %.3g, "
              "max |GPU - CPU| %.3g\n",
              ids.size(), std::sqrt(rms / static_cast<double>(expected)), gpu_ref, cpu_ref, gpu_cpu);
  return gpu_ref <= 1e-3 && gpu_cpu <= 1e-3 ? 0 : 2;
}

// Greedy decoding of `tokens` tokens after a 100-token prompt on the CPU and the GPU: the first step
// whose argmax differs, and the largest logit difference until then.
int Greedy(const ModelConfig& c, const ModelWeights& w, int64_t tokens) {
  auto both = OpenBoth(c, w);
  if (!both.ok()) return bench::Fail(both.status());
  const std::vector<int32_t> prompt = bench::PromptIds(c, 100);
  auto cpu_logits = both->cpu->Prefill(*both->cpu_state, prompt);
  auto gpu_logits = both->gpu->Prefill(*both->gpu_state, prompt);
  double worst = 0.0;
  for (int64_t step = 0; step < tokens; ++step) {
    if (!cpu_logits.ok()) return bench::Fail(cpu_logits.status());
    if (!gpu_logits.ok()) return bench::Fail(gpu_logits.status());
    for (size_t i = 0; i < cpu_logits->size(); ++i) Worse(worst, (*cpu_logits)[i], (*gpu_logits)[i]);
    const auto cpu_id = static_cast<int32_t>(std::max_element(cpu_logits->begin(), cpu_logits->end()) - cpu_logits->begin());
    const auto gpu_id = static_cast<int32_t>(std::max_element(gpu_logits->begin(), gpu_logits->end()) - gpu_logits->begin());
    if (cpu_id != gpu_id) {
      std::printf("greedy: the streams part at step %lld (CPU %d, GPU %d); max |logit diff| until then %.3g\n",
                  static_cast<long long>(step), cpu_id, gpu_id, worst);
      return 3;
    }
    cpu_logits = both->cpu->Decode(*both->cpu_state, cpu_id);
    gpu_logits = both->gpu->Decode(*both->gpu_state, gpu_id);
  }
  std::printf("greedy: %lld tokens, the same on the CPU and the GPU; max |logit diff| %.3g\n", static_cast<long long>(tokens), worst);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a run cut off by its time limit keeps every line it printed
  std::string model_dir, shape = "small", compare_ids, compare_logits;
  int64_t max_tokens = 32768, decode_tokens = 64, grid = 1024, greedy = 0;
  bool int8 = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--model-dir") model_dir = next();
    else if (arg == "--shape") shape = next();
    else if (arg == "--max-tokens") max_tokens = std::atoll(next().c_str());
    else if (arg == "--decode") decode_tokens = std::atoll(next().c_str());
    else if (arg == "--grid") grid = std::atoll(next().c_str());
    else if (arg == "--greedy") greedy = std::atoll(next().c_str());
    else if (arg == "--weights") {
      const std::string weights = next();
      if (weights != "int8" && weights != "as-stored") {
        std::fprintf(stderr, "--weights is as-stored or int8\n");
        return 2;
      }
      int8 = weights == "int8";
    }
    else if (arg == "--compare") {
      compare_ids = next();
      compare_logits = next();
    } else {
      std::fprintf(stderr, "unknown argument %s\n", arg.c_str());
      return 2;
    }
  }
  if (int8 && (greedy > 0 || !compare_ids.empty())) {
    std::fprintf(stderr, "--weights int8 is for the benchmark; --greedy and --compare run the stored weights\n");
    return 2;
  }
  auto device = cuda::FindDevice(0);
  if (!device.ok()) return bench::Fail(device.status());
  std::printf("device: %s, CUDA runtime %d, driver %d\n", device->Describe().c_str(), device->runtime_version, device->driver_version);

  std::unique_ptr<testing::LoadedWeights> loaded;
  std::unique_ptr<RandomWeights> random;
  const ModelConfig* config = nullptr;
  const ModelWeights* weights = nullptr;
  if (model_dir.empty() && (shape == "tiny" || shape == "small")) model_dir = bench::ModelFolder(shape);
  if (!model_dir.empty()) {
    auto opened = testing::OpenModel(model_dir);
    if (!opened.ok()) return bench::Fail(opened.status());
    loaded = std::move(*opened);
    config = &loaded->config;
    weights = &loaded->weights;
    std::printf("model: %s\n", model_dir.c_str());
  } else {
    if (shape != "0.8b" && shape != "4b") {
      std::fprintf(stderr, "--shape is tiny, small, 0.8b or 4b\n");
      return 2;
    }
    const auto t0 = Clock::now();
    random = MakeRandomWeights(shape);
    config = &random->config;
    weights = &random->weights;
    std::printf("model: random weights of Qwen3.5-%s's shapes (made in %.1f s)\n", shape.c_str(), Seconds(t0));
  }
  if (!compare_ids.empty()) return Compare(*config, *weights, compare_ids, compare_logits);
  if (greedy > 0) return Greedy(*config, *weights, greedy);

  const double copy_rate = CopyBandwidth(), product_rate = SplitProductRate();
  std::printf("measured: device copy %.0f GB/s (read + write), split bf16 product %.1f TFLOP/s (both halves counted)\n",
              copy_rate / 1e9, product_rate / 1e12);
  CudaForwardOptions options;
  options.grid_tokens = grid;
  options.int8_weights = int8;
  const auto t0 = Clock::now();
  auto forward = CudaForward::Create(*config, *weights, options);
  if (!forward.ok()) return bench::Fail(forward.status());
  CudaForward& f = **forward;
  std::printf("loaded in %.2f s: weights %.1f MiB on the device (%s), workspace %.1f MiB, grid %lld\n", Seconds(t0),
              static_cast<double>(f.weight_bytes()) / (1 << 20), f.WeightsDescription().c_str(),
              static_cast<double>(f.workspace_bytes()) / (1 << 20), static_cast<long long>(grid));
  {  // warm-up: the first launches load modules
    auto state = f.NewState();
    if (!state.ok() || !f.Prefill(**state, bench::PromptIds(*config, 128)).ok()) return 1;
  }
  const double flops_per_token = MatrixFlopsPerToken(*config);
  for (const bool graphs : {true, false}) {  // decode through one captured graph a token, then launch by launch
    f.set_decode_graphs(graphs);
    auto state = f.NewState();
    if (!state.ok() || !f.Prefill(**state, bench::PromptIds(*config, 512)).ok()) return 1;
    if (auto warm = f.Decode(**state, 3); !warm.ok()) return bench::Fail(warm.status());  // captures the graph
    const auto start = Clock::now();
    for (int64_t i = 0; i < decode_tokens; ++i)
      if (auto r = f.Decode(**state, static_cast<int32_t>(3 + i)); !r.ok()) return bench::Fail(r.status());
    const double rate = static_cast<double>(decode_tokens) / Seconds(start);
    const double bytes = static_cast<double>(f.decode_weight_bytes());
    std::printf("decode after 512: %.1f tok/s, %.0f GB/s of weights (%.1f MiB a token) = %.0f %% of half the copy rate; %s\n", rate,
                rate * bytes / 1e9, bytes / (1 << 20), copy_rate > 0 ? 100.0 * rate * bytes / (copy_rate / 2) : 0.0,
                f.DecodeLaunches().c_str());
  }
  f.set_decode_graphs(true);
  {  // draft windows: what a verified window of rows costs against as many decode steps
    auto state = f.NewState();
    if (!state.ok() || !f.Prefill(**state, bench::PromptIds(*config, 512)).ok()) return 1;
    const auto start = Clock::now();
    for (int64_t i = 0; i < decode_tokens; ++i)
      if (auto r = f.Decode(**state, static_cast<int32_t>(3 + i)); !r.ok()) return bench::Fail(r.status());
    const double step = Seconds(start) / static_cast<double>(decode_tokens);
    for (const int64_t rows : {2, 5, 9, 17}) {
      const int64_t windows = std::max<int64_t>(1, decode_tokens / rows);
      const std::vector<int32_t> ids = bench::PromptIds(*config, rows);
      const auto window_start = Clock::now();
      for (int64_t w = 0; w < windows; ++w) {
        if (auto r = f.DraftWindow(**state, ids); !r.ok()) return bench::Fail(r.status());
        if (Status kept = f.KeepDraft(**state, rows); !kept.ok()) return bench::Fail(kept);
      }
      const double window = Seconds(window_start) / static_cast<double>(windows);
      std::printf("draft window of %2lld rows: %.2f ms = %.2f decode steps; %.1f tok/s when every draft is kept\n",
                  static_cast<long long>(rows), 1e3 * window, window / step, static_cast<double>(rows) / window);
    }
  }
  for (const int64_t batch : {2, 4, 16}) {  // decode batches (parallel slots): every state's next row in one forward
    std::vector<std::unique_ptr<DeviceState>> owned;
    std::vector<DeviceState*> states;
    for (int64_t i = 0; i < batch; ++i) {
      auto state = f.NewState();
      if (!state.ok() || !f.Prefill(**state, bench::PromptIds(*config, 512, static_cast<uint32_t>(i))).ok()) return 1;
      states.push_back(state->get());
      owned.push_back(std::move(*state));
    }
    const std::vector<int32_t> ids(static_cast<size_t>(batch), 3);
    const std::vector<const PromptImages*> images(static_cast<size_t>(batch), nullptr);
    const int64_t steps = std::max<int64_t>(4, decode_tokens / 4);
    const auto start = Clock::now();
    for (int64_t i = 0; i < steps; ++i)
      if (auto r = f.DecodeBatch(states, ids, images); !r.ok()) return bench::Fail(r.status());
    const double step = Seconds(start) / static_cast<double>(steps);
    std::printf("decode batch of %2lld states after 512: %.2f ms a step, %.1f tok/s in all, %.1f a state\n", static_cast<long long>(batch),
                1e3 * step, static_cast<double>(batch) / step, 1.0 / step);
  }
  if (f.has_mtp()) {  // the MTP head: a decode step that feeds it, then 4 drafts, against a plain step
    auto state = f.NewState();
    MtpState mtp;
    if (!state.ok() || !f.Prefill(**state, bench::PromptIds(*config, 512), LogitsRows::kLast, &mtp).ok()) return 1;
    const int64_t rounds = std::max<int64_t>(1, decode_tokens / 4);
    const auto start = Clock::now();
    for (int64_t i = 0; i < rounds; ++i) {
      const int32_t id = static_cast<int32_t>(3 + i);
      if (auto r = f.MtpDraft(mtp, std::span<const int32_t>(&id, 1), 4, config->vocab_size); !r.ok()) return bench::Fail(r.status());
      if (auto r = f.Decode(**state, id, &mtp); !r.ok()) return bench::Fail(r.status());
    }
    std::printf("MTP head: 4 drafts and a step that feeds it %.2f ms a round\n", 1e3 * Seconds(start) / static_cast<double>(rounds));
  }
  {  // branches: 16 candidates of 32 ids after 512 tokens, in one forward and one at a time from a device anchor
    auto state = f.NewState();
    if (!state.ok() || !f.Prefill(**state, bench::PromptIds(*config, 512)).ok()) return 1;
    const std::vector<int32_t> ids = bench::PromptIds(*config, 32);
    const std::vector<PrefillBranch> branches(std::min<int64_t>(16, grid / 32), PrefillBranch{ids, 31});
    const auto batched_start = Clock::now();
    if (auto r = f.PrefillBranches(**state, branches); !r.ok()) return bench::Fail(r.status());
    const double batched = Seconds(batched_start);
    auto anchor = (*state)->SaveAnchor();
    if (!anchor.ok()) return bench::Fail(anchor.status());
    const auto alone_start = Clock::now();
    for (size_t i = 0; i < branches.size(); ++i) {
      if (auto r = f.Prefill(**state, ids); !r.ok()) return bench::Fail(r.status());
      if (Status back = (*state)->RestoreAnchor(*anchor); !back.ok()) return bench::Fail(back);
    }
    std::printf("%zu branches of 32 ids after 512: %.2f ms in one forward, %.2f ms one at a time\n", branches.size(),
                1e3 * batched, 1e3 * Seconds(alone_start));
  }
  for (int64_t n = 512; n <= max_tokens; n *= 4) {
    auto state = f.NewState();
    if (!state.ok()) return bench::Fail(state.status());
    const std::vector<int32_t> ids = bench::PromptIds(*config, n);
    const auto start = Clock::now();
    auto logits = f.Prefill(**state, ids);
    const double s = Seconds(start);
    if (!logits.ok()) return bench::Fail(logits.status());
    const double rate = static_cast<double>(n) / s;
    std::printf("prefill %6lld tokens: %8.1f tok/s (%.3f s), matrix products at %.1f TFLOP/s = %.0f %% of the split product rate; "
                "state %.1f MiB\n",
                static_cast<long long>(n), rate, s, rate * flops_per_token / 1e12,
                product_rate > 0 ? 100.0 * rate * flops_per_token / product_rate : 0.0,
                static_cast<double>((*state)->allocated_bytes()) / (1 << 20));
  }
  if (config->vision && weights->vision) {  // the vision tower: an image's time on the device, its products' rate
    const VisionConfig& v = *config->vision;
    std::mutex unused;
    auto tower = CudaVisionTower::Create(v, *weights->vision, options.device, false, unused);
    if (!tower.ok()) return bench::Fail(tower.status());
    for (const int64_t side : {448, 1024}) {
      const int64_t patches_a_side = side / v.patch_size;
      const ImageGrid grid{1, patches_a_side, patches_a_side};
      const int64_t n = grid.patches(), D = v.hidden_size;
      const std::vector<float> patches(static_cast<size_t>(n * v.patch_values()), 0.25f);
      if (auto warm = (*tower)->Encode(grid, patches); !warm.ok()) return bench::Fail(warm.status());
      const auto start = Clock::now();
      if (auto rows = (*tower)->Encode(grid, patches); !rows.ok()) return bench::Fail(rows.status());
      const double s = Seconds(start);
      const double flops = 2.0 * static_cast<double>(n) *
                           (static_cast<double>(v.patch_values() * D) + static_cast<double>(v.depth * (4 * D * D + 2 * D * v.intermediate_size + 2 * n * D)) +
                            static_cast<double>(v.merged_width() * (v.merged_width() + v.out_hidden_size)) / static_cast<double>(v.spatial_merge_size * v.spatial_merge_size));
      std::printf("vision tower %lld x %lld (%lld patches): %.1f ms, %.1f TFLOP/s = %.0f %% of the split product rate\n",
                  static_cast<long long>(side), static_cast<long long>(side), static_cast<long long>(n), 1e3 * s, flops / s / 1e12,
                  product_rate > 0 ? 100.0 * flops / s / product_rate : 0.0);
    }
  }
  return 0;
}
