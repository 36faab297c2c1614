// Speculative decoding on the tiny model: a draft window's rows give Decode's logits bit for bit,
// and keeping 1, 2, 7, 8, 9 or 24 of its rows leaves the state bit-equal to that many decode steps;
// greedy generation with lookup drafts writes the same tokens and leaves the same state as plain
// greedy decoding, with drafts all accepted, none, or partly, and when a stop ends a window; sampled
// generation with drafts picks the same tokens as without, seed for seed; the lookup drafter
// proposes what followed the newest earlier match. The MTP head's logits match a double-precision
// reading of qwen35-model.md section 9 on the checkpoint's tensors, its K/V rows do not depend on
// how the prompt was split into calls, and its drafts (alone or after lookup) leave tokens and
// state as plain decoding. Several states' windows and decodes in one forward give each its own bits.
#include <QTemporaryDir>
#include <QtTest>

#include <cmath>
#include <cstring>

#include "engine/runtime/forward.h"
#include "engine/runtime/generator.h"
#include "engine/runtime/lookup_drafter.h"
#include "tests/engine/test_runtime_util.h"

using namespace anchorage;

namespace {

bool SameBits(const float* a, const float* b, int64_t n) { return std::memcmp(a, b, static_cast<size_t>(n) * sizeof(float)) == 0; }

using Vec = std::vector<double>;

Vec RmsNorm(const Vec& x, const TensorView& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * (1.0 + w.At(static_cast<int64_t>(i)));
  return y;
}

// y = W x for W [rows, x.size()] row-major.
Vec Linear(const TensorView& w, const Vec& x, int64_t rows) {
  const int64_t cols = static_cast<int64_t>(x.size());
  Vec y(static_cast<size_t>(rows), 0.0);
  for (int64_t j = 0; j < rows; ++j)
    for (int64_t i = 0; i < cols; ++i) y[j] += static_cast<double>(w.At(j * cols + i)) * x[i];
  return y;
}

void Rope(double* v, int64_t rot, double theta, int64_t pos) {
  const int64_t half = rot / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double angle = static_cast<double>(pos) * std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(rot));
    const double x0 = v[i], x1 = v[i + half];
    v[i] = x0 * std::cos(angle) - x1 * std::sin(angle);
    v[i + half] = x1 * std::cos(angle) + x0 * std::sin(angle);
  }
}

