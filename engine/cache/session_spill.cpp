#include "engine/cache/session_spill.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <set>

#include <nlohmann/json.hpp>

#include "engine/cache/plane_codec.h"
#include "engine/core/hex.h"
#include "engine/core/file_util.h"
#include "engine/core/sha256.h"

namespace anchorage {
namespace {

constexpr int kManifestVersion = 1;
constexpr const char* kManifestSuffix = ".manifest";
constexpr const char* kResidentFile = "resident.json";
constexpr double kAssumedRestoreBytesPerS = 1e9;  // before this process restored an entry

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

std::string BlockName(const std::string& id, size_t k) { return id + ".b" + std::to_string(k); }
std::string AnchorName(const std::string& id, int64_t length) { return id + ".a" + std::to_string(length); }
std::string EndName(const std::string& id) { return id + ".end"; }

// The buffers of a block in file order: every attention layer's K, then its V.
// For the pool's threads after PrepareHostWrites.
uint8_t* BufferRowsToFill(SequenceState& s, size_t b) {
  return b % 2 == 0 ? s.k_bytes_to_fill(static_cast<int64_t>(b / 2)) : s.v_bytes_to_fill(static_cast<int64_t>(b / 2));
}
const uint8_t* BufferRows(const SequenceState& s, size_t b) {
  return b % 2 == 0 ? s.k_bytes(static_cast<int64_t>(b / 2)) : s.v_bytes(static_cast<int64_t>(b / 2));
}

nlohmann::json SumsJson(const std::pair<uint64_t, uint64_t>& s) { return nlohmann::json::array({s.first, s.second}); }
std::pair<uint64_t, uint64_t> SumsOf(const nlohmann::json& j) { return {j.at(0).get<uint64_t>(), j.at(1).get<uint64_t>()}; }

}  // namespace

std::pair<uint64_t, uint64_t> WordSums(const void* data, int64_t bytes) {
  // With P the running sum and Q the sum of the P's, the weighted sum is (n + 1) P - Q (mod 2^64):
  // two adds a word, no multiply.
  const auto* p = static_cast<const unsigned char*>(data);
  const int64_t words = bytes / 4;
  uint64_t plain = 0, prefix_total = 0;
  for (int64_t i = 0; i < words; ++i) {
    uint32_t w;
    std::memcpy(&w, p + 4 * i, 4);
    plain += w;
    prefix_total += plain;
  }
  return {plain, static_cast<uint64_t>(words + 1) * plain - prefix_total};
}

int64_t SessionSpill::Manifest::bytes() const {
  int64_t n = 0;
  for (const BlockRecord& b : blocks) n += b.bytes;
  return n;
}

int64_t SessionSpill::Manifest::raw_bytes() const {
  int64_t n = 0;
  for (const BlockRecord& b : blocks) n += b.raw_bytes;
  return n;
}

SessionSpill::SessionSpill(DiskEnv& env, const ModelConfig& config, std::string fingerprint, SessionSpillOptions options)
    : env_(env), config_(config), fingerprint_(std::move(fingerprint)), options_(std::move(options)), pool_(std::max(1, options_.threads)) {}

int64_t SessionSpill::Now() const {
  if (options_.now_ms) return options_.now_ms();
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string SessionSpill::EntryId(const std::string& session, std::span<const int32_t> tokens) {
  Sha256 h;
  if (!session.empty()) {
    h.Update("session:");
    h.Update(session);
  } else {
    const size_t n = std::min<size_t>(tokens.size(), kSpillBlockRows);
    h.Update("tokens:");
    h.Update(std::string_view(reinterpret_cast<const char*>(tokens.data()), n * sizeof(int32_t)));
  }
  return h.FinishHex().substr(0, 32);
}

Result<std::unique_ptr<SessionSpill>> SessionSpill::Open(DiskEnv& env, const ModelConfig& config, std::string fingerprint,
                                                         SessionSpillOptions options) {
  RETURN_IF_ERROR(MakeDirectories(options.dir, 0700));
  std::unique_ptr<SessionSpill> s(new SessionSpill(env, config, std::move(fingerprint), std::move(options)));
  ASSIGN_OR_RETURN(const int swept, SweepTemporaries(env, s->options_.dir));
  ASSIGN_OR_RETURN(std::vector<std::string> names, env.ListFiles(s->options_.dir));
  std::map<std::string, std::vector<std::string>> files_of;
  for (const std::string& name : names)
    if (name != kResidentFile) files_of[name.substr(0, name.find('.'))].push_back(name);
  std::lock_guard lock(s->mu_);
  s->stats_.swept = swept;
  const int64_t now = s->Now();
  for (const auto& [id, files] : files_of) {
    const std::string manifest_path = s->PathOf(id + kManifestSuffix);
    std::optional<Manifest> m;
    if (auto data = env.ReadFile(manifest_path); data.ok())
      if (auto decoded = s->DecodeManifest(*data); decoded.ok()) m = std::move(decoded).value();
    if (m) {
      if (auto used = env.ModifiedTimeMs(manifest_path); used.ok()) m->used_ms = *used;
      if (now - m->used_ms > s->options_.ttl_ms) {
        ++s->stats_.expired;
        m.reset();
      }
    }
    if (!m) {  // unfinished, of another fingerprint, unreadable or expired
      for (const std::string& f : files) (void)env.Remove(s->PathOf(f));
      s->stats_.swept += static_cast<int64_t>(files.size());
      continue;
    }
    s->index_[id] = std::move(*m);
    (void)s->RemoveFilesLocked(id, &s->index_[id]);  // files the manifest does not name
  }
  s->EvictLocked("");
  return s;
}

std::string SessionSpill::EncodeManifest(const Manifest& m) const {
  nlohmann::json blocks = nlohmann::json::array(), anchors = nlohmann::json::array();
  for (const BlockRecord& b : m.blocks) {
    nlohmann::json sums = nlohmann::json::array();
    for (const auto& s : b.sums) sums.push_back(SumsJson(s));
    blocks.push_back({{"rows", b.rows}, {"encoded", b.encoded}, {"lengths", b.lengths}, {"sums", sums}, {"bytes", b.bytes}, {"raw_bytes", b.raw_bytes}});
  }
  for (const AnchorRecord& a : m.anchors) anchors.push_back({{"length", a.length}, {"sums", SumsJson(a.sums)}, {"file", a.file}});
  nlohmann::json j = {{"version", kManifestVersion},
                      {"fingerprint", fingerprint_},
                      {"kv_width", config_.num_key_value_heads * config_.head_dim},
                      {"kv_dtype", KvDtypeName(config_.kv_dtype)},
                      {"attention_layers", config_.num_full_attention_layers()},
                      {"anchor_bytes", SequenceState::AnchorBytes(config_)},
                      {"session_hex", Hex(m.session)},
                      {"tokens", m.tokens},
                      {"taint_row", m.taint_row},
                      {"regions", m.regions},
                      {"anchors", anchors},
                      {"blocks", blocks},
                      {"end", nullptr}};
  if (m.end)
    j["end"] = {{"length", m.end->length}, {"sums", SumsJson(m.end->sums)}, {"file", m.end->file},
                {"taint_row", m.end_taint_row}, {"regions", m.end_regions}};
  return j.dump();
}

Result<SessionSpill::Manifest> SessionSpill::DecodeManifest(const std::string& data) const {
  try {
    const nlohmann::json j = nlohmann::json::parse(data);
    if (j.at("version").get<int>() != kManifestVersion) return Corrupt("spill manifest: version " + j.at("version").dump());
    if (j.at("fingerprint").get<std::string>() != fingerprint_) return Corrupt("spill manifest: another fingerprint");
    if (const std::string dtype = j.value("kv_dtype", "f32"); dtype != KvDtypeName(config_.kv_dtype))
      return Corrupt("spill manifest: " + dtype + " K/V rows, this engine keeps " + KvDtypeName(config_.kv_dtype));
    if (j.at("kv_width").get<int64_t>() != config_.num_key_value_heads * config_.head_dim ||
        j.at("attention_layers").get<int64_t>() != config_.num_full_attention_layers() ||
        j.at("anchor_bytes").get<int64_t>() != SequenceState::AnchorBytes(config_))
      return Corrupt("spill manifest: not this model's layout");
    Manifest m;
    const std::optional<std::string> session = Unhex(j.at("session_hex").get<std::string>());
    if (!session) return Corrupt("spill manifest: a session key that is not hex");
    m.session = *session;
    m.tokens = j.at("tokens").get<std::vector<int32_t>>();
    m.taint_row = j.at("taint_row").get<int64_t>();
    m.regions = j.at("regions").get<std::vector<TokenRegion>>();
    const size_t buffers = static_cast<size_t>(2 * config_.num_full_attention_layers());
    int64_t rows = 0;
    for (const auto& b : j.at("blocks")) {
      BlockRecord r;
      r.rows = b.at("rows").get<int64_t>();
      r.encoded = b.at("encoded").get<bool>();
      r.lengths = b.at("lengths").get<std::vector<int64_t>>();
      for (const auto& s : b.at("sums")) r.sums.push_back(SumsOf(s));
      r.bytes = b.at("bytes").get<int64_t>();
      r.raw_bytes = b.at("raw_bytes").get<int64_t>();
      if (r.rows <= 0 || r.rows > kSpillBlockRows || r.lengths.size() != buffers || r.sums.size() != buffers)
        return Corrupt("spill manifest: a block of another shape");
      int64_t sum = 0;
      for (int64_t n : r.lengths) {
        if (n < 0 || n > r.bytes) return Corrupt("spill manifest: a buffer length outside its block");
        sum += n;
      }
      if (sum != r.bytes) return Corrupt("spill manifest: buffer lengths that do not add up to the block");
      if (!m.blocks.empty() && m.blocks.back().rows != kSpillBlockRows) return Corrupt("spill manifest: a short block that is not the last");
      rows += r.rows;
      m.blocks.push_back(std::move(r));
    }
    if (rows != static_cast<int64_t>(m.tokens.size())) return Corrupt("spill manifest: blocks hold " + std::to_string(rows) + " rows for " + std::to_string(m.tokens.size()) + " tokens");
    for (const auto& a : j.at("anchors")) m.anchors.push_back({a.at("length").get<int64_t>(), SumsOf(a.at("sums")), a.at("file").get<std::string>()});
    if (!j.at("end").is_null()) {
      const auto& e = j.at("end");
      m.end = AnchorRecord{e.at("length").get<int64_t>(), SumsOf(e.at("sums")), e.at("file").get<std::string>()};
      m.end_taint_row = e.at("taint_row").get<int64_t>();
      m.end_regions = e.at("regions").get<std::vector<TokenRegion>>();
    }
    const int64_t n = static_cast<int64_t>(m.tokens.size());
    for (const AnchorRecord& a : m.anchors)
      if (a.length <= 0 || a.length > n) return Corrupt("spill manifest: an anchor past its rows");
    if (m.end && (m.end->length <= 0 || m.end->length > n)) return Corrupt("spill manifest: an end past its rows");
    return m;
  } catch (const nlohmann::json::exception& e) {
    return Corrupt(std::string("spill manifest: ") + e.what());
  }
}

Result<std::string> SessionSpill::EncodeBlock(const SequenceState& state, int64_t begin, const BlockRecord& sums, BlockRecord* record) {
  const int64_t width = state.kv_row_bytes();
  const int64_t bytes = sums.rows * width;
  *record = sums;
  record->encoded = options_.compress;
  record->lengths.clear();
  std::string out;
  auto raw_of = [&](size_t b) {
    return std::span<const char>(reinterpret_cast<const char*>(BufferRows(state, b) + begin * width), static_cast<size_t>(bytes));
  };
  if (options_.compress) {
    // One buffer a task: each plane codec runs alone on its thread.
    std::vector<Result<std::string>> encoded(sums.sums.size(), Result<std::string>(std::string()));
    pool_.Run(encoded.size(), [&](size_t b) { encoded[b] = EncodePlanes(raw_of(b), PlaneCodecOptions{static_cast<int>(KvDtypeBytes(state.kv_dtype())), options_.level, nullptr}); });
    for (auto& e : encoded) {
      if (!e.ok()) return e.status();
      record->lengths.push_back(static_cast<int64_t>(e->size()));
      out += *e;
    }
  } else {
    for (size_t b = 0; b < sums.sums.size(); ++b) {
      record->lengths.push_back(bytes);
      out.append(raw_of(b).data(), raw_of(b).size());
    }
  }
  record->bytes = static_cast<int64_t>(out.size());
  record->raw_bytes = bytes * static_cast<int64_t>(sums.sums.size());
  return out;
}

Result<SpillSaveReport> SessionSpill::Save(const SpillEntry& entry, const SequenceState& state) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t valid = static_cast<int64_t>(entry.tokens.size());
  if (valid == 0 || valid > state.length())
    return InvalidArgument("session spill: " + std::to_string(valid) + " tokens for a state of " + std::to_string(state.length()) + " rows");
  const std::string id = EntryId(entry.session, entry.tokens);
  const int64_t width = state.kv_row_bytes();
  const size_t buffers = static_cast<size_t>(2 * state.num_attention_layers());
  std::lock_guard lock(mu_);
  // The rows as they are, at most: what the save could add to the file system.
  const int64_t at_most = valid * state.kv_bytes_per_token() + static_cast<int64_t>(entry.anchors.size() + 1) * state.anchor_bytes();
  if (auto free = env_.FreeBytes(options_.dir); free.ok() && *free - at_most < options_.min_free_bytes)
    return ResourceExhausted("session spill: writing " + std::to_string(at_most >> 20) + " MiB would leave less than " +
                             std::to_string(options_.min_free_bytes >> 20) + " MiB free on the disk (" + std::to_string(*free >> 20) + " MiB free)");
  std::optional<Manifest> old;
  if (auto it = index_.find(id); it != index_.end()) old = it->second;
  RETURN_IF_ERROR(env_.Remove(PathOf(id + kManifestSuffix)));  // removed first: until the new one, the entry is unfinished
  index_.erase(id);
  SpillSaveReport report;
  Manifest m;
  m.session = entry.session;
  m.tokens = entry.tokens;
  m.taint_row = entry.taint_row;
  m.regions = entry.regions;
  auto write = [&](const std::string& name, std::string_view bytes) {
    report.bytes_written += static_cast<int64_t>(bytes.size());
    return WriteFileCrashSafe(env_, PathOf(name), bytes);
  };
  auto fail = [&](Status s) {
    (void)RemoveFilesLocked(id, nullptr);
    return s;
  };
  // A block is written on a second thread while the next one is summed and encoded.
  std::future<Status> writing;
  auto wait_write = [&]() -> Status { return writing.valid() ? writing.get() : Status::Ok(); };
  for (int64_t begin = 0, k = 0; begin < valid; begin += kSpillBlockRows, ++k) {
    BlockRecord sums;
    sums.rows = std::min(kSpillBlockRows, valid - begin);
    sums.sums.resize(buffers);
    pool_.Run(buffers, [&](size_t b) { sums.sums[b] = WordSums(BufferRows(state, b) + begin * width, sums.rows * width); });
    const bool same_tokens = old && static_cast<size_t>(k) < old->blocks.size() && old->blocks[k].rows == sums.rows &&
                             std::equal(entry.tokens.begin() + begin, entry.tokens.begin() + begin + sums.rows, old->tokens.begin() + begin);
    if (same_tokens && old->blocks[k].sums == sums.sums) {
      m.blocks.push_back(old->blocks[k]);
      ++report.blocks_kept;
      continue;
    }
    BlockRecord record;
    auto bytes = EncodeBlock(state, begin, sums, &record);
    if (!bytes.ok()) {
      (void)wait_write();
      return fail(bytes.status());
    }
    if (Status s = wait_write(); !s.ok()) return fail(s);
    report.bytes_written += static_cast<int64_t>(bytes->size());
    writing = std::async(std::launch::async, [this, name = BlockName(id, static_cast<size_t>(k)), data = std::move(bytes).value()] {
      return WriteFileCrashSafe(env_, PathOf(name), data);
    });
    report.raw_bytes += record.raw_bytes;
    ++report.blocks_written;
    m.blocks.push_back(std::move(record));
  }
  if (Status s = wait_write(); !s.ok()) return fail(s);
  auto put_anchor = [&](const Anchor& a, const std::string& name, const std::optional<AnchorRecord>& before) -> Result<AnchorRecord> {
    AnchorRecord r{a.length, WordSums(a.data.data(), a.bytes()), name};
    if (before && before->length == r.length && before->sums == r.sums && before->file == name) {
      ++report.anchors_kept;
      return r;
    }
    RETURN_IF_ERROR(write(name, std::string_view(reinterpret_cast<const char*>(a.data.data()), static_cast<size_t>(a.bytes()))));
    ++report.anchors_written;
    return r;
  };
  for (const Anchor& a : entry.anchors) {
    std::optional<AnchorRecord> before;
    if (old)
      for (const AnchorRecord& r : old->anchors)
        if (r.length == a.length) before = r;
    auto r = put_anchor(a, AnchorName(id, a.length), before);
    if (!r.ok()) return fail(r.status());
    m.anchors.push_back(*r);
  }
  if (entry.end) {
    auto r = put_anchor(entry.end->anchor, EndName(id), old ? old->end : std::nullopt);
    if (!r.ok()) return fail(r.status());
    m.end = *r;
    m.end_taint_row = entry.end->taint_row;
    m.end_regions = entry.end->regions;
  }
  m.used_ms = Now();
  if (Status s = RemoveFilesLocked(id, &m); !s.ok()) return fail(s);  // blocks and anchors the new entry no longer names
  const std::string manifest = EncodeManifest(m);
  if (Status s = write(id + kManifestSuffix, manifest); !s.ok()) return fail(s);
  index_[id] = std::move(m);
  report.seconds = SecondsSince(start);
  ++stats_.saves;
  stats_.bytes_written += report.bytes_written;
  stats_.save_seconds += report.seconds;
  EvictLocked(id);
  return report;
}

Result<SpillEntry> SessionSpill::Restore(const std::string& id, SequenceState& state, std::span<const int32_t> in_place,
                                         SpillRestoreReport* report, int64_t upto) {
  const auto start = std::chrono::steady_clock::now();
  std::lock_guard lock(mu_);
  const auto it = index_.find(id);
  if (it == index_.end()) return NotFound("session spill: no entry " + id);
  const Manifest& m = it->second;
  SpillRestoreReport r;
  auto fail = [&](Status s) {
    (void)RemoveFilesLocked(id, nullptr);
    index_.erase(id);
    ++stats_.failed_restores;
    return s;
  };
  const int64_t valid = std::min<int64_t>(static_cast<int64_t>(m.tokens.size()), upto);
  const int64_t blocks = (valid + kSpillBlockRows - 1) / kSpillBlockRows;  // whole blocks: the sums are a block's
  if (Status s = state.Reserve(std::min<int64_t>(blocks * kSpillBlockRows, static_cast<int64_t>(m.tokens.size()))); !s.ok()) return s;
  const int64_t common = std::min<int64_t>(CommonPrefixLength(in_place, m.tokens), state.length());
  const int64_t width = state.kv_row_bytes();
  std::vector<size_t> to_read;
  for (size_t k = 0; k < static_cast<size_t>(blocks); ++k) {
    if (static_cast<int64_t>(k) * kSpillBlockRows + m.blocks[k].rows <= common) ++r.blocks_in_place;
    else to_read.push_back(k);
  }
  // The next block's file is read on a second thread while this one is decoded and summed, one
  // buffer a task on the pool.
  auto read_file = [this, &id](size_t k) { return env_.ReadFile(PathOf(BlockName(id, k))); };
  std::future<Result<std::string>> next;
  if (!to_read.empty()) next = std::async(std::launch::async, read_file, to_read[0]);
  if (!to_read.empty()) state.PrepareHostWrites(false, static_cast<int64_t>(to_read[0]) * kSpillBlockRows);  // the pool's threads write the rows
  for (size_t i = 0; i < to_read.size(); ++i) {
    const size_t k = to_read[i];
    const BlockRecord& b = m.blocks[k];
    const int64_t begin = static_cast<int64_t>(k) * kSpillBlockRows;
    const std::string name = BlockName(id, k);
    auto data = next.get();
    if (i + 1 < to_read.size()) next = std::async(std::launch::async, read_file, to_read[i + 1]);
    auto failed = [&](Status s) {
      if (next.valid()) next.wait();
      return fail(std::move(s));
    };
    if (!data.ok()) return failed(data.status());
    if (static_cast<int64_t>(data->size()) != b.bytes)
      return failed(Corrupt(name + ": " + std::to_string(data->size()) + " bytes, the manifest says " + std::to_string(b.bytes)));
    const int64_t bytes = b.rows * width;
    std::vector<int64_t> offsets(b.sums.size() + 1, 0);
    for (size_t buf = 0; buf < b.sums.size(); ++buf) offsets[buf + 1] = offsets[buf] + b.lengths[buf];
    std::vector<Status> checked(b.sums.size(), Status::Ok());
    pool_.Run(b.sums.size(), [&](size_t buf) {
      char* dest = reinterpret_cast<char*>(BufferRowsToFill(state, buf) + begin * width);
      const std::string_view payload = std::string_view(*data).substr(static_cast<size_t>(offsets[buf]), static_cast<size_t>(b.lengths[buf]));
      if (b.encoded) {
        if (Status s = DecodePlanes(payload, std::span(dest, static_cast<size_t>(bytes)), nullptr); !s.ok()) {
          checked[buf] = Corrupt(name + ": " + s.message());
          return;
        }
      } else if (static_cast<int64_t>(payload.size()) != bytes) {
        checked[buf] = Corrupt(name + ": a raw buffer of the wrong size");
        return;
      } else {
        std::memcpy(dest, payload.data(), payload.size());
      }
      if (WordSums(dest, bytes) != b.sums[buf]) checked[buf] = Corrupt(name + ": buffer " + std::to_string(buf) + " does not sum to what was saved");
    });
    for (const Status& s : checked)
      if (!s.ok()) return failed(s);
    ++r.blocks_read;
    r.bytes_read += b.bytes;
  }
  SpillEntry out;
  out.session = m.session;
  out.tokens.assign(m.tokens.begin(), m.tokens.begin() + valid);
  out.taint_row = m.taint_row;
  out.regions = m.regions;
  ClipTokenRegions(out.regions, valid);
  auto read_anchor = [&](const AnchorRecord& a) -> Result<Anchor> {
    ASSIGN_OR_RETURN(std::string data, env_.ReadFile(PathOf(a.file)));
    if (static_cast<int64_t>(data.size()) != SequenceState::AnchorBytes(config_)) return Corrupt(a.file + ": not an anchor of this model");
    if (WordSums(data.data(), static_cast<int64_t>(data.size())) != a.sums) return Corrupt(a.file + ": does not sum to what was saved");
    Anchor anchor;
    anchor.length = a.length;
    anchor.data.resize(data.size() / sizeof(float));
    std::memcpy(anchor.data.data(), data.data(), data.size());
    r.bytes_read += static_cast<int64_t>(data.size());
    return anchor;
  };
  for (const AnchorRecord& a : m.anchors) {
    if (a.length > valid) continue;
    auto anchor = read_anchor(a);
    if (!anchor.ok()) return fail(anchor.status());
    out.anchors.push_back(std::move(anchor).value());
  }
  if (m.end && m.end->length <= valid) {
    auto anchor = read_anchor(*m.end);
    if (!anchor.ok()) return fail(anchor.status());
    out.end = EndAnchor{std::move(anchor).value(), m.end_taint_row, m.end_regions};
  }
  state.SetLength(valid);
  it->second.used_ms = Now();
  (void)env_.SetModifiedTimeMs(PathOf(id + kManifestSuffix), it->second.used_ms);
  r.seconds = SecondsSince(start);
  ++stats_.restores;
  stats_.bytes_read += r.bytes_read;
  stats_.restore_seconds += r.seconds;
  if (report != nullptr) *report = r;
  return out;
}

Status SessionSpill::RemoveFilesLocked(const std::string& id, const Manifest* keep) {
  std::set<std::string> named;
  if (keep != nullptr) {
    named.insert(id + kManifestSuffix);
    for (size_t k = 0; k < keep->blocks.size(); ++k) named.insert(BlockName(id, k));
    for (const AnchorRecord& a : keep->anchors) named.insert(a.file);
    if (keep->end) named.insert(keep->end->file);
  }
  ASSIGN_OR_RETURN(std::vector<std::string> names, env_.ListFiles(options_.dir));
  // The manifest goes first, so a crash part way leaves an unfinished entry, never a wrong one.
  std::stable_partition(names.begin(), names.end(), [](const std::string& n) { return n.ends_with(kManifestSuffix); });
  for (const std::string& name : names)
    if (name.substr(0, name.find('.')) == id && !named.contains(name)) RETURN_IF_ERROR(env_.Remove(PathOf(name)));
  return Status::Ok();
}

void SessionSpill::EvictLocked(const std::string& keep_id) {
  const int64_t now = Now();
  int64_t total = 0;
  for (const auto& [id, m] : index_) total += m.bytes();
  while (!index_.empty()) {
    auto oldest = index_.end();
    for (auto it = index_.begin(); it != index_.end(); ++it)
      if (it->first != keep_id && (oldest == index_.end() || it->second.used_ms < oldest->second.used_ms)) oldest = it;
    if (oldest == index_.end()) break;
    const bool expired = now - oldest->second.used_ms > options_.ttl_ms;
    if (!expired && total <= options_.budget_bytes) break;
    total -= oldest->second.bytes();
    ++(expired ? stats_.expired : stats_.evictions);
    (void)RemoveFilesLocked(oldest->first, nullptr);
    index_.erase(oldest);
  }
}

SpillEntryInfo SessionSpill::InfoOf(const std::string& id, const Manifest& m) {
  return {id, m.session, static_cast<int64_t>(m.tokens.size()), m.bytes(), m.raw_bytes(), m.used_ms, m.end ? m.end->length : 0};
}

std::optional<SpillEntryInfo> SessionSpill::Info(const std::string& id) const {
  std::lock_guard lock(mu_);
  const auto it = index_.find(id);
  if (it == index_.end()) return std::nullopt;
  return InfoOf(id, it->second);
}

void SessionSpill::SetTitler(std::function<std::string(std::span<const int32_t>)> titler) {
  std::lock_guard lock(mu_);
  titler_ = std::move(titler);
  titles_.clear();
}

std::string SessionSpill::Title(const std::string& id) const {
  std::lock_guard lock(mu_);
  const auto it = index_.find(id);
  if (it == index_.end() || !titler_) return "";
  if (const auto known = titles_.find(id); known != titles_.end()) return known->second;
  if (titles_.size() > index_.size()) std::erase_if(titles_, [&](const auto& t) { return !index_.contains(t.first); });
  return titles_[id] = titler_(it->second.tokens);
}

std::vector<SpillEntryInfo> SessionSpill::Entries() const {
  std::vector<SpillEntryInfo> out;
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, m] : index_) out.push_back(InfoOf(id, m));
  }
  std::sort(out.begin(), out.end(), [](const SpillEntryInfo& a, const SpillEntryInfo& b) { return a.used_ms > b.used_ms; });
  return out;
}

