// End alignment on text: which copies of a conversation align with the rows and where they go past.
#include <QtTest>

#include "engine/cache/end_anchor.h"

using anchorage::AlignCopyWithRows;

class TestEndAlignment : public QObject {
  Q_OBJECT

 private slots:
  void cases_data() {
    QTest::addColumn<QString>("rows");
    QTest::addColumn<QString>("copy");
    QTest::addColumn<int>("offset");  // -1: they part
    const QString rows = "<|im_start|>assistant\n<think>\nplan it\n</think>\n\nDone.";
    QTest::newRow("identical") << rows << rows + "<|im_end|>" << rows.size();
    QTest::newRow("reasoning dropped") << rows << "<|im_start|>assistant\nDone.<|im_end|>" << 27;
    QTest::newRow("empty block") << rows << "<|im_start|>assistant\n<think>\n\n</think>\n\nDone.<|im_end|>" << 46;
    QTest::newRow("whitespace at tags") << rows << "<|im_start|>assistant\n<think>\nplan it</think>\nDone.\n<|im_end|>" << 51;
    QTest::newRow("dropped block before a tool call") << "<|im_start|>assistant\n<think>\nplan\n</think>\n\n<tool_call>\nx\n</tool_call>"
                                                      << "<|im_start|>assistant\n<tool_call>\nx\n</tool_call><|im_end|>" << 48;
    QTest::newRow("word changed") << rows << "<|im_start|>assistant\nDone!<|im_end|>" << -1;
    QTest::newRow("space inside text") << "say a b" << "say ab<|im_end|>" << -1;
    QTest::newRow("copy shorter") << rows << "<|im_start|>assistant\nDo" << -1;
    QTest::newRow("reasoning changed inside content") << rows << "<|im_start|>assistant\n<think>\nplan it\n</think>\n\nDone?" << -1;
  }

  // Whitespace may differ only at template tags, region boundaries and the end; a region's
  // reasoning may be left out; a region's cut character may be missing or U+FFFD.
  void withRegions_data() {
    QTest::addColumn<QByteArray>("rows");
    QTest::addColumn<QByteArray>("copy");
    QTest::addColumn<int>("region_begin");  // one region [begin, rows.size())
    QTest::addColumn<bool>("reasoning_pass");
    QTest::addColumn<int>("offset");  // -1: they part
    QTest::newRow("space at an html tag is real") << QByteArray("x <b>bold</b> y") << QByteArray("x <b> bold</b> y") << 0 << true << -1;
    QTest::newRow("space at a comparison is real") << QByteArray("if a < b") << QByteArray("if a <  b!") << 0 << true << -1;
    QTest::newRow("newline at the region start") << QByteArray("Q?\nAnswer.") << QByteArray("Q?\n\nAnswer.<|im_end|>") << 3 << true << 11;
    QTest::newRow("newline inside the prompt is real") << QByteArray("Q?\nMore\nAnswer.") << QByteArray("Q?\n\nMore\nAnswer.") << 8 << true << -1;
    QTest::newRow("cut character held back") << QByteArray("Caf\xC3") << QByteArray("Caf<|im_end|>") << 0 << true << 3;
    QTest::newRow("cut character as U+FFFD") << QByteArray("Caf\xC3") << QByteArray("Caf\xEF\xBF\xBD<|im_end|>") << 0 << true << 6;
    QTest::newRow("decoded cut held back") << QByteArray("Caf\xEF\xBF\xBD") << QByteArray("Caf<|im_end|>") << 0 << true << 3;
    QTest::newRow("a wrong character is no cut") << QByteArray("Caf\xC3") << QByteArray("Cafe<|im_end|>") << 0 << true << -1;
    QTest::newRow("unclosed reasoning is not left out") << QByteArray("<|im_start|>assistant\n<think>\nI was thinking and")
                                                        << QByteArray("<|im_start|>assistant\n<|im_end|>\n") << 30 << true << -1;
    QTest::newRow("unclosed reasoning without the pass") << QByteArray("<|im_start|>assistant\n<think>\nI was thinking and")
                                                         << QByteArray("<|im_start|>assistant\n<|im_end|>\n") << 30 << false << -1;
    QTest::newRow("thinking off: the prompt's empty block left out") << QByteArray("<|im_start|>assistant\n<think>\n\n</think>\n\nDone.")
                                                                   << QByteArray("<|im_start|>assistant\nDone.<|im_end|>") << 41 << true << 27;
    QTest::newRow("thinking off: not without the pass") << QByteArray("<|im_start|>assistant\n<think>\n\n</think>\n\nDone.")
                                                        << QByteArray("<|im_start|>assistant\nDone.<|im_end|>") << 41 << false << -1;
    QTest::newRow("a prompt's closed block with reasoning is not the region's") << QByteArray("<think>\nx\n</think>\n\nA") << QByteArray("A<|im_end|>") << 20 << true << -1;
    QTest::newRow("a prompt's block is not the region's") << QByteArray("<think>\nx\n</think>\n\nQ?A") << QByteArray("Q?A") << 23 << true << -1;
  }

