// Remote mode (anchorage --connect URL): the console operates a running anchorage-server through its
// documented routes: the screens fill, a chat streams, a settings edit and a clear round-trip with
// the admin token and are refused without it, and leaving the console leaves the server running.
#include <QInputDialog>
#include <QLabel>
#include <QPushButton>
#include <QSignalSpy>
#include <QSpinBox>
#include <QTabWidget>
#include <QTableView>
#include <QTableWidget>
#include <QTemporaryDir>
#include <QPlainTextEdit>
#include <QtTest>

#include "app/engine_host.h"
#include "app/main_window.h"
#include "tests/app/console_steps.h"
#include "models/cache_tier_model.h"
#include "models/chat_model.h"
#include "models/journal_model.h"
#include "models/settings_model.h"
#include "tests/server/server_fixture.h"
#include "widgets/chat_screen.h"
#include "widgets/disk_screen.h"
#include "widgets/journal_screen.h"
#include "widgets/shadow_screen.h"

namespace {

qint64 tierValue(CacheTierModel* model, const QString& tier, int column) {
  const int row = model->rowOf(tier);
  return row < 0 ? -1 : model->index(row, column).data(CacheTierModel::ValueRole).toLongLong();
}

QString lastArgument(const QSignalSpy& spy, int argument) { return spy.isEmpty() ? QString() : spy.last()[argument].toString(); }

}  // namespace

class TestConsoleRemote : public QObject {
  Q_OBJECT

 private slots:
  // Without the admin token the Journal screen (an admin route) is greyed with the server's 401 on its
  // first line and tab, and the buttons that would be refused say why before they are pressed; the
  // screens whose routes answer stay as they were. The console asks for the token; given it, all
  // works. When the server stops, every screen says since when its figures are old and the status
  // bar says disconnected.
  void screensSayWhatIsUnavailable() {
    QTemporaryDir dir;
    QVERIFY(dir.isValid());
    anchorage::testing::ServerProcess server;
    QVERIFY(server.Start(dir.path(), {"--grid", "64", "--admin-token", "operator-secret", "--backend", "far=http://127.0.0.1:9", "--kv-dtype", "fp8"}));
    EngineHost host(RemoteTarget{QString::fromStdString(server.base_url()), {}, {}});
    host.setPollIntervalMs(100);
    MainWindow window(&host);
    window.show();
    host.start();
    QTRY_VERIFY_WITH_TIMEOUT(window.cacheModel()->rowOf("resident") >= 0, 20000);
    QTRY_VERIFY_WITH_TIMEOUT(window.findChild<QLabel*>("modelLabel")->text().contains(" · fp8 K/V rows"), 5000);  // the server's, from /health
    auto line = [&](const char* tab) { return window.findChild<QLabel*>(QString("unavailable-") + tab); };
    QTRY_VERIFY_WITH_TIMEOUT(!line("journal")->isHidden(), 10000);
    QVERIFY2(line("journal")->text().contains("HTTP 401") && line("journal")->text().contains("Nothing has been read"), qPrintable(line("journal")->text()));
    QVERIFY(!window.journalScreen()->findChild<QTableView*>()->isEnabled());
    QCOMPARE(window.tabs()->tabToolTip(3), line("journal")->text());
    // The engine log has the server's start notes (from /health) and the route's refusal.
    QTRY_VERIFY_WITH_TIMEOUT(window.logText().contains("note: backend far at http://127.0.0.1:9"), 5000);
    QVERIFY(window.logText().contains("/v1/journal: HTTP 401"));
    QVERIFY(line("memory")->isHidden());
    QVERIFY(window.memoryScreen()->findChild<QTableView*>()->isEnabled());
    const QString sheds = window.memoryScreen()->findChild<QLabel*>("alertEmpty")->text();  // not "none": it cannot know
    QVERIFY2(sheds.contains("journal cannot be read") && sheds.contains("HTTP 401"), qPrintable(sheds));
    for (const char* name : {"clear_resident", "clear_disk", "clear_shadow"}) {
      auto* button = window.findChild<QPushButton*>(name);
      QVERIFY2(button != nullptr, name);
      QTRY_VERIFY_WITH_TIMEOUT(!button->isEnabled() && button->toolTip().contains("--admin-token"), 5000);
    }
    // The console asked for the token when the journal answered 401; given it, the journal reads and the buttons work.
    QInputDialog* ask = nullptr;
    QTRY_VERIFY_WITH_TIMEOUT((ask = window.findChild<QInputDialog*>("adminTokenDialog")) != nullptr, 5000);
    QVERIFY(ask->isVisible());
    ask->setTextValue("operator-secret");
    ask->accept();
    QTRY_VERIFY_WITH_TIMEOUT(line("journal")->isHidden(), 10000);
    QTRY_VERIFY_WITH_TIMEOUT(window.findChild<QPushButton*>("clear_resident")->isEnabled(), 10000);
    QVERIFY(window.journalScreen()->findChild<QTableView*>()->isEnabled());

    server.Kill();
    QTRY_VERIFY_WITH_TIMEOUT(!line("memory")->isHidden(), 10000);
    QVERIFY2(line("memory")->text().contains("What shows was read"), qPrintable(line("memory")->text()));
    QVERIFY(!window.memoryScreen()->findChild<QTableView*>()->isEnabled());
    QVERIFY(!line("chat")->isHidden());
    const QString status = window.findChild<QLabel*>("modelLabel")->text();
    QVERIFY2(status.startsWith("disconnected: no answer from " + QString::fromStdString(server.base_url()) + " since "), qPrintable(status));
    host.drain();
    QVERIFY(host.wait(10000));
  }