// The MTP block in double from the tensors: row p reads (hidden[p], ids[p]) at position p.
// Returns the last row's output after mtp.norm (*out) and its logits.
Vec ReferenceMtp(const ModelConfig& c, const ModelWeights& w, const std::vector<Vec>& hidden, const std::vector<int32_t>& ids, Vec* out) {
  const MtpWeights& m = *w.mtp;
  const LayerWeights& L = m.layer;
  const int64_t H = c.hidden_size, Nh = c.num_attention_heads, Nkv = c.num_key_value_heads, hd = c.head_dim;
  const double eps = c.rms_norm_eps;
  std::vector<Vec> keys, values;
  Vec u;
  for (size_t p = 0; p < ids.size(); ++p) {
    Vec e(static_cast<size_t>(H));
    for (int64_t i = 0; i < H; ++i) e[i] = w.embed_tokens.At(ids[p] * H + i);
    Vec cat = RmsNorm(e, m.pre_fc_norm_embedding, eps);
    const Vec h = RmsNorm(hidden[p], m.pre_fc_norm_hidden, eps);
    cat.insert(cat.end(), h.begin(), h.end());
    u = Linear(m.fc, cat, H);
    const Vec a = RmsNorm(u, L.input_layernorm, eps);
    Vec q = Linear(L.attn.q_proj, a, 2 * Nh * hd), k = Linear(L.attn.k_proj, a, Nkv * hd), v = Linear(L.attn.v_proj, a, Nkv * hd);
    auto norm_head = [&](double* x, const TensorView& nw) {
      Vec row(x, x + hd);
      row = RmsNorm(row, nw, eps);
      std::copy(row.begin(), row.end(), x);
      Rope(x, c.rotary_dim(), c.rope_theta, static_cast<int64_t>(p));
    };
    for (int64_t g = 0; g < Nh; ++g) norm_head(q.data() + g * 2 * hd, L.attn.q_norm);
    for (int64_t g = 0; g < Nkv; ++g) norm_head(k.data() + g * hd, L.attn.k_norm);
    keys.push_back(k);
    values.push_back(v);
    Vec attn(static_cast<size_t>(Nh * hd), 0.0);
    for (int64_t g = 0; g < Nh; ++g) {
      const int64_t kv = g / (Nh / Nkv);
      Vec score;
      double top = -1e300, sum = 0;
      for (const Vec& key : keys) {
        double d = 0;
        for (int64_t i = 0; i < hd; ++i) d += q[g * 2 * hd + i] * key[kv * hd + i];
        score.push_back(d / std::sqrt(static_cast<double>(hd)));
        top = std::max(top, score.back());
      }
      for (double& sc : score) sum += (sc = std::exp(sc - top));
      for (size_t j = 0; j < keys.size(); ++j)
        for (int64_t i = 0; i < hd; ++i) attn[g * hd + i] += score[j] / sum * values[j][kv * hd + i];
      for (int64_t i = 0; i < hd; ++i) attn[g * hd + i] /= 1.0 + std::exp(-q[g * 2 * hd + hd + i]);
    }
    const Vec o = Linear(L.attn.o_proj, attn, H);
    for (int64_t i = 0; i < H; ++i) u[i] += o[i];
    const Vec a2 = RmsNorm(u, L.post_attention_layernorm, eps);
    Vec gate = Linear(L.gate_proj, a2, c.intermediate_size);
    const Vec up = Linear(L.up_proj, a2, c.intermediate_size);
    for (size_t i = 0; i < gate.size(); ++i) gate[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
    const Vec down = Linear(L.down_proj, gate, H);
    for (int64_t i = 0; i < H; ++i) u[i] += down[i];
  }
  *out = RmsNorm(u, m.norm, eps);
  return Linear(w.lm_head, *out, c.vocab_size);
}

double MaxRelativeError(const float* got, const Vec& want) {
  double scale = 1e-6, err = 0;
  for (double v : want) scale = std::max(scale, std::abs(v));
  for (size_t i = 0; i < want.size(); ++i) err = std::max(err, std::abs(got[i] - want[i]));
  return err / scale;
}

SamplingParams Greedy(int64_t n) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = n;
  return p;
}

// The forward, with every draft window refused for want of room (as a device without room for a
// state's draft log refuses one).
class NoRoomForWindows final : public ComputeBackend {
 public:
  explicit NoRoomForWindows(Forward& f) : f_(f) {}
  const char* device_name() const override { return f_.device_name(); }
  std::string DeviceDescription() const override { return f_.DeviceDescription(); }
  std::string WeightsDescription() const override { return f_.WeightsDescription(); }
  int64_t WeightBytes() const override { return f_.WeightBytes(); }
  const ModelConfig& config() const override { return f_.config(); }
  int64_t grid_tokens() const override { return f_.grid_tokens(); }
  int threads() const override { return f_.threads(); }
  std::string StateKey(const std::string& model_fingerprint) const override { return f_.StateKey(model_fingerprint); }
  Result<std::vector<float>> Prefill(SequenceState& s, std::span<const int32_t> ids, LogitsRows rows, MtpState* mtp) override {
    return f_.Prefill(s, ids, rows, mtp);
  }
  Result<std::vector<float>> Decode(SequenceState& s, int32_t id, MtpState* mtp) override { return f_.Decode(s, id, mtp); }
  Result<std::vector<float>> ForkLastLogits(const SequenceState& s, std::span<const int32_t> ids) override { return f_.ForkLastLogits(s, ids); }
  int64_t PrefillWorkspaceBytes(int64_t chunk_tokens) const override { return f_.PrefillWorkspaceBytes(chunk_tokens); }
  bool has_draft_windows() const override { return true; }
  Result<std::vector<float>> DraftWindow(SequenceState&, std::span<const int32_t>, MtpState*) override {
    ++refused;
    return ResourceExhausted("no room for a draft window's log");
  }
  int refused = 0;

 private:
  Forward& f_;
};

}  // namespace

class TestSpeculative : public QObject {
  Q_OBJECT
  QTemporaryDir dir_;
  std::unique_ptr<testing::LoadedWeights> model_;
  std::unique_ptr<Forward> forward_;
  int64_t vocab_ = 0;

