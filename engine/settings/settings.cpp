#include "engine/settings/settings.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <utility>

#include "engine/core/file_util.h"
#include "engine/settings/backend_spec.h"

namespace anchorage {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr int64_t kFallbackRamBytes = int64_t{16} << 30;

double RoundTenth(double v) { return std::round(v * 10.0) / 10.0; }

SettingField Integer(std::string area, std::string name, int64_t min, int64_t max, int64_t def, std::string desc) {
  return {std::move(area), std::move(name), SettingType::kInteger, static_cast<double>(min),
          static_cast<double>(max), {}, def, std::move(desc)};
}
SettingField Number(std::string area, std::string name, double min, double max, double def, std::string desc) {
  return {std::move(area), std::move(name), SettingType::kNumber, min, max, {}, def, std::move(desc)};
}
SettingField Boolean(std::string area, std::string name, bool def, std::string desc) {
  return {std::move(area), std::move(name), SettingType::kBoolean, 0, 0, {}, def, std::move(desc)};
}
SettingField Enum(std::string area, std::string name, std::vector<std::string> values, std::string def,
                  std::string desc) {
  return {std::move(area), std::move(name), SettingType::kEnum, 0, 0, std::move(values), def, std::move(desc)};
}
SettingField String(std::string area, std::string name, std::string def, std::string desc) {
  return {std::move(area), std::move(name), SettingType::kString, 0, 0, {}, def, std::move(desc)};
}

// backends.upstreams: the --backend specs, separated by spaces, checked as the flag checks them.
SettingField BackendList() {
  SettingField f = String("backends", "upstreams", "",
                          "upstreams served beside the embedded model: NAME=URL[,key=ENVVAR] separated by spaces, added to --backend's");
  f.max_bytes = 4096;
  f.check = [](const std::string& text) -> std::optional<std::string> {
    auto specs = ParseBackendList(text);
    if (!specs.ok()) return specs.status().message();
    return std::nullopt;
  };
  return f;
}

const char* TypeName(SettingType type) {
  switch (type) {
    case SettingType::kInteger: return "integer";
    case SettingType::kNumber: return "number";
    case SettingType::kBoolean: return "boolean";
    case SettingType::kEnum: return "enum";
    case SettingType::kString: return "string";
  }
  return "string";
}

const char* JsonTypeName(const nlohmann::json& v) {
  if (v.is_number_integer()) return "integer";
  if (v.is_number()) return "number";
  return v.type_name();
}

// JSON text that never throws: invalid UTF-8 is replaced.
std::string Dump(const nlohmann::json& v, int indent = -1) {
  return v.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string FormatNumber(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

// Why v does not fit field, or nullopt when it does.
std::optional<std::string> CheckValue(const SettingField& field, const nlohmann::json& v) {
  switch (field.type) {
    case SettingType::kInteger:
    case SettingType::kNumber: {
      if (field.type == SettingType::kInteger ? !v.is_number_integer() : !v.is_number()) {
        return std::string("expected ") + (field.type == SettingType::kInteger ? "an integer" : "a number") +
               ", got " + JsonTypeName(v);
      }
      double d = v.get<double>();
      if (d < field.min || d > field.max) {
        return Dump(v) + " is outside " + FormatNumber(field.min) + ".." + FormatNumber(field.max);
      }
      return std::nullopt;
    }
    case SettingType::kBoolean:
      if (!v.is_boolean()) return std::string("expected a boolean, got ") + JsonTypeName(v);
      return std::nullopt;
    case SettingType::kEnum: {
      if (!v.is_string()) return std::string("expected a string, got ") + JsonTypeName(v);
      for (const std::string& allowed : field.values) {
        if (v.get<std::string>() == allowed) return std::nullopt;
      }
      std::string list;
      for (const std::string& allowed : field.values) list += (list.empty() ? "" : ", ") + allowed;
      return Dump(v) + " is not one of " + list;
    }
    case SettingType::kString:
      if (!v.is_string()) return std::string("expected a string, got ") + JsonTypeName(v);
      if (v.get<std::string>().size() > field.max_bytes) return "longer than " + std::to_string(field.max_bytes) + " bytes";
      if (field.check) return field.check(v.get<std::string>());
      return std::nullopt;
  }
  return std::nullopt;
}

// The value as stored: integers as int64, numbers as double.
nlohmann::json Normalize(const SettingField& field, const nlohmann::json& v) {
  if (field.type == SettingType::kInteger) return v.get<int64_t>();
  if (field.type == SettingType::kNumber) return v.get<double>();
  return v;
}

std::vector<std::string> AreasInOrder(const std::vector<SettingField>& fields) {
  std::vector<std::string> areas;
  for (const SettingField& f : fields) {
    if (areas.empty() || areas.back() != f.area) areas.push_back(f.area);
  }
  return areas;
}

// Relations between fields, checked on a document whose fields are all valid.
void CheckRelations(const nlohmann::json& doc, std::vector<FieldError>& errors) {
  double ceiling = doc["memory"]["ceiling_gb"].get<double>();
  double peak = doc["memory"]["prefill_peak_gb"].get<double>();
  if (peak < ceiling) {
    errors.push_back({"memory.prefill_peak_gb", FormatNumber(peak) + " is below memory.ceiling_gb " +
                                                    FormatNumber(ceiling)});
  }
  double budget = doc["state_store"]["budget_gb"].get<double>();
  double entry_cap = doc["state_store"]["entry_cap_gb"].get<double>();
  if (entry_cap > budget) {
    errors.push_back({"state_store.entry_cap_gb", FormatNumber(entry_cap) + " is above state_store.budget_gb " +
                                                      FormatNumber(budget)});
  }
}

// Strict check of a whole document: every field present and valid, nothing unknown.
std::vector<FieldError> ValidateDocument(const std::vector<SettingField>& fields, const nlohmann::json& doc) {
  std::vector<FieldError> errors;
  if (!doc.is_object()) return {{"", std::string("expected a JSON object, got ") + JsonTypeName(doc)}};
  if (!doc.contains("version")) {
    errors.push_back({"version", "missing"});
  } else if (!doc["version"].is_number_integer()) {
    errors.push_back({"version", std::string("expected an integer, got ") + JsonTypeName(doc["version"])});
  }
  std::vector<std::string> areas = AreasInOrder(fields);
  std::set<std::string> bad_areas;
  for (const std::string& area : areas) {
    if (!doc.contains(area)) {
      errors.push_back({area, "missing"});
      bad_areas.insert(area);
    } else if (!doc[area].is_object()) {
      errors.push_back({area, std::string("expected an object, got ") + JsonTypeName(doc[area])});
      bad_areas.insert(area);
    }
  }
  for (const SettingField& f : fields) {
    if (bad_areas.count(f.area) != 0) continue;
    const nlohmann::json& obj = doc[f.area];
    if (!obj.contains(f.name)) {
      errors.push_back({f.key(), "missing"});
    } else if (auto why = CheckValue(f, obj[f.name])) {
      errors.push_back({f.key(), *why});
    }
  }
  for (const std::string& area : areas) {
    if (bad_areas.count(area) != 0) continue;
    for (const auto& [name, value] : doc[area].items()) {
      bool known = false;
      for (const SettingField& f : fields) known = known || (f.area == area && f.name == name);
      if (!known) errors.push_back({area + "." + name, "unknown field"});
    }
  }
  for (const auto& [name, value] : doc.items()) {
    if (name == "version" || name == "overrides") continue;
    bool known = false;
    for (const std::string& area : areas) known = known || area == name;
    if (!known) errors.push_back({name, "unknown field"});
  }
  if (errors.empty()) CheckRelations(doc, errors);
  return errors;
}

// A document from a file: version required; missing fields take defaults; bad fields are noted.
Result<nlohmann::json> LoadDocument(const std::string& path, const std::vector<SettingField>& fields,
                                    std::string* notes) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  nlohmann::json parsed = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) {
    return Corrupt("settings " + path + ": not valid JSON (" + std::to_string(text.size()) + " bytes)");
  }
  if (!parsed.is_object()) return Corrupt("settings " + path + ": not a JSON object");
  if (!parsed.contains("version") || !parsed["version"].is_number_integer() ||
      parsed["version"].get<int64_t>() < 1) {
    return Corrupt("settings " + path + ": no integer version of at least 1");
  }
  nlohmann::json doc = {{"version", parsed["version"].get<int64_t>()}};
  for (const SettingField& f : fields) {
    nlohmann::json value = f.default_value;
    if (parsed.contains(f.area) && parsed[f.area].is_object() && parsed[f.area].contains(f.name)) {
      const nlohmann::json& v = parsed[f.area][f.name];
      if (auto why = CheckValue(f, v)) {
        *notes += (notes->empty() ? "" : "; ") + f.key() + ": " + *why + ", default used";
      } else {
        value = Normalize(f, v);
      }
    }
    doc[f.area][f.name] = value;
  }
  for (const auto& [area, obj] : parsed.items()) {
    if (area == "version") continue;
    bool area_known = false;
    for (const SettingField& f : fields) area_known = area_known || f.area == area;
    if (!area_known) {
      *notes += (notes->empty() ? "" : "; ") + area + ": unknown, ignored";
      continue;
    }
    if (!obj.is_object()) continue;
    for (const auto& [name, value] : obj.items()) {
      if (!doc[area].contains(name)) *notes += (notes->empty() ? "" : "; ") + area + "." + name + ": unknown, ignored";
    }
  }
  std::vector<FieldError> relations;
  CheckRelations(doc, relations);
  if (!relations.empty()) {
    return Corrupt("settings " + path + ": " + relations.front().field + " " + relations.front().message);
  }
  return doc;
}

}  // namespace

