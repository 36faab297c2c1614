#include "engine/runtime/forward.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "engine/compute/cpu/attention.h"
#include "engine/compute/cpu/gated_delta.h"
#include "engine/compute/cpu/matmul.h"
#include "engine/compute/cpu/vec.h"
#include "engine/core/bf16.h"
#include "engine/core/sha256.h"

namespace anchorage {

using cpu::MatMul;
using cpu::Sized;
using Packed = cpu::PackedMatrix;

struct Forward::Layer {
  LayerKind kind = LayerKind::kLinearAttention;
  std::vector<float> in_norm, post_norm;  // fp32 [H], 1 + w
  const Packed* gate = nullptr;           // [I, H]
  const Packed* up = nullptr;             // [I, H]
  const Packed* down = nullptr;           // [H, I]
  // GDN.
  const Packed* qkv = nullptr;            // [conv_dim, H]
  const Packed* z = nullptr;              // [Nv*dv, H]
  const Packed* b = nullptr;              // [Nv, H]
  const Packed* a = nullptr;              // [Nv, H]
  const Packed* out = nullptr;            // [H, Nv*dv]
  std::vector<float> conv;                // fp32 [K, conv_dim], tap-major
  std::vector<float> a_exp;               // fp32 [Nv], exp(A_log)
  std::vector<float> dt_bias;             // fp32 [Nv]
  std::vector<float> gdn_norm;            // fp32 [dv], plain w
  // Attention.
  const Packed* q = nullptr;              // [2*Nh*hd, H]
  const Packed* k = nullptr;              // [Nkv*hd, H]
  const Packed* v = nullptr;              // [Nkv*hd, H]
  const Packed* o = nullptr;              // [H, Nh*hd]
  std::vector<float> q_norm, k_norm;      // fp32 [hd], 1 + w
};

struct Forward::Workspace {
  std::vector<float> x, a, mix;           // fp32 [n, H]
  std::vector<float> qkv, conv;           // fp32 [n, conv_dim]
  std::vector<float> z, core;             // fp32 [n, Nv*dv]
  std::vector<float> bb, aa, beta, g;     // fp32 [n, Nv]
  std::vector<float> qg;                  // fp32 [n, 2*Nh*hd]
  std::vector<float> krows, vrows;        // fp32 [n, Nkv*hd], before they go to their segments' rows
  std::vector<float> attn;                // fp32 [n, Nh*hd]
  std::vector<float> gate, up;            // fp32 [n, I]
  std::vector<float> cos, sin;            // fp32 [n, rotary/2]
  std::vector<float> hidden;              // fp32 [n, H], final-normed rows for the MTP head
  std::vector<float> cat;                 // fp32 [n, 2H], the MTP head's [embedding | hidden]
};

// What a draft window logs of each GDN layer to advance the state by its kept rows later.
struct Forward::DraftLog {
  int64_t pos0 = 0, rows = 0;  // the window's first position and its rows
  std::vector<std::vector<float>> qkv, conv, beta, g;  // per GDN layer: [rows, C], [rows, C], [rows, Nv] x2
  MtpState* mtp = nullptr;    // where the kept rows' hidden states go; null: nowhere
  std::vector<float> hidden;  // [rows, H] when mtp is set
};

// The multi-token-prediction block: fc over [norm_e(embed(id)) | norm_h(hidden)], one decoder layer.
struct Forward::Mtp {
  const Packed* fc = nullptr;               // [H, 2H]
  std::vector<float> norm_embedding, norm_hidden, norm;  // fp32 [H], 1 + w
  Layer layer;
};

namespace {

// The last K-1 pre-conv rows of [tail; qkv rows 0..n) become the tail.
void AdvanceTail(float* tail, const float* qkv, int64_t n, int64_t keep, int64_t C) {
  if (n >= keep) {
    std::copy_n(qkv + (n - keep) * C, keep * C, tail);
  } else {
    std::copy(tail + n * C, tail + keep * C, tail);
    std::copy_n(qkv, n * C, tail + (keep - n) * C);
  }
}

Result<std::vector<float>> Vector(const TensorView& t, int64_t n, float add, const char* role) {
  return TensorValues(t, n, add, "Forward", role);
}

}  // namespace

Status CheckMatrixShape(const TensorView& t, int64_t rows, int64_t cols, const std::string& who, const char* role) {
  if (t.empty()) return NotFound(who + ": missing tensor for " + role);
  if (t.numel() != rows * cols)
    return InvalidArgument(who + ": " + t.name + " has " + std::to_string(t.numel()) + " elements, expected " +
                           std::to_string(rows) + "x" + std::to_string(cols));
  return Status::Ok();
}

Result<std::vector<float>> TensorValues(const TensorView& t, int64_t n, float add, const std::string& who, const char* role) {
  if (t.empty()) return NotFound(who + ": missing tensor for " + role);
  if (t.numel() != n)
    return InvalidArgument(who + ": " + t.name + " has " + std::to_string(t.numel()) + " elements, expected " + std::to_string(n));
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[i] = add + t.At(i);
  return out;
}

Result<std::vector<float>> Fp8BlockScales(const TensorView& t, int64_t rows, int64_t cols, const std::string& who) {
  const int64_t block_n = t.scale_block_rows, block_k = t.scale_block_cols;
  if (t.scale_inv == nullptr || block_n <= 0 || block_k <= 0)
    return InvalidArgument(who + ": " + t.name + " is F8_E4M3 without block scales and a block size");
  const TensorView& s = *t.scale_inv;
  if (s.numel() != ((rows + block_n - 1) / block_n) * ((cols + block_k - 1) / block_k))
    return InvalidArgument(who + ": " + s.name + " holds " + std::to_string(s.numel()) + " scales, not one a " + std::to_string(block_n) +
                           " x " + std::to_string(block_k) + " block");
  std::vector<float> scales(static_cast<size_t>(s.numel()));
  s.ToFloat(0, s.numel(), scales.data());
  return scales;
}

Result<std::vector<float>> ConvTapsOf(const TensorView& conv1d, int64_t channels, int64_t taps, const std::string& who) {
  ASSIGN_OR_RETURN(const std::vector<float> per_channel, TensorValues(conv1d, channels * taps, 0.0f, who, "conv1d"));
  std::vector<float> tap_major(per_channel.size());
  for (int64_t ch = 0; ch < channels; ++ch)
    for (int64_t j = 0; j < taps; ++j) tap_major[static_cast<size_t>(j * channels + ch)] = per_channel[static_cast<size_t>(ch * taps + j)];
  return tap_major;
}

Forward::Forward(const ModelConfig& config, const ForwardOptions& options)
    : config_(config), options_(options), pool_(std::make_unique<ThreadPool>(options.threads)),
      ws_(std::make_unique<Workspace>()) {
  options_.on_layer = nullptr;  // Create's only: the Forward keeps no copy (it may capture the caller's locals)
}

Forward::~Forward() = default;

std::string Forward::StateFingerprint(const std::string& model_fingerprint, const std::string& weights, KvDtype kv_dtype) {
  Sha256 h;
  h.Update("anchorage-state-fingerprint-v3\n" + model_fingerprint + "\n" + cpu::ArithmeticName() + "\n");
  if (!weights.empty()) h.Update("weights " + weights + "\n");
  if (kv_dtype != KvDtype::kF32) h.Update(std::string("kv ") + KvDtypeName(kv_dtype) + "\n");
  return h.FinishHex();
}

std::string Forward::DeviceDescription() const {
  return std::string("cpu, kernel path ") + cpu::PathName(cpu::ActivePath()) + ", " + std::to_string(threads()) + " threads";
}

std::vector<cpu::WeightFormat> Forward::FormatsHeld() const {
  std::vector<cpu::WeightFormat> held;
  for (cpu::WeightFormat f : {cpu::WeightFormat::kFp8E4m3, cpu::WeightFormat::kInt8, cpu::WeightFormat::kBf16})
    if (std::any_of(packed_.begin(), packed_.end(), [f](const Packed& m) { return m.format() == f; })) held.push_back(f);
  return held;
}

std::string Forward::WeightsArithmetic() const {
  std::string out;
  for (cpu::WeightFormat f : FormatsHeld()) {
    if (f == cpu::WeightFormat::kBf16) continue;
    if (!out.empty()) out += ' ';
    out += cpu::ArithmeticNameOf(cpu::ActivePath(), f);
  }
  return out;
}

std::string Forward::WeightsDescription() const {
  std::string out;
  for (cpu::WeightFormat f : FormatsHeld()) {
    if (!out.empty()) out += " + ";
    out += cpu::WeightFormatName(f);
  }
  return out;
}

int64_t Forward::weight_bytes() const {
  int64_t n = 0;
  for (const Packed& m : packed_) n += m.bytes();
  return n;
}

int64_t Forward::decode_weight_bytes() const { return weight_bytes() - (embed_ != lm_head_ ? embed_->bytes() : 0); }

int64_t Forward::PrefillWorkspaceBytes(int64_t chunk_tokens) const {
  const ModelConfig& c = config_;
  const int64_t per_token_floats = 6 * c.hidden_size + 2 * c.conv_dim() + 3 * c.value_dim() + 4 * c.intermediate_size +
                                   4 * c.num_attention_heads * c.head_dim + 6 * c.num_key_value_heads * c.head_dim;
  return chunk_tokens * per_token_floats * 4 + c.vocab_size * 4;
}

Result<const cpu::PackedMatrix*> Forward::Matrix(const TensorView& t, int64_t rows, int64_t cols, const char* role) {
  RETURN_IF_ERROR(CheckMatrixShape(t, rows, cols, "Forward", role));
  if (auto done = packed_index_.find(t.data); done != packed_index_.end()) return done->second;
  if (t.dtype == DType::kF8E4M3) {
    ASSIGN_OR_RETURN(const std::vector<float> scales, Fp8BlockScales(t, rows, cols, "Forward"));
    auto q = cpu::PackedQ8::FromFp8Blocks(rows, cols, reinterpret_cast<const uint8_t*>(t.data), scales.data(), t.scale_block_rows,
                                          t.scale_block_cols, pool_.get());
    if (!q.ok()) return InvalidArgument("Forward: " + t.name + " in " + t.file + ": " + q.status().message());
    packed_.emplace_back(std::move(*q));
  } else if (options_.int8_weights) {
    packed_.emplace_back(cpu::PackedQ8::QuantizeInt8(
        rows, cols, [&t, cols](int64_t j, float* out) { t.ToFloat(j * cols, cols, out); }, pool_.get()));
  } else if (t.dtype == DType::kBF16) {
    packed_.emplace_back(cpu::PackedBf16::FromRowMajor(reinterpret_cast<const uint16_t*>(t.data), rows, cols, pool_.get()));
  } else {
    // F16 and F32 matrices are rounded to BF16 once, here: the kernels multiply bf16 weights.
    packed_.emplace_back(
        cpu::PackedBf16::Pack(rows, cols, [&t, cols](int64_t j, int64_t i) { return FloatToBf16(t.At(j * cols + i)); },
                              pool_.get()));
    converted_bytes_ += rows * cols * 2;
    ++converted_matrices_;
  }
  packed_index_[t.data] = &packed_.back();
  return &packed_.back();
}

Result<Forward::Layer> Forward::NormsAndMlp(const LayerWeights& lw) {
  const int64_t H = config_.hidden_size, I = config_.intermediate_size;
  Layer layer;
  layer.kind = lw.kind;
  ASSIGN_OR_RETURN(layer.in_norm, Vector(lw.input_layernorm, H, 1.0f, "input_layernorm"));
  ASSIGN_OR_RETURN(layer.post_norm, Vector(lw.post_attention_layernorm, H, 1.0f, "post_attention_layernorm"));
  ASSIGN_OR_RETURN(layer.gate, Matrix(lw.gate_proj, I, H, "gate_proj"));
  ASSIGN_OR_RETURN(layer.up, Matrix(lw.up_proj, I, H, "up_proj"));
  ASSIGN_OR_RETURN(layer.down, Matrix(lw.down_proj, H, I, "down_proj"));
  return layer;
}

Result<Forward::Layer> Forward::AttentionLayer(const LayerWeights& lw) {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size, hd = c.head_dim;
  ASSIGN_OR_RETURN(Layer layer, NormsAndMlp(lw));
  layer.kind = LayerKind::kFullAttention;
  const AttentionWeights& at = lw.attn;
  ASSIGN_OR_RETURN(layer.q, Matrix(at.q_proj, 2 * c.num_attention_heads * hd, H, "q_proj"));
  ASSIGN_OR_RETURN(layer.k, Matrix(at.k_proj, c.num_key_value_heads * hd, H, "k_proj"));
  ASSIGN_OR_RETURN(layer.v, Matrix(at.v_proj, c.num_key_value_heads * hd, H, "v_proj"));
  ASSIGN_OR_RETURN(layer.o, Matrix(at.o_proj, H, c.num_attention_heads * hd, "o_proj"));
  ASSIGN_OR_RETURN(layer.q_norm, Vector(at.q_norm, hd, 1.0f, "q_norm"));
  ASSIGN_OR_RETURN(layer.k_norm, Vector(at.k_norm, hd, 1.0f, "k_norm"));
  return layer;
}

Result<std::unique_ptr<Forward>> Forward::Create(const ModelConfig& c, const ModelWeights& w,
                                                 const ForwardOptions& options) {
  static_assert(kExactLineTokens == cpu::kDeltaChunkTokens);
  RETURN_IF_ERROR(CheckForwardShape(c, w, options.grid_tokens, "Forward"));
  std::unique_ptr<Forward> f(new Forward(c, options));
  const int64_t H = c.hidden_size;
  ASSIGN_OR_RETURN(f->embed_, f->Matrix(w.embed_tokens, c.vocab_size, H, "embed_tokens"));
  ASSIGN_OR_RETURN(f->lm_head_, f->Matrix(w.lm_head, c.vocab_size, H, "lm_head"));
  ASSIGN_OR_RETURN(f->final_norm_, Vector(w.norm, H, 1.0f, "norm"));
  const int64_t rot = c.rotary_dim();
  for (int64_t i = 0; i < rot / 2; ++i) {
    f->inv_freq_.push_back(1.0 / std::pow(c.rope_theta, static_cast<double>(2 * i) / static_cast<double>(rot)));
    // Interleaved M-RoPE: h every third frequency from 1, w from 2, each up to three times its section; t the rest.
    f->rope_axis_.push_back(i % 3 == 1 && i < 3 * c.mrope_section[1] ? 1 : i % 3 == 2 && i < 3 * c.mrope_section[2] ? 2 : 0);
  }
  const int64_t K = c.linear_conv_kernel_dim, conv_dim = c.conv_dim(), Nv = c.linear_num_value_heads;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const LayerWeights& lw = w.layers[l];
    if (c.layer_types[l] == LayerKind::kLinearAttention) {
      Layer layer;
      ASSIGN_OR_RETURN(layer, f->NormsAndMlp(lw));
      layer.kind = LayerKind::kLinearAttention;
      const GdnWeights& g = lw.gdn;
      ASSIGN_OR_RETURN(layer.qkv, f->Matrix(g.in_proj_qkv, conv_dim, H, "in_proj_qkv"));
      ASSIGN_OR_RETURN(layer.z, f->Matrix(g.in_proj_z, c.value_dim(), H, "in_proj_z"));
      ASSIGN_OR_RETURN(layer.b, f->Matrix(g.in_proj_b, Nv, H, "in_proj_b"));
      ASSIGN_OR_RETURN(layer.a, f->Matrix(g.in_proj_a, Nv, H, "in_proj_a"));
      ASSIGN_OR_RETURN(layer.out, f->Matrix(g.out_proj, H, c.value_dim(), "out_proj"));
      ASSIGN_OR_RETURN(layer.conv, ConvTapsOf(g.conv1d, conv_dim, K, "Forward"));
      std::vector<float> a_log;
      ASSIGN_OR_RETURN(a_log, Vector(g.A_log, Nv, 0.0f, "A_log"));
      for (float v : a_log) layer.a_exp.push_back(cpu::Exp(v));
      ASSIGN_OR_RETURN(layer.dt_bias, Vector(g.dt_bias, Nv, 0.0f, "dt_bias"));
      ASSIGN_OR_RETURN(layer.gdn_norm, Vector(g.norm, c.linear_value_head_dim, 0.0f, "linear_attn.norm"));
      f->layers_.push_back(std::move(layer));
    } else {
      ASSIGN_OR_RETURN(Layer attention, f->AttentionLayer(lw));
      f->layers_.push_back(std::move(attention));
    }
    if (options.on_layer && !options.on_layer(l + 1, c.num_hidden_layers))
      return Cancelled("Forward: stopped after packing " + std::to_string(l + 1) + " of " + std::to_string(c.num_hidden_layers) + " layers");
  }
  if (w.mtp) {
    const MtpWeights& mw = *w.mtp;
    auto mtp = std::make_unique<Mtp>();
    ASSIGN_OR_RETURN(mtp->fc, f->Matrix(mw.fc, H, 2 * H, "mtp.fc"));
    ASSIGN_OR_RETURN(mtp->norm_embedding, Vector(mw.pre_fc_norm_embedding, H, 1.0f, "mtp.pre_fc_norm_embedding"));
    ASSIGN_OR_RETURN(mtp->norm_hidden, Vector(mw.pre_fc_norm_hidden, H, 1.0f, "mtp.pre_fc_norm_hidden"));
    ASSIGN_OR_RETURN(mtp->norm, Vector(mw.norm, H, 1.0f, "mtp.norm"));
    ASSIGN_OR_RETURN(mtp->layer, f->AttentionLayer(mw.layer));
    f->mtp_ = std::move(mtp);
  }
  return f;
}

