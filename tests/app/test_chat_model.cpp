// ChatModel: a turn adds the question and a streaming answer; deltas grow it; stats end it.
#include <QAbstractItemModelTester>
#include <QJsonObject>
#include <QSignalSpy>
#include <QtTest>

#include "models/chat_model.h"

class TestChatModel : public QObject {
  Q_OBJECT

 private slots:
  void turnsDeltasAndStats() {
    ChatModel model("c1");
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
    QCOMPARE(model.rowCount(), 0);
    QCOMPARE(model.title(), QString("New conversation"));
    QJsonArray sent = model.beginTurn("What is an anchor?");
    QCOMPARE(sent.size(), 1);
    QCOMPARE(sent[0].toObject()["role"].toString(), QString("user"));
    QCOMPARE(model.rowCount(), 2);
    QVERIFY(model.streaming());
    QCOMPARE(model.index(1).data(ChatModel::RoleRole).toString(), QString("assistant"));
    QVERIFY(model.index(1).data(ChatModel::StreamingRole).toBool());

    QSignalSpy changed(&model, &QAbstractItemModel::dataChanged);
    model.applyDelta({"c1", "Think", ""});
    model.applyDelta({"c1", "ing.", ""});
    model.applyDelta({"c1", "", "A copy of"});
    model.applyDelta({"other", "", " ignored"});
    model.applyDelta({"c1", "", " the state."});
    QCOMPARE(changed.count(), 4);
    QCOMPARE(model.index(1).data(ChatModel::ReasoningRole).toString(), QString("Thinking."));
    QCOMPARE(model.index(1).data(ChatModel::ContentRole).toString(), QString("A copy of the state."));
    QCOMPARE(model.index(1).data(ChatModel::StatsRole).toString(), QString());

    ChatTurnStats stats;
    stats.conversation = "c1";
    stats.figures.cache_source = "end";
    stats.figures.cached_tokens = 129;
    stats.figures.reread_tokens = 31;
    stats.figures.ttft_ms = 1.94;
    stats.figures.decode_tokens_per_s = 41.24;
    model.finishTurn(stats);
    QVERIFY(!model.streaming());
    QCOMPARE(model.index(1).data(ChatModel::StatsRole).toString(), QString("end · 129 cached / 31 re-read tokens · TTFT 1.9 ms · 41.2 tok/s"));
    model.applyDelta({"c1", "", "late"});  // after the end: ignored
    QCOMPARE(model.index(1).data(ChatModel::ContentRole).toString(), QString("A copy of the state."));

    // The next turn sends the whole conversation, the answer's reasoning included.
    sent = model.beginTurn("And the end anchor?");
    QCOMPARE(sent.size(), 3);
    QCOMPARE(sent[1].toObject()["content"].toString(), QString("A copy of the state."));
    QCOMPARE(sent[1].toObject()["reasoning_content"].toString(), QString("Thinking."));
    QCOMPARE(model.rowCount(), 4);
    QCOMPARE(model.title(), QString("What is an anchor?"));
  }

  // A conversation's options: its system prompt goes first in every turn's messages, its sampling in
  // the request; a name replaces the first message as its title; regenerate takes back the last
  // answer and sends the same messages again.
  void optionsTitleAndRegenerate() {
    ChatModel model("c3");
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
    QVERIFY(model.regenerate().isEmpty());  // no answer yet
    model.options().systemPrompt = "Answer in one line.";
    model.options().temperature = 0.0;
    model.options().maxTokens = 40;
    QCOMPARE(model.sampling(), QJsonObject({{"max_tokens", 40}, {"temperature", 0.0}}));  // greedy: no seed
    model.options().temperature = 0.8;
    QVERIFY(model.sampling().contains("seed"));
    model.options().temperature = 0.0;
    const QJsonArray first = model.beginTurn("Where do anchors sit?");
    QCOMPARE(first.size(), 2);
    QCOMPARE(first[0].toObject(), QJsonObject({{"role", "system"}, {"content", "Answer in one line."}}));
    QCOMPARE(first[1].toObject()["content"].toString(), QString("Where do anchors sit?"));
    QVERIFY(model.regenerate().isEmpty());  // it still streams
    model.applyDelta({"c3", "", "On grid lines."});
    ChatTurnStats stats;
    stats.conversation = "c3";
    model.finishTurn(stats);
    QCOMPARE(model.title(), QString("Where do anchors sit?"));
    model.setTitle("  Anchors  ");
    QCOMPARE(model.title(), QString("Anchors"));
    model.setTitle("");
    QCOMPARE(model.title(), QString("Where do anchors sit?"));
    const QJsonArray again = model.regenerate();
    QCOMPARE(again, first);
    QCOMPARE(model.rowCount(), 2);
    QVERIFY(model.streaming());
    QCOMPARE(model.index(1).data(ChatModel::ContentRole).toString(), QString());
    QCOMPARE(model.index(1).data(ChatModel::StatsRole).toString(), QString());
  }

  void failedAndStoppedTurns() {
    ChatModel model("c2");
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
    model.beginTurn("hi");
    ChatTurnStats failed;
    failed.conversation = "c2";
    failed.ok = false;
    failed.error = "HTTP 503: the queue is full";
    model.finishTurn(failed);
    QCOMPARE(model.index(1).data(ChatModel::ErrorRole).toString(), QString("HTTP 503: the queue is full"));
    QVERIFY(model.index(1).data(ChatModel::StatsRole).toString().startsWith("failed"));
    const QJsonArray sent = model.beginTurn("again");
    QCOMPARE(sent.size(), 2);  // the failed, empty answer is not sent back
    ChatTurnStats stopped;
    stopped.conversation = "c2";
    stopped.stopped = true;
    stopped.figures.cache_source = "cold";
    model.finishTurn(stopped);
    QVERIFY(model.index(3).data(ChatModel::StatsRole).toString().endsWith("stopped"));
  }

  // Each answer names its output tokens and finish reason; one cut by max_tokens inside its reasoning says so.
  void outputTokensFinishAndACutReasoning() {
    ChatModel model("c3");
    model.beginTurn("hi");
    ChatTurnStats done;
    done.conversation = "c3";
    done.figures.cache_source = "cold";
    done.figures.completion_tokens = 52;
    done.finishReason = "stop";
    model.applyDelta({"c3", "", "Hello."});
    model.finishTurn(done);
    QVERIFY2(model.index(1).data(ChatModel::StatsRole).toString().endsWith(" · 52 tokens, stop"), qPrintable(model.index(1).data(ChatModel::StatsRole).toString()));
    model.beginTurn("think long");
    model.applyDelta({"c3", "Let me see", ""});
    ChatTurnStats cut = done;
    cut.figures.completion_tokens = 64;
    cut.finishReason = "length";
    model.finishTurn(cut);
    QVERIFY2(model.index(3).data(ChatModel::StatsRole).toString().endsWith(" · 64 tokens, length: ended inside its reasoning (raise max tokens)"),
             qPrintable(model.index(3).data(ChatModel::StatsRole).toString()));
  }
};

QTEST_MAIN(TestChatModel)
#include "test_chat_model.moc"
