#include "engine/shadow/shadow_reader.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>

#include "engine/cache/disk_format.h"
#include "engine/core/file_util.h"
#include "engine/core/hex.h"
#include "engine/core/text_split.h"
#include "engine/shadow/shadow_file.h"

namespace anchorage {
namespace {

constexpr size_t kLastAgreements = 20;
constexpr size_t kMaxPending = 32;

int64_t WallMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}
double MonoMs() { return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::string AgreementKey(const ShadowOptions& o) {
  std::string key = o.question;
  for (const std::string& c : o.choices) key += '\x1f' + c;
  return key;
}

// The letters' softmax of one row of logits, and the most likely letter.
ShadowAnswer LetterAnswer(const std::vector<float>& logits, const std::vector<int32_t>& letters) {
  ShadowAnswer a;
  double top = -INFINITY;
  for (int32_t id : letters) top = std::max(top, static_cast<double>(logits[static_cast<size_t>(id)]));
  double sum = 0;
  for (int32_t id : letters) {
    a.probabilities.push_back(std::exp(static_cast<double>(logits[static_cast<size_t>(id)]) - top));
    sum += a.probabilities.back();
  }
  for (double& p : a.probabilities) p /= sum;
  a.choice = static_cast<int>(std::max_element(a.probabilities.begin(), a.probabilities.end()) - a.probabilities.begin());
  return a;
}

}  // namespace

Result<std::unique_ptr<ShadowReader>> ShadowReader::Create(std::unique_ptr<Model> shadow_model, const Model& main, const ForwardOptions& forward,
                                                           const std::string& disk_dir, ShadowOptions options, Journal* journal) {
  if (shadow_model->config.vocab_size != main.config.vocab_size || shadow_model->tokenizer.sha256() != main.tokenizer.sha256())
    return InvalidArgument("the shadow model in " + shadow_model->dir + " has another vocabulary (" + std::to_string(shadow_model->config.vocab_size) +
                           " ids, tokenizer sha256 " + shadow_model->tokenizer.sha256().substr(0, 12) + ") than the served model (" +
                           std::to_string(main.config.vocab_size) + " ids, " + main.tokenizer.sha256().substr(0, 12) + "): token ids would mean other words");
  std::unique_ptr<ShadowReader> r(new ShadowReader());
  ForwardOptions on_grid = forward;
  on_grid.grid_tokens = kShadowGridTokens;
  ASSIGN_OR_RETURN(r->forward_, Forward::Create(shadow_model->config, shadow_model->weights, on_grid));
  shadow_model->tensors->DropResidentPages();
  r->fingerprint_ = Forward::StateFingerprint(shadow_model->fingerprint, r->forward_->WeightsArithmetic()) + "/grid-" + std::to_string(kShadowGridTokens);
  r->model_ = std::move(shadow_model);
  r->disk_dir_ = disk_dir;
  r->journal_ = journal;
  r->options_ = std::move(options);
  if (auto id = r->model_->tokenizer.TokenId("<|im_end|>")) r->im_end_ = *id;
  // The reader reads text: an image's rows become its placeholder token (or end-of-text) one for one.
  for (const char* name : {"<|image_pad|>", "<|endoftext|>"})
    if (auto id = r->model_->tokenizer.TokenId(name); id && r->image_row_ < 0) r->image_row_ = *id;
  if (r->image_row_ < 0) r->image_row_ = 0;
  if (!disk_dir.empty()) {
    RETURN_IF_ERROR(MakeDirectories(disk_dir, 0700));
    r->ScanDisk();
    r->TrimDisk();
  }
  r->Publish();
  return r;
}

ShadowReader::~ShadowReader() = default;

void ShadowReader::SetOptions(const ShadowOptions& options) {
  std::lock_guard lock(options_mu_);
  options_ = options;
}

ShadowOptions ShadowReader::options() const {
  std::lock_guard lock(options_mu_);
  return options_;
}

std::string ShadowReader::PathOf(const std::string& session) const { return (std::filesystem::path(disk_dir_) / ShadowFileName(session)).string(); }

Result<ShadowQuestion> ShadowReader::PrepareQuestion(const std::string& question, const std::vector<std::string>& choices) const {
  if (IsBlank(question)) return InvalidArgument("'question' is empty");
  if (choices.empty()) return InvalidArgument("'choices' must list at least one choice");
  if (choices.size() > 26) return InvalidArgument("'choices' lists " + std::to_string(choices.size()) + " choices; at most 26 (one letter each)");
  ShadowQuestion q;
  q.text = question;
  q.choices = choices;
  std::string text = "<|im_start|>user\n" + question + "\n";
  for (size_t i = 0; i < choices.size(); ++i) {
    if (choices[i].empty()) return InvalidArgument("choice " + std::to_string(i) + " is empty");
    const std::string letter(1, static_cast<char>('A' + i));
    text += letter + ". " + choices[i] + "\n";
    auto id = model_->tokenizer.Encode(letter, false);
    if (!id.ok() || id->size() != 1) return InvalidArgument("the shadow's tokenizer has no single token for the letter " + letter);
    q.letter_ids.push_back((*id)[0]);
  }
  text += "Answer with one letter.<|im_end|>\n<|im_start|>assistant\n";
  auto ids = model_->tokenizer.Encode(text, true);
  if (!ids.ok()) return InvalidArgument("the question cannot be tokenized: " + ids.status().message());
  q.ids = std::move(ids).value();
  return q;
}

ShadowSession* ShadowReader::Resident(const std::string& session, bool create) {
  auto it = sessions_.find(session);
  if (it == sessions_.end()) {
    if (!create) return nullptr;
    it = sessions_.emplace(session, Entry{}).first;
  }
  Entry& e = it->second;
  e.last_used_ms = WallMs();
  e.use = ++uses_;
  if (e.state) return e.state.get();
  if (e.disk_bytes > 0) {
    const std::string path = PathOf(session);
    auto loaded = LoadShadowFile(DiskEnv::Posix(), path, model_->config, kShadowGridTokens, fingerprint_, session);
    (void)DiskEnv::Posix().Remove(path);  // the resident state is the truth from here on
    e.disk_bytes = 0;
    if (loaded.ok()) {
      e.state = std::move(loaded).value();
      ++counters_.disk_loads;
      EnforceBudget(session);
      return e.state.get();
    }
    NoteError("a shadow session file was not read back (the session is read again): " + loaded.status().message());
    ++counters_.drops;
  }
  if (!create) {
    sessions_.erase(it);
    return nullptr;
  }
  e.state = std::make_unique<ShadowSession>(model_->config, kShadowGridTokens);
  return e.state.get();
}

void ShadowReader::BeginTurn(const std::string& session, std::span<const int32_t> served) {
  const ShadowOptions o = options();
  if (!o.enabled) return;
  std::vector<int32_t> text_rows;
  if (std::any_of(served.begin(), served.end(), IsImageKey)) {
    text_rows.assign(served.begin(), served.end());
    for (int32_t& id : text_rows) id = IsImageKey(id) ? image_row_ : id;
    served = text_rows;
  }
  const std::span<const int32_t> served_prompt = served;
  chunks_at_turn_.store(chunks_read_.load());
  ShadowSession* s = Resident(session, true);
  const ShadowFeed feed = s->Feed(served_prompt, true);
  if (feed.rolled_back > 0) {
    ++counters_.rollbacks;
    counters_.reread_tokens += feed.rolled_back;
  }
  turn_used_ms_ = 0;
  const int64_t n = static_cast<int64_t>(served_prompt.size());
  if (!o.question.empty() && !o.choices.empty() && n >= o.min_tokens && n > 0) {
    if (!agreement_question_ || agreement_key_ != AgreementKey(o)) {
      auto q = PrepareQuestion(o.question, o.choices);
      agreement_key_ = AgreementKey(o);
      if (q.ok()) agreement_question_ = std::make_shared<const ShadowQuestion>(std::move(q).value());
      else {
        agreement_question_.reset();
        NoteError("shadow.question: " + q.status().message());
      }
    }
    int64_t insertion = n;
    for (int64_t i = n - 1; i >= 0; --i)
      if (served_prompt[static_cast<size_t>(i)] == im_end_) {
        insertion = i + 1;
        break;
      }
    if (agreement_question_ && s->committed() <= insertion / kShadowGridTokens * kShadowGridTokens) {
      Pending p;
      p.question = agreement_question_;
      p.row.session = session;
      p.row.insertion = insertion;
      p.row.behind_tokens = insertion - s->committed();
      p.context.assign(served_prompt.begin(), served_prompt.begin() + insertion);
      p.started_ms = MonoMs();
      pending_.push_back(std::move(p));
      if (pending_.size() > kMaxPending) pending_.pop_front();
    }
  }
  EnforceBudget(session);
  Publish();
}

void ShadowReader::NoteOutput(const std::string& session, std::span<const int32_t> ids) {
  if (ShadowSession* s = Resident(session, false)) s->Append(ids);
}

Result<bool> ShadowReader::ReadOne(const std::string& session, ShadowSession& s) {
  AnswerDue(session, s);
  const int64_t before = s.committed();
  const double t0 = MonoMs();
  auto read = s.ReadChunk(*forward_);
  if (!read.ok() || !*read) return read;
  last_chunk_ms_ = MonoMs() - t0;
  ++counters_.chunks_read;
  counters_.tokens_read += s.committed() - before;
  counters_.read_ms += last_chunk_ms_;
  chunks_read_.fetch_add(1);
  AnswerDue(session, s);
  return true;
}

void ShadowReader::ReadRationed(const std::string& session, double ms_since_first_token) {
  const ShadowOptions o = options();
  if (!o.enabled || o.ration <= 0) return;
  const double allowed = o.ration * ms_since_first_token - turn_used_ms_;
  const double estimate = last_chunk_ms_ > 0 ? last_chunk_ms_ : o.slice_ms;
  if (allowed < estimate) return;
  ShadowSession* s = Resident(session, false);
  if (s == nullptr || s->backlog() < s->grid_tokens()) return;
  double spent = 0;
  while (s->backlog() >= s->grid_tokens()) {
    const double next = last_chunk_ms_ > 0 ? last_chunk_ms_ : o.slice_ms;
    if (spent + next > allowed || spent + next > o.slice_ms) break;
    const double t0 = MonoMs();
    const int64_t before = s->committed();
    auto read = ReadOne(session, *s);
    spent += MonoMs() - t0;
    counters_.ration_tokens += s->committed() - before;
    if (!read.ok()) {
      NoteError("shadow read: " + read.status().message());
      break;
    }
    if (!*read) break;
  }
  turn_used_ms_ += spent;
  FinishAgreements();
  Publish();
}

bool ShadowReader::HasIdleWork() const {
  if (!options().enabled) return false;
  for (const Pending& p : pending_)
    if (!p.main_done || !p.shadow_done) return true;
  for (const auto& [id, e] : sessions_)
    if (e.state && e.state->backlog() >= e.state->grid_tokens()) return true;
  return false;
}

bool ShadowReader::IdleWork(const std::function<bool()>& should_stop, const MainFork& main_fork) {
  const ShadowOptions o = options();
  if (!o.enabled) return false;
  const double deadline = MonoMs() + o.idle_read_ms;
  bool did = false;
  while (!should_stop() && MonoMs() < deadline) {
    // The main model's side first: its state moves on with the next request.
    auto main_due = std::find_if(pending_.begin(), pending_.end(), [](const Pending& p) { return !p.main_done; });
    if (main_due != pending_.end()) {
      AnswerMain(*main_due, main_fork);
      FinishAgreements();
      did = true;
      continue;
    }
    const std::string* pick = nullptr;  // the most recently used session with a chunk to read
    uint64_t newest = 0;
    for (auto& [id, e] : sessions_)
      if (e.state && e.state->backlog() >= e.state->grid_tokens() && (pick == nullptr || e.use > newest)) {
        newest = e.use;
        pick = &id;
      }
    if (pick == nullptr) {
      for (Pending& p : pending_) {  // answers due where nothing is left to read
        if (p.shadow_done) continue;
        if (ShadowSession* s = Resident(p.row.session, false)) AnswerDue(p.row.session, *s);
        if (!p.shadow_done) {
          p.shadow_done = true;
          p.shadow_note = "the session's state is gone";
        }
      }
      FinishAgreements();
      break;
    }
    const std::string session = *pick;
    auto read = ReadOne(session, *sessions_.at(session).state);
    if (!read.ok()) {
      NoteError("shadow read: " + read.status().message());
      break;
    }
    did = true;
    FinishAgreements();
    Publish();  // an ask waiting for this session sees each chunk
  }
  if (did) Publish();
  return did;
}

void ShadowReader::AnswerDue(const std::string& session, ShadowSession& s) {
  for (Pending& p : pending_) {
    if (p.row.session != session || p.shadow_done) continue;
    const int64_t line = p.row.insertion / kShadowGridTokens * kShadowGridTokens;
    if (s.committed() < line) continue;
    p.shadow_done = true;
    const bool same_ids = s.known() >= p.row.insertion && std::equal(p.context.begin(), p.context.end(), s.ids().begin());
    if (s.committed() > line || !same_ids) {
      p.shadow_note = s.committed() > line ? "the reader was past the turn's point" : "the session changed before the reader reached the turn's point";
      continue;
    }
    auto answer = AnswerOn(s, p.row.insertion, *p.question);
    if (!answer.ok()) {
      p.shadow_note = answer.status().message();
      continue;
    }
    p.row.shadow = *answer;
    p.row.lag_ms = MonoMs() - p.started_ms;
  }
}

void ShadowReader::AnswerMain(Pending& p, const MainFork& main_fork) {
  p.main_done = true;
  if (!main_fork) {
    p.row.main_note = "the main model is not asked";
    return;
  }
  const double t0 = MonoMs();
  auto logits = main_fork(p.context, p.question->ids);
  if (!logits.ok()) {
    p.row.main_note = logits.status().message();
    return;
  }
  ShadowAnswer a = LetterAnswer(*logits, p.question->letter_ids);
  a.read_tokens = p.row.insertion;
  a.ms = MonoMs() - t0;
  p.row.main = a;
}

Result<ShadowAnswer> ShadowReader::AnswerOn(ShadowSession& s, int64_t upto, const ShadowQuestion& q) {
  const double t0 = MonoMs();
  upto = std::clamp(upto, s.committed(), s.known());
  const ShadowOptions o = options();
  const int64_t context = o.context_tokens > 0 ? std::min(o.context_tokens, model_->config.max_position_embeddings) : model_->config.max_position_embeddings;
  if (upto + static_cast<int64_t>(q.ids.size()) > context)
    return InvalidArgument("the question (" + std::to_string(q.ids.size()) + " tokens) over the session's " + std::to_string(upto) +
                           " read tokens exceeds the shadow's context of " + std::to_string(context) + " tokens");
  ASSIGN_OR_RETURN(std::vector<float> logits, s.ForkLogits(*forward_, upto, q.ids));
  ShadowAnswer a = LetterAnswer(logits, q.letter_ids);
  a.read_tokens = upto;
  a.behind_tokens = s.known() - upto;
  a.ms = MonoMs() - t0;
  return a;
}

void ShadowReader::FinishAgreements() {
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (!it->main_done || !it->shadow_done) {
      ++it;
      continue;
    }
    ShadowAgreement row = std::move(it->row);
    const ShadowQuestion& q = *it->question;
    row.question = q.text;
    row.choices = q.choices;
    row.time_ms = WallMs();
    if (row.main_note.empty() && !row.main) row.main_note = "the main model did not answer";
    if (!row.shadow) row.main_note += (row.main_note.empty() ? "" : "; ") + ("shadow: " + it->shadow_note);
    if (row.shadow && row.main) {
      row.agree = row.shadow->choice == row.main->choice;
      ++counters_.compared;
      if (*row.agree) ++counters_.agreed;
    }
    if (journal_ != nullptr) {
      ShadowRow j;
      j.time_ms = row.time_ms;
      j.session = row.session;
      j.question = q.text;
      j.insertion_tokens = row.insertion;
      j.behind_tokens = row.behind_tokens;
      j.lag_ms = row.lag_ms;
      if (row.shadow) {
        j.shadow_choice = q.choices[static_cast<size_t>(row.shadow->choice)];
        j.shadow_probability = row.shadow->probabilities[static_cast<size_t>(row.shadow->choice)];
        j.shadow_probabilities = row.shadow->probabilities;
      }
      if (row.main) {
        j.main_choice = q.choices[static_cast<size_t>(row.main->choice)];
        j.main_probability = row.main->probabilities[static_cast<size_t>(row.main->choice)];
        j.main_probabilities = row.main->probabilities;
      }
      j.agree = row.agree;
      j.note = row.main_note;
      journal_->RecordShadow(std::move(j));
    }
    counters_.last_agreements.insert(counters_.last_agreements.begin(), std::move(row));
    if (counters_.last_agreements.size() > kLastAgreements) counters_.last_agreements.pop_back();
    it = pending_.erase(it);
  }
}

