// The resident prefix on the tiny model with a 64-token grid: every resume (anchor, after a guest and
// its stash, pin swap, A-B-A park swap) writes the same bits as a cold prefill, with 1 and 2 threads;
// the end anchor forwards only new tokens; end alignment; budget eviction; clear.
#include <QtTest>

#include "tests/kernel_path_env.h"

#include <cstring>
#include <limits>

#include "engine/cache/resident_prefix.h"
#include "tests/cache/cache_test_util.h"
#include "engine/model/model.h"
#include "engine/model/tiny_model.h"

using namespace anchorage;
using anchorage::testing::Concat;
using anchorage::testing::Greedy;
using anchorage::testing::Head;
using anchorage::testing::SameBits;
using anchorage::testing::Tokens;

namespace {

constexpr int64_t kGrid = 64;



}  // namespace

class TestResident : public QObject {
  Q_OBJECT

 private:
  QTemporaryDir dir_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Forward> forward1_, forward2_;
  int32_t vocab_ = 0;

  std::unique_ptr<Forward> MakeForward(int threads) {
    ForwardOptions o;
    o.grid_tokens = kGrid;
    o.threads = threads;
    auto f = Forward::Create(model_->config, model_->weights, o);
    return f.ok() ? std::move(f).value() : nullptr;
  }

  // Asserts that the resident state after prefilling `prompt` equals a cold prefill's, bit for bit.
  void ExpectColdEqual(Forward& forward, const ResidentPrefix& rp, const std::vector<float>& logits, const std::vector<int32_t>& prompt) {
    SequenceState cold(model_->config);
    auto cold_logits = forward.Prefill(cold, prompt);
    QVERIFY(cold_logits.ok());
    QVERIFY2(SameBits(logits, *cold_logits), "logits differ from a cold prefill");
    QVERIFY2(rp.state().BitEqual(cold), "K/V rows, recurrent states or conv tails differ from a cold prefill");
  }

  void RunAllResumes(Forward& forward, std::vector<std::vector<float>>* logits_out) {
    ResidentOptions o;
    o.guest_max_tokens = 96;
    ResidentPrefix rp(forward, &model_->tokenizer, o);
    const auto a = Tokens(1, 400, vocab_);
    ResumeInfo info;

    auto l = rp.Prefill({a, "a", 0}, &info);
    QVERIFY(l.ok());
    QCOMPARE(info.source, CacheSource::kCold);
    QCOMPARE(rp.anchors().size(), size_t(6));  // 64 .. 384

    // Resume at an anchor: shares 250 tokens, resumes at 192.
    const auto b = Concat(Head(a, 250), Tokens(2, 90, vocab_));
    l = rp.Prefill({b, "a", 0}, &info);
    QVERIFY(l.ok());
    QCOMPARE(info.source, CacheSource::kResident);
    QCOMPARE(info.cached_tokens, int64_t(192));
    ExpectColdEqual(forward, rp, *l, b);
    logits_out->push_back(*l);

    // A guest (short, unrelated) runs; its stash puts the rows back; the conversation resumes as before.
    const auto grown = Concat(b, Tokens(3, 150, vocab_));  // 490 tokens
    l = rp.Prefill({grown, "a", 0}, &info);
    QVERIFY(l.ok());
    const SamplingParams greedy = Greedy(4);
    auto guest = rp.Generate({Tokens(4, 70, vocab_), "", 4}, greedy, nullptr);
    QVERIFY(guest.ok());
    QVERIFY(guest->resume.guest);
    auto second_guest = rp.Generate({Tokens(40, 60, vocab_), "", 4}, greedy, nullptr);  // guest after guest
    QVERIFY2(second_guest.ok(), second_guest.status().ToString().c_str());
    QVERIFY(second_guest->resume.guest);
    const auto after_guest = Concat(grown, Tokens(5, 20, vocab_));
    l = rp.Prefill({after_guest, "a", 0}, &info);
    QVERIFY(l.ok());
    QCOMPARE(info.source, CacheSource::kResident);
    QCOMPARE(info.cached_tokens, int64_t(448));
    ExpectColdEqual(forward, rp, *l, after_guest);
    logits_out->push_back(*l);

    // Pin: a long request of the same session replaces the prompt (a compaction); the head comes back.
    const auto compaction = Tokens(6, 300, vocab_);
    l = rp.Prefill({compaction, "a", 0}, &info);
    QVERIFY(l.ok());
    QCOMPARE(info.source, CacheSource::kCold);
    QCOMPARE(int(rp.Stats().pin.entries), 1);
    const auto back = Concat(Head(after_guest, 330), Tokens(7, 40, vocab_));
    l = rp.Prefill({back, "a", 0}, &info);
    QVERIFY(l.ok());
    QCOMPARE(info.source, CacheSource::kPin);
    QVERIFY(info.cached_tokens > 0 && info.cached_tokens <= 330);
    ExpectColdEqual(forward, rp, *l, back);
    logits_out->push_back(*l);

    // Park: session B shares a 100-token head with A, then session A returns.
    const auto a2 = Concat(back, Tokens(8, 60, vocab_));  // 430 tokens
    l = rp.Prefill({a2, "a", 0}, &info);
    QVERIFY(l.ok());
    const auto b2 = Concat(Head(a2, 100), Tokens(9, 200, vocab_));
    l = rp.Prefill({b2, "b", 0}, &info);
    QVERIFY(l.ok());
    QCOMPARE(info.cached_tokens, int64_t(64));
    QCOMPARE(rp.Stats().park.session, std::string("a"));
    const auto a3 = Concat(a2, Tokens(10, 30, vocab_));
    l = rp.Prefill({a3, "a", 0}, &info);
    QVERIFY(l.ok());
    QCOMPARE(info.source, CacheSource::kPark);
    QCOMPARE(info.cached_tokens, int64_t(384));
    ExpectColdEqual(forward, rp, *l, a3);
    logits_out->push_back(*l);
    // And B comes back from the park the other way round.
    const auto b3 = Concat(b2, Tokens(11, 10, vocab_));
    l = rp.Prefill({b3, "b", 0}, &info);
    QVERIFY(l.ok());
    QCOMPARE(info.source, CacheSource::kPark);
    ExpectColdEqual(forward, rp, *l, b3);
    logits_out->push_back(*l);
  }