std::optional<SpillOffer> SessionSpill::Offer(std::span<const int32_t> prompt, std::span<const int32_t> in_place, int64_t limit) const {
  std::lock_guard lock(mu_);
  std::optional<SpillOffer> best;
  for (const auto& [id, m] : index_) {
    const int64_t common = CommonPrefixLength(prompt, m.tokens);
    const int64_t reach = std::min(common, limit);
    SpillOffer o{id, 0, false, 0};
    for (const AnchorRecord& a : m.anchors)
      if (a.length <= reach && MayResumeAt(a.length, common, m.taint_row, m.regions)) o.resume_length = std::max(o.resume_length, a.length);
    if (m.end && m.end->length <= reach && m.end->length > o.resume_length && MayResumeAtEnd(m.end->length, common, m.end_taint_row, m.end_regions)) {
      o.resume_length = m.end->length;
      o.from_end = true;
    }
    if (o.resume_length == 0 || (best && best->resume_length >= o.resume_length)) continue;
    o.read_bytes = RestoreBytes(m, in_place, o.resume_length, o.from_end);
    best = std::move(o);
  }
  return best;
}

int64_t SessionSpill::RestoreBytes(const Manifest& m, std::span<const int32_t> in_place, int64_t upto, bool with_end) const {
  const int64_t here = CommonPrefixLength(in_place, m.tokens);
  int64_t bytes = 0;
  for (size_t k = 0; k < m.blocks.size(); ++k) {
    const int64_t begin = static_cast<int64_t>(k) * kSpillBlockRows;
    if (begin < upto && begin + m.blocks[k].rows > here) bytes += m.blocks[k].bytes;
  }
  int64_t anchors = with_end ? 1 : 0;
  for (const AnchorRecord& a : m.anchors) anchors += a.length <= upto;
  return bytes + anchors * SequenceState::AnchorBytes(config_);
}

