// Request-local prefix reuse on the tiny model: every branch's logits, run after a shared prefix and
// its question's prefix, are the bits an independent prefill of its whole prompt writes, for shared
// prefixes of 1, 2, 31, 63, 64, 65, 127, 128, 129 and 1,000 ids and branches of 1, 64, 65 and 200;
// in any branch order, twice, and with no common prefix; the layout counts what it saves.
#include <QTemporaryDir>
#include <QtTest>

#include <algorithm>
#include <cstring>

#include "engine/decide/decide.h"
#include "tests/engine/test_runtime_util.h"

using namespace anchorage;

class TestDecide : public QObject {
  Q_OBJECT
  QTemporaryDir dir_;
  std::unique_ptr<testing::LoadedWeights> model_;
  std::unique_ptr<Forward> forward_;
  int64_t vocab_ = 0;

  // Logits rows [logits_from, n) of an independent cold prefill of ids.
  std::vector<float> Independent(const DecideBranch& b) {
    SequenceState s(model_->config);
    auto logits = forward_->Prefill(s, b.ids, LogitsRows::kAll);
    if (!logits.ok()) return {};
    return std::vector<float>(logits->begin() + b.logits_from * vocab_, logits->end());
  }

  // Runs the branches with reuse (batched up to max_batch) and checks every one against its independent prefill.
  DecideLayout CheckAgainstIndependent(const std::vector<DecideBranch>& branches, int64_t groups, int64_t max_batch = 1) {
    const DecideLayout layout = PlanDecide(branches, groups, true, DecideBatching::For(*forward_, max_batch));
    std::vector<bool> seen(branches.size(), false);
    Status s = RunDecide(*forward_, branches, layout, [&](size_t i, std::span<const float> logits) {
      const std::vector<float> want = Independent(branches[i]);
      seen[i] = true;
      if (logits.size() != want.size() || std::memcmp(logits.data(), want.data(), want.size() * sizeof(float)) != 0)
        qWarning("branch %zu (%zu ids, logits from %lld) differs from its independent prefill", i, branches[i].ids.size(), static_cast<long long>(branches[i].logits_from));
      else
        return true;
      return false;
    });
    if (!s.ok()) qWarning("%s", s.ToString().c_str());
    [&] { QVERIFY(s.ok()); }();
    for (bool b : seen) [&] { QVERIFY(b); }();
    return layout;
  }

 private slots:
  void initTestCase() {
    auto m = testing::MakeModel(TinyModelSize::kTiny, 23, dir_.path().toStdString());
    QVERIFY(m.ok());
    model_ = std::move(m).value();
    auto f = Forward::Create(model_->config, model_->weights, ForwardOptions{256, 2});
    QVERIFY(f.ok());
    forward_ = std::move(f).value();
    vocab_ = model_->config.vocab_size;
  }