 private slots:
  void initTestCase() {
    ANCHORAGE_SKIP_UNLESS_KERNEL_PATH_RUNS();
    QVERIFY(GenerateTinyModel(TinyModelSize::kTiny, 11, dir_.path().toStdString()).ok());
    auto m = LoadModel(dir_.path().toStdString());
    QVERIFY2(m.ok(), m.status().ToString().c_str());
    model_ = std::move(m).value();
    vocab_ = model_->tokenizer.vocab_size();
    forward1_ = MakeForward(1);
    forward2_ = MakeForward(2);
    QVERIFY(forward1_ && forward2_);
  }

  // With a 1,024-token grid, a 700-token prompt has no grid line below its end: the anchors at the
  // last 64-line below the end and below the last user message's start are what later turns resume at.
  void exactLineAnchorsBetweenGridLines() {
    ForwardOptions o;
    o.grid_tokens = 1024;
    o.threads = 2;
    auto forward = Forward::Create(model_->config, model_->weights, o);
    QVERIFY(forward.ok());
    ResidentPrefix rp(**forward, &model_->tokenizer, ResidentOptions{});
    ResumeInfo info;
    const auto a = Tokens(21, 700, vocab_);
    QVERIFY(rp.Prefill({a, "s", 0}, &info).ok());
    QCOMPARE(rp.anchors().lengths(), std::vector<int64_t>{640});
    const auto b = Concat(Head(a, 650), Tokens(22, 40, vocab_));
    auto l = rp.Prefill({b, "s", 0}, &info);
    QVERIFY(l.ok());
    QCOMPARE(info.source, CacheSource::kResident);
    QCOMPARE(info.cached_tokens, int64_t(640));
    QCOMPARE(info.reread_tokens, int64_t(690 - 640));
    ExpectColdEqual(**forward, rp, *l, b);

    // A chat: the last user message starts past token 300; a client that rewrites that message
    // resumes at the 64-line below its start, not at 0.
    auto encode = [&](const std::string& text) { return *model_->tokenizer.Encode(text); };
    std::string system = "<|im_start|>system\n";
    for (int i = 0; i < 30; ++i) system += "rule " + std::to_string(i) + " keeps the tools honest. ";
    const std::string head = system + "<|im_end|>\n<|im_start|>user\nfirst question<|im_end|>\n<|im_start|>assistant\nan answer<|im_end|>\n";
    const auto before_user = encode(head);
    QVERIFY(before_user.size() > 300);
    // The client puts a reminder at the message's start and drops it next turn; the message runs
    // past the next 64-line, so the end's anchor lies above where the copies part.
    std::string task;
    for (int i = 0; i < 40; ++i) task += "step " + std::to_string(i) + " of the plan. ";
    const auto turn = encode(head + "<|im_start|>user\n<tool_response>\nignored\n</tool_response><|im_end|>\n<|im_start|>user\ntoday is Monday. " + task + "<|im_end|>\n<|im_start|>assistant\n");
    const auto tool_part = encode("<|im_start|>user\n<tool_response>\nignored\n</tool_response><|im_end|>\n");
    const int64_t user_start = static_cast<int64_t>(before_user.size() + tool_part.size());
    QVERIFY(user_start / 64 * 64 % 1024 != 0);  // not a grid line: only the user-message anchor sits there
    QVERIFY(rp.Prefill({turn, "c", 0}, &info).ok());
    const auto lines = rp.anchors().lengths();
    QVERIFY2(std::find(lines.begin(), lines.end(), user_start / 64 * 64) != lines.end(),
             qPrintable(QString("no anchor at %1 below the user message at %2").arg(user_start / 64 * 64).arg(user_start)));
    const auto rewritten = encode(head + "<|im_start|>user\n<tool_response>\nignored\n</tool_response><|im_end|>\n<|im_start|>user\n" + task + "<|im_end|>\n<|im_start|>assistant\n");
    QVERIFY(static_cast<int64_t>(turn.size() - 1) / 64 * 64 > user_start / 64 * 64 + 64);
    l = rp.Prefill({rewritten, "c", 0}, &info);
    QVERIFY(l.ok());
    QCOMPARE(info.cached_tokens, user_start / 64 * 64);
    ExpectColdEqual(**forward, rp, *l, rewritten);
  }

