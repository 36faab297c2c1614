#include "engine/server/http_server.h"

#include <chrono>
#include <random>

#include <nlohmann/json.hpp>

#include "engine/compute/cpu/matmul.h"
#include "engine/core/text_split.h"
#include "engine/server/compaction.h"
#include "engine/server/decide_api.h"
#include "engine/server/openai_api.h"
#include "engine/server/output_parser.h"

namespace anchorage {

namespace {

using ojson = nlohmann::ordered_json;

constexpr int kQueuedStreamHeadersMs = 250;  // a stream still queued after this gets its headers
constexpr int kQueuedCommentMs = 1000;       // and an SSE comment this often while it waits

int64_t NowSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string RandomHex(size_t n) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  static const char* kHex = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) s += kHex[rng() & 15];
  return s;
}

// JSON text for a response; invalid UTF-8 from a model's output becomes U+FFFD instead of throwing.
template <typename Json>
std::string Dump(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

void SendError(HttpResponse& res, const ApiError& e) {
  res.status = e.status;
  res.SetContent(Dump(e.ToJson()), "application/json");
}

void SendJson(HttpResponse& res, const ojson& body) { res.SetContent(Dump(body), "application/json"); }


// A prepared request: the prompt ids and what the response needs to know about them.
struct Prepared {
  CompletionRequest request;
  std::vector<int32_t> prompt_ids;
  ImageCatalog images;
  bool starts_in_reasoning = false;
};

// usage.anchorage of a finished request; /health's last_request carries the same fields.
ojson FiguresJson(const RequestFigures& s) {
  return {{"cache_tier", s.cache_source == "disk" || s.cache_source == "spill" ? s.cache_source : s.cached_tokens > 0 ? "ram" : "none"},
          {"cache_source", s.cache_source}, {"cached_tokens", s.cached_tokens}, {"reread_tokens", s.reread_tokens},
          {"served_prompt_tokens", s.served_prompt_tokens}, {"prefill_ms", s.prefill_ms}, {"ttft_ms", s.ttft_ms},
          {"decode_tokens_per_s", s.decode_tokens_per_s}, {"queue_ms", s.queue_ms}, {"queue_position", s.queue_position}, {"image_tokens", s.image_tokens},
          {"drafted_tokens", s.drafted_tokens},
          {"accepted_tokens", s.accepted_tokens}};
}

ojson ToolCallsJson(const std::vector<ParsedToolCall>& calls, bool with_index) {
  ojson out = ojson::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    ojson c;
    if (with_index) c["index"] = i;
    c["id"] = "call_" + RandomHex(24);
    c["type"] = "function";
    c["function"] = {{"name", calls[i].name}, {"arguments", Dump(calls[i].arguments)}};
    out.push_back(std::move(c));
  }
  return out;
}

std::string FinishReasonFor(const GenerationResult& result, bool has_tool_calls) {
  if (result.finish == FinishReason::kLength) return "length";
  if (result.finish == FinishReason::kCancelled) return "cancelled";
  return has_tool_calls ? "tool_calls" : "stop";
}

std::string SseEvent(const ojson& chunk) { return "data: " + Dump(chunk) + "\n\n"; }

}  // namespace

HttpServer::HttpServer(Model& model, Scheduler& scheduler, ServerOptions options, Journal* journal, SettingsStore* settings)
    : model_(model),
      scheduler_(scheduler),
      options_(std::move(options)),
      journal_(journal),
      settings_(settings),
      policy_(options_.access),
      transport_(options_.transport) {
  if (options_.context_tokens <= 0) options_.context_tokens = model_.config.max_position_embeddings;
  transport_.SetErrorWriter([](HttpResponse& res, const HttpError& e) {
    ApiError error{e.status, e.message, e.status >= 500 ? "server_error" : "invalid_request_error", "", e.code};
    res.SetContent(Dump(error.ToJson()), "application/json");
  });
  transport_.SetObserver([this](const HttpRequest& req, int status) {
    const bool known = req.path.rfind("/v1/", 0) == 0 || req.path == "/health" || req.path == "/metrics";
    metrics_.CountRequest(known ? req.path : "other", status);
  });
  transport_.SetGate([this](const HttpRequest& req, HttpResponse& res) { return Admit(req, res); });
  RouteOperations();
  RouteCache();
  RouteShadow();
  RouteDecide();
  RouteJournalAndSettings();
  RouteCompletions();
}

HttpServer::~HttpServer() = default;

Status HttpServer::Bind() { return transport_.Bind(options_.host, options_.port); }
void HttpServer::Serve() { transport_.Serve(); }
void HttpServer::Stop() { transport_.Stop(); }

bool HttpServer::PromptIds(const CompletionRequest& r, std::vector<int32_t>* ids_out, bool* starts_in_reasoning, ApiError* error,
                           ImageCatalog* images) const {
  *starts_in_reasoning = false;
  if (r.kind == RequestKind::kChat) {
    auto text = model_.chat_template.RenderChatBody(r.template_body);
    if (!text.ok()) {
      *error = {400, "the chat template rejected the conversation: " + text.status().message(), "invalid_request_error", "messages", "template_error"};
      return false;
    }
    const std::string& prompt = *text;
    *starts_in_reasoning = prompt.size() >= 8 && prompt.compare(prompt.size() - 8, 8, "<think>\n") == 0;
    auto ids = model_.tokenizer.Encode(prompt, /*parse_special=*/true);
    if (!ids.ok()) {
      *error = {400, ids.status().message(), "invalid_request_error", "messages", "tokenizer_error"};
      return false;
    }
    *ids_out = std::move(*ids);
    if (!r.image_urls.empty()) {
      if (options_.images == nullptr) {
        *error = {400, "image parts are not supported: " + options_.images_off, "invalid_request_error", "messages", "images_unsupported"};
        return false;
      }
      auto prepared = PrepareImages(*options_.images, r.image_urls, options_.image_input, static_cast<int32_t>(options_.images->image_token_id()), ids_out);
      if (!prepared.ok()) {
        const Status& st = prepared.status();
        if (st.code() == StatusCode::kInvalidArgument) {
          *error = {400, st.message(), "invalid_request_error", "messages", "invalid_image"};
        } else if (st.code() == StatusCode::kResourceExhausted) {
          *error = {503, st.message(), "server_error", "", "memory_exhausted"};
        } else {
          *error = {500, st.message(), "server_error", "", "vision_tower_failed"};
        }
        return false;
      }
      if (images != nullptr) *images = std::move(*prepared);
    }
  } else if (r.prompt_is_ids) {
    *ids_out = r.prompt_ids;
  } else {
    auto ids = model_.tokenizer.Encode(r.prompt_text, /*parse_special=*/true);
    if (!ids.ok()) {
      *error = {400, ids.status().message(), "invalid_request_error", "prompt", "tokenizer_error"};
      return false;
    }
    *ids_out = std::move(*ids);
  }
  return true;
}