void ShadowReader::EnforceBudget(const std::string& keep) {
  const int64_t budget = options().budget_bytes;
  auto total = [&] {
    int64_t b = 0;
    for (const auto& [id, e] : sessions_)
      if (e.state) b += e.state->bytes();
    return b;
  };
  int64_t bytes = total();
  while (bytes > budget) {
    auto victim = sessions_.end();
    for (auto it = sessions_.begin(); it != sessions_.end(); ++it)
      if (it->second.state && it->first != keep && (victim == sessions_.end() || it->second.use < victim->second.use)) victim = it;
    if (victim == sessions_.end()) break;  // the session in use stays, even over the cap
    bytes -= victim->second.state->bytes();
    (void)Evict(victim->first, victim->second);
  }
  resident_bytes_.store(bytes);
}

Status ShadowReader::Evict(const std::string& session, Entry& e) {
  ++counters_.evictions;
  Status saved = disk_dir_.empty() ? NotFound("no disk") : SaveShadowFile(DiskEnv::Posix(), PathOf(session), fingerprint_, session, *e.state);
  e.disk_read_tokens = e.state->committed();
  e.state.reset();
  if (!saved.ok()) {
    if (!disk_dir_.empty()) NoteError("a shadow session could not be written (it will be read again): " + saved.message());
    ++counters_.drops;
    e.disk_bytes = 0;
    return saved;
  }
  e.disk_bytes = [&] { auto n = DiskEnv::Posix().FileSize(PathOf(session)); return n.ok() ? *n : int64_t{1}; }();
  TrimDisk();
  return Status::Ok();
}