  void serverUrlsAreCheckedBeforeConnecting() {
    QString error;
    QCOMPARE(ServerBaseUrl("http://127.0.0.1:8000/v1/", &error), QString("http://127.0.0.1:8000"));
    QCOMPARE(ServerBaseUrl(" https://gpu-box:8443 ", &error), QString("https://gpu-box:8443"));
    for (const char* bad : {"localhost:8000", "ftp://box:21", "http://box:8000/v2/chat", "http://user:pw@box:8000", "http://", ""}) {
      error.clear();
      QVERIFY2(ServerBaseUrl(bad, &error).isEmpty(), qPrintable(bad));
      QVERIFY2(error.contains("is not a server URL"), qPrintable(error));
    }
  }

  void anUnreachableServerIsSaidAndRetried() {
    EngineHost host(RemoteTarget{"http://127.0.0.1:9", {}, {}});
    host.setPollIntervalMs(100);
    QSignalSpy connection(&host, &EngineHost::connectionChanged);
    QSignalSpy ready(&host, &EngineHost::ready);
    host.start();
    QTRY_VERIFY_WITH_TIMEOUT(!connection.isEmpty(), 10000);
    QCOMPARE(connection.last()[0].toBool(), false);
    QVERIFY2(lastArgument(connection, 1).contains("Cannot reach http://127.0.0.1:9"), qPrintable(lastArgument(connection, 1)));
    QCOMPARE(ready.count(), 0);
    host.drain();
    QVERIFY(host.wait(10000));
  }