void HttpServer::Route(const std::string& method, const std::string& path, RouteClass route_class, RouteAccess access, HttpHandler handler) {
  access_[method + " " + path] = access;
  transport_.Route(method, path, route_class, std::move(handler));
}

bool HttpServer::Admit(const HttpRequest& req, HttpResponse& res) const {
  auto refuse = [&](const ApiError& e) {
    SendError(res, e);
    return false;
  };
  if (auto e = policy_.CheckHost(req)) return refuse(*e);
  if (auto e = policy_.CheckOrigin(req)) return refuse(*e);
  for (const auto& [name, value] : policy_.CorsHeaders(req, req.method == "OPTIONS")) res.SetHeader(name, value);
  if (req.method == "OPTIONS") return false;
  auto it = access_.find(req.method + " " + req.path);
  if (auto e = policy_.Authorize(it == access_.end() ? RouteAccess::kAdmin : it->second, req)) return refuse(*e);
  if (auto e = AccessPolicy::CheckContentType(req)) return refuse(*e);
  return true;
}

void HttpServer::RouteOperations() {
  Route("GET", "/health", RouteClass::kControl, RouteAccess::kPublic, [this](const HttpRequest& req, HttpResponse& res) {
    const RequestFigures last = scheduler_.last_stats();
    ojson last_request = FiguresJson(last);
    last_request["prompt_tokens"] = last.prompt_tokens;
    last_request["completion_tokens"] = last.completion_tokens;
    const anchorage::CacheStats cache = scheduler_.CacheStats();
    nlohmann::json cache_health = nlohmann::json::object();
    if (cache.write_guard) cache_health["disk_writes"] = WriteGuardJson(*cache.write_guard);
    SendJson(res, {{"status", scheduler_.draining() ? "draining" : "ok"},
                   {"cache", cache_health},
                   {"model", options_.model_id},
                   {"state", scheduler_.busy() ? "busy" : "idle"},
                   {"queue", scheduler_.queue_depth()},
                   {"slots", SlotsJson(scheduler_.Slots())},
                   {"busy_slots", scheduler_.busy_slots()},
                   {"fingerprint", model_.fingerprint},
                   {"state_fingerprint", model_.state_fingerprint},
                   {"kernel_path", cpu::PathName(cpu::ActivePath())},
                   {"precision", options_.precision},
                   {"weights", model_.weights_format},
                   {"kv_dtype", KvDtypeName(model_.config.kv_dtype)},
                   {"generated_model", model_.generated},
                   // What this request's credentials pass: the client routes (chat, models) and the admin ones (clear, settings, journal).
                   {"access", {{"client", !policy_.Authorize(RouteAccess::kClient, req).has_value()}, {"admin", !policy_.Authorize(RouteAccess::kAdmin, req).has_value()}}},
                   {"notes", options_.notes},
                   {"connections", transport_.open_connections()},
                   {"journal", JournalHealthJson()},
                   {"backends", options_.backends != nullptr ? options_.backends->HealthJson() : ojson::array()},
                   {"threads", scheduler_.forward().threads()},
                   {"device", scheduler_.forward().device_name()},
                   {"device_description", scheduler_.forward().DeviceDescription()},
                   {"device_bytes", scheduler_.forward().DeviceBytes()},
                   {"device_free_bytes", scheduler_.forward().DeviceFreeBytes()},
                   {"last_request", last_request}});
  });
  Route("GET", "/metrics", RouteClass::kControl, RouteAccess::kClient, [this](const HttpRequest&, HttpResponse& res) {
    std::string text = metrics_.Render(scheduler_.queue_depth(), scheduler_.busy());
    text += "# HELP anchorage_slot_tokens Rows each slot's state holds, with its state (idle, prefill, decode).\n# TYPE anchorage_slot_tokens gauge\n";
    for (const SlotSnapshot& slot : scheduler_.Slots())
      text += "anchorage_slot_tokens{slot=\"" + std::to_string(slot.index) + "\",state=\"" + slot.state + "\"} " + std::to_string(slot.tokens) + "\n";
    const Scheduler::DecodeCounts decodes = scheduler_.decode_counts();
    text += "# HELP anchorage_decode_steps_total Forwards that decoded the next rows of running slots.\n# TYPE anchorage_decode_steps_total counter\n";
    text += "anchorage_decode_steps_total " + std::to_string(decodes.steps) + "\n";
    text += "# HELP anchorage_batched_decode_rows_total Slots' rows decoded in a forward with another slot's rows.\n# TYPE anchorage_batched_decode_rows_total counter\n";
    text += "anchorage_batched_decode_rows_total " + std::to_string(decodes.batched_rows) + "\n";
    text += "# HELP anchorage_batched_window_rows_total Draft window rows verified in a forward with another slot's rows.\n# TYPE anchorage_batched_window_rows_total counter\n";
    text += "anchorage_batched_window_rows_total " + std::to_string(decodes.batched_window_rows) + "\n";
    const anchorage::CacheStats stats = scheduler_.CacheStats();
    if (stats.disk_enabled) text += RenderDiskMetrics(stats.disk);
    if (stats.spill_enabled) text += RenderSpillMetrics(stats.spill);
    if (ShadowReader* shadow = scheduler_.shadow()) text += RenderShadowMetrics(shadow->Snapshot());
    if (options_.backends != nullptr && !options_.backends->empty()) text += options_.backends->MetricsText();
    res.SetContent(text, "text/plain; version=0.0.4");
  });
  Route("GET", "/v1/models", RouteClass::kControl, RouteAccess::kClient, [this](const HttpRequest&, HttpResponse& res) {
    ojson data = ojson::array();
    std::vector<std::string> names = {options_.model_id};
    names.insert(names.end(), options_.model_aliases.begin(), options_.model_aliases.end());
    for (const std::string& name : names)
      data.push_back({{"id", name}, {"object", "model"}, {"created", 0}, {"owned_by", "anchorage"}, {"max_model_len", options_.context_tokens}});
    if (options_.backends != nullptr)
      for (const ojson& entry : options_.backends->ModelEntries()) data.push_back(entry);
    SendJson(res, {{"object", "list"}, {"data", data}});
  });
}

