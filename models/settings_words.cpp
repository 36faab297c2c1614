#include "models/settings_words.h"

#include <QHash>
#include <QObject>
#include <QStringList>

namespace {

struct Known {
  const char* label;
  const char* unit;
  int decimals;
};

const QHash<QString, Known>& KnownWords() {
  static const QHash<QString, Known> known = {
      {"memory.ceiling_gb", {"Ceiling between requests", " GiB", 2}},
      {"memory.prefill_peak_gb", {"Peak during prefill", " GiB", 2}},
      {"memory.allocator_slack_gb", {"Allocator slack", " GiB", 2}},
      {"resident.enabled", {"Keep the resident prefix", "", 0}},
      {"resident.resident_gb", {"Grid anchors budget", " GiB", 2}},
      {"resident.guest_max_tokens", {"Longest guest request", " tokens", 0}},
      {"resident.stash_gb", {"Guest stash budget", " GiB", 2}},
      {"resident.pin_gb", {"Pinned head budget", " GiB", 2}},
      {"resident.park_gb", {"Parked session budget", " GiB", 2}},
      {"resident.end_anchor", {"Keep the end anchor", "", 0}},
      {"resident.end_align_reasoning", {"Align ends past stripped reasoning", "", 0}},
      {"state_store.enabled", {"Keep snapshots", "", 0}},
      {"state_store.budget_gb", {"Snapshot budget", " GiB", 2}},
      {"state_store.entry_cap_gb", {"Largest snapshot", " GiB", 2}},
      {"state_store.boundaries", {"Snapshot at message boundaries", "", 0}},
      {"disk_cache.mode", {"Mode", "", 0}},
      {"disk_cache.budget_gb", {"Budget", " GiB", 1}},
      {"disk_cache.ttl_days", {"Keep unused entries", " days", 0}},
      {"disk_cache.min_free_gb", {"Leave free on the disk", " GiB", 1}},
      {"disk_cache.admit_after", {"Write after cold reads", "", 0}},
      {"disk_cache.min_tokens", {"Shortest prefix written", " tokens", 0}},
      {"disk_cache.write_budget_gb", {"Writes a day (tier and spill)", " GiB", 0}},
      {"spill.mode", {"Session spill", "", 0}},
      {"spill.budget_gb", {"Spill budget", " GiB", 1}},
      {"spill.min_tokens", {"Shortest conversation spilled", " tokens", 0}},
      {"spill.ttl_hours", {"Keep unused conversations", " hours", 0}},
      {"shadow.enabled", {"Enabled", "", 0}},
      {"shadow.model", {"Shadow model folder", "", 0}},
      {"shadow.ration", {"Share of a turn", "", 3}},
      {"shadow.budget_gb", {"Resident budget", " GiB", 1}},
      {"shadow.disk_gb", {"Disk budget", " GiB", 1}},
      {"shadow.ttl_hours", {"Keep unused session files", " hours", 0}},
      {"shadow.question", {"Agreement question", "", 0}},
      {"shadow.choices", {"Choices", "", 0}},
      {"shadow.min_tokens", {"Ask at turns from", " tokens", 0}},
      {"speculative.mode", {"Drafts", "", 0}},
      {"speculative.max_draft", {"Most drafts a window", "", 0}},
      {"speculative.beside_others", {"Drafts beside other slots", "", 0}},
      {"speculative.suffix_store", {"Store of earlier requests", "", 0}},
      {"speculative.suffix_store_mb", {"Store budget", " MiB", 0}},
      {"compaction.mode", {"Compaction requests", "", 0}},
      {"compaction.prepare", {"Write the answer ahead", "", 0}},
      {"compaction.idle_s", {"Idle before writing ahead", " s", 0}},
      {"compaction.min_tokens", {"Shortest conversation written ahead", " tokens", 0}},
      {"response_cache.enabled", {"Answer repeated greedy requests", "", 0}},
      {"response_cache.mb", {"Budget", " MiB", 0}},
      {"engine.kv_dtype", {"K/V rows", "", 0}},
      {"engine.precision", {"Precision", "", 0}},
      {"engine.parallel", {"Slots (0: auto)", "", 0}},
      {"journal.retention_days", {"Keep rows", " days", 0}},
      {"journal.retention_rows", {"Most rows a table", "", 0}},
      {"backends.upstreams", {"Upstreams (name=URL, …)", "", 0}},
  };
  return known;
}

}  // namespace

SettingWords WordsForSetting(const QString& key) {
  if (const auto it = KnownWords().constFind(key); it != KnownWords().constEnd())
    return {QObject::tr(it->label), QObject::tr(it->unit), it->decimals};
  // "retention_days" -> "Retention" in days: the unit from the name's ending, the rest in words.
  static const QList<std::pair<QString, QString>> kUnits = {{"_gb", " GiB"}, {"_mb", " MiB"}, {"_days", " days"}, {"_hours", " hours"},
                                                           {"_tokens", " tokens"}, {"_ms", " ms"}, {"_s", " s"}};
  QString name = key.section('.', 1);
  SettingWords w;
  for (const auto& [ending, unit] : kUnits)
    if (name.endsWith(ending)) {
      name.chop(ending.size());
      w.unit = unit;
      w.decimals = unit == " GiB" ? 2 : 0;
      break;
    }
  name.replace('_', ' ');
  w.label = name.isEmpty() ? key : name.left(1).toUpper() + name.mid(1);
  return w;
}

QString SettingsAreaTitle(const QString& area) {
  static const QHash<QString, const char*> kTitles = {
      {"memory", "Memory: limits"},          {"resident", "Memory: resident tiers"}, {"state_store", "Memory: state store"},
      {"response_cache", "Memory: response cache"}, {"disk_cache", "Disk cache: the disk tier"}, {"spill", "Disk cache: session spill"},
      {"shadow", "Shadow"},                  {"journal", "Journal"},                  {"backends", "Backends"},
      {"engine", "Engine"},                  {"speculative", "Engine: speculative decoding"}, {"compaction", "Engine: compaction"},
  };
  if (const auto it = kTitles.constFind(area); it != kTitles.constEnd()) return QObject::tr(it.value());
  QString words = QString(area).replace('_', ' ');
  return words.left(1).toUpper() + words.mid(1);
}

int SettingsAreaRank(const QString& area) {
  static const QStringList kOrder = {"memory", "resident", "state_store", "response_cache", "disk_cache", "spill", "shadow",
                                     "journal", "backends", "engine", "speculative", "compaction"};
  const int at = static_cast<int>(kOrder.indexOf(area));
  return at < 0 ? static_cast<int>(kOrder.size()) : at;
}