Status CheckForwardShape(const ModelConfig& c, const ModelWeights& w, int64_t grid_tokens, const std::string& who) {
  if (grid_tokens <= 0 || grid_tokens % kExactLineTokens != 0)
    return InvalidArgument(who + ": grid_tokens " + std::to_string(grid_tokens) + " is not a positive multiple of 64");
  if (static_cast<int64_t>(w.layers.size()) != c.num_hidden_layers ||
      static_cast<int64_t>(c.layer_types.size()) != c.num_hidden_layers)
    return InvalidArgument(who + ": " + std::to_string(w.layers.size()) + " weight layers for " +
                           std::to_string(c.num_hidden_layers) + " configured layers");
  if (c.num_key_value_heads <= 0 || c.num_attention_heads % c.num_key_value_heads != 0 ||
      c.linear_num_key_heads <= 0 || c.linear_num_value_heads % c.linear_num_key_heads != 0)
    return InvalidArgument(who + ": head counts do not group evenly");
  return Status::Ok();
}

Status CheckTokenIds(std::span<const int32_t> ids, int64_t vocab_size, const std::string& who) {
  if (ids.empty()) return InvalidArgument(who + ": no token ids");
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= vocab_size)
      return InvalidArgument(who + ": token id " + std::to_string(ids[i]) + " at index " + std::to_string(i) +
                             " outside vocab " + std::to_string(vocab_size));
  return Status::Ok();
}