ojson HttpServer::JournalHealthJson() const {
  if (journal_ == nullptr) return nullptr;
  const Journal::Health h = journal_->health();
  return {{"ok", h.errors == 0}, {"errors", h.errors}, {"failed_rows", h.failed_rows}, {"dropped_rows", h.dropped_rows},
          {"last_error", h.last_error.empty() ? ojson(nullptr) : ojson(h.last_error)}};
}

ParseOptions HttpServer::ParseOptionsOf() const {
  return ParseOptions{options_.model_id, model_.config.vocab_size, options_.model_aliases, options_.strict_model_names, options_.max_images,
                      options_.images != nullptr ? std::string() : options_.images_off};
}

bool HttpServer::CacheRequestOf(const HttpRequest& req, CacheRequest* out, ApiError* error) const {
  ojson body;
  if (auto backend = BackendOf(req.body, &body)) {
    *error = {404, "model '" + backend->name + "' is served by a backend; its caches are the upstream's", "invalid_request_error", "model", "backend_model"};
    return false;
  }
  auto request = ParseCompletionRequest(RequestKind::kChat, req.body, ParseOptionsOf(), error);
  if (!request) return false;
  bool reasoning = false;
  if (!PromptIds(*request, &out->prompt, &reasoning, error, &out->images)) return false;
  out->session = request->session.empty() ? req.HeaderValue("x-session-id") : request->session;
  return true;
}

void HttpServer::RouteCache() {
  Route("GET", "/v1/cache/stats", RouteClass::kControl, RouteAccess::kClient,
                   [this](const HttpRequest& req, HttpResponse& res) {
                     // Titles are conversation text: only for a caller the admin token passes, where the server has one.
                     const bool titles = !options_.access.admin_token.empty() && !policy_.Authorize(RouteAccess::kAdmin, req).has_value();
                     ojson stats = scheduler_.CacheStatsJson(titles);
                     if (options_.images != nullptr) {
                       const ImageEncoderStats i = options_.images->Stats();
                       stats["images"] = {{"encoded", i.encoded}, {"hits", i.hits}, {"entries", i.entries}, {"bytes", i.bytes},
                                          {"capacity_bytes", i.capacity_bytes}, {"encode_ms_total", i.encode_ms_total},
                                          {"device", options_.images->device_name()}};
                     } else {
                       stats["images"] = {{"off", options_.images_off}};
                     }
                     SendJson(res, stats);
                   });

  // The tier comes from ?tier= or the body's "tier"; a clear that does not say which tier clears nothing.
  Route("POST", "/v1/cache/clear", RouteClass::kWork, RouteAccess::kAdmin, [this](const HttpRequest& req, HttpResponse& res) {
    std::string tier = req.ParamValue("tier");
    if (!IsBlank(req.body)) {
      ojson body;
      ApiError error;
      if (!ParseJsonBody(req.body, &body, &error)) return SendError(res, error);
      if (body.contains("tier")) {
        if (!body["tier"].is_string()) return SendError(res, {400, "'tier' must be a string", "invalid_request_error", "tier", "invalid_tier"});
        const std::string from_body = body["tier"].get<std::string>();
        if (req.HasParam("tier") && from_body != tier)
          return SendError(res, {400, "the query names tier '" + tier + "' and the body names '" + from_body + "'; name one", "invalid_request_error", "tier", "conflicting_tier"});
        tier = from_body;
      }
    }
    if (tier.empty())
      return SendError(res, {400, "name the tier to clear: ?tier=T or {\"tier\": T}, where T is " + std::string(kCacheTierNames), "invalid_request_error", "tier",
                             "missing_tier"});
    Status s = scheduler_.ClearCache(tier);
    if (!s.ok()) return SendError(res, {400, s.message(), "invalid_request_error", "tier", "unknown_tier"});
    SendJson(res, {{"cleared", tier}, {"stats", ToJson(scheduler_.CacheStats())}});
  });

  Route("POST", "/v1/cache/peek", RouteClass::kWork, RouteAccess::kClient, [this](const HttpRequest& req, HttpResponse& res) {
    CacheRequest request;
    ApiError error;
    if (!CacheRequestOf(req, &request, &error)) return SendError(res, error);
    auto info = scheduler_.PeekCache(request, 250);
    if (!info.ok()) return SendError(res, {409, "the engine is busy; peek again shortly", "invalid_request_error", "", "engine_busy"});
    const double rate = scheduler_.measured_prefill_rate();
    SendJson(res, {{"tier", CacheSourceName(info->source)},
                   {"cached_tokens", info->cached_tokens},
                   {"reread_tokens", info->reread_tokens},
                   {"reread_eta_ms", rate > 0 ? ojson(1000.0 * static_cast<double>(info->reread_tokens) / rate) : ojson(nullptr)},
                   {"tokens", request.prompt.size()},
                   {"guest", info->guest},
                   {"aligned", info->aligned}});
  });

  Route("POST", "/v1/cache/prewarm", RouteClass::kWork, RouteAccess::kAdmin, [this](const HttpRequest& req, HttpResponse& res) {
    CacheRequest request;
    ApiError error;
    if (!CacheRequestOf(req, &request, &error)) return SendError(res, error);
    auto peek = scheduler_.PeekCache(request, 250);
    if (!peek.ok()) return SendError(res, {409, "the engine is busy; prewarm again shortly", "invalid_request_error", "", "engine_busy"});
    ojson body = {{"tier", CacheSourceName(peek->source)}, {"cached_tokens", peek->cached_tokens}, {"tokens", request.prompt.size()}};
    switch (peek->source) {
      case CacheSource::kCold:
        body["prewarmed"] = false;
        body["reason"] = "no tier holds a state of this conversation";
        break;
      case CacheSource::kResident:
      case CacheSource::kEnd:
        body["prewarmed"] = false;
        body["reason"] = "the state is already in place in the engine's buffer";
        break;
      default: {
        auto info = scheduler_.PrewarmCache(request);
        if (!info.ok()) return SendError(res, {500, info.status().ToString(), "server_error", "", "engine_error"});
        body["prewarmed"] = true;
        body["reason"] = std::string("brought from the ") + CacheSourceName(peek->source) + " into the engine's buffer";
        body["now"] = {{"tier", CacheSourceName(info->source)}, {"cached_tokens", info->cached_tokens}};
      }
    }
    SendJson(res, body);
  });
}

