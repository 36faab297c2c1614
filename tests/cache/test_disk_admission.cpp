// The disk tier's admission: cold lines counted by prefix hash (resumed ones not), the longest line
// read twice, a session's head, the branch where an earlier prompt went on differently, nothing
// under min_tokens or above the exact rows, and counts that survive a reopen.
#include <QTemporaryDir>
#include <QtTest>

#include "engine/cache/disk_admission.h"
#include "engine/cache/disk_files.h"
#include "tests/cache/cache_test_util.h"

using namespace anchorage;
using anchorage::testing::Concat;
using anchorage::testing::Head;
using anchorage::testing::Tokens;

namespace {

constexpr int64_t G = 1024;

AdmissionRequest Request(const std::vector<int32_t>& prompt, int64_t resume_at = 0) {
  AdmissionRequest r;
  r.prompt = prompt;
  r.resume_at = resume_at;
  r.exact_upto = static_cast<int64_t>(prompt.size());
  return r;
}

}  // namespace

class TestDiskAdmission : public QObject {
  Q_OBJECT
 private slots:
  void sessionsShareAHead() {
    QTemporaryDir dir;
    const std::string path = dir.filePath("counts.json").toStdString();
    DiskAdmission a = DiskAdmission::Open(DiskEnv::Posix(), path, AdmissionOptions{});
    const auto first = Tokens(1, 5000, 30000);
    // The first long request of a session: anchors at the last 4 lines below its last user message.
    AdmissionRequest r = Request(first);
    r.first_of_session = true;
    r.user_start = 4500;
    QCOMPARE(a.Plan(r), (std::vector<int64_t>{1024, 2048, 3072, 4096}));
    const auto hashes = PrefixHashes(first, G);
    QCOMPARE(a.Count(hashes[0]), int64_t(1));
    // A second prompt sharing 3,000 tokens: lines 1 and 2 are read cold a second time; line 2 is
    // the longest twice-read line and the branch (the count falls at line 3).
    const auto second = Concat(Head(first, 3000), Tokens(2, 3000, 30000));
    QCOMPARE(a.Plan(Request(second)), (std::vector<int64_t>{2048}));
    QCOMPARE(a.Count(hashes[1]), int64_t(2));
    QCOMPARE(a.Count(hashes[2]), int64_t(1));
    // Resumed lines are not counted: a request resuming at 2,048 reads only lines 3.. cold.
    QVERIFY(a.Plan(Request(second, 2048)).size() <= 1);
    QCOMPARE(a.Count(hashes[1]), int64_t(2));
    QCOMPARE(a.Count(PrefixHashes(second, G)[2]), int64_t(2));
    // A third prompt that shares 5,000 with the second: its longest twice-read line is 4,096 now.
    const auto third = Concat(Head(second, 5000), Tokens(3, 1000, 30000));
    const auto plan = a.Plan(Request(third));
    QVERIFY(std::find(plan.begin(), plan.end(), 4096) != plan.end());
    // The counts survive a reopen.
    QVERIFY(a.Save().ok());
    DiskAdmission b = DiskAdmission::Open(DiskEnv::Posix(), path, AdmissionOptions{});
    QCOMPARE(b.Count(hashes[1]), a.Count(hashes[1]));
    QCOMPARE(b.Count(PrefixHashes(third, G)[3]), a.Count(PrefixHashes(third, G)[3]));
    // On another grid the counts mean nothing and are not read.
    AdmissionOptions other;
    other.line_tokens = 512;
    QCOMPARE(DiskAdmission::Open(DiskEnv::Posix(), path, other).Count(hashes[1]), int64_t(0));
  }

  void limits() {
    QTemporaryDir dir;
    DiskAdmission a = DiskAdmission::Open(DiskEnv::Posix(), dir.filePath("c.json").toStdString(), AdmissionOptions{});
    const auto shortp = Tokens(4, 3000, 30000);
    QVERIFY(a.Plan(Request(shortp)).empty());
    QVERIFY(a.Plan(Request(shortp)).empty());  // twice read, but under min_tokens
    const auto longp = Tokens(5, 6000, 30000);
    AdmissionRequest r = Request(longp);
    r.first_of_session = true;
    r.user_start = 5900;
    r.exact_upto = 2100;  // rows above came from a decode: never written
    QCOMPARE(a.Plan(r), (std::vector<int64_t>{1024, 2048}));
    // The same prompt again: every line read twice, the longest wins; equal counts are no branch.
    QCOMPARE(a.Plan(Request(longp)), (std::vector<int64_t>{5120}));
    // A prompt that parts from it at 1,500: line 1 read three times, line 2 of the new one once.
    const auto parted = Concat(Head(longp, 1500), Tokens(6, 4500, 30000));
    AdmissionRequest branch = Request(parted);
    branch.first_answer_start = 1500;
    QCOMPARE(a.Plan(branch), (std::vector<int64_t>{1024}));
    // One that shares 3,100 with that one: the longest twice-read line is 3,072; the branch at
    // 1,024 (count 3, then 2) is kept too, as it lies below the first answer.
    const auto later = Concat(Head(parted, 3100), Tokens(7, 3000, 30000));
    AdmissionRequest head = Request(later);
    head.first_answer_start = 1500;
    QCOMPARE(a.Plan(head), (std::vector<int64_t>{1024, 3072}));
    // The same parting point with no head to share (the answer starts at 0): no branch.
    const auto no_head_prompt = Concat(Head(parted, 3100), Tokens(8, 3000, 30000));
    AdmissionRequest no_head = Request(no_head_prompt);
    no_head.first_answer_start = 0;
    QCOMPARE(a.Plan(no_head), (std::vector<int64_t>{3072}));
  }

  void unreadableCountsStartEmpty() {
    QTemporaryDir dir;
    const std::string path = dir.filePath("c.json").toStdString();
    QVERIFY(WriteFileAtomic(path, "{not json").ok());
    DiskAdmission a = DiskAdmission::Open(DiskEnv::Posix(), path, AdmissionOptions{});
    QCOMPARE(a.Count("anything"), int64_t(0));
    QVERIFY(a.Save().ok());
    QVERIFY(DiskAdmission::Open(DiskEnv::Posix(), path, AdmissionOptions{}).Count("x") == 0);
  }
};

QTEST_APPLESS_MAIN(TestDiskAdmission)
#include "test_disk_admission.moc"