  void everyResumeIsBitExactWithOneAndTwoThreads() {
    std::vector<std::vector<float>> one, two;
    RunAllResumes(*forward1_, &one);
    if (QTest::currentTestFailed()) return;
    RunAllResumes(*forward2_, &two);
    if (QTest::currentTestFailed()) return;
    QCOMPARE(one.size(), two.size());
    for (size_t i = 0; i < one.size(); ++i) QVERIFY2(SameBits(one[i], two[i]), "1 and 2 threads differ");
  }

  void endAnchorForwardsOnlyNewTokens() {
    ResidentPrefix rp(*forward2_, &model_->tokenizer, ResidentOptions{});
    ResidentOptions off;
    off.enabled = false;
    ResidentPrefix cold(*forward2_, &model_->tokenizer, off);
    const SamplingParams greedy = Greedy(24);
    const auto prompt = Tokens(20, 150, vocab_);
    auto first = rp.Generate({prompt, "s", 24}, greedy, nullptr);
    QVERIFY(first.ok());
    QCOMPARE(first->generation.tokens.size(), size_t(24));
    const auto& gen = first->generation.tokens;
    const auto follow = Concat(Concat(prompt, gen), Tokens(21, 30, vocab_));
    std::vector<SampledToken> warm_tokens, cold_tokens;
    auto warm = rp.Generate({follow, "s", 24}, greedy, [&](const GeneratedToken& t) { warm_tokens.push_back(t.sampled); return true; });
    QVERIFY(warm.ok());
    QCOMPARE(warm->resume.source, CacheSource::kEnd);
    QCOMPARE(warm->resume.cached_tokens, int64_t(150 + 23));  // the last generated token was never forwarded
    QCOMPARE(warm->resume.reread_tokens, int64_t(1 + 30));
    QVERIFY(rp.taint_row() == 150);
    auto reference = cold.Generate({follow, "s", 24}, greedy, [&](const GeneratedToken& t) { cold_tokens.push_back(t.sampled); return true; });
    QVERIFY(reference.ok());
    QCOMPARE(reference->resume.source, CacheSource::kCold);
    // The greedy gate: the same tokens, except after a near tie, which is detected and reported.
    std::string note;
    const std::string gate = anchorage::testing::GreedyGate(warm_tokens, cold_tokens, 1e-3f, &note);
    if (!note.empty()) qInfo() << note.c_str();
    QVERIFY2(gate.empty(), gate.c_str());
  }