void ShadowReader::ScanDisk() {
  if (disk_dir_.empty()) return;
  DiskEnv& env = DiskEnv::Posix();
  auto files = env.ListFiles(disk_dir_);
  if (!files.ok()) return;
  for (const std::string& name : *files) {
    const std::string path = (std::filesystem::path(disk_dir_) / name).string();
    if (name.ends_with(kTemporarySuffix)) {
      (void)env.Remove(path);
      continue;
    }
    if (!name.ends_with(".shadow")) continue;
    auto head = env.ReadFilePrefix(path, 64 << 10);
    auto header = head.ok() ? PeekCacheFileHeader(*head) : Result<CacheFileHeader>(Corrupt("unreadable"));
    std::optional<std::string> session;
    if (header.ok() && header->kind == "shadow" && header->fingerprint == fingerprint_ && header->links.size() == 1) session = Unhex(header->links[0]);
    const int64_t used = [&] { auto t = env.ModifiedTimeMs(path); return t.ok() ? *t : int64_t{0}; }();
    if (!session || ShadowFileName(*session) != name) {
      (void)env.Remove(path);
      continue;
    }
    Entry& e = sessions_[*session];
    if (e.state) continue;
    e.disk_bytes = [&] { auto n = env.FileSize(path); return n.ok() ? *n : int64_t{1}; }();
    e.disk_read_tokens = header->tokens;
    e.last_used_ms = std::max(e.last_used_ms, used);
  }
}