Status CheckMtpIds(const MtpState& mtp, std::span<const int32_t> next_ids, bool every_row, int64_t vocab_size, const std::string& who) {
  const int64_t n = static_cast<int64_t>(next_ids.size());
  if (every_row ? n == 0 || n != mtp.pending_rows : n > mtp.pending_rows)
    return InvalidArgument(who + ": " + std::to_string(n) + " ids for " + std::to_string(mtp.pending_rows) + " waiting rows");
  return n == 0 ? Status::Ok() : CheckTokenIds(next_ids, vocab_size, who);
}

Status CheckBranch(const PrefillBranch& branch, int64_t vocab_size, const std::string& who) {
  RETURN_IF_ERROR(CheckTokenIds(branch.ids, vocab_size, who));
  if (branch.logits_from < 0 || branch.logits_from >= static_cast<int64_t>(branch.ids.size()))
    return InvalidArgument(who + ": logits from " + std::to_string(branch.logits_from) + " of " + std::to_string(branch.ids.size()) + " ids");
  return Status::Ok();
}

Status Forward::CheckIds(std::span<const int32_t> ids) const { return CheckTokenIds(ids, config_.vocab_size, "Forward"); }

MtpState* Forward::HeadReads(std::span<const int32_t> ids, MtpState* mtp) {
  if (mtp == nullptr || std::none_of(ids.begin(), ids.end(), IsImageKey)) return mtp;
  *mtp = MtpState{};
  return nullptr;
}

Status CheckPromptIds(std::span<const int32_t> ids, int64_t vocab_size, const PromptImages* images, int64_t first_row, const std::string& who) {
  if (ids.empty()) return InvalidArgument(who + ": no token ids");
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!IsImageKey(ids[i])) {
      if (ids[i] < 0 || ids[i] >= vocab_size)
        return InvalidArgument(who + ": token id " + std::to_string(ids[i]) + " at index " + std::to_string(i) + " outside vocab " +
                               std::to_string(vocab_size));
      continue;
    }
    const int64_t row = first_row + static_cast<int64_t>(i);
    if (images == nullptr || images->EmbeddingOf(row, ids[i]) == nullptr)
      return InvalidArgument(who + ": row " + std::to_string(row) + " holds an image key id the sequence has no image row for");
  }
  return Status::Ok();
}

Status Forward::CheckIds(std::span<const int32_t> ids, const SequenceState& state) const {
  return CheckPromptIds(ids, config_.vocab_size, state.images().get(), state.length(), "Forward");
}

Result<std::vector<float>> Forward::Prefill(SequenceState& state, std::span<const int32_t> ids, LogitsRows rows,
                                            MtpState* mtp) {
  RETURN_IF_ERROR(CheckIds(ids, state));
  const int64_t n = static_cast<int64_t>(ids.size());
  RETURN_IF_ERROR(state.Reserve(state.length() + n));
  const bool all = rows == LogitsRows::kAll;
  mtp = HeadReads(ids, mtp);
  if (mtp != nullptr && mtp->pending_rows > 1) *mtp = MtpState{};  // their next ids are not here: start the head anew
  std::vector<float> logits(static_cast<size_t>((all ? n : 1) * config_.vocab_size));
  const int64_t G = options_.grid_tokens;
  int64_t done = 0;
  while (done < n) {
    const int64_t pos = state.length();
    const int64_t m = GridChunkRows(pos, n - done, G);
    const bool last = done + m == n;
    float* out = all ? logits.data() + done * config_.vocab_size : (last ? logits.data() : nullptr);
    float* hidden = mtp_ && mtp ? Sized(ws_->hidden, m * config_.hidden_size) : nullptr;
    RunChunk(state, ids.data() + done, m, Mode::kChunked, all, out, hidden);
    done += m;
    if (hidden != nullptr) RETURN_IF_ERROR(MtpAfterChunk(*mtp, ids, state.length() - done, pos, hidden, m));
  }
  return logits;
}

