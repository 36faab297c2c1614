#include "engine/server/service.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <optional>

#include "engine/core/file_util.h"
#include "engine/core/text_split.h"
#include "engine/model/tiny_model.h"
#include "engine/compute/cpu/matmul.h"
#include "engine/runtime/cuda_plugin.h"
#include "engine/runtime/forward.h"
#include "engine/runtime/weights_report.h"
#include "engine/text/conversation_title.h"

namespace anchorage {

namespace {

int64_t Gib(double gb) { return static_cast<int64_t>(gb * double(1ll << 30)); }

// The settings key a run-time flag overrides, and its value as JSON.
std::pair<std::string, nlohmann::json> SettingForFlag(const std::string& flag, const std::string& value) {
  if (flag == "caches") return {"resident.enabled", value == "on"};
  if (flag == "end-anchor") return {"resident.end_anchor", value == "on"};
  if (flag == "resident-gb") return {"resident.resident_gb", std::stod(value)};
  if (flag == "resident-stash-gb") return {"resident.stash_gb", std::stod(value)};
  if (flag == "resident-pin-gb") return {"resident.pin_gb", std::stod(value)};
  if (flag == "resident-park-gb") return {"resident.park_gb", std::stod(value)};
  if (flag == "resident-guest-max") return {"resident.guest_max_tokens", std::stoll(value)};
  return {"", nullptr};
}

// The CUDA backend for --device cuda (an error where it cannot run) or auto (nullptr and a note where
// it cannot: the CPU runs the model).
Result<std::unique_ptr<ComputeBackend>> OpenCudaBackend(const ServerConfig& config, const Model& model, bool fast_products,
                                                        const std::function<void(const std::string&)>& fall_back) {
  const bool asked = config.device == "cuda";
  auto refuse = [&](const std::string& why) -> Result<std::unique_ptr<ComputeBackend>> {
    if (asked) return Unsupported("--device cuda: " + why);
    fall_back(why);
    return std::unique_ptr<ComputeBackend>();
  };
  // auto asks the plugin only where an NVIDIA driver is there, so a machine without one never loads the CUDA libraries.
  if (!asked && !std::getenv("ANCHORAGE_CUDA_PLUGIN") && !std::filesystem::exists("/dev/nvidiactl"))
    return refuse("no NVIDIA driver");
  CudaPluginRequest request;
  request.config = &model.config;
  request.weights = &model.weights;
  request.grid_tokens = config.grid_tokens;
  request.device = config.cuda_device;
  request.int8_weights = config.int8_weights;
  request.fast_products = fast_products;
  auto backend = LoadCudaBackend(request);
  if (!backend.ok()) return refuse(backend.status().message());
  return std::move(backend).value();
}

}  // namespace

ResidentOptions ResidentOptionsFromSettings(const nlohmann::json& effective) {
  // The effective document holds every field (the schema fills its defaults): no second set of defaults here.
  ResidentOptions o;
  const nlohmann::json& r = effective.at("resident");
  o.enabled = r.at("enabled").get<bool>();
  o.end_anchor = r.at("end_anchor").get<bool>();
  o.end_align_reasoning = r.at("end_align_reasoning").get<bool>();
  o.anchor_budget_bytes = Gib(r.at("resident_gb").get<double>());
  o.guest_max_tokens = r.at("guest_max_tokens").get<int64_t>();
  o.stash_budget_bytes = Gib(r.at("stash_gb").get<double>());
  o.pin_budget_bytes = Gib(r.at("pin_gb").get<double>());
  o.park_budget_bytes = Gib(r.at("park_gb").get<double>());
  const nlohmann::json& st = effective.at("state_store");
  o.store_enabled = st.at("enabled").get<bool>();
  o.store_budget_bytes = Gib(st.at("budget_gb").get<double>());
  o.store_entry_cap_bytes = Gib(st.at("entry_cap_gb").get<double>());
  o.store_prefix_snapshots = st.at("boundaries").get<bool>();
  const nlohmann::json& m = effective.at("memory");
  o.memory_ceiling_bytes = Gib(m.at("ceiling_gb").get<double>());
  o.memory_peak_bytes = Gib(m.at("prefill_peak_gb").get<double>());
  o.memory_slack_bytes = Gib(m.at("allocator_slack_gb").get<double>());
  const nlohmann::json& d = effective.at("disk_cache");
  o.disk.mode = ParseDiskMode(d.at("mode").get<std::string>()).value_or(DiskMode::kOff);
  o.disk.budget_bytes = Gib(d.at("budget_gb").get<double>());
  o.disk.ttl_days = d.at("ttl_days").get<int64_t>();
  o.disk.admit_after = d.at("admit_after").get<int>();
  o.disk.min_free_bytes = Gib(d.at("min_free_gb").get<double>());
  o.disk.min_tokens = d.at("min_tokens").get<int64_t>();
  o.disk.write_budget_bytes = Gib(d.at("write_budget_gb").get<double>());
  const nlohmann::json& sp = effective.at("spill");
  o.spill.enabled = sp.at("mode").get<std::string>() != "off";
  o.spill.budget_bytes = Gib(sp.at("budget_gb").get<double>());
  o.spill.min_tokens = sp.at("min_tokens").get<int64_t>();
  o.spill.ttl_ms = sp.at("ttl_hours").get<int64_t>() * 3600 * 1000;
  const nlohmann::json& spec = effective.at("speculative");
  const std::string mode = spec.at("mode").get<std::string>();
  o.max_draft = mode == "off" ? 0 : static_cast<int>(spec.at("max_draft").get<int64_t>());
  o.lookup_drafts = mode == "lookup" || mode == "both";
  o.mtp_drafts = mode == "mtp" || mode == "both";
  const std::string beside = spec.at("beside_others").get<std::string>();
  o.drafts_beside_others = beside == "on" ? DraftsBesideOthers::kOn : beside == "off" ? DraftsBesideOthers::kOff : DraftsBesideOthers::kAuto;
  o.suffix_store = spec.at("suffix_store").get<std::string>() != "off";
  o.suffix_store_read_only = spec.at("suffix_store").get<std::string>() == "read";
  o.suffix_store_bytes = static_cast<int64_t>(spec.at("suffix_store_mb").get<double>() * double(1 << 20));
  const nlohmann::json& rc = effective.at("response_cache");
  o.response_cache = rc.at("enabled").get<bool>();
  o.response_cache_bytes = static_cast<int64_t>(rc.at("mb").get<double>() * double(1 << 20));
  const nlohmann::json& cp = effective.at("compaction");
  o.compaction_prepare = cp.at("mode").get<std::string>() == "continuation" && cp.at("prepare").get<std::string>() == "on";
  o.compaction_idle_s = cp.at("idle_s").get<double>();
  o.compaction_min_tokens = cp.at("min_tokens").get<int64_t>();
  return o;
}

std::vector<BackendSpec> BackendSpecsOf(const ServerConfig& config, const nlohmann::json& effective) {
  std::vector<BackendSpec> specs = config.backends;
  // The settings' list was checked when it was stored; a name --backend already uses is the flag's.
  auto listed = ParseBackendList(effective.at("backends").at("upstreams").get<std::string>());
  if (listed.ok())
    for (BackendSpec& b : *listed)
      if (std::none_of(specs.begin(), specs.end(), [&](const BackendSpec& s) { return s.name == b.name; })) specs.push_back(std::move(b));
  return specs;
}

ShadowOptions ShadowOptionsFromSettings(const nlohmann::json& effective) {
  ShadowOptions o;
  const nlohmann::json& sh = effective.at("shadow");
  o.enabled = sh.at("enabled").get<bool>();
  o.ration = sh.at("ration").get<double>();
  o.budget_bytes = Gib(sh.at("budget_gb").get<double>());
  o.disk_budget_bytes = Gib(sh.at("disk_gb").get<double>());
  o.disk_ttl_ms = sh.at("ttl_hours").get<int64_t>() * 3600 * 1000;
  o.question = sh.at("question").get<std::string>();
  o.choices.clear();
  for (const std::string& c : SplitList(sh.at("choices").get<std::string>(), '|')) o.choices.push_back(c);
  o.min_tokens = sh.at("min_tokens").get<int64_t>();
  return o;
}

// Data-folder entries readable by others get 0600 (files) or 0700 (folders); says what it changed.
static std::vector<std::string> TightenDataFolder(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> changed;
  std::error_code ec;
  auto tighten = [&](const fs::path& p, bool is_dir) {
    const fs::perms want = is_dir ? fs::perms::owner_all : fs::perms::owner_read | fs::perms::owner_write;
    const fs::perms have = fs::status(p, ec).permissions() & fs::perms::mask;
    if (ec || (have & (fs::perms::group_all | fs::perms::others_all)) == fs::perms::none) return;
    fs::permissions(p, want, fs::perm_options::replace, ec);
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%o", static_cast<unsigned>(have));
    changed.push_back(p.string() + " was readable by others (mode " + mode + "); now " + (is_dir ? "0700" : "0600"));
  };
  tighten(dir, true);
  for (auto it = fs::recursive_directory_iterator(dir, fs::directory_options::skip_permission_denied, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_symlink(ec)) continue;
    if (it->is_directory(ec)) tighten(it->path(), true);
    else if (it->is_regular_file(ec)) tighten(it->path(), false);
  }
  return changed;
}

Result<std::unique_ptr<Service>> Service::Start(const ServerConfig& config, const std::function<void(double, const std::string&)>& progress,
                                                const std::atomic<bool>* cancel) {
  namespace fs = std::filesystem;
  auto say = [&](double f, const std::string& what) -> Status {
    if (cancel != nullptr && cancel->load()) return Cancelled("the load was cancelled before " + what);
    if (progress) progress(f, what);
    return Status::Ok();
  };
  std::unique_ptr<Service> s(new Service());
  s->config_ = config;
  if (IsDirectory(config.data_dir))
    for (const std::string& change : TightenDataFolder(config.data_dir)) s->notes_.push_back("warning: data folder: " + change);
  RETURN_IF_ERROR(MakeDirectories(config.data_dir, 0700));

  std::string model_dir = config.model_dir;
  if (model_dir.empty()) {
    model_dir = (fs::path(config.data_dir) / "models" / "tiny-seed0").string();
    if (!fs::exists(fs::path(model_dir) / "model.safetensors")) {
      RETURN_IF_ERROR(say(0.05, "generating the tiny model in " + model_dir));
      RETURN_IF_ERROR(GenerateTinyModel(TinyModelSize::kTiny, 0, model_dir));
    }
  }
  RETURN_IF_ERROR(say(0.2, "loading " + model_dir));
  ASSIGN_OR_RETURN(s->model_, LoadModel(model_dir));
  s->model_->generated = config.model_dir.empty();
  if (const int64_t positions = s->model_->config.max_position_embeddings; config.context_tokens > positions)
    return InvalidArgument("--ctx " + std::to_string(config.context_tokens) + " is beyond what the model was made for: its max_position_embeddings is " +
                           std::to_string(positions) + " (leave --ctx out to serve that)");
  std::vector<std::string> names = SplitList(config.served_model_name, ',');
  s->model_id_ = names.empty() ? fs::path(model_dir).filename().string() : names[0];
  if (!names.empty()) names.erase(names.begin());

  RETURN_IF_ERROR(say(0.6, "opening the settings and the journal"));
  ASSIGN_OR_RETURN(SettingsStore settings, SettingsStore::Open((fs::path(config.data_dir) / "settings.json").string()));
  s->settings_ = std::make_unique<SettingsStore>(std::move(settings));
  if (Status w = s->settings_->startup_warning(); !w.ok()) s->notes_.push_back("settings: " + w.message());
  for (const auto& [flag, value] : config.run_time_knobs) {
    auto [key, json_value] = SettingForFlag(flag, value);
    if (key.empty()) continue;
    RETURN_IF_ERROR(s->settings_->ApplyOverride(key, json_value, "--" + flag));
    s->notes_.push_back("--" + flag + " " + value + " overrides the settings document's " + key + " for this run");
  }
  const nlohmann::json effective = s->settings_->Effective();
  // The K/V dtype: --kv-dtype, else the settings' engine.kv_dtype; auto (neither) is bf16.
  KvDtype kv_dtype = config.kv_dtype.value_or(KvDtype::kBf16);
  if (const std::string named = effective["engine"].value("kv_dtype", "auto"); !config.kv_dtype && named != "auto") {
    ASSIGN_OR_RETURN(kv_dtype, ParseKvDtype(named));
  }
  if (kv_dtype == KvDtype::kFp8 && s->model_->config.head_dim % kKvFp8Block != 0)
    return InvalidArgument("fp8 K/V rows take blocks of " + std::to_string(kKvFp8Block) + " values of a head; this model's head_dim is " +
                           std::to_string(s->model_->config.head_dim) + " (use --kv-dtype bf16)");
  s->model_->config.kv_dtype = kv_dtype;
  JournalOptions journal_options;
  journal_options.data_dir = config.data_dir;
  journal_options.retention_days = effective["journal"].value("retention_days", int64_t(30));
  journal_options.retention_rows = effective["journal"].value("retention_rows", int64_t(1000000));
  ASSIGN_OR_RETURN(s->journal_, Journal::Open(journal_options));

  RETURN_IF_ERROR(say(0.7, "preparing the engine"));
  ForwardOptions forward_options;
  forward_options.grid_tokens = config.grid_tokens;
  forward_options.threads = config.threads;
  forward_options.int8_weights = config.int8_weights;
  forward_options.on_layer = [&](int64_t packed, int64_t layers) {
    return say(0.7 + 0.1 * static_cast<double>(packed) / static_cast<double>(layers),
               "packing layer " + std::to_string(packed) + " of " + std::to_string(layers)).ok();
  };
  std::optional<WeightsBaseline> stored_weights;
  if (config.int8_weights) {
    RETURN_IF_ERROR(say(0.7, "running the stored weights on a fixed prompt, to measure what int8 costs"));
    ASSIGN_OR_RETURN(stored_weights, MeasureStoredWeights(s->model_->config, s->model_->weights, forward_options));
  }
  // The precision: --precision, else the settings' engine.precision. Set before the backend, whose
  // fingerprint names the arithmetic it gives.
  const std::string precision_name = config.precision.value_or(effective["engine"].value("precision", std::string("exact")));
  ASSIGN_OR_RETURN(const cpu::Precision precision, cpu::PrecisionFromName(precision_name));
  if (precision != cpu::ActivePrecision()) cpu::SetPrecision(precision);
  std::unique_ptr<ComputeBackend> forward;
  if (config.device != "cpu") {
    ASSIGN_OR_RETURN(forward, OpenCudaBackend(config, *s->model_, precision == cpu::Precision::kFast, [&](const std::string& why) {
      s->notes_.push_back("device: the CPU runs the model (" + why + ")");
    }));
    if (forward) RETURN_IF_ERROR(say(0.8, "the model is on " + forward->DeviceDescription()));
  }
  if (!forward) {
    ASSIGN_OR_RETURN(forward, Forward::Create(s->model_->config, s->model_->weights, forward_options));
  }
  if (stored_weights) {
    ASSIGN_OR_RETURN(WeightsReport report, CompareWithStoredWeights(*stored_weights, *forward));
    s->notes_.push_back(report.Describe());
  }
  s->model_->weights_format = forward->WeightsDescription();
  s->model_->tensors->DropResidentPages();  // the backend holds its own copy of every matrix
  s->model_->state_fingerprint = forward->StateKey(s->model_->fingerprint);
  s->device_ = forward->DeviceDescription();
  const bool on_cpu = std::string(forward->device_name()) == "cpu";
  s->precision_ = precision == cpu::Precision::kFast && (!on_cpu || cpu::RunsFast(cpu::ActivePath(), precision)) ? "fast" : "exact";
  if (precision == cpu::Precision::kFast && s->precision_ != "fast")
    s->notes_.push_back(std::string("precision: fast asked, exact runs: the ") + cpu::PathName(cpu::ActivePath()) +
                        " path multiplies in fp32 (fast needs AVX-512 BF16 or AMX)");
  SchedulerOptions scheduler_options;
  scheduler_options.max_queue = config.max_queue;
  // Slots: --parallel, else the settings' engine.parallel; auto (0) is 2 on the CPU and 4 on CUDA.
  const int auto_parallel = std::string(forward->device_name()) == "cuda" ? 4 : 2;
  scheduler_options.parallel = config.parallel.value_or(static_cast<int>(effective["engine"].value("parallel", int64_t(0))));
  if (scheduler_options.parallel <= 0) scheduler_options.parallel = auto_parallel;
  scheduler_options.resident = ResidentOptionsFromSettings(effective);
  if (scheduler_options.resident.max_draft > 0 && !forward->has_draft_windows())
    s->notes_.push_back(std::string("speculative: no drafts on the ") + forward->device_name() + " backend yet; plain decoding (the same tokens)");
  else if (scheduler_options.resident.mtp_drafts && !forward->has_mtp())
    s->notes_.push_back("speculative: no MTP drafts (" + s->model_->weights.mtp_note + ")" +
                        (scheduler_options.resident.lookup_drafts ? "; lookup drafts only" : "; no drafts"));
  if (config.disk_cache_dir != "off") {
    const std::string dir = config.disk_cache_dir.empty() ? (fs::path(config.data_dir) / "cache" / "disk").string() : config.disk_cache_dir;
    RETURN_IF_ERROR(say(0.8, "opening the disk tier in " + dir));
    // Rows computed on another grid or by another arithmetic are not this engine's: the fingerprint names both.
    const std::string fingerprint = s->model_->state_fingerprint + "/grid-" + std::to_string(config.grid_tokens);
    auto disk = DiskCache::Open(DiskEnv::Posix(), s->model_->config, fingerprint, dir, config.grid_tokens, scheduler_options.resident.disk);
    if (!disk.ok()) {
      s->notes_.push_back("warning: the disk tier is off: " + disk.status().message());
    } else {
      s->disk_ = std::move(disk).value();
      s->write_guard_ = WriteGuard::Open(DiskEnv::Posix(), (fs::path(dir) / "writes.json").string(), scheduler_options.resident.disk.write_budget_bytes);
      s->disk_->set_write_guard(s->write_guard_.get());
      const DiskTierStats t = s->disk_->tier().stats();
      if (t.swept_corrupt > 0)
        s->notes_.push_back("warning: disk tier: deleted " + std::to_string(t.swept_corrupt) + " unreadable files (the journal names them)");
      if (t.swept_foreign > 0 || t.swept_temporaries > 0)
        s->notes_.push_back("disk tier: swept " + std::to_string(t.swept_foreign) + " files of another fingerprint and " +
                            std::to_string(t.swept_temporaries) + " cut-short writes");
      // The session spill lives in the tier's folder and shares its fingerprint.
      SessionSpillOptions spill_options;
      spill_options.dir = (fs::path(dir) / "sessions").string();
      spill_options.budget_bytes = scheduler_options.resident.spill.budget_bytes;
      spill_options.ttl_ms = scheduler_options.resident.spill.ttl_ms;
      spill_options.min_free_bytes = scheduler_options.resident.disk.min_free_bytes;
      auto spill = SessionSpill::Open(DiskEnv::Posix(), s->model_->config, fingerprint, spill_options);
      if (!spill.ok()) s->notes_.push_back("warning: the session spill is off: " + spill.status().message());
      else s->spill_ = std::move(spill).value();
      if (s->spill_) {
        const Tokenizer* tokenizer = &s->model_->tokenizer;
        s->spill_->SetTitler([tokenizer](std::span<const int32_t> ids) { return ConversationTitle(*tokenizer, ids); });
      }
      if (s->spill_ && s->spill_->stats().swept > 0)
        s->notes_.push_back("session spill: swept " + std::to_string(s->spill_->stats().swept) + " files of unfinished, foreign or expired entries");
    }
  }
  // The shadow reader: on the named model, or beside the generated tiny model on the generated shadow model.
  std::string shadow_dir = config.shadow_model_dir.empty() ? effective["shadow"]["model"].get<std::string>() : config.shadow_model_dir;
  const bool shadow_named = !shadow_dir.empty();
  if (shadow_dir.empty() && config.model_dir.empty()) {
    shadow_dir = (fs::path(config.data_dir) / "models" / "shadow-seed0").string();
    if (!fs::exists(fs::path(shadow_dir) / "model.safetensors")) {
      RETURN_IF_ERROR(say(0.85, "generating the shadow model in " + shadow_dir));
      RETURN_IF_ERROR(GenerateTinyModel(TinyModelSize::kShadow, 0, shadow_dir));
    }
  }
  if (!shadow_dir.empty() && shadow_dir != "off") {
    RETURN_IF_ERROR(say(0.87, "loading the shadow model " + shadow_dir));
    ShadowOptions shadow_options = ShadowOptionsFromSettings(effective);
    shadow_options.context_tokens = config.context_tokens;
    Result<std::unique_ptr<ShadowReader>> shadow = [&]() -> Result<std::unique_ptr<ShadowReader>> {
      ASSIGN_OR_RETURN(std::unique_ptr<Model> shadow_model, LoadModel(shadow_dir));
      return ShadowReader::Create(std::move(shadow_model), *s->model_, ForwardOptions{kShadowGridTokens, config.threads},
                                  (fs::path(config.data_dir) / "cache" / "shadow").string(), shadow_options, s->journal_.get());
    }();
    if (!shadow.ok() && shadow_named) return InvalidArgument("the shadow model: " + shadow.status().message());
    if (!shadow.ok()) s->notes_.push_back("warning: the shadow reader is off: " + shadow.status().message());
    else s->shadow_ = std::move(shadow).value();
  }
  scheduler_options.shadow = s->shadow_.get();
  // The lookup drafter's store of earlier requests (token ids only) in DATA_DIR/cache/suffix.
  {
    SuffixStoreOptions so;
    so.dir = (fs::path(config.data_dir) / "cache" / "suffix").string();
    so.tokenizer_sha256 = s->model_->tokenizer.sha256();
    so.max_bytes = scheduler_options.resident.suffix_store_bytes;
    so.read_only = scheduler_options.resident.suffix_store_read_only;
    auto store = SuffixStore::Open(so, s->model_->config.vocab_size);
    if (!store.ok()) s->notes_.push_back("warning: the suffix store is off: " + store.status().message());
    else s->suffix_store_ = std::move(store).value();
    if (s->suffix_store_ && !s->suffix_store_->note().empty()) s->notes_.push_back("suffix store: " + s->suffix_store_->note());
  }
  scheduler_options.suffix_store = s->suffix_store_.get();
  scheduler_options.disk = s->disk_.get();
  scheduler_options.spill = s->spill_.get();
  scheduler_options.write_guard = s->write_guard_.get();
  scheduler_options.journal = s->journal_.get();
  scheduler_options.model_id = s->model_id_;
  scheduler_options.precision = s->precision_;
  if (!config.test_replies_file.empty()) {
    ASSIGN_OR_RETURN(std::string text, ReadFile(config.test_replies_file));
    auto script = ReplyScript::FromJson(nlohmann::json::parse(text, nullptr, false), s->model_->tokenizer);
    if (!script.ok()) return InvalidArgument(config.test_replies_file + ": " + script.status().message());
    scheduler_options.reply_script = std::move(script).value();
  }
  s->scheduler_ = std::make_unique<Scheduler>(*s->model_, std::move(forward), scheduler_options);
  if (s->spill_) {
    auto resumed = s->scheduler_->ResumeSpilled();
    if (!resumed.ok()) s->notes_.push_back("warning: the conversation the last stop left was not read back: " + resumed.status().message());
    else if (*resumed) s->notes_.push_back("session spill: read back the conversation the last stop left resident");
  }

  Scheduler* scheduler = s->scheduler_.get();
  Journal* journal = s->journal_.get();
  ShadowReader* shadow = s->shadow_.get();
  const int64_t context_tokens = config.context_tokens;
  const bool parallel_flag = config.parallel.has_value();
  s->settings_->AddListener([scheduler, journal, shadow, context_tokens, parallel_flag, auto_parallel](const nlohmann::json& effective, int64_t) {
    scheduler->SetResidentOptions(ResidentOptionsFromSettings(effective));
    if (!parallel_flag) {  // --parallel holds for the run
      const int wanted = static_cast<int>(effective["engine"].value("parallel", int64_t(0)));
      scheduler->SetParallel(wanted > 0 ? wanted : auto_parallel);
    }
    if (shadow != nullptr) {
      ShadowOptions o = ShadowOptionsFromSettings(effective);
      o.context_tokens = context_tokens;
      shadow->SetOptions(o);
    }
    journal->SetRetention(effective["journal"].value("retention_days", int64_t(30)), effective["journal"].value("retention_rows", int64_t(1000000)));
  });

  ServerOptions options;
  options.host = config.host;
  options.port = config.port;
  options.model_id = s->model_id_;
  options.model_aliases = names;
  options.strict_model_names = config.strict_model_names;
  options.access.bind_host = config.host;
  options.access.admin_token = config.admin_token;
  options.access.api_keys = config.api_keys;
  options.access.allowed_hosts = config.allowed_hosts;
  options.access.cors_origins = config.cors_origins;
  options.context_tokens = config.context_tokens;
  HttpTransportOptions& t = options.transport;
  t.header_timeout_ms = static_cast<int>(config.http_header_timeout_ms);
  t.body_idle_timeout_ms = static_cast<int>(config.http_body_timeout_ms);
  t.keep_alive_timeout_ms = static_cast<int>(config.http_keep_alive_timeout_ms);
  t.max_connections = static_cast<size_t>(config.max_connections);
  t.max_connections_per_client = static_cast<size_t>(config.max_connections_per_client);
  t.worker_threads = static_cast<int>(config.http_threads);
  t.limits.max_body_bytes = static_cast<size_t>(config.max_body_bytes);
  {
    BackendOptions backend_options;
    backend_options.timeout_ms = config.backend_timeout_ms;
    const std::vector<BackendSpec> specs = BackendSpecsOf(config, s->settings_->Effective());
    for (const BackendSpec& b : specs) {
      const bool has_key = b.key_env.empty() || std::getenv(b.key_env.c_str()) != nullptr;
      s->notes_.push_back("backend " + b.name + " at " + b.url + (has_key ? "" : "; warning: its key variable " + b.key_env + " is not set"));
    }
    s->backends_ = std::make_unique<Backends>(specs, backend_options);
    options.backends = s->backends_.get();
    Backends* backends = s->backends_.get();
    s->settings_->AddListener([backends, config](const nlohmann::json& effective, int64_t) { backends->SetSpecs(BackendSpecsOf(config, effective)); });
  }
  if (!config.image_folder.empty() && !fs::is_directory(config.image_folder))
    return InvalidArgument("--image-folder " + config.image_folder + " is not a folder");
  if (!config.image_ca_file.empty()) {
    auto pem = ReadFile(config.image_ca_file);
    if (!pem.ok() || pem->find("-----BEGIN CERTIFICATE-----") == std::string::npos)
      return InvalidArgument("--image-ca-file " + config.image_ca_file + " is not a readable file of PEM certificates");
  }
  // Images: the tower runs on the backend's device where it has one, else on the CPU beside the engine; its output kept by digest.
  if (!s->model_->weights.vision) {
    options.images_off = "this model has no vision tower (" + s->model_->weights.vision_note + ")";
  } else if (config.image_max_count == 0) {
    options.images_off = "this server takes no images (--image-max-count 0)";
  } else {
    ComputeBackend& backend = s->scheduler_->forward();
    auto encoder = ImageEncoder::Create(s->model_->config, s->model_->weights, config.threads, config.image_cache_mb << 20, &backend);
    if (const std::string note = backend.VisionTowerNote(); encoder.ok() && !note.empty())
      s->notes_.push_back(std::string("images: the vision tower runs on the CPU, not the ") + backend.device_name() + " (" + note + ")");
    if (!encoder.ok()) {
      options.images_off = "the vision tower cannot run: " + encoder.status().message();
      s->notes_.push_back("warning: images are off: " + encoder.status().message());
    } else {
      s->images_ = std::move(encoder).value();
      options.images = s->images_.get();
    }
  }
  options.max_images = config.image_max_count;
  options.image_input.max_pixels = config.image_max_pixels;
  options.image_input.folder = config.image_folder;
  options.image_input.fetch_http = config.image_urls;
  options.image_input.ca_file = config.image_ca_file;
  options.notes = s->notes_;
  options.precision = s->precision_;
  s->http_options_ = options;
  s->http_ = std::make_unique<HttpServer>(*s->model_, *s->scheduler_, options, s->journal_.get(), s->settings_.get());
  RETURN_IF_ERROR(say(0.9, "binding " + config.host + ":" + std::to_string(config.port)));
  RETURN_IF_ERROR(s->http_->Bind());
  if (progress) progress(1.0, "ready");  // bound: too late to cancel
  return s;
}

void Service::ServeInBackground() {
  serving_ = std::thread([this] { http_->Serve(); });
}

std::string Service::address() const {
  if (!http_) return "";
  const std::string& host = http_options_.host;
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(http_->port());
}

void Service::StopServing() {
  if (!serving()) return;
  http_->Stop();
  serving_.join();
  http_.reset();  // closes the socket: a client is refused rather than left waiting
  endpoint_off_ = true;
}

Status Service::ServeAt(const std::string& host, int port) {
  if (drained_) return Unsupported("the service has drained");
  RETURN_IF_ERROR(CheckBindAllowed(host, config_.admin_token));  // before the old endpoint stops
  const ServerOptions before = http_options_;
  const int before_port = http_ ? http_->port() : before.port;
  StopServing();
  auto bind = [this](const std::string& at_host, int at_port) -> Status {
    ServerOptions options = http_options_;
    options.host = at_host;
    options.port = at_port;
    options.access.bind_host = at_host;
    auto next = std::make_unique<HttpServer>(*model_, *scheduler_, options, journal_.get(), settings_.get());
    RETURN_IF_ERROR(next->Bind());
    http_ = std::move(next);
    endpoint_off_ = false;
    http_options_ = options;
    ServeInBackground();
    return Status::Ok();
  };
  Status moved = bind(host, port);
  if (moved.ok()) return moved;
  if (Status back = bind(before.host, before_port); !back.ok())
    return IoError(moved.message() + "; the endpoint is off: its old address " + before.host + ":" + std::to_string(before_port) + " failed too: " +
                   back.message());
  return moved;
}

std::string Service::client_token() const { return !config_.admin_token.empty() ? config_.admin_token : config_.api_keys.empty() ? "" : config_.api_keys[0]; }

std::string Service::url() const { return http_ ? "http://" + address() + "/v1" : ""; }

void Service::Drain() {
  if (drained_) return;
  drained_ = true;
  scheduler_->BeginDrain();
  scheduler_->WaitIdle();
  if (http_) http_->Stop();  // Serve() returns once every worker has written its response
  if (serving_.joinable()) serving_.join();
  // The spill journals its own write (or the drop and why); the drain goes on either way.
  (void)scheduler_->SpillForStop();
  (void)scheduler_->WriteShadowForStop();
  journal_->Flush();
}

Service::~Service() {
  if (http_ || endpoint_off_) Drain();
}

}  // namespace anchorage