std::vector<SettingField> SettingsSchemaFields(int64_t total_ram_bytes) {
  double ram_gb = static_cast<double>(total_ram_bytes > 0 ? total_ram_bytes : kFallbackRamBytes) / kGiB;
  return {
      Number("memory", "ceiling_gb", 0, 16384, RoundTenth(0.5 * ram_gb),
             "GiB the engine may hold between requests, caches included (default 50% of RAM)"),
      Number("memory", "prefill_peak_gb", 0, 16384, RoundTenth(0.7 * ram_gb),
             "GiB the engine may hold during a prefill; caches are shed to fit, else 503 (default 70% of RAM)"),
      Number("memory", "allocator_slack_gb", 0, 64, 0.5,
             "GiB of freed blocks the allocator may keep between requests"),
      Boolean("resident", "enabled", true, "keep the previous request's rows and anchors in memory"),
      Number("resident", "resident_gb", 0, 1024, 2.5, "GiB for the resident prefix's anchors"),
      Integer("resident", "guest_max_tokens", 0, 1 << 20, 8192,
              "longest unrelated request served beside the resident conversation (guest stash)"),
      Number("resident", "stash_gb", 0, 1024, 1, "GiB for the guest stash"),
      Number("resident", "pin_gb", 0, 1024, 4, "GiB for the pinned head kept before a compaction"),
      Number("resident", "park_gb", 0, 1024, 4, "GiB for the parked session (A-B-A switching)"),
      Boolean("resident", "end_anchor", true, "keep the state at the end of every generation"),
      Boolean("resident", "end_align_reasoning", true,
              "end alignment also serves a client copy that left out a generation's reasoning"),
      Boolean("state_store", "enabled", true, "keep whole snapshots keyed by tokens"),
      Number("state_store", "budget_gb", 0, 1024, 2, "GiB for all snapshots"),
      Number("state_store", "entry_cap_gb", 0, 1024, 1, "GiB for one snapshot; at most budget_gb"),
      Boolean("state_store", "boundaries", true, "also snapshot at message boundaries"),
      Enum("disk_cache", "mode", {"off", "read", "readwrite"}, "readwrite",
           "disk tier: off, read existing entries only, or read and write"),
      Number("disk_cache", "budget_gb", 0, 65536, 16, "GiB the disk tier may occupy"),
      Integer("disk_cache", "ttl_days", 0, 3650, 7, "days an unused entry is kept; 0 keeps entries until evicted"),
      Integer("disk_cache", "admit_after", 1, 100, 2, "cold reads of a prefix before it is written"),
      Number("disk_cache", "min_free_gb", 0, 65536, 20, "GiB the file system must keep free; writes stop below"),
      Integer("disk_cache", "min_tokens", 0, 1 << 24, 4096, "shortest prefix in tokens worth writing"),
      Number("disk_cache", "write_budget_gb", 0, 1 << 20, 200, "GiB the disk tier and the spill may write a day; past it they write less"),
      Enum("spill", "mode", {"off", "on"}, "on", "session spill: whole conversations to the disk tier's folder and back"),
      Number("spill", "budget_gb", 0, 65536, 64, "GiB the session spill may occupy"),
      Integer("spill", "min_tokens", 0, 1 << 24, 16384, "shortest conversation an eviction writes"),
      Integer("spill", "ttl_hours", 1, 87600, 48, "hours an unused conversation is kept"),
      Boolean("shadow", "enabled", true, "read every session with the shadow model, when one is loaded"),
      String("shadow", "model", "", "the shadow model's folder (--shadow-model); empty: the generated shadow model beside the generated tiny one, else none"),
      Number("shadow", "ration", 0, 0.5, 0.02, "share of a turn's time since its first token the reader may use between decode steps"),
      Number("shadow", "budget_gb", 0, 1024, 4, "GiB of resident shadow states; past it the least recently used go to disk"),
      Number("shadow", "disk_gb", 0, 65536, 16, "GiB of shadow session files"),
      Integer("shadow", "ttl_hours", 1, 87600, 48, "hours an unused shadow session file is kept"),
      String("shadow", "question", "What does the user ask for in the last message?", "the agreement question asked of both models at long turns; empty: none"),
      String("shadow", "choices", "a code edit|an explanation|something else", "the agreement question's choices, separated by |"),
      Integer("shadow", "min_tokens", 0, 1 << 24, 8192, "shortest prompt the agreement question is asked at"),
      Enum("speculative", "mode", {"off", "lookup", "mtp", "both"}, "lookup", "speculative decoding: off, lookup drafts (n-gram copies of the conversation), the checkpoint's MTP head, or both (lookup first); the tokens stay the same"),
      Integer("speculative", "max_draft", 1, 64, 8, "most drafts a decode window verifies"),
      Enum("speculative", "beside_others", {"auto", "on", "off"}, "auto",
           "drafts of a slot while other slots decode, its window's rows in their batch (on the CPU): auto where its kept drafts pay for their rows by the engine's measured step costs, on, or off; the tokens stay the same"),
      Enum("speculative", "suffix_store", {"off", "read", "readwrite"}, "readwrite", "the lookup drafter's store of earlier requests' token ids: off, read only, or read and append"),
      Number("speculative", "suffix_store_mb", 1, 4096, 16, "MiB the suffix store keeps; past it the oldest half goes"),
      Enum("compaction", "mode", {"continuation", "client"}, "continuation", "an agent's compaction request of a conversation the engine holds: served as its continuation, or as the client sent it"),
      Enum("compaction", "prepare", {"on", "off"}, "on", "write the continuation's answer ahead while the engine is idle, so the compaction request is answered at once"),
      Number("compaction", "idle_s", 0, 86400, 30, "seconds without a request before the answer is written ahead"),
      Integer("compaction", "min_tokens", 0, 1 << 24, 32768, "shortest resident conversation whose compaction is written ahead"),
      Boolean("response_cache", "enabled", false, "answer an identical greedy request (same prompt ids and parameters) from memory; never sampled ones"),
      Number("response_cache", "mb", 1, 65536, 64, "MiB of answers the response cache keeps; past it the least recently used go"),
      BackendList(),
      Enum("engine", "kv_dtype", {"auto", "f32", "bf16", "fp8"}, "auto",
           "how every state keeps its attention K/V rows, from the next start: bf16 (half the bytes a token in every tier and on the GPU), fp8 (e4m3 with a power-of-two scale per 32 values: about a quarter), f32, or auto (bf16); --kv-dtype overrides"),
      Enum("engine", "precision", {"exact", "fast"}, "exact",
           "how the bf16 kernel paths multiply, from the next start: exact (fp32-grade products) or fast (activations rounded once to bf16 on the CPU's bf16 units: faster, logits further from the reference; exact where there are none); --precision overrides"),
      Integer("engine", "parallel", 0, 64, 0,
              "slots: conversations that run at once, batched, each bit for bit what it computes alone; 0: auto (2 on the CPU, 4 on CUDA). A change applies between steps: slots are added at once, and the last ones removed once idle, their conversations written to the spill; --parallel holds for the run"),
      Integer("journal", "retention_days", 1, 3650, 30, "days journal rows are kept"),
      Integer("journal", "retention_rows", 1000, 1000000000, 1000000, "rows kept per journal table"),
  };
}