void HttpServer::RouteDecide() {
  Route("POST", "/v1/decide", RouteClass::kWork, RouteAccess::kClient, [this](const HttpRequest& req, HttpResponse& res) {
    const auto start = std::chrono::steady_clock::now();
    ojson body;
    ApiError error;
    if (!ParseJsonBody(req.body, &body, &error)) return SendError(res, error);
    std::optional<DecideRequest> request = ParseDecideRequest(body, &error);
    if (!request) return SendError(res, error);
    auto bad = [&](const std::string& message, const std::string& code) { SendError(res, {400, message, "invalid_request_error", "questions", code}); };
    // Each question's prompt is what an independent chat request with it renders; a candidate's ids follow it.
    struct Branch {
      size_t question = 0, candidate = 0;
      std::vector<int32_t> scored;
    };
    const size_t questions = request->questions.size();
    std::vector<DecideBranch> branches;
    std::vector<Branch> meta;
    std::vector<std::vector<int32_t>> letters(questions);
    for (size_t q = 0; q < questions; ++q) {
      const DecideQuestion& question = request->questions[q];
      CompletionRequest chat;
      chat.template_body = DecideChatBody(*request, question);
      std::vector<int32_t> prompt;
      bool in_reasoning = false;
      if (!PromptIds(chat, &prompt, &in_reasoning, &error)) return SendError(res, error);
      if (model_.config.vision && std::count(prompt.begin(), prompt.end(), static_cast<int32_t>(model_.config.vision->image_token_id)) > 0) {
        SendError(res, {400, "/v1/decide reads text observations only; send images to /v1/chat/completions", "invalid_request_error", "messages",
                        "images_unsupported"});
        return;
      }
      // False when the branch does not fit the context (the error is sent).
      auto add = [&](std::vector<int32_t> scored, size_t candidate) {
        DecideBranch b;
        b.ids = prompt;
        b.ids.insert(b.ids.end(), scored.begin(), scored.end());
        if (static_cast<int64_t>(b.ids.size()) > options_.context_tokens) {
          bad("questions[" + std::to_string(q) + "] makes a prompt of " + std::to_string(b.ids.size()) + " tokens; this server's context limit is " +
                  std::to_string(options_.context_tokens) + " tokens",
              "context_length_exceeded");
          return false;
        }
        b.group = static_cast<int64_t>(q);
        b.logits_from = static_cast<int64_t>(prompt.size()) - 1;
        branches.push_back(std::move(b));
        meta.push_back({q, candidate, std::move(scored)});
        return true;
      };
      for (size_t i = 0; i < question.choices.size(); ++i) {
        const std::string letter(1, static_cast<char>('A' + i));
        auto id = model_.tokenizer.Encode(letter, false);
        if (!id.ok() || id->size() != 1) return bad("the tokenizer has no single token for the letter " + letter, "unsupported_choices");
        letters[q].push_back((*id)[0]);
      }
      if (!question.choices.empty() && !add({}, 0)) return;
      for (size_t c = 0; c < question.candidates.size(); ++c) {
        auto ids = model_.tokenizer.Encode(question.candidates[c], false);
        if (!ids.ok()) return bad("questions[" + std::to_string(q) + "].candidates[" + std::to_string(c) + "]: " + ids.status().message(), "tokenizer_error");
        if (!add(std::move(ids).value(), c)) return;
      }
    }
    const int64_t vocab = model_.config.vocab_size, vocab_limit = std::min<int64_t>(vocab, model_.tokenizer.vocab_size());
    std::vector<std::vector<double>> probabilities(questions);
    std::vector<std::vector<CandidateScore>> scores(questions);
    for (size_t q = 0; q < questions; ++q) scores[q].resize(request->questions[q].candidates.size());
    std::vector<double> question_ms(questions, 0);
    auto last = std::chrono::steady_clock::now();
    auto ran = scheduler_.Decide(branches, static_cast<int64_t>(questions), request->reuse, request->max_batch, [&](size_t i, std::span<const float> logits) {
      const Branch& b = meta[i];
      if (!letters[b.question].empty()) probabilities[b.question] = ChoiceProbabilities(logits.first(static_cast<size_t>(vocab)), letters[b.question]);
      else scores[b.question][b.candidate] = ScoreCandidate(logits, b.scored, vocab, vocab_limit);
      const auto now = std::chrono::steady_clock::now();
      question_ms[b.question] += std::chrono::duration<double, std::milli>(now - last).count();
      last = now;
      return !(req.client_gone && req.client_gone());  // a client that hung up stops the rest
    });
    if (!ran.ok()) {
      const Status& st = ran.status();
      if (st.code() == StatusCode::kCancelled) return SendError(res, {499, "the client hung up", "server_error", "", "cancelled"});
      if (st.code() == StatusCode::kResourceExhausted) return SendError(res, {503, st.message(), "server_error", "", "memory_exhausted"});
      return SendError(res, {500, st.ToString(), "server_error", "", "engine_error"});
    }
    ojson answers = ojson::array();
    for (size_t q = 0; q < questions; ++q) {
      const DecideQuestion& question = request->questions[q];
      ojson a = {{"question", question.text}};
      size_t best = 0;
      if (!question.choices.empty()) {
        for (size_t i = 0; i < probabilities[q].size(); ++i)
          if (probabilities[q][i] > probabilities[q][best]) best = i;
        a["probabilities"] = probabilities[q];
        a["argmax"] = best;
        a["choice"] = question.choices[best];
        a["letter"] = std::string(1, static_cast<char>('A' + best));
      } else {
        ojson list = ojson::array();
        for (size_t c = 0; c < scores[q].size(); ++c) {
          list.push_back({{"sum_logprob", scores[q][c].sum}, {"mean_logprob", scores[q][c].mean}, {"tokens", scores[q][c].tokens}});
          if (scores[q][c].sum > scores[q][best].sum) best = c;
        }
        a["scores"] = list;
        a["argmax"] = best;
        a["candidate"] = question.candidates[best];
      }
      a["ms"] = question_ms[q];
      answers.push_back(std::move(a));
    }
    SendJson(res, {{"object", "decision"},
                   {"model", options_.model_id},
                   {"answers", answers},
                   {"usage", {{"logical_tokens", ran->logical_tokens}, {"processed_tokens", ran->processed_tokens},
                              {"shared_prefix_tokens", ran->shared}, {"branches", branches.size()}}},
                   {"ms", std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count()}});
  });
}