  std::unique_ptr<SequenceState> Prefilled(const std::vector<int32_t>& prompt) {
    auto s = std::make_unique<SequenceState>(model_->config);
    if (!forward_->Prefill(*s, prompt).ok()) return nullptr;
    return s;
  }
  // Generates with and without drafts from the same prefilled prompt; both must agree in every bit.
  void CompareWithPlain(const std::vector<int32_t>& prompt, SamplingParams params, int max_draft, GenerationResult* drafted_out = nullptr,
                        bool lookup = true, bool mtp = false) {
    Generator generator(*forward_, nullptr);
    auto plain_state = Prefilled(std::vector<int32_t>(prompt.begin(), prompt.end() - 1));
    auto draft_state = Prefilled(std::vector<int32_t>(prompt.begin(), prompt.end() - 1));
    const std::vector<int32_t> last(prompt.end() - 1, prompt.end());
    auto plain = generator.Generate(*plain_state, last, params, nullptr);
    SpeculativeOptions spec;
    spec.max_draft = max_draft;
    spec.lookup = lookup;
    spec.mtp = mtp;
    spec.history = std::span(prompt).first(prompt.size() - 1);
    auto drafted = generator.Generate(*draft_state, last, params, nullptr, nullptr, spec);
    QVERIFY(plain.ok() && drafted.ok());
    QCOMPARE(drafted->tokens, plain->tokens);
    QCOMPARE(static_cast<int>(drafted->finish), static_cast<int>(plain->finish));
    QVERIFY(draft_state->BitEqual(*plain_state));
    QCOMPARE(plain->drafted_tokens, int64_t{0});
    if (drafted_out != nullptr) *drafted_out = *drafted;
  }

 private slots:
  void initTestCase() {
    auto m = testing::MakeModel(TinyModelSize::kTiny, 17, dir_.path().toStdString());
    QVERIFY(m.ok());
    model_ = std::move(m).value();
    auto f = Forward::Create(model_->config, model_->weights, ForwardOptions{64, 2});
    QVERIFY(f.ok());
    forward_ = std::move(f).value();
    vocab_ = model_->config.vocab_size;
  }

  void windowRowsAreDecodeSteps_data() {
    QTest::addColumn<int>("kept");
    for (int k : {1, 2, 7, 8, 9, 24}) QTest::newRow(std::to_string(k).c_str()) << k;
  }
  void windowRowsAreDecodeSteps() {
    QFETCH(int, kept);
    const std::vector<int32_t> prompt = testing::RandomIds(150, vocab_, 3);
    const std::vector<int32_t> ids = testing::RandomIds(25, vocab_, 4);
    auto stepped = Prefilled(prompt);
    auto windowed = Prefilled(prompt);
    std::vector<std::vector<float>> step_logits;
    for (int i = 0; i < 25; ++i) {
      auto l = forward_->Decode(*stepped, ids[static_cast<size_t>(i)]);
      QVERIFY(l.ok());
      step_logits.push_back(*l);
    }
    auto window = forward_->DraftWindow(*windowed, ids);
    QVERIFY(window.ok());
    for (int i = 0; i < 25; ++i) QVERIFY2(SameBits(window->data() + i * vocab_, step_logits[static_cast<size_t>(i)].data(), vocab_), ("row " + std::to_string(i)).c_str());
    QVERIFY(forward_->KeepDraft(*windowed, kept).ok());
    auto reference = Prefilled(prompt);
    for (int i = 0; i < kept; ++i) QVERIFY(forward_->Decode(*reference, ids[static_cast<size_t>(i)]).ok());
    QVERIFY(windowed->BitEqual(*reference));
    QVERIFY(!forward_->KeepDraft(*windowed, 1).ok());  // the window is closed
    // The next step continues as decoding would.
    auto after_window = forward_->Decode(*windowed, 5);
    auto after_steps = forward_->Decode(*reference, 5);
    QVERIFY(SameBits(after_window->data(), after_steps->data(), vocab_));
  }

