// JournalModel and JournalFilterModel: columns, raw JSON role, new rows inserted at the top, filters.
#include <QAbstractItemModelTester>
#include <QJsonDocument>
#include <QSignalSpy>
#include <QtTest>

#include "models/journal_charts.h"
#include "models/journal_filter_model.h"
#include "models/journal_model.h"

namespace {

JournalRowSnapshot request(qint64 id, int status, const QString& session) {
  JournalRowSnapshot r;
  r.id = id;
  r.timeMs = 1700000000000 + id;
  r.type = r.kind = "request";
  r.tier = "end";
  r.session = session;
  r.tokens = 100 + id;
  r.status = status;
  r.route = "/v1/chat/completions";
  r.finishReason = status == 200 ? "stop" : "error";
  r.outputTokens = status == 200 ? 10 * id : 0;
  r.slot = static_cast<int>(id % 2);
  r.queueMs = 12.5;
  r.queuePosition = id == 2 ? 3 : 0;
  r.ttftMs = status == 200 ? 100.0 * double(id) + 0.4 : 0.0;  // shown without decimals from 100 on
  r.decodeTokensPerS = status == 200 ? 40.0 + double(id) : 0.0;
  r.text = status == 200 ? "" : "no room for the prefill";
  r.json = QJsonDocument(QJsonObject{{"id", id}, {"type", "request"}, {"status", status}}).toJson(QJsonDocument::Compact);
  return r;
}

JournalRowSnapshot cacheEvent(qint64 id, const QString& kind, const QString& tier) {
  JournalRowSnapshot r;
  r.id = id;
  r.timeMs = 1700000000000 + id;
  r.type = "cache_event";
  r.kind = kind;
  r.tier = tier;
  r.session = "s1";
  r.tokens = 64;
  r.text = "reason " + kind;
  r.json = QJsonDocument(QJsonObject{{"id", id}, {"type", "cache_event"}, {"kind", kind}}).toJson(QJsonDocument::Compact);
  return r;
}

}  // namespace

class TestJournalModel : public QObject {
  Q_OBJECT

 private slots:
  void chartPointsComeFromRequestRows() {
    auto timed = [](qint64 id, qint64 time, const QString& source, double ttft, qint64 reread) {
      JournalRowSnapshot r = request(id, 200, "s1");
      r.timeMs = time;
      r.json = QJsonDocument(QJsonObject{{"id", id}, {"type", "request"}, {"cache_source", source}, {"ttft_ms", ttft}, {"reread_tokens", reread}})
                   .toJson(QJsonDocument::Compact);
      return r;
    };
    // Newest first, as the journal gives them, with a cache event and a row without a source between.
    JournalRowSnapshot bare = request(5, 503, "s2");
    bare.timeMs = 4000;
    const QList<RequestPoint> points = RequestPoints({timed(4, 3000, "end", 12.5, 40), cacheEvent(3, "hit", "end"), bare,
                                                      timed(2, 2000, "cold", 900.0, 1500), timed(1, 1000, "end", 10.0, 30)});
    QCOMPARE(points.size(), 4);
    QCOMPARE(points[0].timeMs, qint64{1000});
    QCOMPARE(points[1].source, QString("cold"));
    QCOMPARE(points[1].ttftMs, 900.0);
    QCOMPARE(points[1].rereadTokens, qint64{1500});
    QCOMPARE(points[2].rereadTokens, qint64{40});
    QCOMPARE(points[3].source, QString("unknown"));
    const QMap<QString, int> shares = SourceShares(points);
    QCOMPARE(shares.value("end"), 2);
    QCOMPARE(shares.value("cold"), 1);
    QCOMPARE(shares.value("unknown"), 1);
    QCOMPARE(shares.size(), 3);
  }