void ShadowReader::TrimDisk() {
  if (disk_dir_.empty()) return;
  DiskEnv& env = DiskEnv::Posix();
  const ShadowOptions o = options();
  const int64_t now = WallMs();
  for (auto it = sessions_.begin(); it != sessions_.end();) {  // files unused past the TTL go
    if (!it->second.state && it->second.disk_bytes > 0 && now - it->second.last_used_ms > o.disk_ttl_ms) {
      (void)env.Remove(PathOf(it->first));
      it = sessions_.erase(it);
    } else {
      ++it;
    }
  }
  // Over the disk budget the least recently used files go.
  while (true) {
    int64_t bytes = 0;
    auto victim = sessions_.end();
    for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
      if (it->second.state || it->second.disk_bytes == 0) continue;
      bytes += it->second.disk_bytes;
      if (victim == sessions_.end() || std::tie(it->second.use, it->second.last_used_ms) < std::tie(victim->second.use, victim->second.last_used_ms)) victim = it;
    }
    if (bytes <= o.disk_budget_bytes || victim == sessions_.end()) break;
    (void)env.Remove(PathOf(victim->first));
    sessions_.erase(victim);
  }
}

Status ShadowReader::WriteAll() {
  if (disk_dir_.empty()) return Status::Ok();
  Status first;
  for (auto& [id, e] : sessions_) {
    if (!e.state || e.state->known() == 0) continue;
    Status s = SaveShadowFile(DiskEnv::Posix(), PathOf(id), fingerprint_, id, *e.state);
    if (!s.ok() && first.ok()) first = s;
  }
  return first;
}