int64_t MachineTotalRamBytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit) {
    if (key == "MemTotal:") return kib * 1024;
  }
  return 0;
}

nlohmann::json DefaultSettingsDocument(int64_t total_ram_bytes) {
  nlohmann::json doc = {{"version", 1}};
  for (const SettingField& f : SettingsSchemaFields(total_ram_bytes)) doc[f.area][f.name] = f.default_value;
  return doc;
}

int SettingsError::http_status() const {
  switch (kind) {
    case Kind::kStaleVersion: return 409;
    case Kind::kInvalid: return 400;
    case Kind::kIo: return 500;
  }
  return 500;
}

nlohmann::json SettingsError::ToJson() const {
  nlohmann::json list = nlohmann::json::array();
  for (const FieldError& e : fields) list.push_back({{"field", e.field}, {"message", e.message}});
  const char* code = kind == Kind::kStaleVersion ? "stale_version" : kind == Kind::kInvalid ? "invalid_settings"
                                                                                            : "settings_write_failed";
  const char* type = kind == Kind::kIo ? "server_error" : "invalid_request_error";
  nlohmann::json param = fields.empty() ? nlohmann::json(nullptr) : nlohmann::json(fields.front().field);
  return {{"error",
           {{"message", message},
            {"type", type},
            {"code", code},
            {"param", param},
            {"current_version", current_version},
            {"fields", list}}}};
}