  void withRegions() {
    QFETCH(QByteArray, rows);
    QFETCH(QByteArray, copy);
    QFETCH(int, region_begin);
    QFETCH(bool, reasoning_pass);
    QFETCH(int, offset);
    anchorage::AlignOptions options;
    options.regions = {{static_cast<size_t>(region_begin), static_cast<size_t>(rows.size())}};
    options.reasoning_pass = reasoning_pass;
    auto got = AlignCopyWithRows(rows.toStdString(), copy.toStdString(), options);
    if (offset < 0) {
      QVERIFY2(!got.has_value(), "expected the copy to part from the rows");
    } else {
      QVERIFY2(got.has_value(), "expected the copy to align");
      QCOMPARE(static_cast<int>(*got), offset);
    }
  }

  // An edited reply: the copy left the first answer's reasoning out and parts inside the second
  // answer. The checkpoints before the parting are reached, each with the copy's offset there; one
  // inside the left-out block and one past the parting are not.
  void checkpointsBeforeTheCopyParts() {
    const std::string first = "<|im_start|>assistant\n<think>\nplan\n</think>\n\nOne.<|im_end|>\n";
    const std::string user = "<|im_start|>user\nnext question<|im_end|>\n<|im_start|>assistant\n";
    const std::string rows = "<|im_start|>user\nhi<|im_end|>\n" + first + user + "Two answers.";
    const size_t region1 = rows.find("<think>"), region1_end = rows.find("<|im_end|>", region1);
    const size_t region2 = rows.find("Two");
    anchorage::AlignOptions options;
    options.regions = {{region1 + 8, region1_end}, {region2, rows.size()}};
    const std::string copy = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nOne.<|im_end|>\n" + user + "Two edits.<|im_end|>";
    const size_t in_block = rows.find("plan"), in_user = rows.find("next"), in_reply = rows.find("answers"), before_reply = region2 + 4;
    const auto reached = anchorage::AlignedCheckpoints(rows, copy, options, {in_block, in_user, before_reply, in_reply});
    QCOMPARE(reached.size(), size_t(2));
    QCOMPARE(reached[0].first, in_user);
    QCOMPARE(reached[0].second, copy.find("next"));
    QCOMPARE(reached[1].first, before_reply);
    QCOMPARE(reached[1].second, copy.find("Two") + 4);
    options.reasoning_pass = false;  // without the second pass the copy parts at the left-out block
    QVERIFY(anchorage::AlignedCheckpoints(rows, copy, options, {in_block, in_user}).empty());
  }

  void cases() {
    QFETCH(QString, rows);
    QFETCH(QString, copy);
    QFETCH(int, offset);
    auto got = AlignCopyWithRows(rows.toStdString(), copy.toStdString());
    if (offset < 0) {
      QVERIFY2(!got.has_value(), "expected the copy to part from the rows");
    } else {
      QVERIFY2(got.has_value(), "expected the copy to align");
      QCOMPARE(static_cast<int>(*got), offset);
    }
  }
};

QTEST_APPLESS_MAIN(TestEndAlignment)
#include "test_end_alignment.moc"
