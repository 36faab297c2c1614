#include "engine/runtime/vision_tower.h"

#include <cmath>

#include "engine/compute/cpu/attention.h"
#include "engine/compute/cpu/matmul.h"
#include "engine/core/bf16.h"
#include "engine/runtime/forward.h"

namespace anchorage {

namespace {

constexpr double kLayerNormEps = 1e-6;
constexpr double kRotaryTheta = 10000.0;

Result<cpu::PackedBf16> PackMatrix(const TensorView& t, int64_t rows, int64_t cols, ThreadPool& pool) {
  if (t.empty()) return NotFound("VisionTower: missing tensor");
  if (t.numel() != rows * cols)
    return InvalidArgument("VisionTower: " + t.name + " has " + std::to_string(t.numel()) + " elements, expected " + std::to_string(rows * cols));
  if (t.dtype == DType::kF8E4M3) return Unsupported("VisionTower: " + t.name + " is FP8; the vision tower runs BF16, F16 or F32 weights");
  if (t.dtype == DType::kBF16) return cpu::PackedBf16::FromRowMajor(reinterpret_cast<const uint16_t*>(t.data), rows, cols, &pool);
  return cpu::PackedBf16::Pack(rows, cols, [&t, cols](int64_t j, int64_t i) { return FloatToBf16(t.At(j * cols + i)); }, &pool);
}

float GeluTanh(float x) { return 0.5f * x * (1.0f + std::tanh(0.7978845608f * (x + 0.044715f * x * x * x))); }

float GeluErf(float x) {
  const double v = x;
  return static_cast<float>(0.5 * v * (1.0 + std::erf(v * 0.7071067811865476)));
}

// Calls fn(row) for every row in [0, rows), spread over the pool.
void ForRows(ThreadPool& pool, int64_t rows, const std::function<void(int64_t)>& fn) {
  pool.ParallelFor(static_cast<size_t>(rows), [&](size_t begin, size_t end) {
    for (size_t r = begin; r < end; ++r) fn(static_cast<int64_t>(r));
  });
}

}  // namespace

Status CheckTowerInput(const VisionConfig& c, const ImageGrid& grid, std::span<const float> patches) {
  const int64_t m = c.spatial_merge_size;
  if (grid.t < 1 || grid.h < m || grid.w < m || grid.h % m != 0 || grid.w % m != 0)
    return InvalidArgument("VisionTower: a grid of " + std::to_string(grid.t) + " x " + std::to_string(grid.h) + " x " + std::to_string(grid.w) +
                           " patches is not whole merged patches of " + std::to_string(m) + " x " + std::to_string(m));
  if (static_cast<int64_t>(patches.size()) != grid.patches() * c.patch_values())
    return InvalidArgument("VisionTower: " + std::to_string(patches.size()) + " patch values for " + std::to_string(grid.patches()) +
                           " patches of " + std::to_string(c.patch_values()));
  return Status::Ok();
}

ImageProcessing VisionProcessing(const VisionConfig& c) {
  ImageProcessing p;
  p.patch_size = c.patch_size;
  p.merge_size = c.spatial_merge_size;
  p.temporal_patch_size = c.temporal_patch_size;
  return p;
}

std::vector<float> VisionPatchPositions(const VisionConfig& c, std::span<const float> pos_embed, const ImageGrid& grid) {
  const int64_t D = c.hidden_size, G = c.grid_per_side();
  const auto axis = [G](int64_t i, int64_t size) { return size == 1 ? 0.0 : static_cast<double>(i) * static_cast<double>(G - 1) / static_cast<double>(size - 1); };
  std::vector<float> out(static_cast<size_t>(grid.patches() * D));
  std::vector<double> sum(static_cast<size_t>(D));
  int64_t p = 0;
  for (const auto& [row, column] : PatchesInMergeOrder(grid, c.spatial_merge_size)) {
    const double y = axis(row, grid.h), x = axis(column, grid.w);
    const int64_t y0 = static_cast<int64_t>(y), x0 = static_cast<int64_t>(x);
    const int64_t y1 = std::min(y0 + 1, G - 1), x1 = std::min(x0 + 1, G - 1);
    const double dy = y - static_cast<double>(y0), dx = x - static_cast<double>(x0);
    const std::pair<int64_t, double> corners[4] = {{y0 * G + x0, (1 - dy) * (1 - dx)}, {y0 * G + x1, (1 - dy) * dx},
                                                   {y1 * G + x0, dy * (1 - dx)}, {y1 * G + x1, dy * dx}};
    std::fill(sum.begin(), sum.end(), 0.0);
    for (const auto& [index, weight] : corners)
      for (int64_t i = 0; i < D; ++i) sum[i] += weight * pos_embed[static_cast<size_t>(index * D + i)];
    for (int64_t i = 0; i < D; ++i) out[static_cast<size_t>(p * D + i)] = static_cast<float>(sum[i]);
    ++p;
  }
  return out;
}

void VisionRotaryTable(const VisionConfig& c, const ImageGrid& grid, std::vector<float>* cos, std::vector<float>* sin) {
  const int64_t half = c.head_dim() / 2, quarter = half / 2;
  cos->resize(static_cast<size_t>(grid.patches() * half));
  sin->resize(cos->size());
  int64_t p = 0;
  for (const auto& [row, column] : PatchesInMergeOrder(grid, c.spatial_merge_size)) {
    for (int64_t i = 0; i < half; ++i) {
      const int64_t axis_position = i < quarter ? row : column;
      const int64_t j = i % quarter;
      const double angle = static_cast<double>(axis_position) * std::pow(kRotaryTheta, -2.0 * static_cast<double>(j) / static_cast<double>(half));
      (*cos)[static_cast<size_t>(p * half + i)] = static_cast<float>(std::cos(angle));
      (*sin)[static_cast<size_t>(p * half + i)] = static_cast<float>(std::sin(angle));
    }
    ++p;
  }
}

struct VisionTower::Block {
  std::vector<float> norm1_w, norm1_b, norm2_w, norm2_b, qkv_b, proj_b, fc1_b, fc2_b;
  cpu::PackedBf16 qkv, proj, fc1, fc2;
};

VisionTower::VisionTower(const VisionConfig& config, ThreadPool& pool) : config_(config), pool_(pool) {}
VisionTower::~VisionTower() = default;

Result<std::unique_ptr<VisionTower>> VisionTower::Create(const VisionConfig& c, const VisionWeights& w, ThreadPool& pool) {
  std::unique_ptr<VisionTower> tower(new VisionTower(c, pool));
  const int64_t D = c.hidden_size, I = c.intermediate_size, M = c.merged_width();
  const auto vec = [](const TensorView& t, int64_t n, const char* role) { return TensorValues(t, n, 0.0f, "VisionTower", role); };
  ASSIGN_OR_RETURN(tower->patch_embed_, PackMatrix(w.patch_embed_weight, D, c.patch_values(), pool));
  ASSIGN_OR_RETURN(tower->patch_bias_, vec(w.patch_embed_bias, D, "patch_embed.proj.bias"));
  ASSIGN_OR_RETURN(tower->pos_embed_, vec(w.pos_embed, c.num_position_embeddings * D, "pos_embed"));
  if (static_cast<int64_t>(w.blocks.size()) != c.depth)
    return InvalidArgument("VisionTower: " + std::to_string(w.blocks.size()) + " blocks for a depth of " + std::to_string(c.depth));
  for (const VisionBlockWeights& bw : w.blocks) {
    Block b;
    ASSIGN_OR_RETURN(b.norm1_w, vec(bw.norm1_weight, D, "norm1.weight"));
    ASSIGN_OR_RETURN(b.norm1_b, vec(bw.norm1_bias, D, "norm1.bias"));
    ASSIGN_OR_RETURN(b.norm2_w, vec(bw.norm2_weight, D, "norm2.weight"));
    ASSIGN_OR_RETURN(b.norm2_b, vec(bw.norm2_bias, D, "norm2.bias"));
    ASSIGN_OR_RETURN(b.qkv, PackMatrix(bw.qkv_weight, 3 * D, D, pool));
    ASSIGN_OR_RETURN(b.qkv_b, vec(bw.qkv_bias, 3 * D, "attn.qkv.bias"));
    ASSIGN_OR_RETURN(b.proj, PackMatrix(bw.proj_weight, D, D, pool));
    ASSIGN_OR_RETURN(b.proj_b, vec(bw.proj_bias, D, "attn.proj.bias"));
    ASSIGN_OR_RETURN(b.fc1, PackMatrix(bw.fc1_weight, I, D, pool));
    ASSIGN_OR_RETURN(b.fc1_b, vec(bw.fc1_bias, I, "mlp.linear_fc1.bias"));
    ASSIGN_OR_RETURN(b.fc2, PackMatrix(bw.fc2_weight, D, I, pool));
    ASSIGN_OR_RETURN(b.fc2_b, vec(bw.fc2_bias, D, "mlp.linear_fc2.bias"));
    tower->blocks_.push_back(std::move(b));
  }
  ASSIGN_OR_RETURN(tower->merger_norm_w_, vec(w.merger_norm_weight, D, "merger.norm.weight"));
  ASSIGN_OR_RETURN(tower->merger_norm_b_, vec(w.merger_norm_bias, D, "merger.norm.bias"));
  ASSIGN_OR_RETURN(tower->merger_fc1_, PackMatrix(w.merger_fc1_weight, M, M, pool));
  ASSIGN_OR_RETURN(tower->merger_fc1_b_, vec(w.merger_fc1_bias, M, "merger.linear_fc1.bias"));
  ASSIGN_OR_RETURN(tower->merger_fc2_, PackMatrix(w.merger_fc2_weight, c.out_hidden_size, M, pool));
  ASSIGN_OR_RETURN(tower->merger_fc2_b_, vec(w.merger_fc2_bias, c.out_hidden_size, "merger.linear_fc2.bias"));
  return tower;
}

int64_t VisionTower::weight_bytes() const {
  int64_t bytes = patch_embed_.bytes() + merger_fc1_.bytes() + merger_fc2_.bytes() + static_cast<int64_t>(pos_embed_.size()) * 4;
  for (const Block& b : blocks_) bytes += b.qkv.bytes() + b.proj.bytes() + b.fc1.bytes() + b.fc2.bytes();
  return bytes;
}

void VisionTower::LayerNorm(const float* x, int64_t rows, const std::vector<float>& weight, const std::vector<float>& bias, float* y) {
  const int64_t D = config_.hidden_size;
  ForRows(pool_, rows, [&](int64_t r) {
    const float* in = x + r * D;
    double mean = 0.0, var = 0.0;
    for (int64_t i = 0; i < D; ++i) mean += in[i];
    mean /= static_cast<double>(D);
    for (int64_t i = 0; i < D; ++i) var += (in[i] - mean) * (in[i] - mean);
    const double inv = 1.0 / std::sqrt(var / static_cast<double>(D) + kLayerNormEps);
    for (int64_t i = 0; i < D; ++i) y[r * D + i] = static_cast<float>((in[i] - mean) * inv * weight[i] + bias[i]);
  });
}

void VisionTower::Linear(const float* x, int64_t rows, const cpu::PackedBf16& w, const std::vector<float>& bias, float* y) {
  cpu::MatMulBf16(pool_, x, rows, w.cols(), w, y, w.rows());
  const int64_t n = w.rows();
  ForRows(pool_, rows, [&](int64_t r) {
    for (int64_t j = 0; j < n; ++j) y[r * n + j] += bias[j];
  });
}

Result<std::vector<float>> VisionTower::Encode(const ImageGrid& grid, std::span<const float> patches) {
  const VisionConfig& c = config_;
  RETURN_IF_ERROR(CheckTowerInput(c, grid, patches));
  const int64_t m = c.spatial_merge_size, n = grid.patches(), D = c.hidden_size, I = c.intermediate_size, hd = c.head_dim(), half = hd / 2;

  std::vector<float> x(static_cast<size_t>(n * D));
  Linear(patches.data(), n, patch_embed_, patch_bias_, x.data());
  const std::vector<float> positions = VisionPatchPositions(c, pos_embed_, grid);
  for (size_t i = 0; i < x.size(); ++i) x[i] += positions[i];
  std::vector<float> cos, sin;
  VisionRotaryTable(c, grid, &cos, &sin);

  std::vector<float> h(static_cast<size_t>(n * D)), qkv(static_cast<size_t>(n * 3 * D)), attended(static_cast<size_t>(n * D)),
      up(static_cast<size_t>(n * I)), down(static_cast<size_t>(n * D));
  const cpu::AttentionShape shape{c.num_heads, c.num_heads, hd, static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)))};
  const int64_t frame = grid.h * grid.w;
  for (const Block& b : blocks_) {
    LayerNorm(x.data(), n, b.norm1_w, b.norm1_b, h.data());
    Linear(h.data(), n, b.qkv, b.qkv_b, qkv.data());
    ForRows(pool_, n, [&](int64_t r) {
      for (int64_t part = 0; part < 2; ++part)  // q, then k
        for (int64_t head = 0; head < c.num_heads; ++head) {
          float* v = qkv.data() + r * 3 * D + part * D + head * hd;
          for (int64_t i = 0; i < half; ++i) {
            const float co = cos[static_cast<size_t>(r * half + i)], si = sin[static_cast<size_t>(r * half + i)];
            const float a = v[i], b2 = v[i + half];
            v[i] = a * co - b2 * si;
            v[i + half] = b2 * co + a * si;
          }
        }
    });
    for (int64_t f = 0; f < grid.t; ++f) {  // each frame attends within itself
      const float* base = qkv.data() + f * frame * 3 * D;
      cpu::AttentionBidirectional(pool_, shape, base, 3 * D, hd, frame, frame, cpu::KvSource(base + D, base + 2 * D, 3 * D),
                                  attended.data() + f * frame * D, D);
    }
    Linear(attended.data(), n, b.proj, b.proj_b, down.data());
    for (size_t i = 0; i < x.size(); ++i) x[i] += down[i];
    LayerNorm(x.data(), n, b.norm2_w, b.norm2_b, h.data());
    Linear(h.data(), n, b.fc1, b.fc1_b, up.data());
    ForRows(pool_, n, [&](int64_t r) {
      for (int64_t i = 0; i < I; ++i) up[static_cast<size_t>(r * I + i)] = GeluTanh(up[static_cast<size_t>(r * I + i)]);
    });
    Linear(up.data(), n, b.fc2, b.fc2_b, down.data());
    for (size_t i = 0; i < x.size(); ++i) x[i] += down[i];
  }

  LayerNorm(x.data(), n, merger_norm_w_, merger_norm_b_, h.data());
  const int64_t rows = n / (m * m), M = c.merged_width();
  std::vector<float> merged(static_cast<size_t>(rows * M));
  Linear(h.data(), rows, merger_fc1_, merger_fc1_b_, merged.data());
  ForRows(pool_, rows, [&](int64_t r) {
    for (int64_t i = 0; i < M; ++i) merged[static_cast<size_t>(r * M + i)] = GeluErf(merged[static_cast<size_t>(r * M + i)]);
  });
  std::vector<float> out(static_cast<size_t>(rows * c.out_hidden_size));
  Linear(merged.data(), rows, merger_fc2_, merger_fc2_b_, out.data());
  return out;
}

}  // namespace anchorage