struct SettingsStore::State {
  std::string path;
  std::vector<SettingField> fields;
  std::mutex replace_mu;  // serializes Replace: file writes, install and listeners
  mutable std::mutex mu;  // guards everything below
  nlohmann::json stored;
  std::map<std::string, std::pair<nlohmann::json, std::string>> overrides;  // key -> (value, source)
  std::map<int, Listener> listeners;
  int next_listener_id = 1;
  Status warning;

  const SettingField* Find(const std::string& key) const {
    for (const SettingField& f : fields) {
      if (f.key() == key) return &f;
    }
    return nullptr;
  }
  nlohmann::json EffectiveLocked() const {
    nlohmann::json doc = stored;
    for (const auto& [key, entry] : overrides) {
      const SettingField* f = Find(key);
      doc[f->area][f->name] = entry.first;
    }
    return doc;
  }
  nlohmann::json OverridesLocked() const {
    nlohmann::json out = nlohmann::json::object();
    for (const auto& [key, entry] : overrides) {
      const SettingField* f = Find(key);
      out[key] = {{"value", entry.first}, {"source", entry.second}, {"stored", stored[f->area][f->name]}};
    }
    return out;
  }
};

SettingsStore::SettingsStore(std::unique_ptr<State> state) : state_(std::move(state)) {}
SettingsStore::SettingsStore(SettingsStore&&) noexcept = default;
SettingsStore& SettingsStore::operator=(SettingsStore&&) noexcept = default;
SettingsStore::~SettingsStore() = default;

