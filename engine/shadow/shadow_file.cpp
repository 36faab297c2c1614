#include "engine/shadow/shadow_file.h"

#include <cstring>

#include "engine/cache/disk_format.h"
#include "engine/core/hex.h"
#include "engine/core/sha256.h"

namespace anchorage {
namespace {

std::string_view BytesOf(const void* p, size_t bytes) { return {static_cast<const char*>(p), bytes}; }

// A section's name: prefix and index, appended (GCC 12 warns -Wrestrict on "literal" + std::string).
std::string SectionName(const char* prefix, int64_t index) {
  std::string name(prefix);
  name += std::to_string(index);
  return name;
}

Result<const DecodedSection*> Section(const DecodedCacheFile& f, const std::string& name, SectionDType dtype, const std::vector<int64_t>& shape) {
  const DecodedSection* s = f.Find(name);
  if (s == nullptr) return Corrupt("shadow file: no section " + name);
  if (s->dtype != dtype || s->shape != shape) return Corrupt("shadow file: section " + name + " has another model's layout");
  return s;
}

template <typename T>
std::vector<T> Copy(std::string_view bytes) {
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

}  // namespace

std::string ShadowFileName(const std::string& session) {
  Sha256 h;
  h.Update("anchorage-shadow-v1/");
  h.Update(session);
  return h.FinishHex().substr(0, 32) + ".shadow";
}

Status SaveShadowFile(DiskEnv& env, const std::string& path, const std::string& fingerprint, const std::string& session, const ShadowSession& s) {
  const SequenceState& state = s.state();
  const int64_t rows = s.committed(), width = KvSectionWidth(state.kv_dtype(), state.kv_width());
  const Anchor recurrent = state.SaveAnchor();
  std::vector<int64_t> checkpoint_lengths;
  for (const Anchor& c : s.checkpoints()) checkpoint_lengths.push_back(c.length);
  const std::vector<int64_t>& pending = s.pending_checkpoints();
  CacheFileHeader header{"shadow", fingerprint, rows, {Hex(session)}};
  std::vector<SectionSpec> sections = {
      {"ids", SectionDType::kI32, {s.known()}, BytesOf(s.ids().data(), s.ids().size() * 4)},
      {"checkpoint_lengths", SectionDType::kI32, {static_cast<int64_t>(checkpoint_lengths.size()) * 2}, BytesOf(checkpoint_lengths.data(), checkpoint_lengths.size() * 8)},
      {"pending_lines", SectionDType::kI32, {static_cast<int64_t>(pending.size()) * 2}, BytesOf(pending.data(), pending.size() * 8)},
      {"recurrent", SectionDType::kF32, {static_cast<int64_t>(recurrent.data.size())}, BytesOf(recurrent.data.data(), recurrent.data.size() * 4)}};
  const SectionDType kv = KvSectionDType(state.kv_dtype());
  const size_t kv_bytes = static_cast<size_t>(rows * state.kv_row_bytes());
  for (int64_t a = 0; a < state.num_attention_layers(); ++a) {
    sections.push_back({SectionName("k", static_cast<int64_t>(a)), kv, {rows, width}, BytesOf(state.k_bytes(a), kv_bytes)});
    sections.push_back({SectionName("v", static_cast<int64_t>(a)), kv, {rows, width}, BytesOf(state.v_bytes(a), kv_bytes)});
  }
  for (size_t i = 0; i < s.checkpoints().size(); ++i) {
    const Anchor& c = s.checkpoints()[i];
    sections.push_back({SectionName("checkpoint", static_cast<int64_t>(i)), SectionDType::kF32, {static_cast<int64_t>(c.data.size())}, BytesOf(c.data.data(), c.data.size() * 4)});
  }
  ASSIGN_OR_RETURN(EncodedCacheFile file, EncodeCacheFile(header, sections));
  return WriteFileCrashSafe(env, path, file.pieces);
}

Result<std::unique_ptr<ShadowSession>> LoadShadowFile(DiskEnv& env, const std::string& path, const ModelConfig& config, int64_t grid_tokens,
                                                      const std::string& fingerprint, const std::string& session) {
  ASSIGN_OR_RETURN(std::string data, env.ReadFile(path));
  auto decoded = DecodeCacheFile(std::move(data), "shadow", fingerprint);
  if (!decoded.ok()) return Corrupt(path + ": " + decoded.status().message());
  const DecodedCacheFile& f = *decoded;
  if (f.header.links.size() != 1 || f.header.links[0] != Hex(session)) return Corrupt(path + ": the file holds another session");
  auto s = std::make_unique<ShadowSession>(config, grid_tokens);
  SequenceState& state = s->mutable_state();
  const int64_t rows = f.header.tokens, width = KvSectionWidth(state.kv_dtype(), state.kv_width());
  if (rows < 0 || rows % grid_tokens != 0) return Corrupt(path + ": the state does not end on this grid");
  const DecodedSection* ids = f.Find("ids");
  const DecodedSection* lengths = f.Find("checkpoint_lengths");
  const DecodedSection* pending = f.Find("pending_lines");
  if (ids == nullptr || lengths == nullptr || pending == nullptr || ids->dtype != SectionDType::kI32 || lengths->bytes.size() % 8 != 0 ||
      pending->bytes.size() % 8 != 0)
    return Corrupt(path + ": the ids or the checkpoint lengths are missing");
  const std::vector<int64_t> checkpoint_lengths = Copy<int64_t>(lengths->bytes);
  const int64_t anchor_floats = state.anchor_bytes() / 4;
  ASSIGN_OR_RETURN(const DecodedSection* recurrent, Section(f, "recurrent", SectionDType::kF32, {anchor_floats}));
  RETURN_IF_ERROR(state.Reserve(rows));
  for (int64_t a = 0; a < state.num_attention_layers(); ++a) {
    const SectionDType kv = KvSectionDType(state.kv_dtype());
    ASSIGN_OR_RETURN(const DecodedSection* k, Section(f, SectionName("k", static_cast<int64_t>(a)), kv, {rows, width}));
    ASSIGN_OR_RETURN(const DecodedSection* v, Section(f, SectionName("v", static_cast<int64_t>(a)), kv, {rows, width}));
    std::memcpy(state.k_bytes(a), k->bytes.data(), k->bytes.size());
    std::memcpy(state.v_bytes(a), v->bytes.data(), v->bytes.size());
  }
  state.SetLength(rows);
  RETURN_IF_ERROR(state.RestoreAnchor(Anchor{rows, Copy<float>(recurrent->bytes)}));
  std::vector<Anchor> checkpoints;
  for (size_t i = 0; i < checkpoint_lengths.size(); ++i) {
    ASSIGN_OR_RETURN(const DecodedSection* c, Section(f, SectionName("checkpoint", static_cast<int64_t>(i)), SectionDType::kF32, {anchor_floats}));
    checkpoints.push_back(Anchor{checkpoint_lengths[i], Copy<float>(c->bytes)});
  }
  Status adopted = s->Adopt(Copy<int32_t>(ids->bytes), std::move(checkpoints), Copy<int64_t>(pending->bytes));
  if (!adopted.ok()) return Corrupt(path + ": " + adopted.message());
  return s;
}

}  // namespace anchorage