void HttpServer::RouteShadow() {
  Route("GET", "/v1/shadow/status", RouteClass::kControl, RouteAccess::kClient, [this](const HttpRequest&, HttpResponse& res) {
    ShadowReader* shadow = scheduler_.shadow();
    if (shadow == nullptr) return SendJson(res, {{"loaded", false}, {"reason", "no shadow model is loaded (start with --shadow-model DIR)"}});
    SendJson(res, ShadowStatusJson(shadow->Snapshot()));
  });

  Route("POST", "/v1/shadow/ask", RouteClass::kWork, RouteAccess::kClient, [this](const HttpRequest& req, HttpResponse& res) {
    const auto start = std::chrono::steady_clock::now();
    ojson body;
    ApiError error;
    if (!ParseJsonBody(req.body, &body, &error)) return SendError(res, error);
    auto bad = [&](const std::string& message, const std::string& param) { SendError(res, {400, message, "invalid_request_error", param, "invalid_value"}); };
    if (!body.is_object()) return bad("the body must be a JSON object", "");
    if (!body.contains("session") || !body["session"].is_string()) return bad("'session' must be a string: the conversation id the shadow reads", "session");
    if (!body.contains("question") || !body["question"].is_string()) return bad("'question' must be a string", "question");
    if (!body.contains("choices") || !body["choices"].is_array()) return bad("'choices' must be an array of strings (1 to 26)", "choices");
    std::vector<std::string> choices;
    for (const auto& c : body["choices"]) {
      if (!c.is_string()) return bad("every choice must be a string", "choices");
      choices.push_back(c.get<std::string>());
    }
    int wait_ms = 2000;
    if (body.contains("wait_ms")) {
      if (!body["wait_ms"].is_number_integer() || body["wait_ms"].get<int64_t>() < 0 || body["wait_ms"].get<int64_t>() > 60000)
        return bad("'wait_ms' must be an integer in [0, 60000]", "wait_ms");
      wait_ms = body["wait_ms"].get<int>();
    }
    auto answer = scheduler_.AskShadow(body["session"].get<std::string>(), body["question"].get<std::string>(), choices, wait_ms);
    if (!answer.ok()) {
      const Status& st = answer.status();
      if (st.code() == StatusCode::kUnsupported) return SendError(res, {503, st.message(), "server_error", "", "shadow_unavailable"});
      if (st.code() == StatusCode::kNotFound) return SendError(res, {404, st.message(), "invalid_request_error", "session", "unknown_session"});
      if (st.code() == StatusCode::kInvalidArgument) return bad(st.message(), st.message().find("context") != std::string::npos ? "question" : "choices");
      return SendError(res, {500, st.ToString(), "server_error", "", "engine_error"});
    }
    ojson probabilities = ojson::array();
    for (double p : answer->probabilities) probabilities.push_back(p);
    SendJson(res, {{"choice", choices[static_cast<size_t>(answer->choice)]},
                   {"index", answer->choice},
                   {"letter", std::string(1, static_cast<char>('A' + answer->choice))},
                   {"probabilities", probabilities},
                   {"read_tokens", answer->read_tokens},
                   {"behind_tokens", answer->behind_tokens},
                   {"forward_ms", answer->ms},
                   {"ms", std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count()}});
  });
}

void HttpServer::RouteJournalAndSettings() {
  Route("GET", "/v1/journal", RouteClass::kControl, RouteAccess::kAdmin, [this](const HttpRequest& req, HttpResponse& res) {
    if (journal_ == nullptr) return SendError(res, {404, "this server keeps no journal", "invalid_request_error", "", "not_found"});
    JournalQuery q;
    auto integer = [&](const char* name, int64_t lo, int64_t hi, std::optional<int64_t>* out) -> bool {
      if (!req.HasParam(name)) return true;
      const std::string v = req.ParamValue(name);
      char* end = nullptr;
      errno = 0;
      long long x = std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || errno == ERANGE || x < lo || x > hi) {
        SendError(res, {400, std::string("'") + name + "' must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]", "invalid_request_error", name, ""});
        return false;
      }
      *out = x;
      return true;
    };
    std::optional<int64_t> limit, offset;
    if (!integer("from", 0, INT64_MAX, &q.from_ms) || !integer("to", 0, INT64_MAX, &q.to_ms) || !integer("before", 1, INT64_MAX, &q.before_id) ||
        !integer("limit", 1, 1000, &limit) || !integer("offset", 0, 100000, &offset))
      return;
    q.limit = limit.value_or(100);
    q.offset = offset.value_or(0);
    q.kind = req.ParamValue("kind");
    q.tier = req.ParamValue("tier");
    q.session = req.ParamValue("session");
    q.text = req.ParamValue("text");
    auto page = journal_->Query(q);
    if (!page.ok()) return SendError(res, {400, page.status().message(), "invalid_request_error", "", "journal_error"});
    SendJson(res, {{"rows", page->rows}, {"total", page->total}, {"next_cursor", page->next_cursor ? ojson(*page->next_cursor) : ojson(nullptr)}});
  });

  Route("GET", "/v1/settings", RouteClass::kControl, RouteAccess::kClient, [this](const HttpRequest&, HttpResponse& res) {
    if (settings_ == nullptr) return SendError(res, {404, "this server has no settings document", "invalid_request_error", "", "not_found"});
    SendJson(res, settings_->Document());
  });
  Route("GET", "/v1/settings/schema", RouteClass::kControl, RouteAccess::kClient, [this](const HttpRequest&, HttpResponse& res) {
    if (settings_ == nullptr) return SendError(res, {404, "this server has no settings document", "invalid_request_error", "", "not_found"});
    SendJson(res, settings_->Schema());
  });
  Route("PUT", "/v1/settings", RouteClass::kWork, RouteAccess::kAdmin, [this](const HttpRequest& req, HttpResponse& res) {
    if (settings_ == nullptr) return SendError(res, {404, "this server has no settings document", "invalid_request_error", "", "not_found"});
    ojson doc;
    ApiError error;
    if (!ParseJsonBody(req.body, &doc, &error)) return SendError(res, error);
    ReplaceOutcome outcome = settings_->Replace(nlohmann::json::parse(req.body));
    if (!outcome.ok()) {
      res.status = outcome.error->http_status();
      return res.SetContent(Dump(outcome.error->ToJson()), "application/json");
    }
    SendJson(res, settings_->Document());
  });
}