Result<SettingsStore> SettingsStore::Open(const std::string& path, const SettingsOptions& options) {
  if (path.empty()) return InvalidArgument("settings: path is empty");
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (!dir.empty() && !IsDirectory(dir)) RETURN_IF_ERROR(MakeDirectories(dir, 0700));
  int64_t ram = options.total_ram_bytes > 0 ? options.total_ram_bytes : MachineTotalRamBytes();

  auto state = std::make_unique<State>();
  state->path = path;
  state->fields = SettingsSchemaFields(ram);
  std::string bak = path + ".bak";

  std::string notes;
  Result<nlohmann::json> loaded = LoadDocument(path, state->fields, &notes);
  if (loaded.ok()) {
    state->stored = std::move(loaded).value();
    if (!notes.empty()) state->warning = InvalidArgument("settings " + path + ": " + notes);
  } else if (loaded.status().code() == StatusCode::kNotFound && !FileExists(bak)) {
    state->stored = DefaultSettingsDocument(ram);
  } else {
    std::string why = loaded.status().message();
    std::string bak_notes;
    Result<nlohmann::json> previous = LoadDocument(bak, state->fields, &bak_notes);
    if (previous.ok()) {
      state->stored = std::move(previous).value();
      state->warning = Corrupt(why + "; using the last good version " +
                               std::to_string(state->stored["version"].get<int64_t>()) + " from " + bak);
    } else {
      state->stored = DefaultSettingsDocument(ram);
      state->warning = Corrupt(why + "; " + previous.status().message() + "; using defaults");
    }
  }
  return SettingsStore(std::move(state));
}

nlohmann::json SettingsStore::Document() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  nlohmann::json doc = state_->stored;
  if (!state_->overrides.empty()) doc["overrides"] = state_->OverridesLocked();
  return doc;
}

nlohmann::json SettingsStore::Effective() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->EffectiveLocked();
}