  void operatesARunningServer() {
    QTemporaryDir dir;
    QVERIFY(dir.isValid());
    anchorage::testing::ServerProcess server;
    QVERIFY(server.Start(dir.path(), {"--grid", "64", "--admin-token", "operator-secret"}));
    QString error;
    const QString base = ServerBaseUrl(QString::fromStdString(server.base_url()) + "/v1/", &error);
    QCOMPARE(base, QString::fromStdString(server.base_url()));

    EngineHost host(RemoteTarget{base, "operator-secret", {}});
    host.setPollIntervalMs(100);
    MainWindow window(&host);
    window.show();
    host.start();
    QTRY_COMPARE_WITH_TIMEOUT(window.endpointUrl(), base + "/v1", 20000);
    QTRY_VERIFY_WITH_TIMEOUT(window.settingsModel()->version() >= 1, 10000);
    QVERIFY(window.settingsModel()->value("memory.ceiling_gb").toDouble() > 0);
    QTRY_VERIFY_WITH_TIMEOUT(window.cacheModel()->rowOf("resident") >= 0, 10000);
    QTRY_VERIFY_WITH_TIMEOUT(window.windowTitle().contains(QString(" · on 127.0.0.1:%1").arg(server.port())), 10000);

    // A chat from the Chat tab streams from the server; its journal row and its end anchor show up.
    ChatScreen* chat = window.chatScreen();
    window.tabs()->setCurrentWidget(chat);
    chat->findChild<QSpinBox*>("maxTokens")->setValue(8);
    chat->input()->setPlainText("Hello from the workstation.");
    QSignalSpy deltas(&host, &EngineHost::chatDelta);
    QTest::mouseClick(chat->sendButton(), Qt::LeftButton);
    ChatModel* conversation = chat->currentModel();
    QTRY_VERIFY_WITH_TIMEOUT(!conversation->streaming(), 120000);
    QCOMPARE(conversation->index(1).data(ChatModel::ErrorRole).toString(), QString());
    QVERIFY(deltas.count() >= 1);
    QVERIFY2(conversation->index(1).data(ChatModel::StatsRole).toString().startsWith("cold · 0 cached / "),
             qPrintable(conversation->index(1).data(ChatModel::StatsRole).toString()));
    JournalModel* journal = window.journalModel();
    auto requestRowOfSession = [&] {
      for (int r = 0; r < journal->rowCount(); ++r)
        if (journal->index(r, JournalModel::KindColumn).data().toString() == "request" &&
            journal->index(r, JournalModel::SessionColumn).data().toString() == conversation->conversation())
          return r;
      return -1;
    };
    QTRY_VERIFY_WITH_TIMEOUT(requestRowOfSession() >= 0, 10000);
    QCOMPARE(journal->index(requestRowOfSession(), JournalModel::KindColumn).data(JournalModel::StatusRole).toInt(), 200);
    CacheTierModel* tiers = window.cacheModel();
    QTRY_COMPARE_WITH_TIMEOUT(tierValue(tiers, "end", CacheTierModel::EntriesColumn), 1, 10000);
    QTRY_VERIFY_WITH_TIMEOUT(window.findChild<QLabel*>("phaseLabel")->text().startsWith("idle · last: cold"), 10000);
    // The Disk cache and Shadow screens read the server's tiers: its disk folder, the chat's shadow session.
    QTRY_VERIFY_WITH_TIMEOUT(window.diskScreen()->summaryText().contains("readwrite"), 10000);
    QVERIFY2(window.diskScreen()->summaryText().contains(dir.path() + "/cache/disk"), qPrintable(window.diskScreen()->summaryText()));
    QTRY_VERIFY_WITH_TIMEOUT(window.shadowScreen()->summaryText().contains("Reading"), 10000);
    QTRY_VERIFY_WITH_TIMEOUT(window.shadowScreen()->sessionTable()->rowCount() >= 1, 10000);

    // A limit edit from the Memory screen lands in the server's document.
    SettingsModel* settings = window.settingsModel();
    const qint64 version = settings->version();
    double wanted = 0;
    applyCeilingEdit(window, &wanted);
    if (QTest::currentTestFailed()) return;
    auto stored = server.Get("/v1/settings");
    QVERIFY(stored && stored->status == 200);
    const nlohmann::json document = nlohmann::json::parse(stored->body);
    QCOMPARE(document["version"].get<qint64>(), version + 1);
    QCOMPARE(document["memory"]["ceiling_gb"].get<double>(), wanted);

    // A stale edit: 409, and the console holds the server's current version when it says so.
    QSignalSpy outcomes(&host, &EngineHost::settingsOutcome);
    QJsonObject stale = settings->documentWith({{"memory.ceiling_gb", 1.0}});
    stale["version"] = version;
    host.replaceSettings(stale);
    QTRY_COMPARE_WITH_TIMEOUT(outcomes.count(), 1, 10000);
    const SettingsOutcome refused = outcomes[0][0].value<SettingsOutcome>();
    QCOMPARE(refused.ok, false);
    QCOMPARE(refused.httpStatus, 409);
    QCOMPARE(settings->version(), version + 1);
    // A bad value: 400 naming the field.
    QJsonObject bad = settings->documentWith({{"memory.ceiling_gb", -3.0}});
    host.replaceSettings(bad);
    QTRY_COMPARE_WITH_TIMEOUT(outcomes.count(), 2, 10000);
    const SettingsOutcome invalid = outcomes[1][0].value<SettingsOutcome>();
    QCOMPARE(invalid.httpStatus, 400);
    QVERIFY2(invalid.message.contains("memory.ceiling_gb"), qPrintable(invalid.message));

    // A clear with the admin token empties the tier on the server.
    QSignalSpy cleared(&host, &EngineHost::tierCleared);
    host.clearTier("end");
    QTRY_COMPARE_WITH_TIMEOUT(cleared.count(), 1, 10000);
    QCOMPARE(cleared[0][0].toString(), QString("end"));
    QVERIFY2(cleared[0][1].toBool(), qPrintable(cleared[0][2].toString()));
    QTRY_COMPARE_WITH_TIMEOUT(tierValue(tiers, "end", CacheTierModel::EntriesColumn), 0, 10000);
    auto stats = server.Get("/v1/cache/stats");
    QVERIFY(stats && stats->status == 200);
    QCOMPARE(nlohmann::json::parse(stats->body)["end"]["entries"].get<int>(), 0);

    // Closing the console stops its polling; the server keeps serving.
    QSignalSpy drained(&host, &EngineHost::drained);
    window.close();
    QTRY_VERIFY_WITH_TIMEOUT(!host.isRunning(), 10000);
    QCOMPARE(drained.count(), 1);
    auto health = server.Get("/health");
    QVERIFY(health && health->status == 200);

    // Without the token: the screens that need it say so, and a clear or an edit is refused.
    EngineHost guest(RemoteTarget{base, {}, {}});
    guest.setPollIntervalMs(100);
    QSignalSpy guestConnection(&guest, &EngineHost::connectionChanged);
    QSignalSpy guestReady(&guest, &EngineHost::ready);
    guest.start();
    QTRY_COMPARE_WITH_TIMEOUT(guestReady.count(), 1, 10000);
    QTRY_VERIFY_WITH_TIMEOUT(lastArgument(guestConnection, 1).contains("/v1/journal: HTTP 401"), 10000);
    QSignalSpy guestCleared(&guest, &EngineHost::tierCleared);
    guest.clearTier("resident");
    QTRY_COMPARE_WITH_TIMEOUT(guestCleared.count(), 1, 10000);
    QCOMPARE(guestCleared[0][1].toBool(), false);
    QVERIFY2(guestCleared[0][2].toString().contains("HTTP 401") && guestCleared[0][2].toString().contains("admin token"),
             qPrintable(guestCleared[0][2].toString()));
    QSignalSpy guestOutcome(&guest, &EngineHost::settingsOutcome);
    guest.replaceSettings(QJsonObject{{"version", version + 1}});
    QTRY_COMPARE_WITH_TIMEOUT(guestOutcome.count(), 1, 10000);
    QCOMPARE(guestOutcome[0][0].value<SettingsOutcome>().httpStatus, 401);
    guest.drain();
    QVERIFY(guest.wait(10000));
    stats = server.Get("/v1/cache/stats");
    QVERIFY(stats && stats->status == 200);
    QVERIFY2(nlohmann::json::parse(stats->body)["resident"]["rows"].get<int>() > 0, "the refused clear cleared nothing");
  }
};

QTEST_MAIN(TestConsoleRemote)
#include "test_console_remote.moc"