  void rowsColumnsRoles() {
    JournalModel model;
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
    model.setSnapshot({{cacheEvent(3, "write", "anchors"), request(2, 200, "s1"), cacheEvent(1, "hit", "end")}, 3});
    QCOMPARE(model.rowCount(), 3);
    QCOMPARE(model.columnCount(), int(JournalModel::ColumnCount));
    QCOMPARE(model.total(), 3);
    QCOMPARE(model.index(1, JournalModel::KindColumn).data().toString(), QString("request"));
    QCOMPARE(model.index(1, JournalModel::StatusColumn).data().toString(), QString("200"));
    QCOMPARE(model.index(0, JournalModel::StatusColumn).data().toString(), QString());
    QCOMPARE(model.index(1, JournalModel::TokensColumn).data().toLongLong(), 102);
    QCOMPARE(model.index(0, JournalModel::TimeColumn).data(JournalModel::SortRole).toLongLong(), 1700000000003);
    QCOMPARE(model.index(0, 0).data(JournalModel::IdRole).toLongLong(), 3);
    const QJsonObject raw = QJsonDocument::fromJson(model.index(2, 0).data(JournalModel::JsonRole).toString().toUtf8()).object();
    QCOMPARE(raw["kind"].toString(), QString("hit"));
    QCOMPARE(model.headerData(JournalModel::TextColumn, Qt::Horizontal).toString(), QString("Text"));
    QCOMPARE(model.headerData(JournalModel::TtftColumn, Qt::Horizontal).toString(), QString("TTFT (ms)"));
    // A request's own columns, and blanks for an event.
    QCOMPARE(model.index(1, JournalModel::RouteColumn).data().toString(), QString("/v1/chat/completions"));
    QCOMPARE(model.index(1, JournalModel::OutputColumn).data().toString(), QString("20"));
    QCOMPARE(model.index(1, JournalModel::TtftColumn).data().toString(), QString("200"));
    QCOMPARE(model.index(1, JournalModel::RateColumn).data().toString(), QString("42.0"));
    QCOMPARE(model.index(1, JournalModel::FinishColumn).data().toString(), QString("stop"));
    QCOMPARE(model.index(1, JournalModel::TextColumn).data().toString(), QString());
    QCOMPARE(model.index(1, JournalModel::SlotColumn).data().toString(), QString("0"));
    QCOMPARE(model.index(1, JournalModel::WaitColumn).data().toString(), QString("12.5 (#3)"));  // third in the queue when it came
    QCOMPARE(model.headerData(JournalModel::WaitColumn, Qt::Horizontal).toString(), QString("Waited (ms)"));
    for (int column : {JournalModel::RouteColumn, JournalModel::SlotColumn, JournalModel::WaitColumn, JournalModel::OutputColumn, JournalModel::TtftColumn, JournalModel::RateColumn, JournalModel::FinishColumn})
      QCOMPARE(model.index(0, column).data().toString(), QString());
    // The date with the time, and the milliseconds in the tooltip.
    const QString shown = model.index(0, JournalModel::TimeColumn).data().toString();
    QCOMPARE(shown, QDateTime::fromMSecsSinceEpoch(1700000000003).toString("yyyy-MM-dd HH:mm:ss"));
    QVERIFY(model.index(0, JournalModel::TimeColumn).data(Qt::ToolTipRole).toString().endsWith(".003"));
  }

  // The detail pane's summary: a headline, labelled fields in a fixed order, the rest by name, empty ones left out.
  void summariesReadAsWords() {
    QJsonObject row{{"id", 7},
                    {"type", "request"},
                    {"route", "/v1/chat/completions"},
                    {"status", 200},
                    {"finish_reason", "stop"},
                    {"error", ""},
                    {"prompt_tokens", 131},
                    {"cached_tokens", 100},
                    {"ttft_ms", 2.6008},
                    {"decode_tokens_per_s", 5297.95},
                    {"zeta_unknown", "kept"},
                    {"time_ms", 1700000000123.0}};
    const QStringList lines = JournalRowSummary(row).split('\n');
    QCOMPARE(lines[0], QString("Request /v1/chat/completions: 200, stop"));
    QStringList words;  // each field's line with its padding collapsed
    for (const QString& line : lines.mid(1)) words << line.simplified();
    QVERIFY2(words.contains("Time: " + QDateTime::fromMSecsSinceEpoch(1700000000123).toString("yyyy-MM-dd HH:mm:ss") + ".123"),
             qPrintable(lines.join(" | ")));
    QVERIFY(words.contains("TTFT (ms): 2.60"));
    QVERIFY(words.contains("Decode tok/s: 5298"));
    QVERIFY(words.contains("Cached tokens: 100"));
    QCOMPARE(words.last(), QString("zeta_unknown: kept"));
    QVERIFY(std::none_of(words.begin(), words.end(), [](const QString& l) { return l.startsWith("Error") || l.startsWith("id"); }));
    QVERIFY(words.indexOf(QRegularExpression("^Prompt tokens.*")) < words.indexOf(QRegularExpression("^TTFT.*")));
    const qsizetype column = lines[1].indexOf(QRegularExpression("[^ ]", QRegularExpression::NoPatternOption), lines[1].indexOf(':') + 1);
    for (const QString& line : lines.mid(1)) QCOMPARE(line.indexOf(QRegularExpression("[^ ]"), line.indexOf(':') + 1), column);  // values line up
    const QStringList event = JournalRowSummary(QJsonObject{{"type", "cache_event"}, {"kind", "write"}, {"tier", "store"}, {"tokens", 211}}).split('\n');
    QCOMPARE(event[0], QString("Cache event: write in store"));
  }