nlohmann::json SettingsStore::Schema() const {
  nlohmann::json areas = nlohmann::json::object();
  for (const SettingField& f : state_->fields) {
    nlohmann::json entry = {{"type", TypeName(f.type)}, {"default", f.default_value}, {"description", f.description}};
    if (f.type == SettingType::kInteger) {
      entry["min"] = static_cast<int64_t>(f.min);
      entry["max"] = static_cast<int64_t>(f.max);
    } else if (f.type == SettingType::kNumber) {
      entry["min"] = f.min;
      entry["max"] = f.max;
    } else if (f.type == SettingType::kEnum) {
      entry["values"] = f.values;
    } else if (f.type == SettingType::kString) {
      entry["max_bytes"] = f.max_bytes;
    }
    areas[f.area][f.name] = entry;
  }
  return {{"version", {{"type", "integer"}, {"description", "the version this document edits; +1 per change"}}},
          {"areas", areas}};
}

int64_t SettingsStore::version() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->stored["version"].get<int64_t>();
}

ReplaceOutcome SettingsStore::Replace(const nlohmann::json& document) {
  std::lock_guard<std::mutex> replace_lock(state_->replace_mu);
  nlohmann::json current;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    current = state_->stored;
  }
  int64_t current_version = current["version"].get<int64_t>();
  ReplaceOutcome outcome;
  outcome.version = current_version;

  if (document.is_object() && document.contains("version") && document["version"].is_number_integer() &&
      document["version"].get<int64_t>() != current_version) {
    SettingsError e;
    e.kind = SettingsError::Kind::kStaleVersion;
    e.current_version = current_version;
    e.fields.push_back({"version", "edits version " + Dump(document["version"]) + ", the current one is " +
                                       std::to_string(current_version)});
    e.message = "settings changed since version " + Dump(document["version"]) + "; the current version is " +
                std::to_string(current_version);
    outcome.error = std::move(e);
    return outcome;
  }
  std::vector<FieldError> errors = ValidateDocument(state_->fields, document);
  if (!errors.empty()) {
    SettingsError e;
    e.kind = SettingsError::Kind::kInvalid;
    e.current_version = current_version;
    e.message = std::to_string(errors.size()) + " invalid settings field" + (errors.size() == 1 ? "" : "s") + ": ";
    for (size_t i = 0; i < errors.size(); ++i) {
      e.message += (i == 0 ? "" : "; ") + (errors[i].field.empty() ? "document" : errors[i].field) + " " +
                   errors[i].message;
    }
    e.fields = std::move(errors);
    outcome.error = std::move(e);
    return outcome;
  }

  nlohmann::json next = {{"version", current_version + 1}};
  for (const SettingField& f : state_->fields) next[f.area][f.name] = Normalize(f, document[f.area][f.name]);

  auto io_error = [&](const Status& s) {
    SettingsError e;
    e.kind = SettingsError::Kind::kIo;
    e.current_version = current_version;
    e.message = s.message();
    outcome.error = std::move(e);
    return outcome;
  };
  if (Status s = WriteFileAtomic(state_->path + ".bak", Dump(current, 2) + "\n"); !s.ok()) return io_error(s);
  if (Status s = WriteFileAtomic(state_->path, Dump(next, 2) + "\n"); !s.ok()) return io_error(s);

  nlohmann::json effective;
  std::vector<Listener> listeners;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stored = next;
    effective = state_->EffectiveLocked();
    for (const auto& [id, listener] : state_->listeners) listeners.push_back(listener);
  }
  outcome.version = current_version + 1;
  for (const Listener& listener : listeners) listener(effective, outcome.version);
  return outcome;
}

Status SettingsStore::ApplyOverride(const std::string& key, const nlohmann::json& value, const std::string& source) {
  const SettingField* f = state_->Find(key);
  if (f == nullptr) return InvalidArgument("settings override " + key + " from " + source + ": unknown field");
  if (auto why = CheckValue(*f, value)) {
    return InvalidArgument("settings override " + key + " from " + source + ": " + *why);
  }
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->overrides[key] = {Normalize(*f, value), source};
  return Status::Ok();
}

nlohmann::json SettingsStore::Overrides() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->OverridesLocked();
}

int SettingsStore::AddListener(Listener listener) {
  std::lock_guard<std::mutex> lock(state_->mu);
  int id = state_->next_listener_id++;
  state_->listeners[id] = std::move(listener);
  return id;
}

void SettingsStore::RemoveListener(int id) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->listeners.erase(id);
}

Status SettingsStore::startup_warning() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->warning;
}

const std::string& SettingsStore::path() const { return state_->path; }

}  // namespace anchorage