Status Forward::MtpAfterChunk(MtpState& mtp, std::span<const int32_t> ids, int64_t start, int64_t pos, const float* hidden, int64_t m) {
  MtpWait(mtp, pos, hidden, m);
  const int64_t first = mtp.begin + mtp.rows;
  const int64_t known = std::min(mtp.pending_rows, start + static_cast<int64_t>(ids.size()) - 1 - first);
  if (known <= 0) return Status::Ok();
  return MtpCommit(mtp, ids.subspan(static_cast<size_t>(first + 1 - start), static_cast<size_t>(known)));
}

Result<std::vector<float>> Forward::PrefillCarrying(SequenceState& state, std::span<const int32_t> ids, MtpState* mtp, DecodeRiders& riders) {
  const int64_t n = static_cast<int64_t>(ids.size()), k = static_cast<int64_t>(riders.states.size());
  const int64_t pos = state.length();
  bool carry = k > 0 && !riders.taken && n > 0 && GridChunkRows(pos, n, options_.grid_tokens) == n &&
               CheckDecodeBatch(riders.states, riders.ids, config_.vocab_size).ok();
  for (SequenceState* rider : riders.states) carry = carry && rider != &state;
  if (!carry) return Prefill(state, ids, LogitsRows::kLast, mtp);
  RETURN_IF_ERROR(CheckIds(ids, state));
  mtp = HeadReads(ids, mtp);
  RETURN_IF_ERROR(state.Reserve(pos + n));
  for (SequenceState* rider : riders.states)
    if (!rider->Reserve(rider->length() + 1).ok()) return Prefill(state, ids, LogitsRows::kLast, mtp);
  if (mtp != nullptr && mtp->pending_rows > 1) *mtp = MtpState{};  // as Prefill: their next ids are not here
  std::vector<Segment> segments = {SegmentOf(state, n, Mode::kChunked)};
  std::vector<int64_t> logit_rows = {n - 1};
  AppendDecodeRows(riders.states, n, &segments, &logit_rows);
  std::vector<int32_t> rows_ids(ids.begin(), ids.end());
  rows_ids.insert(rows_ids.end(), riders.ids.begin(), riders.ids.end());
  const int64_t V = config_.vocab_size;
  std::vector<float> logits(static_cast<size_t>((1 + k) * V));
  float* hidden = mtp_ && mtp ? Sized(ws_->hidden, (n + k) * config_.hidden_size) : nullptr;
  RunRows(segments, rows_ids.data(), n + k, logit_rows, logits.data(), hidden);
  state.SetLength(pos + n);
  for (SequenceState* rider : riders.states) rider->SetLength(rider->length() + 1);
  riders.logits.assign(logits.begin() + V, logits.end());
  riders.taken = true;
  logits.resize(static_cast<size_t>(V));
  if (hidden != nullptr) RETURN_IF_ERROR(MtpAfterChunk(*mtp, ids, pos, pos, hidden, n));
  return logits;
}

int64_t Forward::piece_tokens_beside_decodes() const { return std::min<int64_t>(options_.grid_tokens, 128); }

Result<std::vector<float>> Forward::PrefillBranches(const SequenceState& prefix, std::span<const PrefillBranch> branches) {
  const int64_t pos0 = prefix.length();
  int64_t rows = 0, logits_rows = 0;
  for (const PrefillBranch& b : branches) {
    RETURN_IF_ERROR(CheckBranch(b, config_.vocab_size, "PrefillBranches"));
    const int64_t n = static_cast<int64_t>(b.ids.size());
    rows += n;
    logits_rows += n - b.logits_from;
  }
  if (branches.empty()) return std::vector<float>();
  const int64_t KW = prefix.kv_width();
  // Each branch's own recurrent part (from the prefix's) and K/V rows; the prefix's rows are read in place.
  struct BranchScratch {
    std::vector<std::vector<float>> recurrent, tails;
    std::vector<std::vector<uint8_t>> k, v;
  };
  std::vector<BranchScratch> own(branches.size());
  std::vector<Segment> segments(branches.size());
  std::vector<int32_t> ids;
  std::vector<int64_t> logit_rows;
  ids.reserve(static_cast<size_t>(rows));
  logit_rows.reserve(static_cast<size_t>(logits_rows));
  int64_t row0 = 0;
  for (size_t i = 0; i < branches.size(); ++i) {
    const int64_t n = static_cast<int64_t>(branches[i].ids.size());
    BranchScratch& o = own[i];
    Segment& seg = segments[i];
    seg.row0 = row0;
    seg.n = n;
    seg.pos0 = pos0;
    seg.images = prefix.images().get();
    for (int64_t g = 0; g < prefix.num_gdn_layers(); ++g) {
      o.recurrent.emplace_back(prefix.recurrent(g), prefix.recurrent(g) + prefix.recurrent_floats());
      o.tails.emplace_back(prefix.conv_tail(g), prefix.conv_tail(g) + prefix.tail_floats());
    }
    for (int64_t a = 0; a < prefix.num_attention_layers(); ++a) {
      o.k.emplace_back(static_cast<size_t>(n * prefix.kv_row_bytes()));
      o.v.emplace_back(static_cast<size_t>(n * prefix.kv_row_bytes()));
    }
    for (auto& r : o.recurrent) seg.recurrent.push_back(r.data());
    for (auto& t : o.tails) seg.tails.push_back(t.data());
    for (int64_t a = 0; a < prefix.num_attention_layers(); ++a) {
      uint8_t* k = o.k[static_cast<size_t>(a)].data();
      uint8_t* v = o.v[static_cast<size_t>(a)].data();
      seg.kv.push_back(cpu::KvSource{prefix.kv_dtype(), prefix.k_bytes(a), prefix.v_bytes(a), KW, pos0, k, v});
      seg.k_out.push_back(k);
      seg.v_out.push_back(v);
    }
    ids.insert(ids.end(), branches[i].ids.begin(), branches[i].ids.end());
    for (int64_t t = branches[i].logits_from; t < n; ++t) logit_rows.push_back(row0 + t);
    row0 += n;
  }
  std::vector<float> logits(static_cast<size_t>(logits_rows * config_.vocab_size));
  RunRows(segments, ids.data(), rows, logit_rows, logits.data(), nullptr);
  return logits;
}

Result<std::vector<float>> Forward::ForkLastLogits(const SequenceState& state, std::span<const int32_t> ids) {
  if (ids.empty()) return InvalidArgument("a fork needs at least one id to forward");
  const PrefillBranch fork{ids, static_cast<int64_t>(ids.size()) - 1};
  return PrefillBranches(state, std::span(&fork, 1));
}

int64_t Forward::BranchesBytes(int64_t branches, int64_t rows, int64_t logits_rows) const {
  return branches * SequenceState::AnchorBytes(config_) + rows * SequenceState::KvBytesPerToken(config_) + logits_rows * config_.vocab_size * 4;
}