int64_t SessionSpill::LongestCommon(std::span<const int32_t> prompt) const {
  std::lock_guard lock(mu_);
  int64_t best = 0;
  for (const auto& [id, m] : index_) best = std::max(best, CommonPrefixLength(prompt, m.tokens));
  return best;
}

std::optional<SpillEndCandidate> SessionSpill::EndCandidate(std::span<const int32_t> prompt, std::span<const int32_t> in_place,
                                                            int64_t min_common) const {
  std::lock_guard lock(mu_);
  const Manifest* best = nullptr;
  std::string best_id;
  int64_t best_common = min_common - 1;
  for (const auto& [id, m] : index_) {
    if (!m.end) continue;
    const int64_t common = CommonPrefixLength(prompt, m.tokens);
    if (common < m.end->length && common > best_common) {
      best = &m;
      best_id = id;
      best_common = common;
    }
  }
  if (best == nullptr) return std::nullopt;
  return SpillEndCandidate{best_id,          {best->tokens.begin(), best->tokens.begin() + best->end->length},
                           best->end->length, best->end_taint_row,
                           best->end_regions, RestoreBytes(*best, in_place, best->end->length, true)};
}

std::optional<std::vector<int32_t>> SessionSpill::EndRecord(const std::string& session) const {
  std::lock_guard lock(mu_);
  const Manifest* newest = nullptr;
  for (const auto& [id, m] : index_)
    if (m.session == session && m.end && (newest == nullptr || m.used_ms > newest->used_ms)) newest = &m;
  if (newest == nullptr) return std::nullopt;
  return std::vector<int32_t>(newest->tokens.begin(), newest->tokens.begin() + newest->end->length);
}