  void endAlignmentServesACopyWithoutReasoning() {
    ResidentPrefix rp(*forward2_, &model_->tokenizer, ResidentOptions{});
    const std::string turn1 = "<|im_start|>user\nWhat is a grid line?<|im_end|>\n<|im_start|>assistant\n<think>\n";
    auto prompt = model_->tokenizer.Encode(turn1);
    QVERIFY(prompt.ok());
    auto reply = model_->tokenizer.Encode("Think about chunks.\n</think>\n\nA grid line is a chunk boundary.<|im_end|>");
    QVERIFY(reply.ok());
    const SamplingParams forced = testing::ForcedReply(model_->tokenizer, *reply);
    auto first = rp.Generate({*prompt, "", 64}, forced, nullptr);
    QVERIFY(first.ok());
    const int64_t end = static_cast<int64_t>(prompt->size() + reply->size() - 1);
    QCOMPARE(static_cast<int64_t>(rp.rows().size()), end);

    auto expect = [&](const std::string& copy, bool resumes, bool aligned) {
      auto ids = model_->tokenizer.Encode(copy);
      QVERIFY(ids.ok());
      ResumeInfo info = rp.Peek({*ids, "", 16});
      QCOMPARE(info.source == CacheSource::kEnd, resumes);
      if (!resumes) return;
      QCOMPARE(info.cached_tokens, end);
      QCOMPARE(info.aligned, aligned);
      // What is served is the rows' own tokens up to the end anchor, then the copy's new text.
      QVERIFY(std::equal(rp.rows().begin(), rp.rows().end(), info.served_prompt.begin()));
      const std::string tail = model_->tokenizer.Decode(std::vector<int32_t>(info.served_prompt.begin() + end, info.served_prompt.end()));
      QCOMPARE(tail, std::string("<|im_end|>\n<|im_start|>user\nAnd a row?<|im_end|>\n<|im_start|>assistant\n<think>\n"));
    };
    const std::string next = "<|im_end|>\n<|im_start|>user\nAnd a row?<|im_end|>\n<|im_start|>assistant\n<think>\n";
    // Exactly the rows: resumes without alignment.
    expect(turn1 + "Think about chunks.\n</think>\n\nA grid line is a chunk boundary." + next, true, false);
    // Qwen3.5 drops an earlier answer's reasoning block.
    expect("<|im_start|>user\nWhat is a grid line?<|im_end|>\n<|im_start|>assistant\nA grid line is a chunk boundary." + next, true, true);
    // A later template renders an empty block for a client that sent no reasoning.
    expect(turn1 + "\n</think>\n\nA grid line is a chunk boundary." + next, true, true);
    // Whitespace next to the reasoning differs.
    expect(turn1 + "Think about chunks.</think>\n\n\nA grid line is a chunk boundary." + next, true, true);
    // A real token differs: back to the anchors.
    expect("<|im_start|>user\nWhat is a grid line?<|im_end|>\n<|im_start|>assistant\nA grid line is a chunk border." + next, false, false);
    expect("<|im_start|>user\nWhat is a grid  line?<|im_end|>\n<|im_start|>assistant\nA grid line is a chunk boundary." + next, false, false);
  }

  // A generation that forwards nothing keeps its end off the 64-lines, a cold prefill's own state: a
  // longer prompt resumes at the line below it instead (a resume there would run other delta-rule
  // chunks), so nothing is tainted, and another prompt sharing the longer one's head resumes above
  // the old end with a cold prefill's bits.
  void offLineEndIsNotResumedOffTheLine() {
    ResidentPrefix rp(*forward1_, &model_->tokenizer, ResidentOptions{});
    SamplingParams one;
    one.temperature = 0;
    one.max_tokens = 1;
    const auto p = Tokens(50, 100, vocab_);
    auto first = rp.Generate({p, "t", 1}, one, nullptr);
    QVERIFY(first.ok());
    QCOMPARE(static_cast<int64_t>(rp.rows().size()), int64_t(100));
    QCOMPARE(rp.taint_row(), std::numeric_limits<int64_t>::max());  // the prompt's rows are a cold prefill's
    const auto longer = Concat(p, Tokens(51, 230, vocab_));
    ResumeInfo info;
    auto l = rp.Prefill({longer, "t", 0}, &info);
    QVERIFY(l.ok());
    QCOMPARE(info.source, CacheSource::kResident);
    QCOMPARE(info.cached_tokens, int64_t(64));
    QCOMPARE(rp.taint_row(), std::numeric_limits<int64_t>::max());
    ExpectColdEqual(*forward1_, rp, *l, longer);
    const auto branch = Concat(std::vector<int32_t>(longer.begin(), longer.begin() + 300), Tokens(53, 20, vocab_));
    auto b = rp.Prefill({branch, "u", 0}, &info);
    QVERIFY(b.ok());
    QVERIFY2(info.cached_tokens > 100, std::to_string(info.cached_tokens).c_str());
    ExpectColdEqual(*forward1_, rp, *b, branch);
  }