Result<std::vector<float>> Forward::Decode(SequenceState& state, int32_t id, MtpState* mtp) {
  RETURN_IF_ERROR(CheckIds(std::span<const int32_t>(&id, 1)));
  RETURN_IF_ERROR(state.Reserve(state.length() + 1));
  std::vector<float> logits(static_cast<size_t>(config_.vocab_size));
  const int64_t pos = state.length();
  float* hidden = mtp_ && mtp ? Sized(ws_->hidden, config_.hidden_size) : nullptr;
  RunChunk(state, &id, 1, Mode::kRecurrent, false, logits.data(), hidden);
  if (hidden != nullptr) MtpWait(*mtp, pos, hidden, 1);
  return logits;
}

Result<std::vector<float>> Forward::DecodeBatch(std::span<SequenceState* const> states, std::span<const int32_t> ids) {
  RETURN_IF_ERROR(CheckDecodeBatch(states, ids, config_.vocab_size));
  for (SequenceState* state : states) RETURN_IF_ERROR(state->Reserve(state->length() + 1));
  const int64_t n = static_cast<int64_t>(states.size());
  std::vector<Segment> segments;
  std::vector<int64_t> rows;
  AppendDecodeRows(states, 0, &segments, &rows);
  std::vector<float> logits(static_cast<size_t>(n * config_.vocab_size));
  RunRows(segments, ids.data(), n, rows, logits.data(), nullptr);
  for (SequenceState* state : states) state->SetLength(state->length() + 1);
  return logits;
}

void Forward::AppendDecodeRows(std::span<SequenceState* const> states, int64_t row0, std::vector<Segment>* segments,
                               std::vector<int64_t>* logit_rows) {
  for (SequenceState* state : states) {
    segments->push_back(SegmentOf(*state, 1, Mode::kRecurrent));
    segments->back().row0 = row0;
    logit_rows->push_back(row0++);
  }
}

Result<std::vector<float>> Forward::Verify(SequenceState& state, std::span<const int32_t> ids) {
  RETURN_IF_ERROR(CheckIds(ids, state));
  const int64_t n = static_cast<int64_t>(ids.size());
  RETURN_IF_ERROR(state.Reserve(state.length() + n));
  std::vector<float> logits(static_cast<size_t>(n * config_.vocab_size));
  RunChunk(state, ids.data(), n, Mode::kChunked, true, logits.data());
  return logits;
}

Result<std::vector<float>> Forward::DraftWindow(SequenceState& state, std::span<const int32_t> ids, MtpState* mtp) {
  RETURN_IF_ERROR(CheckIds(ids));
  if (ids.empty()) return InvalidArgument("a draft window needs at least one id");
  const int64_t n = static_cast<int64_t>(ids.size());
  RETURN_IF_ERROR(state.Reserve(state.length() + n));
  DraftLog& log = OpenDraftLog(state, n, mtp);
  float* hidden = log.mtp ? Sized(log.hidden, n * config_.hidden_size) : nullptr;
  std::vector<float> logits(static_cast<size_t>(n * config_.vocab_size));
  RunChunk(state, ids.data(), n, Mode::kDraft, true, logits.data(), hidden, &log);
  return logits;
}

Forward::DraftLog& Forward::OpenDraftLog(SequenceState& state, int64_t n, MtpState* mtp) {
  std::unique_ptr<DraftLog>& held = drafts_[&state];
  if (held == nullptr) held = std::make_unique<DraftLog>();
  DraftLog& log = *held;
  log.pos0 = state.length();
  log.rows = n;
  log.qkv.resize(static_cast<size_t>(state.num_gdn_layers()));
  log.conv.resize(log.qkv.size());
  log.beta.resize(log.qkv.size());
  log.g.resize(log.qkv.size());
  log.mtp = mtp_ ? mtp : nullptr;
  return log;
}

Result<std::vector<float>> Forward::DecodeWindowsBatch(std::span<SequenceState* const> states, std::span<const std::vector<int32_t>> rows) {
  std::vector<int32_t> ids;
  for (const std::vector<int32_t>& r : rows) {
    if (r.empty()) return InvalidArgument("DecodeWindowsBatch: a state with no row");
    ids.push_back(r.front());
  }
  RETURN_IF_ERROR(CheckDecodeBatch(states, ids, config_.vocab_size));  // the states: distinct, one entry each
  for (size_t i = 0; i < states.size(); ++i) RETURN_IF_ERROR(CheckIds(rows[i], *states[i]));
  for (size_t i = 0; i < states.size(); ++i) RETURN_IF_ERROR(states[i]->Reserve(states[i]->length() + static_cast<int64_t>(rows[i].size())));
  std::vector<Segment> segments;
  ids.clear();
  for (size_t i = 0; i < states.size(); ++i) {
    const int64_t n = static_cast<int64_t>(rows[i].size());
    segments.push_back(SegmentOf(*states[i], n, n == 1 ? Mode::kRecurrent : Mode::kDraft));
    segments.back().row0 = static_cast<int64_t>(ids.size());
    if (n > 1) segments.back().log = &OpenDraftLog(*states[i], n, nullptr);
    ids.insert(ids.end(), rows[i].begin(), rows[i].end());
  }
  const int64_t total = static_cast<int64_t>(ids.size());
  std::vector<int64_t> logit_rows(static_cast<size_t>(total));
  std::iota(logit_rows.begin(), logit_rows.end(), int64_t{0});
  std::vector<float> logits(static_cast<size_t>(total * config_.vocab_size));
  RunRows(segments, ids.data(), total, logit_rows, logits.data(), nullptr);
  for (size_t i = 0; i < states.size(); ++i) states[i]->SetLength(segments[i].pos0 + segments[i].n);
  return logits;
}

Status Forward::KeepDraft(SequenceState& state, int64_t rows) {
  const auto open = drafts_.find(&state);
  if (open == drafts_.end() || state.length() != open->second->pos0 + open->second->rows)
    return InvalidArgument("KeepDraft: no draft window is open on this state");
  DraftLog& log = *open->second;
  if (rows < 0 || rows > log.rows) return InvalidArgument("KeepDraft: " + std::to_string(rows) + " rows of a window of " + std::to_string(log.rows));
  const ModelConfig& c = config_;
  const int64_t C = c.conv_dim(), Nv = c.linear_num_value_heads, r = Nv / c.linear_num_key_heads;
  const int64_t dk = c.linear_key_head_dim, dv = c.linear_value_head_dim, KD = c.key_dim();
  for (int64_t gi = 0; gi < state.num_gdn_layers() && rows > 0; ++gi) {
    const float* conv = log.conv[static_cast<size_t>(gi)].data();
    float* S = state.recurrent(gi);
    pool_->Run(static_cast<size_t>(Nv), [&](size_t hh) {
      const int64_t h = static_cast<int64_t>(hh), kh = h / r;
      thread_local std::vector<float> out;
      out.resize(static_cast<size_t>(rows * dv));
      cpu::DeltaInputs in;
      in.q = conv + kh * dk;
      in.k = conv + KD + kh * dk;
      in.v = conv + 2 * KD + h * dv;
      in.q_stride = in.k_stride = in.v_stride = C;
      in.beta = log.beta[static_cast<size_t>(gi)].data() + h;
      in.g = log.g[static_cast<size_t>(gi)].data() + h;
      in.beta_stride = in.g_stride = Nv;
      cpu::GatedDeltaRecurrent(in, rows, dk, dv, S + h * dk * dv, out.data(), dv);
    });
    AdvanceTail(state.conv_tail(gi), log.qkv[static_cast<size_t>(gi)].data(), rows, c.linear_conv_kernel_dim - 1, C);
  }
  state.SetLength(log.pos0 + rows);
  if (log.mtp != nullptr && rows > 0) MtpWait(*log.mtp, log.pos0, log.hidden.data(), rows);
  drafts_.erase(open);  // the log goes with the window
  return Status::Ok();
}