  // Windows of three states and a plain decode of a fourth in one forward: every row the bits of its
  // state's own DraftWindow (so Decode's), and each window kept on its own (in any order, the others
  // still open) leaves its state bit-equal to that many decode steps; a bad id anywhere changes nothing.
  void windowsOfSeveralStatesInOneForward() {
    const std::vector<std::vector<int32_t>> prompts = {testing::RandomIds(150, vocab_, 5), testing::RandomIds(70, vocab_, 6),
                                                       testing::RandomIds(64, vocab_, 7), testing::RandomIds(9, vocab_, 8)};
    const std::vector<std::vector<int32_t>> rows = {testing::RandomIds(6, vocab_, 9), {11}, testing::RandomIds(3, vocab_, 10),
                                                    testing::RandomIds(9, vocab_, 12)};
    const std::vector<int> kept = {4, 1, 3, 1};
    std::vector<std::unique_ptr<SequenceState>> batched, alone;
    std::vector<SequenceState*> states;
    for (const auto& prompt : prompts) {
      batched.push_back(Prefilled(prompt));
      alone.push_back(Prefilled(prompt));
      states.push_back(batched.back().get());
    }
    std::vector<std::vector<int32_t>> bad = rows;
    bad[2][1] = static_cast<int32_t>(vocab_);
    QVERIFY(!forward_->DecodeWindowsBatch(states, bad).ok());
    for (size_t i = 0; i < states.size(); ++i) QVERIFY(states[i]->BitEqual(*alone[i]));
    auto logits = forward_->DecodeWindowsBatch(states, rows);
    QVERIFY2(logits.ok(), logits.status().ToString().c_str());
    int64_t row = 0;
    for (size_t i = 0; i < states.size(); ++i) {
      auto own = rows[i].size() == 1 ? forward_->Decode(*alone[i], rows[i][0]) : forward_->DraftWindow(*alone[i], rows[i]);
      QVERIFY(own.ok());
      for (size_t r = 0; r < rows[i].size(); ++r, ++row)
        QVERIFY2(SameBits(logits->data() + row * vocab_, own->data() + r * vocab_, vocab_), ("state " + std::to_string(i) + " row " + std::to_string(r)).c_str());
    }
    for (size_t i : {3, 0, 2}) {  // the decoded state (1) has no window to keep
      QVERIFY(forward_->KeepDraft(*states[i], kept[i]).ok());
      QVERIFY(forward_->KeepDraft(*alone[i], kept[i]).ok());
      QVERIFY2(states[i]->BitEqual(*alone[i]), ("state " + std::to_string(i)).c_str());
    }
    QVERIFY(!forward_->KeepDraft(*states[1], 1).ok());
    QVERIFY(states[1]->BitEqual(*alone[1]));
  }

  // A window refused for want of room leaves the generation going on without drafts: plain greedy's
  // tokens and state, one window tried.
  void aWindowWithoutRoomGoesOnWithoutDrafts() {
    std::vector<int32_t> block = testing::RandomIds(40, vocab_, 7), prompt;
    for (int i = 0; i < 4; ++i) prompt.insert(prompt.end(), block.begin(), block.end());
    NoRoomForWindows refusing(*forward_);
    auto plain_state = Prefilled(std::vector<int32_t>(prompt.begin(), prompt.end() - 1));
    auto tried_state = Prefilled(std::vector<int32_t>(prompt.begin(), prompt.end() - 1));
    const std::vector<int32_t> last(prompt.end() - 1, prompt.end());
    auto plain = Generator(*forward_, nullptr).Generate(*plain_state, last, Greedy(40), nullptr);
    SpeculativeOptions spec;
    spec.max_draft = 6;
    spec.lookup = true;
    spec.history = std::span(prompt).first(prompt.size() - 1);
    auto tried = Generator(refusing, nullptr).Generate(*tried_state, last, Greedy(40), nullptr, nullptr, spec);
    QVERIFY2(tried.ok(), tried.status().ToString().c_str());
    QVERIFY(plain.ok());
    QCOMPARE(tried->tokens, plain->tokens);
    QVERIFY(tried_state->BitEqual(*plain_state));
    QCOMPARE(refusing.refused, 1);
    QCOMPARE(tried->drafted_tokens, int64_t{0});
  }