  // Sorting by a request's figures: numbers, not text, and events below every request.
  void sortsByTheRequestsFigures() {
    JournalModel model;
    JournalRowSnapshot slow = request(9, 200, "s1");
    slow.ttftMs = 1500.0;  // "1500" sorts before "200" as text
    model.setSnapshot({{slow, cacheEvent(3, "hit", "end"), request(2, 200, "s2"), request(1, 200, "s3")}, 4});
    JournalFilterModel filter;
    filter.setSourceModel(&model);
    filter.sort(JournalModel::TtftColumn, Qt::DescendingOrder);
    QCOMPARE(filter.index(0, JournalModel::TtftColumn).data().toString(), QString("1500"));
    QCOMPARE(filter.index(1, JournalModel::TtftColumn).data().toString(), QString("200"));
    QCOMPARE(filter.index(2, JournalModel::TtftColumn).data().toString(), QString("100"));
    QCOMPARE(filter.index(3, JournalModel::KindColumn).data().toString(), QString("hit"));
    filter.sort(JournalModel::OutputColumn, Qt::AscendingOrder);
    QCOMPARE(filter.index(0, JournalModel::KindColumn).data().toString(), QString("hit"));
    QCOMPARE(filter.index(1, JournalModel::OutputColumn).data().toString(), QString("10"));
  }

  void newRowsAreInsertedAtTheTop() {
    JournalModel model;
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
    model.setSnapshot({{request(2, 200, "s1"), cacheEvent(1, "hit", "end")}, 2});
    QSignalSpy inserted(&model, &QAbstractItemModel::rowsInserted);
    QSignalSpy removed(&model, &QAbstractItemModel::rowsRemoved);
    QSignalSpy resets(&model, &QAbstractItemModel::modelReset);
    // Two new rows; the snapshot keeps 3 rows, so the oldest shown row leaves at the bottom.
    model.setSnapshot({{cacheEvent(4, "shed", "anchors"), request(3, 503, "s2"), request(2, 200, "s1")}, 4});
    QCOMPARE(resets.count(), 0);
    QCOMPARE(inserted.count(), 1);
    QCOMPARE(inserted[0][1].toInt(), 0);
    QCOMPARE(inserted[0][2].toInt(), 1);
    QCOMPARE(removed.count(), 1);
    QCOMPARE(model.rowCount(), 3);
    QCOMPARE(model.index(0, 0).data(JournalModel::IdRole).toLongLong(), 4);
    QCOMPARE(model.index(2, 0).data(JournalModel::IdRole).toLongLong(), 2);
    QCOMPARE(model.total(), 4);
    // No overlap (retention pruned what was shown): start over.
    model.setSnapshot({{cacheEvent(9, "clear", "all")}, 1});
    QCOMPARE(resets.count(), 1);
    QCOMPARE(model.rowCount(), 1);
  }

  void filtersAndSorting() {
    JournalModel model;
    JournalFilterModel filter;
    filter.setSourceModel(&model);
    QAbstractItemModelTester tester(&filter, QAbstractItemModelTester::FailureReportingMode::QtTest);
    model.setSnapshot({{cacheEvent(5, "shed", "anchors"), request(4, 503, "s2"), cacheEvent(3, "write", "anchors"), request(2, 200, "s1"), cacheEvent(1, "hit", "end")}, 5});
    QCOMPARE(filter.rowCount(), 5);
    filter.setKind("request");
    QCOMPARE(filter.rowCount(), 2);
    filter.setKind("cache_event");
    QCOMPARE(filter.rowCount(), 3);
    filter.setTier("ANCH");
    QCOMPARE(filter.rowCount(), 2);
    filter.setKind("");
    filter.setTier("");
    filter.setSession("s2");
    QCOMPARE(filter.rowCount(), 1);
    filter.setSession("");
    filter.setText("no room");
    QCOMPARE(filter.rowCount(), 1);
    filter.setText("");
    filter.setAlertsOnly(true);
    QCOMPARE(filter.rowCount(), 2);  // the shed and the 503
    filter.setAlertsOnly(false);
    filter.sort(JournalModel::TokensColumn, Qt::AscendingOrder);
    QCOMPARE(filter.index(0, JournalModel::TokensColumn).data().toLongLong(), 64);
    QCOMPARE(filter.index(4, JournalModel::TokensColumn).data().toLongLong(), 104);
    // Live: a new row lands in the filtered view.
    filter.setKind("shed");
    model.setSnapshot({{cacheEvent(6, "shed", "end"), cacheEvent(5, "shed", "anchors"), request(4, 503, "s2"), cacheEvent(3, "write", "anchors"), request(2, 200, "s1")}, 6});
    QCOMPARE(filter.rowCount(), 2);
  }
};

QTEST_MAIN(TestJournalModel)
#include "test_journal_model.moc"