Status ShadowReader::Clear() {
  for (auto& [id, e] : sessions_)
    if (e.disk_bytes > 0 || !disk_dir_.empty()) (void)DiskEnv::Posix().Remove(PathOf(id));
  sessions_.clear();
  pending_.clear();
  resident_bytes_.store(0);
  Publish();
  return Status::Ok();
}

Result<ShadowAnswer> ShadowReader::Ask(const std::string& session, const ShadowQuestion& question) {
  ShadowSession* s = Resident(session, false);
  if (s == nullptr) return NotFound("the shadow holds no session '" + session + "'");
  ++counters_.asks;
  auto answer = AnswerOn(*s, s->committed() + s->grid_tokens() - 1, question);
  Publish();
  return answer;
}

Status ShadowReader::WaitFresh(const std::string& session, int timeout_ms) {
  std::unique_lock lock(status_mu_);
  auto find = [&]() -> const ShadowSessionInfo* {
    for (const ShadowSessionInfo& i : status_.sessions)
      if (i.session == session) return &i;
    return nullptr;
  };
  if (find() == nullptr) return NotFound("the shadow holds no session '" + session + "'");
  published_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] {
    const ShadowSessionInfo* i = find();
    return i == nullptr || i->backlog < status_.grid_tokens;
  });
  return Status::Ok();
}