void HttpServer::RouteCompletions() {
  Route("POST", "/v1/chat/completions", RouteClass::kWork, RouteAccess::kClient,
                   [this](const HttpRequest& req, HttpResponse& res) { Completion(RequestKind::kChat, req, res); });
  Route("POST", "/v1/completions", RouteClass::kWork, RouteAccess::kClient,
                   [this](const HttpRequest& req, HttpResponse& res) { Completion(RequestKind::kCompletion, req, res); });
}

std::optional<BackendSpec> HttpServer::BackendOf(const std::string& body, ojson* parsed) const {
  if (options_.backends == nullptr || options_.backends->empty()) return std::nullopt;
  ApiError ignored;  // a body that does not parse is refused by the embedded model's parser
  if (!ParseJsonBody(body, parsed, &ignored) || !parsed->contains("model") || !(*parsed)["model"].is_string()) return std::nullopt;
  return options_.backends->Route((*parsed)["model"].get<std::string>());
}

std::optional<ApiError> HttpServer::UnroutedModel(const ojson& parsed) const {
  if (options_.backends == nullptr || options_.backends->empty() || !parsed.is_object() || !parsed.contains("model") || !parsed["model"].is_string())
    return std::nullopt;
  const std::string model = parsed["model"].get<std::string>();
  const auto& aliases = options_.model_aliases;
  if (model.empty() || model == options_.model_id || std::find(aliases.begin(), aliases.end(), model) != aliases.end()) return std::nullopt;
  const std::vector<std::string> not_up = options_.backends->NotUp();
  if (not_up.empty()) return std::nullopt;  // every list is known: the embedded model serves any other name
  std::string names;
  for (const std::string& b : not_up) names += (names.empty() ? "" : ", ") + b;
  return ApiError{503, "the model '" + model + "' is neither '" + options_.model_id + "' nor listed by a backend that is up; backend " + names +
                           " is not up, so its models are unknown",
                  "server_error", "model", "backend_unavailable"};
}

void HttpServer::Forwarded(const BackendSpec& backend, const ojson& body, const HttpRequest& req, HttpResponse& res) {
  const bool stream = body.contains("stream") && body["stream"].is_boolean() && body["stream"].get<bool>();
  std::string session = SessionOfBody(body);  // as the embedded model's requests: the body's, else the header's
  if (session.empty()) session = req.HeaderValue("x-session-id");
  const std::string model = body["model"].get<std::string>();
  options_.backends->Forward(backend, req.path, req.body, stream, req.HeaderValue("x-session-id"), req.client_gone, res, SendError,
                             [this, session, model, route = req.path](const ForwardOutcome& o) {
                               if (journal_ == nullptr) return;
                               RequestRow row;
                               row.session = session;
                               row.model = model;
                               row.route = route;
                               row.status = o.status;
                               row.error = o.error;
                               row.figures.prompt_tokens = o.prompt_tokens;
                               row.figures.completion_tokens = o.completion_tokens;
                               row.figures.ttft_ms = o.ttft_ms;
                               row.figures.cache_source = o.backend;
                               row.cache_tier = "backend";
                               row.finish_reason = o.finish_reason;
                               journal_->RecordRequest(std::move(row));
                             });
}

