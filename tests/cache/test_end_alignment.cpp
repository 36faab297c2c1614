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