  void lookupProposesWhatFollowed() {
    const std::vector<int32_t> ids = {1, 2, 3, 4, 9, 9, 1, 2, 3, 5, 6, 7, 1, 2, 3};
    QCOMPARE(LookupDraft(ids, 3), (std::vector<int32_t>{5, 6, 7}));  // the newest match of 1 2 3
    QCOMPARE(LookupDraft(ids, 10), (std::vector<int32_t>{5, 6, 7, 1, 2, 3}));
    QVERIFY(LookupDraft(std::vector<int32_t>{1, 2, 3, 4}, 4).empty());
    QVERIFY(LookupDraft(ids, 0).empty());
  }

  void greedyWithDraftsIsPlainGreedy() {
    GenerationResult r;
    // A prompt that repeats itself: the drafts find the copies.
    std::vector<int32_t> block = testing::RandomIds(40, vocab_, 7), prompt;
    for (int i = 0; i < 4; ++i) prompt.insert(prompt.end(), block.begin(), block.end());
    CompareWithPlain(prompt, Greedy(80), 6, &r);
    QVERIFY(r.drafted_tokens > 0);
    for (uint32_t seed : {11u, 12u, 13u}) CompareWithPlain(testing::RandomIds(200, vocab_, seed), Greedy(60), 4);
  }

  void forcedCopiesAreAcceptedWhole() {
    std::vector<int32_t> block = testing::RandomIds(30, vocab_, 21);
    std::vector<int32_t> prompt = block;
    prompt.insert(prompt.end(), block.begin(), block.begin() + 5);
    SamplingParams p = Greedy(24);
    p.forced_ids.assign(block.begin() + 5, block.begin() + 29);  // the reply repeats the prompt: every draft is right
    GenerationResult all;
    CompareWithPlain(prompt, p, 8, &all);
    QCOMPARE(all.tokens, p.forced_ids);
    QVERIFY(all.drafted_tokens >= 16);
    QCOMPARE(all.accepted_tokens, all.drafted_tokens);
    // Wrong drafts: the reply's first id continues the copy (a window opens), its second parts from it.
    SamplingParams wrong = p;
    wrong.max_tokens = 3;
    wrong.forced_ids = {block[5], static_cast<int32_t>((block[6] + 1) % vocab_), block[0]};
    GenerationResult none;
    CompareWithPlain(prompt, wrong, 8, &none);
    QVERIFY(none.drafted_tokens > 0);
    QCOMPARE(none.accepted_tokens, int64_t{0});
    // Partly right: the copy, then other ids from its middle on.
    SamplingParams partly = p;
    for (size_t i = 10; i < partly.forced_ids.size(); ++i) partly.forced_ids[i] = (partly.forced_ids[i] + 3) % static_cast<int32_t>(vocab_);
    GenerationResult some;
    CompareWithPlain(prompt, partly, 8, &some);
    QVERIFY(some.accepted_tokens > 0 && some.accepted_tokens < some.drafted_tokens);
    // A stop inside a window ends it where plain decoding would stop.
    SamplingParams stop = p;
    stop.stop_token_ids = {p.forced_ids[9]};
    GenerationResult stopped;
    CompareWithPlain(prompt, stop, 8, &stopped);
    QCOMPARE(stopped.finish, FinishReason::kStop);
  }

  void sampledWithDraftsIsPlainSampling() {
    std::vector<int32_t> block = testing::RandomIds(40, vocab_, 9), prompt;
    for (int i = 0; i < 3; ++i) prompt.insert(prompt.end(), block.begin(), block.end());
    int64_t drafted = 0, accepted = 0;
    for (uint64_t seed : {1u, 2u, 3u, 4u, 5u}) {
      for (float temperature : {0.3f, 1.0f}) {
        SamplingParams p = Greedy(60);
        p.temperature = temperature;
        p.seed = seed;
        p.top_p = 0.9f;
        GenerationResult r;
        CompareWithPlain(prompt, p, 6, &r);
        drafted += r.drafted_tokens;
        accepted += r.accepted_tokens;
      }
    }
    QVERIFY2(drafted > 0 && accepted > 0, (std::to_string(drafted) + " drafted, " + std::to_string(accepted) + " accepted").c_str());
  }