double SessionSpill::RestoreBytesPerSecond() const {
  std::lock_guard lock(mu_);
  return stats_.restore_seconds > 0 && stats_.bytes_read > 0 ? static_cast<double>(stats_.bytes_read) / stats_.restore_seconds
                                                              : kAssumedRestoreBytesPerS;
}

Status SessionSpill::SetResident(const std::string& id) {
  return WriteFileCrashSafe(env_, PathOf(kResidentFile), nlohmann::json{{"id", id}}.dump());
}

std::optional<std::string> SessionSpill::TakeResident() {
  auto data = env_.ReadFile(PathOf(kResidentFile));
  if (!data.ok()) return std::nullopt;
  (void)env_.Remove(PathOf(kResidentFile));
  try {
    std::string id = nlohmann::json::parse(*data).at("id").get<std::string>();
    std::lock_guard lock(mu_);
    if (index_.contains(id)) return id;
  } catch (const nlohmann::json::exception&) {
  }
  return std::nullopt;
}

Status SessionSpill::Remove(const std::string& id) {
  std::lock_guard lock(mu_);
  index_.erase(id);
  return RemoveFilesLocked(id, nullptr);
}

Status SessionSpill::Clear() {
  std::lock_guard lock(mu_);
  index_.clear();
  ASSIGN_OR_RETURN(std::vector<std::string> names, env_.ListFiles(options_.dir));
  for (const std::string& name : names) RETURN_IF_ERROR(env_.Remove(PathOf(name)));
  return Status::Ok();
}

void SessionSpill::Record(CacheEvent event) {
  event.time_ms = Now();
  std::lock_guard lock(mu_);
  recent_.push_back(std::move(event));
  while (recent_.size() > 32) recent_.pop_front();
}

std::vector<CacheEvent> SessionSpill::RecentEvents() const {
  std::lock_guard lock(mu_);
  return {recent_.begin(), recent_.end()};
}

void SessionSpill::set_limits(int64_t budget_bytes, int64_t ttl_ms, int64_t min_free_bytes) {
  std::lock_guard lock(mu_);
  options_.budget_bytes = budget_bytes;
  options_.ttl_ms = ttl_ms;
  options_.min_free_bytes = min_free_bytes;
  EvictLocked("");
}

SessionSpillStats SessionSpill::stats() const {
  std::lock_guard lock(mu_);
  SessionSpillStats s = stats_;
  s.entries = static_cast<int64_t>(index_.size());
  for (const auto& [id, m] : index_) {
    s.bytes += m.bytes();
    s.raw_bytes += m.raw_bytes();
  }
  return s;
}

}  // namespace anchorage