  // A request refused for memory leaves every tier as it was: nothing pinned, parked or dropped.
  void refusalChangesNoTier() {
    ResidentPrefix rp(*forward1_, &model_->tokenizer, ResidentOptions{});
    const SamplingParams greedy = Greedy(3);
    QVERIFY(rp.Generate({Tokens(60, 300, vocab_), "a", 3}, greedy, nullptr).ok());
    const auto before = ToJson(rp.Stats());
    const std::vector<int32_t> rows = rp.rows();
    const int64_t length = rp.state().length();
    ResidentOptions tight = rp.options();
    tight.memory_peak_bytes = rp.state().allocated_bytes() + 1000;  // no prefill fits, even cold
    rp.set_options(tight);
    for (const char* session : {"a", "b"}) {  // a would pin, b would park
      auto refused = rp.Generate({Tokens(61, 200, vocab_), session, 3}, greedy, nullptr);
      QVERIFY(!refused.ok());
      QCOMPARE(refused.status().code(), StatusCode::kResourceExhausted);
    }
    const auto after = ToJson(rp.Stats());
    QVERIFY(rp.rows() == rows);
    QCOMPARE(rp.state().length(), length);
    for (const char* tier : {"anchors", "end", "stash", "pin", "park", "store"})
      QVERIFY2(after[tier]["entries"] == before[tier]["entries"] && after[tier]["bytes"] == before[tier]["bytes"], tier);
    QCOMPARE(after["anchors"]["lengths"], before["anchors"]["lengths"]);
    QCOMPARE(after["memory"]["refused"].get<int>(), 2);
  }

  // Prewarm brings a parked end into place, and the next request resumes exactly where prewarm said.
  void prewarmAnswersWhatTheNextRequestGets() {
    ResidentPrefix rp(*forward1_, &model_->tokenizer, ResidentOptions{});
    const SamplingParams greedy = Greedy(6);
    const auto a = Tokens(70, 200, vocab_);
    auto first = rp.Generate({a, "a", 6}, greedy, nullptr);
    QVERIFY(first.ok());
    QVERIFY(rp.Generate({Concat(Head(a, 64), Tokens(71, 150, vocab_)), "b", 6}, greedy, nullptr).ok());
    QCOMPARE(rp.Stats().park.session, std::string("a"));
    const auto follow = Concat(Concat(a, first->generation.tokens), Tokens(72, 20, vocab_));
    auto warmed = rp.Prewarm({follow, "a", 6});
    QVERIFY(warmed.ok());
    QCOMPARE(warmed->source, CacheSource::kEnd);
    const ResumeInfo peek = rp.Peek({follow, "a", 6});
    QCOMPARE(peek.source, CacheSource::kEnd);
    QCOMPARE(peek.cached_tokens, warmed->cached_tokens);
    auto served = rp.Generate({follow, "a", 6}, greedy, nullptr);
    QVERIFY(served.ok());
    QCOMPARE(served->resume.source, CacheSource::kEnd);
    QCOMPARE(served->resume.cached_tokens, warmed->cached_tokens);
  }

  // Cutting the same session's rows again with the same head does not copy the pin again.
  void pinOncePerHead() {
    ResidentPrefix rp(*forward1_, &model_->tokenizer, ResidentOptions{});
    ResumeInfo info;
    const auto x = Tokens(80, 300, vocab_);
    const auto y = Tokens(81, 300, vocab_);
    QVERIFY(rp.Prefill({x, "s", 0}).ok());
    QVERIFY(rp.Prefill({y, "s", 0}).ok());  // a compaction: the head of x is pinned
    QCOMPARE(int(rp.Stats().pin.pins), 1);
    QVERIFY(rp.Prefill({Concat(x, Tokens(82, 3, vocab_)), "s", 0}, &info).ok());  // back to x, from the pin
    QCOMPARE(info.source, CacheSource::kPin);
    QVERIFY(rp.Prefill({y, "s", 0}).ok());  // the same compaction again: x's head is pinned already
    QCOMPARE(int(rp.Stats().pin.pins), 1);
    QVERIFY(rp.Prefill({Concat(x, Tokens(83, 3, vocab_)), "s", 0}, &info).ok());
    QCOMPARE(info.source, CacheSource::kPin);
  }

