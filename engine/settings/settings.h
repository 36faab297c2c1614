// The settings document: every run-time knob in one versioned JSON file, with its schema.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/core/status.h"

namespace anchorage {

enum class SettingType { kInteger, kNumber, kBoolean, kEnum, kString };

// One field of the schema; defaults of the memory area depend on the machine's RAM.
struct SettingField {
  std::string area;  // "memory"
  std::string name;  // "ceiling_gb"
  SettingType type;
  double min = 0;  // kInteger, kNumber: inclusive range
  double max = 0;
  std::vector<std::string> values;  // kEnum: the allowed strings
  nlohmann::json default_value;
  std::string description;  // one line
  size_t max_bytes = 256;   // kString: the longest value
  std::function<std::optional<std::string>(const std::string&)> check = nullptr;  // kString: why a value is wrong, or nullopt
  std::string key() const { return area + "." + name; }
};

// The schema in order of the document; total_ram_bytes sizes the memory defaults.
std::vector<SettingField> SettingsSchemaFields(int64_t total_ram_bytes);
// MemTotal from /proc/meminfo in bytes, or 0 when unreadable.
int64_t MachineTotalRamBytes();
// The default document (version 1) for a machine with total_ram_bytes.
nlohmann::json DefaultSettingsDocument(int64_t total_ram_bytes);

struct FieldError {
  std::string field;  // "memory.ceiling_gb", "version", or "" for the document itself
  std::string message;
};

// Why Replace changed nothing. kStaleVersion maps to HTTP 409, kInvalid to 400, kIo to 500.
struct SettingsError {
  enum class Kind { kStaleVersion, kInvalid, kIo };
  Kind kind = Kind::kInvalid;
  int64_t current_version = 0;
  std::vector<FieldError> fields;  // kInvalid: every bad field, in schema order
  std::string message;             // one line naming the cause
  int http_status() const;
  // {"error": {"message", "type", "code", "param", "current_version", "fields": [{"field", "message"}]}}
  nlohmann::json ToJson() const;
};

// Replace's answer: the new version, or the error and nothing changed.
struct ReplaceOutcome {
  int64_t version = 0;  // the new version on success; the current one otherwise
  std::optional<SettingsError> error;
  bool ok() const { return !error.has_value(); }
};

struct SettingsOptions {
  int64_t total_ram_bytes = 0;  // 0: read /proc/meminfo
};

// Thread-safe; movable. The file is written before memory changes; listeners run after the commit.
class SettingsStore {
 public:
  using Listener = std::function<void(const nlohmann::json& effective, int64_t version)>;

  // Loads path, else path.bak, else defaults; a bad file is reported in startup_warning(), never fatal.
  // Fails only when the directory of path cannot be created.
  static Result<SettingsStore> Open(const std::string& path, const SettingsOptions& options = {});

  SettingsStore(SettingsStore&&) noexcept;
  SettingsStore& operator=(SettingsStore&&) noexcept;
  ~SettingsStore();

  // The stored document {"version", areas...} (what PUT edits), plus "overrides" when any are set.
  nlohmann::json Document() const;
  // The values in force: the stored document with the overrides applied, no "overrides" key.
  nlohmann::json Effective() const;
  // {"version": N, "areas": {area: {field: {type, min, max, values, default, description}}}}.
  nlohmann::json Schema() const;
  int64_t version() const;

  // Installs a whole document that names the version it edits; "overrides" in it is ignored.
  // On success the old document goes to path.bak, the new one to path, then memory; version + 1.
  ReplaceOutcome Replace(const nlohmann::json& document);

  // A command-line value for key ("memory.ceiling_gb") that wins over the file for this run.
  Status ApplyOverride(const std::string& key, const nlohmann::json& value, const std::string& source);
  // {key: {"value", "source", "stored"}} for every override in force.
  nlohmann::json Overrides() const;

  // Called after each committed Replace, on the replacing thread; it must not call Replace.
  int AddListener(Listener listener);
  void RemoveListener(int id);

  // Why the file was not used as is at open (parse error, fallback to .bak or defaults); ok otherwise.
  Status startup_warning() const;
  const std::string& path() const;

 private:
  struct State;
  explicit SettingsStore(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace anchorage