void Forward::RmsNormRows(const float* x, const float* w1, int64_t n, int64_t width, float* y) {
  const float eps = static_cast<float>(config_.rms_norm_eps);
  pool_->Run(static_cast<size_t>(n), [&](size_t t) {
    const float* xr = x + t * width;
    float* yr = y + t * width;
    const float inv = 1.0f / std::sqrt(cpu::Dot(xr, xr, width) / static_cast<float>(width) + eps);
    for (int64_t i = 0; i < width; ++i) yr[i] = xr[i] * inv * w1[i];
  });
}

void Forward::Elementwise(int64_t count, const std::function<void(size_t begin, size_t end)>& fn) {
  constexpr int64_t kInline = 1 << 16;  // fewer elements than this are not worth waking the pool
  if (count < kInline) return fn(0, static_cast<size_t>(count));
  pool_->ParallelFor(static_cast<size_t>(count), fn);
}

void Forward::AddRows(const float* from, int64_t count, float* to) {
  Elementwise(count, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) to[i] += from[i];
  });
}

void Forward::RopeTable(int64_t pos0, int64_t n, int64_t row0, const PromptImages* images) {
  const int64_t half = config_.rotary_dim() / 2;
  float* cs = Sized(ws_->cos, (row0 + n) * half) + row0 * half;
  float* sn = Sized(ws_->sin, (row0 + n) * half) + row0 * half;
  int64_t axes[3];
  for (int64_t t = 0; t < n; ++t) {
    if (images != nullptr) images->PositionOf(pos0 + t, axes);
    else TextPositions(pos0 + t, axes);
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(axes[rope_axis_[static_cast<size_t>(i)]]) * inv_freq_[i];
      cs[t * half + i] = static_cast<float>(std::cos(angle));
      sn[t * half + i] = static_cast<float>(std::sin(angle));
    }
  }
}

Forward::Segment Forward::SegmentOf(SequenceState& state, int64_t n, Mode mode) {
  Segment seg;
  seg.n = n;
  seg.mode = mode;
  seg.pos0 = state.length();
  seg.images = state.images().get();
  const int64_t KW = state.kv_width();
  for (int64_t g = 0; g < state.num_gdn_layers(); ++g) {
    seg.recurrent.push_back(state.recurrent(g));
    seg.tails.push_back(state.conv_tail(g));
  }
  for (int64_t a = 0; a < state.num_attention_layers(); ++a) {
    seg.kv.push_back(cpu::KvSource{state.kv_dtype(), state.k_bytes(a), state.v_bytes(a), KW});
    seg.k_out.push_back(state.k_bytes(a) + seg.pos0 * state.kv_row_bytes());
    seg.v_out.push_back(state.v_bytes(a) + seg.pos0 * state.kv_row_bytes());
  }
  return seg;
}

void Forward::RunChunk(SequenceState& state, const int32_t* ids, int64_t n, Mode mode, bool all_rows,
                       float* logits, float* hidden, DraftLog* log) {
  Segment seg = SegmentOf(state, n, mode);
  seg.log = log;
  std::vector<int64_t> rows;
  if (logits != nullptr)
    for (int64_t t = all_rows ? 0 : n - 1; t < n; ++t) rows.push_back(t);
  RunRows(std::span(&seg, 1), ids, n, rows, logits, hidden);
  state.SetLength(seg.pos0 + n);
}

void Forward::RunRows(std::span<const Segment> segments, const int32_t* ids, int64_t n, std::span<const int64_t> logit_rows, float* logits,
                      float* hidden) {
  const int64_t H = config_.hidden_size;
  Workspace& ws = *ws_;
  float* x = Sized(ws.x, n * H);
  float* a = Sized(ws.a, n * H);
  float* mix = Sized(ws.mix, n * H);
  for (const Segment& seg : segments)
    for (int64_t t = seg.row0; t < seg.row0 + seg.n; ++t) {
      if (!IsImageKey(ids[t])) embed_->RowToFloat(ids[t], x + t * H);
      else std::copy_n(seg.images->EmbeddingOf(seg.pos0 + t - seg.row0, ids[t]), H, x + t * H);  // checked before the forward
    }
  const int64_t half = config_.rotary_dim() / 2;
  Sized(ws_->cos, n * half);
  Sized(ws_->sin, n * half);
  for (const Segment& seg : segments) RopeTable(seg.pos0, seg.n, seg.row0, seg.images);  // angles and cos/sin in double, stored fp32
  int64_t gdn_index = 0, attn_index = 0;
  for (const Layer& layer : layers_) {
    RmsNormRows(x, layer.in_norm.data(), n, H, a);
    if (layer.kind == LayerKind::kLinearAttention) {
      GdnMixer(layer, segments, gdn_index++, n);
    } else {
      AttentionMixer(layer, segments, attn_index++, n);
    }
    AddRows(mix, n * H, x);
    RmsNormRows(x, layer.post_norm.data(), n, H, a);
    Mlp(layer, n);
    AddRows(mix, n * H, x);
  }
  if (hidden != nullptr) RmsNormRows(x, final_norm_.data(), n, H, hidden);
  if (logits == nullptr || logit_rows.empty()) return;
  // The rows that want logits, final-normed side by side, a run of consecutive rows at a time: a
  // row's bits are its own at any count.
  const int64_t m = static_cast<int64_t>(logit_rows.size());
  for (int64_t i = 0; i < m;) {
    const int64_t t = logit_rows[static_cast<size_t>(i)];
    int64_t run = 1;
    while (i + run < m && logit_rows[static_cast<size_t>(i + run)] == t + run) ++run;
    if (hidden != nullptr) std::copy_n(hidden + t * H, run * H, a + i * H);
    else RmsNormRows(x + t * H, final_norm_.data(), run, H, a + i * H);
    i += run;
  }
  MatMul(*pool_, a, m, H, *lm_head_, logits, config_.vocab_size);
}