  // The context check counts the prompt as served: end alignment serves the rows' own tokens, which
  // can be more than the client's copy.
  void contextCountsTheServedPrompt() {
    ResidentPrefix rp(*forward2_, &model_->tokenizer, ResidentOptions{});
    const std::string turn1 = "<|im_start|>user\nWhat is a grid line?<|im_end|>\n<|im_start|>assistant\n<think>\n";
    auto prompt = model_->tokenizer.Encode(turn1);
    auto reply = model_->tokenizer.Encode("Think about chunks for a while, then answer.\n</think>\n\nA grid line is a chunk boundary.<|im_end|>");
    QVERIFY(prompt.ok() && reply.ok());
    const SamplingParams forced = testing::ForcedReply(model_->tokenizer, *reply);
    QVERIFY(rp.Generate({*prompt, "", 64}, forced, nullptr).ok());
    auto copy = model_->tokenizer.Encode("<|im_start|>user\nWhat is a grid line?<|im_end|>\n<|im_start|>assistant\nA grid line is a chunk boundary.<|im_end|>\n<|im_start|>user\nAnd a row?<|im_end|>\n<|im_start|>assistant\n");
    QVERIFY(copy.ok());
    const ResumeInfo peek = rp.Peek({*copy, "", 8});
    QVERIFY(peek.aligned);
    const int64_t served = static_cast<int64_t>(peek.served_prompt.size());
    QVERIFY(served > static_cast<int64_t>(copy->size()));
    const SamplingParams greedy = Greedy(8);
    auto refused = rp.Generate({*copy, "", 8, served}, greedy, nullptr);
    QVERIFY(!refused.ok());
    QCOMPARE(refused.status().code(), StatusCode::kOutOfRange);
    QCOMPARE(rp.Peek({*copy, "", 8}).source, CacheSource::kEnd);  // the refusal changed nothing
    auto fitted = rp.Generate({*copy, "", 8, served + 2}, greedy, nullptr);
    QVERIFY(fitted.ok());
    QVERIFY(fitted->generation.tokens.size() <= 2);
  }

  // Clients without a session id: a rewrite inside the newest user message (Qwen Code's date
  // reminder) is the same conversation and neither pins nor parks; another conversation parks.
  // A short side request of the resident session (opencode's title request) is a guest.
  void conversationsWithoutASessionId() {
    ResidentPrefix rp(*forward1_, &model_->tokenizer, ResidentOptions{});
    auto ids = [&](const std::string& text) {
      auto r = model_->tokenizer.Encode(text);
      return r.ok() ? *r : std::vector<int32_t>{};
    };
    std::string system = "<|im_start|>system\nYou are a coding agent. Tools: read, write, run.";
    for (int i = 0; i < 40; ++i) system += " Rule " + std::to_string(i) + ": keep the tests green.";
    system += "<|im_end|>\n";
    std::string history = system + "<|im_start|>user\nFix the build.<|im_end|>\n<|im_start|>assistant\nI read the log and patch the file.<|im_end|>\n";
    auto turn = [&](const std::string& date) {
      return ids(history + "<|im_start|>user\n<reminder>Today is " + date + ".</reminder> Now run the tests.<|im_end|>\n<|im_start|>assistant\n");
    };
    const SamplingParams greedy = Greedy(3);
    QVERIFY(rp.Generate({turn("Monday"), "", 3}, greedy, nullptr).ok());
    auto edited = rp.Generate({turn("Tuesday"), "", 3}, greedy, nullptr);
    QVERIFY(edited.ok());
    QVERIFY(!edited->resume.guest);
    auto stats = rp.Stats();
    QCOMPARE(int(stats.park.entries), 0);
    QCOMPARE(int(stats.pin.pins), 0);
    QVERIFY(edited->resume.cached_tokens >= static_cast<int64_t>(ids(system).size()) / kGrid * kGrid);

    auto other = rp.Generate({ids(system + "<|im_start|>user\nWrite a poem about grids.<|im_end|>\n<|im_start|>assistant\n"), "", 3}, greedy, nullptr);
    QVERIFY(other.ok());
    QCOMPARE(int(rp.Stats().park.entries), 1);

    ResidentPrefix tagged(*forward1_, &model_->tokenizer, ResidentOptions{});
    const auto conversation = turn("Monday");
    auto first = tagged.Generate({conversation, "ses-1", 3}, greedy, nullptr);
    QVERIFY(first.ok());
    std::string ask = "<|im_start|>system\nYou write short titles.";
    for (int i = 0; i < 22; ++i) ask += " Title rule " + std::to_string(i) + ".";
    const auto title = ids(ask + "<|im_end|>\n<|im_start|>user\nGenerate a title for: fix the build.<|im_end|>\n<|im_start|>assistant\n");
    // Too long for the quarter rule, short enough for the side-request rule.
    QVERIFY2(4 * title.size() >= conversation.size() && 2 * title.size() < conversation.size(),
             (std::to_string(title.size()) + " of " + std::to_string(conversation.size())).c_str());
    auto titled = tagged.Generate({title, "ses-1", 3}, greedy, nullptr);
    QVERIFY(titled.ok());
    QVERIFY(titled->resume.guest);
    QCOMPARE(int(tagged.Stats().pin.pins), 0);
    QCOMPARE(int(tagged.Stats().park.entries), 0);
    const auto follow = Concat(Concat(conversation, first->generation.tokens), ids("<|im_end|>\n<|im_start|>user\nThanks.<|im_end|>\n<|im_start|>assistant\n"));
    auto back = tagged.Generate({follow, "ses-1", 3}, greedy, nullptr);
    QVERIFY(back.ok());
    QCOMPARE(back->resume.source, CacheSource::kEnd);
  }