ShadowStatus ShadowReader::Snapshot() const {
  std::lock_guard lock(status_mu_);
  return status_;
}

const ShadowSession* ShadowReader::Find(const std::string& session) const {
  auto it = sessions_.find(session);
  return it == sessions_.end() ? nullptr : it->second.state.get();
}

void ShadowReader::NoteError(const std::string& what) { counters_.last_error = what; }

void ShadowReader::Publish() {
  const ShadowOptions o = options();
  ShadowStatus s = counters_;
  s.enabled = o.enabled;
  s.model = model_->dir;
  s.grid_tokens = kShadowGridTokens;
  s.budget_bytes = o.budget_bytes;
  s.question = o.question;
  s.choices = o.choices;
  s.ration = o.ration;
  s.ms_per_1000_tokens = s.tokens_read > 0 ? 1000.0 * s.read_ms / static_cast<double>(s.tokens_read) : 0;
  std::vector<const std::pair<const std::string, Entry>*> by_use;  // most recently used first
  for (const auto& entry : sessions_) by_use.push_back(&entry);
  std::sort(by_use.begin(), by_use.end(), [](const auto* a, const auto* b) { return a->second.use > b->second.use; });
  int64_t resident = 0;
  for (const auto* entry : by_use) {
    const auto& [id, e] = *entry;
    ShadowSessionInfo i;
    i.session = id;
    i.last_used_ms = e.last_used_ms;
    if (e.state) {
      i.known = e.state->known();
      i.read = e.state->committed();
      i.backlog = e.state->backlog();
      i.bytes = e.state->bytes();
      for (const Anchor& c : e.state->checkpoints()) i.checkpoints.push_back(c.length);
      resident += i.bytes;
    } else {
      i.on_disk = e.disk_bytes > 0;
      i.bytes = e.disk_bytes;
      i.read = i.known = e.disk_read_tokens;
      s.disk_bytes += e.disk_bytes;
      if (i.on_disk) ++s.disk_files;  // a session dropped without a file is listed, not counted as one
    }
    s.sessions.push_back(std::move(i));
  }
  s.resident_bytes = resident;
  resident_bytes_.store(resident);
  {
    std::lock_guard lock(status_mu_);
    status_ = std::move(s);
  }
  published_.notify_all();
}

}  // namespace anchorage