void Forward::GdnMixer(const Layer& L, std::span<const Segment> segments, int64_t gi, int64_t n) {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size, C = c.conv_dim(), K = c.linear_conv_kernel_dim;
  const int64_t Nv = c.linear_num_value_heads, Nk = c.linear_num_key_heads;
  const int64_t dk = c.linear_key_head_dim, dv = c.linear_value_head_dim, VD = c.value_dim(), KD = c.key_dim();
  const int64_t r = Nv / Nk;
  Workspace& ws = *ws_;
  float* qkv = Sized(ws.qkv, n * C);
  float* conv = Sized(ws.conv, n * C);
  float* z = Sized(ws.z, n * VD);
  float* core = Sized(ws.core, n * VD);
  float* bb = Sized(ws.bb, n * Nv);
  float* aa = Sized(ws.aa, n * Nv);
  float* beta = Sized(ws.beta, n * Nv);
  float* g = Sized(ws.g, n * Nv);
  const float* a = ws.a.data();
  const cpu::Product in_projections[] = {{*L.qkv, qkv, C}, {*L.z, z, VD}, {*L.b, bb, Nv}, {*L.a, aa, Nv}};
  cpu::MatMulShared(*pool_, a, n, H, in_projections);
  // Causal depthwise conv over [tail; qkv] of each segment, taps in order, then SiLU; then the q/k L2 norms per head.
  std::vector<const Segment*> segment_of(static_cast<size_t>(n));
  for (const Segment& seg : segments) std::fill_n(segment_of.begin() + seg.row0, seg.n, &seg);
  const float eps = static_cast<float>(c.rms_norm_eps);
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(dk));
  pool_->Run(static_cast<size_t>(n), [&](size_t tt) {
    const int64_t t = static_cast<int64_t>(tt);
    const Segment& seg = *segment_of[tt];
    const float* tail = seg.tails[static_cast<size_t>(gi)];  // [K-1, C]
    const float* rows = qkv + seg.row0 * C;
    const int64_t local = t - seg.row0;
    float* out = conv + t * C;
    for (int64_t ch = 0; ch < C; ++ch) out[ch] = 0.0f;
    for (int64_t j = 0; j < K; ++j) {
      const int64_t s = local - (K - 1) + j;
      const float* in = s >= 0 ? rows + s * C : tail + (K - 1 + s) * C;
      const float* w = L.conv.data() + j * C;
      for (int64_t ch = 0; ch < C; ++ch) out[ch] += w[ch] * in[ch];
    }
    for (int64_t ch = 0; ch < C; ++ch) out[ch] = cpu::Silu(out[ch]);
    for (int64_t h = 0; h < 2 * Nk; ++h) {
      float* v = out + h * dk;
      const float inv = 1.0f / std::sqrt(cpu::Dot(v, v, dk) + eps);
      for (int64_t i = 0; i < dk; ++i) v[i] *= inv;
      if (h < Nk)
        for (int64_t i = 0; i < dk; ++i) v[i] *= q_scale;
    }
    for (int64_t h = 0; h < Nv; ++h) {
      beta[t * Nv + h] = cpu::Sigmoid(bb[t * Nv + h]);
      g[t * Nv + h] = -L.a_exp[h] * cpu::Softplus(aa[t * Nv + h] + L.dt_bias[h]);
    }
  });
  for (const Segment& seg : segments) {
    if (seg.mode != Mode::kDraft) {
      AdvanceTail(seg.tails[static_cast<size_t>(gi)], qkv + seg.row0 * C, seg.n, K - 1, C);
      continue;
    }
    DraftLog& log = *seg.log;  // a window's tail and state advance at KeepDraft, by the kept rows
    const size_t i = static_cast<size_t>(gi);
    const int64_t a = seg.row0, b = seg.row0 + seg.n;
    log.qkv[i].assign(qkv + a * C, qkv + b * C);
    log.conv[i].assign(conv + a * C, conv + b * C);
    log.beta[i].assign(beta + a * Nv, beta + b * Nv);
    log.g[i].assign(g + a * Nv, g + b * Nv);
  }
  // The delta rule per segment and value head; chunks of 64 aligned to absolute positions.
  pool_->Run(segments.size() * static_cast<size_t>(Nv), [&](size_t task) {
    const Segment& seg = segments[task / static_cast<size_t>(Nv)];
    const int64_t h = static_cast<int64_t>(task % static_cast<size_t>(Nv));
    const int64_t kh = h / r;
    const int64_t pos0 = seg.pos0;
    const Mode mode = seg.mode;
    float* Sh = seg.recurrent[static_cast<size_t>(gi)] + h * dk * dv;
    int64_t t = seg.row0;
    const int64_t end = seg.row0 + seg.n;
    while (t < end) {
      const int64_t p = pos0 + t - seg.row0;
      const int64_t m = mode != Mode::kChunked
                            ? end - t
                            : std::min(end - t, (p / cpu::kDeltaChunkTokens + 1) * cpu::kDeltaChunkTokens - p);
      cpu::DeltaInputs in;
      in.q = conv + t * C + kh * dk;
      in.k = conv + t * C + KD + kh * dk;
      in.v = conv + t * C + 2 * KD + h * dv;
      in.q_stride = in.k_stride = in.v_stride = C;
      in.beta = beta + t * Nv + h;
      in.g = g + t * Nv + h;
      in.beta_stride = in.g_stride = Nv;
      if (mode == Mode::kDraft) {  // on a copy: the state itself waits for KeepDraft
        thread_local std::vector<float> scratch;
        scratch.assign(Sh, Sh + dk * dv);
        cpu::GatedDeltaRecurrent(in, m, dk, dv, scratch.data(), core + t * VD + h * dv, VD);
      } else if (mode == Mode::kRecurrent) {
        cpu::GatedDeltaRecurrent(in, m, dk, dv, Sh, core + t * VD + h * dv, VD);
      } else {
        cpu::GatedDeltaChunk(in, m, dk, dv, Sh, core + t * VD + h * dv, VD);
      }
      t += m;
    }
  });
  // Gated RMSNorm per value head: normalise, times w, times silu(z).
  pool_->Run(static_cast<size_t>(n), [&](size_t tt) {
    const int64_t t = static_cast<int64_t>(tt);
    for (int64_t h = 0; h < Nv; ++h) {
      float* o = core + t * VD + h * dv;
      const float* zr = z + t * VD + h * dv;
      const float inv = 1.0f / std::sqrt(cpu::Dot(o, o, dv) / static_cast<float>(dv) + eps);
      for (int64_t e = 0; e < dv; ++e) o[e] = o[e] * inv * L.gdn_norm[e] * cpu::Silu(zr[e]);
    }
  });
  MatMul(*pool_, core, n, VD, *L.out, ws.mix.data(), H);
}

void Forward::AttentionMixer(const Layer& L, float* k_all, float* v_all, int64_t pos0, int64_t n, Mode mode) {
  const int64_t KW = config_.num_key_value_heads * config_.head_dim;
  Segment seg;
  seg.n = n;
  seg.pos0 = pos0;
  seg.mode = mode;
  seg.kv = {cpu::KvSource{k_all, v_all, KW}};
  seg.k_out = {reinterpret_cast<uint8_t*>(k_all + pos0 * KW)};
  seg.v_out = {reinterpret_cast<uint8_t*>(v_all + pos0 * KW)};
  AttentionMixer(L, std::span(&seg, 1), 0, n);
}