  // End alignment on the real Qwen3.5 template, for three copies real clients send back. Each
  // resumes at the end anchor and is served the rows' own tokens up to it.
  void endAlignmentOfRealClientCopies_data() {
    QTest::addColumn<QString>("reply");          // what the engine generated (forced), as text
    QTest::addColumn<bool>("split_bytes");       // force the reply a byte token at a time (not canonical BPE)
    QTest::addColumn<bool>("cut_utf8");          // end the reply one byte into a two-byte character
    QTest::addColumn<QString>("reasoning_sent");  // reasoning_content of the copy
    QTest::addColumn<QString>("content_sent");    // content of the copy
    QTest::newRow("same text, other tokens") << "\n</think>\n\nHello grid." << true << false << "" << "Hello grid.";
    QTest::newRow("held-back UTF-8") << "\n</think>\n\nCaf" << false << true << "" << "Caf";
    QTest::newRow("U+FFFD for the cut character") << "\n</think>\n\nCaf" << false << true << "" << "Caf\xEF\xBF\xBD";
  }

  void endAlignmentOfRealClientCopies() {
    QFETCH(QString, reply);
    QFETCH(bool, split_bytes);
    QFETCH(bool, cut_utf8);
    QFETCH(QString, reasoning_sent);
    QFETCH(QString, content_sent);
    using ojson = nlohmann::ordered_json;
    ResidentPrefix rp(*forward2_, &model_->tokenizer, ResidentOptions{});
    ojson first_turn = {{"messages", ojson::array({{{"role", "user"}, {"content", "What is a grid line?"}}})}};
    auto prompt_text = model_->chat_template.RenderChatBody(first_turn);
    QVERIFY(prompt_text.ok());
    auto prompt = model_->tokenizer.Encode(*prompt_text);
    QVERIFY(prompt.ok());
    std::vector<int32_t> forced;
    const std::string reply_text = reply.toStdString();
    if (split_bytes) {
      const std::string head = "\n</think>\n\n";
      forced = *model_->tokenizer.Encode(head);
      for (char c : reply_text.substr(head.size())) {
        auto byte = model_->tokenizer.Encode(std::string(1, c));
        QVERIFY(byte.ok() && byte->size() == 1);
        forced.push_back((*byte)[0]);
      }
    } else {
      forced = *model_->tokenizer.Encode(reply_text);
    }
    if (cut_utf8) {
      auto lead = model_->tokenizer.TokenId("\xC3\x83");  // the byte-level symbol of byte 0xC3
      QVERIFY(lead.has_value());
      forced.push_back(*lead);
    }
    SamplingParams params;
    params.temperature = 0;
    params.forced_ids = forced;
    params.max_tokens = static_cast<int64_t>(forced.size()) + 1;  // one more: every forced token is forwarded
    auto first = rp.Generate({*prompt, "", 64}, params, nullptr);
    QVERIFY(first.ok());
    const std::vector<int32_t> rows = rp.rows();
    QVERIFY(rows.size() >= prompt->size() + forced.size());

    ojson assistant = {{"role", "assistant"}, {"content", content_sent.toStdString()}};
    if (!reasoning_sent.isEmpty()) assistant["reasoning_content"] = reasoning_sent.toStdString();
    ojson copy_body = {{"messages", ojson::array({first_turn["messages"][0], assistant, {{"role", "user"}, {"content", "And a row?"}}})}};
    auto copy_text = model_->chat_template.RenderChatBody(copy_body);
    QVERIFY(copy_text.ok());
    auto copy = model_->tokenizer.Encode(*copy_text);
    QVERIFY(copy.ok());
    const ResumeInfo info = rp.Peek({*copy, "", 16});
    QVERIFY2(info.source == CacheSource::kEnd, CacheSourceName(info.source));
    QCOMPARE(info.cached_tokens, static_cast<int64_t>(rows.size()));
    QVERIFY(info.aligned);
    QVERIFY(std::equal(rows.begin(), rows.end(), info.served_prompt.begin()));
    const std::string tail = model_->tokenizer.Decode(std::vector<int32_t>(info.served_prompt.begin() + static_cast<long>(rows.size()), info.served_prompt.end()));
    QVERIFY2(tail.find("<|im_start|>user\nAnd a row?<|im_end|>") != std::string::npos, tail.c_str());
    // The reasoning pass is a setting: without it the cut reasoning is not served from the end.
    if (!reasoning_sent.isEmpty()) {
      ResidentOptions strict = rp.options();
      strict.end_align_reasoning = false;
      rp.set_options(strict);
      QVERIFY(rp.Peek({*copy, "", 16}).source != CacheSource::kEnd);
    }
  }