  void mtpHeadMatchesReference() {
    QVERIFY(forward_->has_mtp());
    const std::vector<int32_t> x = testing::RandomIds(4, vocab_, 31);
    // The trunk's final-normed hidden rows at positions 0, 1 and 2, each the last row of a prefill.
    std::vector<Vec> hidden;
    MtpState mtp;
    for (size_t n = 1; n <= 3; ++n) {
      SequenceState s(model_->config);
      mtp = MtpState{};
      QVERIFY(forward_->Prefill(s, std::span(x).first(n), LogitsRows::kLast, &mtp).ok());
      QCOMPARE(mtp.pending_rows, int64_t{1});
      QCOMPARE(mtp.rows, static_cast<int64_t>(n - 1));
      hidden.emplace_back(mtp.pending.begin(), mtp.pending.end());
    }
    std::vector<float> logits;
    auto drafts = forward_->MtpDraft(mtp, std::span(x).subspan(3, 1), 2, vocab_, &logits);
    QVERIFY(drafts.ok());
    QCOMPARE(drafts->size(), size_t{2});
    Vec out;
    const Vec first = ReferenceMtp(model_->config, model_->weights, hidden, {x[1], x[2], x[3]}, &out);
    hidden.push_back(out);  // the second draft reads the head's own output and the first draft
    const Vec second = ReferenceMtp(model_->config, model_->weights, hidden, {x[1], x[2], x[3], (*drafts)[0]}, &out);
    const double e1 = MaxRelativeError(logits.data(), first), e2 = MaxRelativeError(logits.data() + vocab_, second);
    QVERIFY2(e1 < 1e-4 && e2 < 1e-4, (std::to_string(e1) + " and " + std::to_string(e2)).c_str());
    QCOMPARE((*drafts)[0], static_cast<int32_t>(std::max_element(first.begin(), first.end()) - first.begin()));
  }

  void mtpRowsDoNotDependOnTheCallSplit() {
    const std::vector<int32_t> prompt = testing::RandomIds(200, vocab_, 41);
    SequenceState whole_state(model_->config), split_state(model_->config);
    MtpState whole, split;
    QVERIFY(forward_->Prefill(whole_state, prompt, LogitsRows::kLast, &whole).ok());
    QVERIFY(forward_->Prefill(split_state, std::span(prompt).first(128), LogitsRows::kLast, &split).ok());
    QVERIFY(forward_->Prefill(split_state, std::span(prompt).subspan(128), LogitsRows::kLast, &split).ok());
    QCOMPARE(whole.begin, int64_t{0});
    QCOMPARE(whole.rows, int64_t{199});
    QCOMPARE(split.rows, whole.rows);
    QCOMPARE(split.pending_rows, int64_t{1});
    const int64_t floats = whole.rows * model_->config.num_key_value_heads * model_->config.head_dim;
    QVERIFY(SameBits(whole.k.data(), split.k.data(), floats));
    QVERIFY(SameBits(whole.v.data(), split.v.data(), floats));
    QVERIFY(SameBits(whole.pending.data(), split.pending.data(), model_->config.hidden_size));
  }

  void mtpDraftsKeepPlainDecoding() {
    int64_t drafted = 0, accepted = 0;
    for (uint32_t seed : {51u, 52u, 53u}) {
      GenerationResult r;
      CompareWithPlain(testing::RandomIds(150, vocab_, seed), Greedy(60), 4, &r, false, true);
      QVERIFY(r.drafted_tokens > 0);
      drafted += r.drafted_tokens;
      accepted += r.accepted_tokens;
      for (float temperature : {0.5f, 1.0f}) {
        SamplingParams p = Greedy(40);
        p.temperature = temperature;
        p.seed = seed;
        CompareWithPlain(testing::RandomIds(90, vocab_, seed + 7), p, 3, &r, false, true);
        QVERIFY(r.drafted_tokens > 0);
      }
    }
    qInfo("MTP drafts on the tiny model's random head: %lld drafted, %lld accepted", static_cast<long long>(drafted), static_cast<long long>(accepted));
    // Both: lookup drafts where the prompt repeats, the head elsewhere.
    std::vector<int32_t> block = testing::RandomIds(40, vocab_, 61), prompt;
    for (int i = 0; i < 3; ++i) prompt.insert(prompt.end(), block.begin(), block.end());
    GenerationResult both;
    CompareWithPlain(prompt, Greedy(80), 6, &both, true, true);
    QVERIFY(both.drafted_tokens > 0);
  }
};

QTEST_GUILESS_MAIN(TestSpeculative)
#include "test_speculative.moc"