void Forward::AttentionMixer(const Layer& L, std::span<const Segment> segments, int64_t ai, int64_t n) {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size, Nh = c.num_attention_heads, Nkv = c.num_key_value_heads, hd = c.head_dim;
  const int64_t QW = 2 * Nh * hd, KW = Nkv * hd, half = c.rotary_dim() / 2;
  Workspace& ws = *ws_;
  float* qg = Sized(ws.qg, n * QW);
  float* attn = Sized(ws.attn, n * Nh * hd);
  float* krows = Sized(ws.krows, n * KW);
  float* vrows = Sized(ws.vrows, n * KW);
  const float* a = ws.a.data();
  const cpu::Product projections[] = {{*L.q, qg, QW}, {*L.k, krows, KW}, {*L.v, vrows, KW}};
  cpu::MatMulShared(*pool_, a, n, H, projections);
  const float eps = static_cast<float>(c.rms_norm_eps);
  const float* cs = ws.cos.data();
  const float* sn = ws.sin.data();
  auto norm_rope = [&](float* v, const float* w1, int64_t t) {
    const float inv = 1.0f / std::sqrt(cpu::Dot(v, v, hd) / static_cast<float>(hd) + eps);
    for (int64_t i = 0; i < hd; ++i) v[i] = v[i] * inv * w1[i];
    for (int64_t i = 0; i < half; ++i) {
      const float x0 = v[i], x1 = v[i + half];
      const float co = cs[t * half + i], si = sn[t * half + i];
      v[i] = x0 * co - x1 * si;
      v[i + half] = x1 * co + x0 * si;
    }
  };
  pool_->Run(static_cast<size_t>(n), [&](size_t tt) {
    const int64_t t = static_cast<int64_t>(tt);
    for (int64_t h = 0; h < Nh; ++h) norm_rope(qg + t * QW + h * 2 * hd, L.q_norm.data(), t);
    for (int64_t h = 0; h < Nkv; ++h) norm_rope(krows + t * KW + h * hd, L.k_norm.data(), t);
  });
  cpu::AttentionShape shape{Nh, Nkv, hd, 1.0f / std::sqrt(static_cast<float>(hd))};
  for (const Segment& seg : segments) {
    const size_t i = static_cast<size_t>(ai);
    cpu::StoreKvRows(krows + seg.row0 * KW, seg.n, KW, seg.kv[i].dtype, seg.k_out[i]);
    cpu::StoreKvRows(vrows + seg.row0 * KW, seg.n, KW, seg.kv[i].dtype, seg.v_out[i]);
    const float* q = qg + seg.row0 * QW;
    float* out = attn + seg.row0 * Nh * hd;
    if (seg.mode == Mode::kRecurrent && seg.n == 1) {
      cpu::AttentionDecode(*pool_, shape, q, 2 * hd, seg.pos0 + 1, seg.kv[i], out);
    } else if (seg.mode == Mode::kDraft) {  // each row as its own decode step: the same kernel over the rows before it
      for (int64_t t = 0; t < seg.n; ++t)
        cpu::AttentionDecode(*pool_, shape, q + t * QW, 2 * hd, seg.pos0 + t + 1, seg.kv[i], out + t * Nh * hd);
    } else {
      cpu::AttentionPrefill(*pool_, shape, q, QW, 2 * hd, seg.n, seg.pos0, seg.kv[i], out, Nh * hd);
    }
  }
  pool_->Run(static_cast<size_t>(n), [&](size_t tt) {
    const int64_t t = static_cast<int64_t>(tt);
    for (int64_t h = 0; h < Nh; ++h) {
      float* o = attn + t * Nh * hd + h * hd;
      const float* gate = qg + t * QW + h * 2 * hd + hd;
      for (int64_t e = 0; e < hd; ++e) o[e] *= cpu::Sigmoid(gate[e]);
    }
  });
  MatMul(*pool_, attn, n, Nh * hd, *L.o, ws.mix.data(), H);
}

void Forward::Mlp(const Layer& L, int64_t n) {
  const int64_t H = config_.hidden_size, I = config_.intermediate_size;
  Workspace& ws = *ws_;
  float* gate = Sized(ws.gate, n * I);
  float* up = Sized(ws.up, n * I);
  const cpu::Product gate_up[] = {{*L.gate, gate, I}, {*L.up, up, I}};
  cpu::MatMulShared(*pool_, ws.a.data(), n, H, gate_up);
  Elementwise(n * I, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) gate[i] = cpu::Silu(gate[i]) * up[i];
  });
  MatMul(*pool_, gate, n, I, *L.down, ws.mix.data(), H);
}

void Forward::MtpWait(MtpState& mtp, int64_t pos0, const float* hidden, int64_t n) {
  const int64_t H = config_.hidden_size;
  if (mtp.begin < 0 || mtp.begin + mtp.rows + mtp.pending_rows != pos0) {
    mtp.begin = pos0;
    mtp.rows = 0;
    mtp.pending_rows = 0;
    mtp.pending.clear();
  }
  mtp.pending.insert(mtp.pending.end(), hidden, hidden + n * H);
  mtp.pending_rows += n;
}

void Forward::MtpRows(MtpState& mtp, const float* hidden, const int32_t* ids, int64_t n, int64_t slot, float* out) {
  const Mtp& head = *mtp_;
  const int64_t H = config_.hidden_size, KW = config_.num_key_value_heads * config_.head_dim;
  const size_t need = static_cast<size_t>((slot + n) * KW);
  if (mtp.k.size() < need) {
    const size_t grown = std::max(need, 2 * mtp.k.size());
    mtp.k.resize(grown);
    mtp.v.resize(grown);
  }
  Workspace& ws = *ws_;
  float* cat = Sized(ws.cat, n * 2 * H);
  float* x = Sized(ws.x, n * H);
  float* a = Sized(ws.a, n * H);
  float* mix = Sized(ws.mix, n * H);
  for (int64_t t = 0; t < n; ++t) embed_->RowToFloat(ids[t], x + t * H);
  RmsNormRows(x, head.norm_embedding.data(), n, H, a);
  RmsNormRows(hidden, head.norm_hidden.data(), n, H, mix);
  for (int64_t t = 0; t < n; ++t) {
    std::copy_n(a + t * H, H, cat + t * 2 * H);
    std::copy_n(mix + t * H, H, cat + t * 2 * H + H);
  }
  MatMul(*pool_, cat, n, 2 * H, *head.fc, x, H);
  RopeTable(mtp.begin + slot, n);
  const Layer& L = head.layer;
  RmsNormRows(x, L.in_norm.data(), n, H, a);
  AttentionMixer(L, mtp.k.data(), mtp.v.data(), slot, n, n == 1 ? Mode::kRecurrent : Mode::kChunked);
  AddRows(mix, n * H, x);
  RmsNormRows(x, L.post_norm.data(), n, H, a);
  Mlp(L, n);
  AddRows(mix, n * H, x);
  if (out != nullptr) RmsNormRows(x + (n - 1) * H, head.norm.data(), 1, H, out);
}

Status Forward::MtpCommit(MtpState& mtp, std::span<const int32_t> next_ids) {
  if (!mtp_) return Unsupported("the checkpoint has no MTP head");
  RETURN_IF_ERROR(CheckMtpIds(mtp, next_ids, false, config_.vocab_size, "MtpCommit"));
  const int64_t n = static_cast<int64_t>(next_ids.size()), H = config_.hidden_size;
  if (n == 0) return Status::Ok();
  MtpRows(mtp, mtp.pending.data(), next_ids.data(), n, mtp.rows, nullptr);
  mtp.pending.erase(mtp.pending.begin(), mtp.pending.begin() + n * H);
  mtp.pending_rows -= n;
  mtp.rows += n;
  return Status::Ok();
}

Result<std::vector<int32_t>> Forward::MtpDraft(MtpState& mtp, std::span<const int32_t> next_ids, int max_draft,
                                               int64_t vocab_limit, std::vector<float>* all_logits) {
  if (!mtp_) return Unsupported("the checkpoint has no MTP head");
  RETURN_IF_ERROR(CheckMtpIds(mtp, next_ids, true, config_.vocab_size, "MtpDraft"));
  const int64_t n = static_cast<int64_t>(next_ids.size()), H = config_.hidden_size, V = std::min(vocab_limit, config_.vocab_size);
  std::vector<float> out(static_cast<size_t>(H)), logits(static_cast<size_t>(config_.vocab_size));
  MtpRows(mtp, mtp.pending.data(), next_ids.data(), n, mtp.rows, out.data());
  mtp.pending.clear();
  mtp.pending_rows = 0;
  mtp.rows += n;
  std::vector<int32_t> drafts;
  if (all_logits != nullptr) all_logits->clear();
  for (int j = 0; j < max_draft; ++j) {
    if (j > 0) {  // the head's own output and its last draft, one position on
      const int32_t last = drafts.back();
      std::vector<float> fed = out;
      MtpRows(mtp, fed.data(), &last, 1, mtp.rows + j - 1, out.data());
    }
    MatMul(*pool_, out.data(), 1, H, *lm_head_, logits.data(), config_.vocab_size);
    if (all_logits != nullptr) all_logits->insert(all_logits->end(), logits.begin(), logits.end());
    drafts.push_back(static_cast<int32_t>(std::max_element(logits.begin(), logits.begin() + V) - logits.begin()));
  }
  return drafts;
}

}  // namespace anchorage