  // A reply cut by max_tokens inside its reasoning: a copy that leaves the unclosed block out is not
  // served the rows (no template renders an unclosed block in an earlier turn); it resumes below
  // the reply with a cold prefill's bits.
  void aCutReasoningIsNotServedToACopyWithoutIt() {
    using ojson = nlohmann::ordered_json;
    ResidentPrefix rp(*forward2_, &model_->tokenizer, ResidentOptions{});
    ojson first_turn = {{"messages", ojson::array({{{"role", "user"}, {"content", "What is a grid line?"}}})}};
    auto prompt = model_->tokenizer.Encode(*model_->chat_template.RenderChatBody(first_turn));
    QVERIFY(prompt.ok());
    SamplingParams params;
    params.temperature = 0;
    params.forced_ids = *model_->tokenizer.Encode("I think about chunks and");
    params.max_tokens = static_cast<int64_t>(params.forced_ids.size()) + 1;
    QVERIFY(rp.Generate({*prompt, "", 64}, params, nullptr).ok());
    for (const bool sent : {false, true}) {
      ojson assistant = {{"role", "assistant"}, {"content", ""}};
      if (sent) assistant["reasoning_content"] = "I think about chunks and";
      ojson copy_body = {{"messages", ojson::array({first_turn["messages"][0], assistant, {{"role", "user"}, {"content", "And a row?"}}})}};
      auto copy = model_->tokenizer.Encode(*model_->chat_template.RenderChatBody(copy_body));
      QVERIFY(copy.ok());
      const ResumeInfo peek = rp.Peek({*copy, "", 16});
      QVERIFY2(peek.source != CacheSource::kEnd && !peek.aligned, CacheSourceName(peek.source));
      QVERIFY(peek.served_prompt == *copy);
    }
    ojson copy_body = {{"messages", ojson::array({first_turn["messages"][0], {{"role", "assistant"}, {"content", ""}}, {{"role", "user"}, {"content", "And a row?"}}})}};
    const std::vector<int32_t> copy = *model_->tokenizer.Encode(*model_->chat_template.RenderChatBody(copy_body));
    ResumeInfo info;
    auto logits = rp.Prefill({copy, "", 0}, &info);
    QVERIFY(logits.ok());
    ExpectColdEqual(*forward2_, rp, *logits, copy);
  }

  void budgetEvictionKeepsTheNewestFourAndClearServesCold() {
    ResidentOptions o;
    SequenceState probe(model_->config);
    o.anchor_budget_bytes = probe.anchor_bytes() * 2;  // room for two, but four are protected
    ResidentPrefix rp(*forward1_, &model_->tokenizer, o);
    const auto a = Tokens(30, 520, vocab_);
    auto l = rp.Prefill({a, "", 0});
    QVERIFY(l.ok());
    QCOMPARE(rp.anchors().lengths(), (std::vector<int64_t>{320, 384, 448, 512}));
    QVERIFY(rp.anchors().evictions() >= 4);
    ResumeInfo info;
    const auto b = Concat(Head(a, 500), Tokens(31, 10, vocab_));
    l = rp.Prefill({b, "", 0}, &info);
    QVERIFY(l.ok());
    QCOMPARE(info.cached_tokens, int64_t(448));
    ExpectColdEqual(*forward1_, rp, *l, b);

    // Clearing the anchors leaves the state store's prefix snapshot; clearing everything serves cold.
    QVERIFY(rp.Clear("anchors").ok());
    QCOMPARE(rp.anchors().size(), size_t(0));
    l = rp.Prefill({b, "", 0}, &info);
    QVERIFY(l.ok());
    QCOMPARE(info.source, CacheSource::kStore);
    ExpectColdEqual(*forward1_, rp, *l, b);
    QVERIFY(rp.Clear("all").ok());
    QCOMPARE(rp.anchors().size(), size_t(0));
    l = rp.Prefill({b, "", 0}, &info);
    QVERIFY(l.ok());
    QCOMPARE(info.source, CacheSource::kCold);
    ExpectColdEqual(*forward1_, rp, *l, b);
    QVERIFY(!rp.Clear("bogus").ok());
  }
};

QTEST_APPLESS_MAIN(TestResident)
#include "test_resident.moc"