void HttpServer::Completion(RequestKind kind, const HttpRequest& req, HttpResponse& res) {
  ojson routed;
  if (auto backend = BackendOf(req.body, &routed)) return Forwarded(*backend, routed, req, res);
  // Journals a rejected request; reject answers it too.
  auto journal_refusal = [this, session = req.HeaderValue("x-session-id"), route = req.path](const ApiError& e) {
    if (journal_ == nullptr) return;
    RequestRow row;
    row.session = session;
    row.model = options_.model_id;
    row.route = route;
    row.status = e.status;
    row.error = e.message;
    row.figures.cache_source.clear();  // refused before any tier was asked
    journal_->RecordRequest(std::move(row));
  };
  auto reject = [&](const ApiError& e) {
    SendError(res, e);
    journal_refusal(e);
  };
  if (std::optional<ApiError> unrouted = UnroutedModel(routed)) {
    if (unrouted->status == 503) res.SetHeader("Retry-After", "5");
    return reject(*unrouted);
  }
  ApiError error;
  const ParseOptions parse_options = ParseOptionsOf();
  auto request = ParseCompletionRequest(kind, req.body, parse_options, &error);
  if (!request) return reject(error);
  if (request->session.empty() && req.HasHeader("x-session-id")) request->session = req.HeaderValue("x-session-id");

  auto prepared = std::make_shared<Prepared>();
  prepared->request = std::move(*request);
  CompletionRequest& r = prepared->request;
  if (!PromptIds(r, &prepared->prompt_ids, &prepared->starts_in_reasoning, &error, &prepared->images)) return reject(error);
  const int64_t prompt_tokens = static_cast<int64_t>(prepared->prompt_ids.size());
  if (prompt_tokens == 0) return reject({400, "the prompt is empty after tokenization", "invalid_request_error", "prompt", "empty_prompt"});
  if (prompt_tokens >= options_.context_tokens)
    return reject({400, "the prompt holds " + std::to_string(prompt_tokens) + " tokens; this server's context limit is " + std::to_string(options_.context_tokens) + " tokens",
                           "invalid_request_error", kind == RequestKind::kChat ? "messages" : "prompt", "context_length_exceeded"});
  // An agent's compaction of a conversation the engine holds: its continuation, resumed at the end anchor.
  std::vector<int32_t> continuation;
  std::optional<CompactionRequest> compaction;
  if (kind == RequestKind::kChat && !r.session.empty() && r.template_body.contains("messages"))
    compaction = RecognizeCompaction(r.template_body["messages"]);
  if (compaction && settings_ != nullptr && settings_->Effective()["compaction"].value("mode", "continuation") != "continuation")
    compaction.reset();  // compaction.mode client: served as sent
  if (compaction)
    if (auto record = scheduler_.ConversationRecord(r.session);
        record && std::none_of(record->begin(), record->end(), IsImageKey) &&  // the record's text cannot show its images
        RecordIsThisConversation(model_.tokenizer.Decode(*record), *compaction))
      if (auto ids = ContinuationIds(*record, *compaction, model_.chat_template, model_.tokenizer); ids.ok()) {
        continuation = std::move(*ids);
        prepared->starts_in_reasoning = false;  // its turn has thinking off
      }
  const int64_t room = options_.context_tokens - prompt_tokens;
  r.sampling.max_tokens = r.max_tokens_given ? std::min(r.sampling.max_tokens, room) : room;
  for (int64_t id : model_.config.eos_token_ids) r.sampling.stop_token_ids.push_back(static_cast<int32_t>(id));
  for (const char* stop : {"<|im_end|>", "<|endoftext|>"})
    if (auto id = model_.tokenizer.TokenId(stop)) r.sampling.stop_token_ids.push_back(*id);
  if (compaction) scheduler_.NoteCompaction(*compaction, r.sampling, options_.context_tokens);  // what the preparer writes with

  auto job = std::make_shared<Job>(continuation.empty() ? prepared->prompt_ids : continuation, r.sampling, r.session, req.path);
  job->set_context_tokens(options_.context_tokens);
  job->set_images(prepared->images);
  if (!continuation.empty()) job->set_continuation_of(prompt_tokens);
  // The journal records the finish reason the client sees: tool_calls when the reply parses as calls.
  job->set_finish_reason_namer([prepared, kind](const GenerationResult& result) {
    const CompletionRequest& rq = prepared->request;
    bool calls = false;
    if (kind == RequestKind::kChat && rq.parse_tool_calls) {
      OutputParser parser(prepared->starts_in_reasoning, rq.tools);
      parser.Push(result.text);
      parser.Finish();
      calls = !parser.tool_calls().empty();
    }
    return FinishReasonFor(result, calls);
  });
  Status submitted = scheduler_.Submit(job);
  if (!submitted.ok()) {
    res.SetHeader("Retry-After", "1");
    return reject({503, submitted.message(), "server_error", "", submitted.code() == StatusCode::kCancelled ? "shutting_down" : "queue_full"});
  }

  auto refusal = [kind](const Status& admitted) -> ApiError {
    if (admitted.code() == StatusCode::kResourceExhausted) return {503, admitted.message(), "server_error", "", "memory_exhausted"};
    if (admitted.code() == StatusCode::kOutOfRange)
      return {400, admitted.message(), "invalid_request_error", kind == RequestKind::kChat ? "messages" : "prompt", "context_length_exceeded"};
    return {500, admitted.ToString(), "server_error", "", "engine_error"};
  };
  // A stream still queued after a moment gets its headers at once and SSE comments while it waits.
  const std::optional<Status> admitted = r.stream ? job->WaitAdmittedFor(std::chrono::milliseconds(kQueuedStreamHeadersMs)) : job->WaitAdmitted();
  if (admitted && !admitted->ok()) {
    if (admitted->code() == StatusCode::kResourceExhausted) res.SetHeader("Retry-After", "2");
    return reject(refusal(*admitted));
  }
  const std::string id = (kind == RequestKind::kChat ? "chatcmpl-" : "cmpl-") + RandomHex(24);
  const int64_t created = NowSeconds();
  const std::string object = kind == RequestKind::kChat ? "chat.completion" : "text_completion";
  auto usage_json = [this](const Job& j) {
    const RequestFigures& s = j.stats();
    ojson u = {{"prompt_tokens", s.prompt_tokens},
               {"completion_tokens", s.completion_tokens},
               {"total_tokens", s.prompt_tokens + s.completion_tokens},
               {"prompt_tokens_details", {{"cached_tokens", std::max<int64_t>(0, s.prompt_tokens - s.reread_tokens)}}},
               {"anchorage", FiguresJson(s)}};
    metrics_.CountTokens(s.prompt_tokens, std::max<int64_t>(0, s.prompt_tokens - s.reread_tokens), s.completion_tokens);
    metrics_.CountDrafts(s.drafted_tokens, s.accepted_tokens);
    if (s.ttft_ms > 0) metrics_.ObserveTtftMs(s.ttft_ms);
    if (s.prefill_ms > 0) metrics_.ObservePrefillTokensPerS(1000.0 * static_cast<double>(s.reread_tokens) / s.prefill_ms);
    if (s.decode_tokens_per_s > 0) metrics_.ObserveDecodeTokensPerS(s.decode_tokens_per_s);
    return u;
  };
  auto token_logprob = [this](const SampledToken& t, int top) {
    auto entry = [this](int32_t tid, float lp) {
      std::string text = model_.tokenizer.Decode({tid});
      ojson bytes = ojson::array();  // the token's own bytes, part of a character where it holds one
      for (unsigned char c : model_.tokenizer.TokenBytes(tid)) bytes.push_back(c);
      return ojson{{"token", text}, {"logprob", lp}, {"bytes", bytes}};
    };
    ojson e = entry(t.id, t.logprob);
    ojson alternatives = ojson::array();
    for (int i = 0; i < top && i < static_cast<int>(t.top.size()); ++i) alternatives.push_back(entry(t.top[i].first, t.top[i].second));
    e["top_logprobs"] = alternatives;
    return e;
  };

  if (!r.stream) {
    std::vector<SampledToken> sampled;
    bool done = false;
    while (!done) {
      for (const GeneratedToken& t : job->WaitTokens(&done)) sampled.push_back(t.sampled);
      if (!done && req.client_gone && req.client_gone()) job->Cancel();  // nobody reads the answer: stop before the next token
    }
    if (!job->status().ok()) return SendError(res, {500, job->status().ToString(), "server_error", "", "engine_error"});
    const GenerationResult& result = job->result();
    ojson choice = {{"index", 0}};
    ojson logprobs = nullptr;
    if (r.logprobs) {
      ojson content = ojson::array();
      for (const SampledToken& t : sampled)
        if (std::find(r.sampling.stop_token_ids.begin(), r.sampling.stop_token_ids.end(), t.id) == r.sampling.stop_token_ids.end())
          content.push_back(token_logprob(t, r.top_logprobs));
      logprobs = {{"content", content}};
    }
    bool has_tools = false;
    if (kind == RequestKind::kChat) {
      OutputParser parser(prepared->starts_in_reasoning, r.parse_tool_calls ? r.tools : ojson::array(), r.parse_tool_calls);
      parser.Push(result.text);
      parser.Finish();
      ojson message = {{"role", "assistant"}, {"content", parser.content()}};
      if (!parser.reasoning().empty()) message["reasoning_content"] = parser.reasoning();
      if (r.parse_tool_calls && !parser.tool_calls().empty()) {
        has_tools = true;
        message["tool_calls"] = ToolCallsJson(parser.tool_calls(), false);
        if (parser.content().empty()) message["content"] = nullptr;
      }
      choice["message"] = message;
    } else {
      choice["text"] = result.text;
    }
    choice["logprobs"] = logprobs;
    choice["finish_reason"] = FinishReasonFor(result, has_tools);
    ojson body = {{"id", id}, {"object", object}, {"created", created}, {"model", options_.model_id}, {"choices", ojson::array({choice})}};
    body["usage"] = usage_json(*job);
    res.SetContent(Dump(body), "application/json");
    return;
  }

  const std::string chunk_object = kind == RequestKind::kChat ? "chat.completion.chunk" : "text_completion";
  res.SetHeader("Cache-Control", "no-cache");
  res.content_type = "text/event-stream";
  res.stream = [this, job, prepared, id, created, chunk_object, kind, usage_json, token_logprob, queued = !admitted, refusal, journal_refusal](HttpStream& sink) {
        const CompletionRequest& r = prepared->request;
        auto chunk = [&](ojson choice_delta, ojson finish, ojson logprobs) {
          ojson choice = {{"index", 0}};
          if (kind == RequestKind::kChat) choice["delta"] = std::move(choice_delta);
          else choice["text"] = choice_delta.value("content", std::string());
          choice["logprobs"] = std::move(logprobs);
          choice["finish_reason"] = std::move(finish);
          return ojson{{"id", id}, {"object", chunk_object}, {"created", created}, {"model", options_.model_id}, {"choices", ojson::array({choice})}};
        };
        auto send = [&](const std::string& data) {
          if (!sink.Write(data)) {
            job->Cancel();
            return false;
          }
          return true;
        };
        OutputParser parser(prepared->starts_in_reasoning, r.parse_tool_calls ? r.tools : ojson::array(), r.parse_tool_calls);
        size_t tool_index = 0;
        auto send_delta = [&](const OutputDelta& d, ojson logprobs) {
          if (d.empty() && logprobs.is_null()) return true;
          if (kind == RequestKind::kCompletion) return send(SseEvent(chunk({{"content", d.content}}, nullptr, std::move(logprobs))));
          if (!d.reasoning.empty() && !send(SseEvent(chunk({{"reasoning_content", d.reasoning}}, nullptr, nullptr)))) return false;
          if (!d.content.empty() || !logprobs.is_null())
            if (!send(SseEvent(chunk({{"content", d.content}}, nullptr, std::move(logprobs))))) return false;
          for (const ParsedToolCall& call : d.tool_calls) {
            ojson tc = ToolCallsJson({call}, true)[0];
            tc["index"] = tool_index++;
            if (!send(SseEvent(chunk({{"tool_calls", ojson::array({tc})}}, nullptr, nullptr)))) return false;
          }
          return true;
        };
        while (queued) {
          const size_t position = scheduler_.QueuePosition(job.get());
          if (!send(": queued" + (position > 0 ? ", position " + std::to_string(position) : std::string()) + "\n\n")) return;
          if (const std::optional<Status> a = job->WaitAdmittedFor(std::chrono::milliseconds(kQueuedCommentMs))) {
            if (a->ok()) break;
            const ApiError e = refusal(*a);  // the headers went: the refusal is the stream's one event
            send(SseEvent(e.ToJson()));
            journal_refusal(e);
            return;
          }
        }
        if (kind == RequestKind::kChat && !send(SseEvent(chunk({{"role", "assistant"}, {"content", ""}}, nullptr, nullptr)))) return;
        bool done = false;
        while (!done) {
          for (const GeneratedToken& t : job->WaitTokens(&done)) {
            const bool is_stop = std::find(r.sampling.stop_token_ids.begin(), r.sampling.stop_token_ids.end(), t.sampled.id) != r.sampling.stop_token_ids.end();
            ojson logprobs = nullptr;
            if (r.logprobs && !is_stop) logprobs = {{"content", ojson::array({token_logprob(t.sampled, r.top_logprobs)})}};
            OutputDelta d = kind == RequestKind::kChat ? parser.Push(t.text) : OutputDelta{"", t.text, {}};
            if (!send_delta(d, std::move(logprobs))) {
              metrics_.CountCancelled();
              return;
            }
          }
        }
        if (!job->status().ok()) {
          ApiError e{500, job->status().ToString(), "server_error", "", "engine_error"};
          send(SseEvent(e.ToJson()));
          return;
        }
        if (kind == RequestKind::kChat && !send_delta(parser.Finish(), nullptr)) return;
        const bool has_tools = r.parse_tool_calls && !parser.tool_calls().empty();
        if (!send(SseEvent(chunk(ojson::object(), FinishReasonFor(job->result(), has_tools), nullptr)))) return;
        ojson usage = usage_json(*job);
        if (r.include_usage) {
          ojson last = {{"id", id}, {"object", chunk_object}, {"created", created}, {"model", options_.model_id}, {"choices", ojson::array()}, {"usage", usage}};
          if (!send(SseEvent(last))) return;
        }
        send("data: [DONE]\n\n");
        return;
  };
}

}  // namespace anchorage