  void branchesAreIndependentPrefills_data() {
    QTest::addColumn<int>("prefix");
    QTest::addColumn<int>("branch");
    for (int p : {1, 2, 31, 63, 64, 65, 127, 128, 129, 1000})
      for (int b : {1, 64, 65, 200}) QTest::newRow((std::to_string(p) + "+" + std::to_string(b)).c_str()) << p << b;
  }
  void branchesAreIndependentPrefills() {
    QFETCH(int, prefix);
    QFETCH(int, branch);
    const std::vector<int32_t> observation = testing::RandomIds(prefix, vocab_, 5);
    // Two questions of three branches: the question's ids, then each branch's own ids; the scored
    // rows are the last `branch` ids' (a candidate) or the last one (a choice).
    std::vector<DecideBranch> branches;
    for (int64_t q = 0; q < 2; ++q) {
      const std::vector<int32_t> question = testing::RandomIds(70, vocab_, static_cast<uint32_t>(10 + q));
      for (int c = 0; c < 3; ++c) {
        DecideBranch b;
        b.group = q;
        b.ids = observation;
        b.ids.insert(b.ids.end(), question.begin(), question.end());
        const std::vector<int32_t> own = testing::RandomIds(branch, vocab_, static_cast<uint32_t>(100 + 10 * q + c));
        b.ids.insert(b.ids.end(), own.begin(), own.end());
        b.logits_from = c == 0 ? static_cast<int64_t>(b.ids.size()) - 1 : static_cast<int64_t>(b.ids.size()) - branch - 1;
        branches.push_back(std::move(b));
      }
    }
    const DecideLayout layout = CheckAgainstIndependent(branches, 2);
    QCOMPARE(layout.shared % 64, int64_t{0});
    QVERIFY(layout.shared <= prefix);
    QVERIFY(layout.processed_tokens <= layout.logical_tokens);
    if (prefix >= 64) QVERIFY(layout.shared > prefix - 64);
    // Batched: the same bits and the same tokens processed; branches that fit a grid chunk go together.
    const DecideLayout batched = CheckAgainstIndependent(branches, 2, 3);
    QCOMPARE(batched.processed_tokens, layout.processed_tokens);
    if (branch < 200) QVERIFY2(!batched.batches.empty(), "short branches run batched");
    // Lone branches (one a question, as choices are) go on together from the shared prefix.
    std::vector<DecideBranch> lone;
    for (int64_t q = 0; q < 3; ++q) {
      DecideBranch b = branches[static_cast<size_t>(q)];
      b.group = q;
      b.ids.back() = static_cast<int32_t>(q);  // three different questions
      lone.push_back(std::move(b));
    }
    const DecideLayout apart = CheckAgainstIndependent(lone, 3, 1);
    const DecideLayout together = CheckAgainstIndependent(lone, 3, 16);
    QCOMPARE(together.processed_tokens, apart.processed_tokens);
    if (70 + branch + prefix % 64 <= forward_->grid_tokens()) {
      QCOMPARE(together.batches.size(), size_t{1});
      QCOMPARE(together.batches[0].group, int64_t{-1});
    }
  }

  void orderRepeatsAndNoCommonPrefix() {
    const std::vector<int32_t> observation = testing::RandomIds(300, vocab_, 7);
    std::vector<DecideBranch> branches;
    for (int c = 0; c < 5; ++c) {
      DecideBranch b;
      b.ids = observation;
      const std::vector<int32_t> own = testing::RandomIds(10 + c, vocab_, static_cast<uint32_t>(40 + c));
      b.ids.insert(b.ids.end(), own.begin(), own.end());
      b.logits_from = 300 - 1;
      branches.push_back(std::move(b));
    }
    const DecideLayout once = CheckAgainstIndependent(branches, 1);
    QCOMPARE(once.shared, int64_t{256});
    QCOMPARE(once.logical_tokens, int64_t{5 * 300 + 10 + 11 + 12 + 13 + 14});
    QCOMPARE(once.processed_tokens, int64_t{256 + 5 * 44 + 10 + 11 + 12 + 13 + 14});
    std::reverse(branches.begin(), branches.end());
    CheckAgainstIndependent(branches, 1);
    CheckAgainstIndependent(branches, 1);
    const DecideLayout pairs = CheckAgainstIndependent(branches, 1, 2);
    QCOMPARE(pairs.batches.size(), size_t{2});  // 2 + 2, the fifth alone
    QCOMPARE(pairs.processed_tokens, once.processed_tokens);
    // No common prefix at all: each branch runs from the start.
    for (size_t i = 0; i < branches.size(); ++i) branches[i].ids[0] = static_cast<int32_t>(i);
    const DecideLayout none = CheckAgainstIndependent(branches, 1);
    QCOMPARE(none.shared, int64_t{0});
    QCOMPARE(none.processed_tokens, none.logical_tokens);
    // Reuse off: the same answers with nothing shared.
    const DecideLayout off = PlanDecide(branches, 1, false);
    QCOMPARE(off.processed_tokens, off.logical_tokens);
  }
};

QTEST_GUILESS_MAIN(TestDecide)
#include "test_decide.moc"
