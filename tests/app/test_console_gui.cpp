// The console on the tiny model: a chat from the Chat tab streams its answer, the Journal and the
// Memory screen follow, a limit edit is applied (and a stale one refused), tiers clear, the Disk cache
// screen shows the tier and edits and clears it, the Shadow screen shows the chat's session, edits
// the ration and clears it, close drains.
#include <QAbstractItemModelTester>
#include <QCheckBox>
#include <QDialogButtonBox>
#include <QApplication>
#include <QClipboard>
#include <QFile>
#include <QJsonDocument>
#include <QLabel>
#include <QLineEdit>
#include <QListWidget>
#include <QPlainTextEdit>
#include <QPushButton>
#include <QDoubleSpinBox>
#include <QSignalSpy>
#include <QSpinBox>
#include <QTabWidget>
#include <QTableView>
#include <QTableWidget>
#include <QTemporaryDir>
#include <QTextBrowser>
#include <QChart>
#include <QPieSeries>
#include <QScatterSeries>
#include <QComboBox>
#include <QDialog>
#include <QtTest>

#include <httplib.h>

#include "app/engine_host.h"
#include "engine/core/file_util.h"
#include "tests/app/console_steps.h"
#include "engine/model/tiny_model.h"
#include "engine/model/model.h"
#include "app/main_window.h"
#include "models/cache_tier_model.h"
#include "models/chat_model.h"
#include "models/journal_model.h"
#include "models/memory_history.h"
#include "models/settings_model.h"
#include "widgets/backends_screen.h"
#include "widgets/chat_screen.h"
#include "widgets/disk_screen.h"
#include "widgets/journal_screen.h"
#include "widgets/memory_screen.h"
#include "widgets/shadow_screen.h"

namespace {

// The tiny model with one scripted reply: "a very long story" answers about 20,000 tokens (forced
// through the real forward), so a stop always comes before its end.
anchorage::ServerConfig tinyConfig(const QString& dataDir) {
  const std::string dir = dataDir.toStdString();
  std::string story;
  for (int i = 0; i < 20000; ++i) story += " once";
  const std::string replies = dir + "/replies.json";
  if (!anchorage::MakeDirectories(dir, 0700).ok() ||
      !anchorage::WriteFileAtomic(replies, nlohmann::json::array({{{"match", "very long story"}, {"reply", story}}}).dump()).ok())
    return anchorage::ServerConfig{};
  std::vector<std::string> words = {"anchorage", "--data-dir", dir, "--port", "0", "--grid", "64", "--threads", "1",
                                    "--backend", "elsewhere=http://127.0.0.1:9", "--test-replies", replies};
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  auto parsed = anchorage::ParseServerCommandLine(static_cast<int>(argv.size()), argv.data());
  return parsed.ok() ? *parsed : anchorage::ServerConfig{};
}

qint64 tierValue(CacheTierModel* model, const QString& tier, int column) {
  const int row = model->rowOf(tier);
  return row < 0 ? -1 : model->index(row, column).data(CacheTierModel::ValueRole).toLongLong();
}

}  // namespace

class TestConsoleGui : public QObject {
  Q_OBJECT

 private slots:
  // File > Open model folder: the folder is checked first (each missing part named), and the console
  // starts again with the same flags and --model DIR.
  void openModelChecksTheFolderAndKeepsTheFlags() {
    QCOMPARE(ArgumentsWithModel({"anchorage", "--port", "0", "--model", "/old", "--grid", "64", "--model=/older"}, "/new"),
             QStringList({"anchorage", "--port", "0", "--grid", "64", "--model", "/new"}));
    QTemporaryDir dir;
    const std::string model = dir.filePath("tiny").toStdString();
    QVERIFY(anchorage::GenerateTinyModel(anchorage::TinyModelSize::kTiny, 3, model).ok());
    QVERIFY(anchorage::CheckModelFolder(model).ok());
    QVERIFY(!anchorage::CheckModelFolder(dir.filePath("nowhere").toStdString()).ok());
    QVERIFY(QFile::remove(QString::fromStdString(model + "/tokenizer.json")));
    anchorage::Status no_tokenizer = anchorage::CheckModelFolder(model);
    QVERIFY2(!no_tokenizer.ok() && no_tokenizer.message().find("tokenizer.json") != std::string::npos, no_tokenizer.message().c_str());
    QVERIFY(QFile::remove(QString::fromStdString(model + "/config.json")));
    anchorage::Status no_config = anchorage::CheckModelFolder(model);
    QVERIFY2(!no_config.ok() && no_config.message().find("config.json") != std::string::npos, no_config.message().c_str());
  }

  // Cancel stops a load in progress: before it starts (the banner's button), or between two layers.
  void cancellingALoadStopsIt() {
    QTemporaryDir dir;
    QVERIFY(dir.isValid());
    {
      EngineHost host(tinyConfig(dir.path()));
      MainWindow window(&host);
      QSignalSpy cancelled(&host, &EngineHost::loadCancelled);
      QSignalSpy ready(&host, &EngineHost::ready);
      auto* cancel = window.findChild<QPushButton*>("cancelLoadButton");
      QVERIFY(cancel != nullptr);
      QTest::mouseClick(cancel, Qt::LeftButton);
      host.start();
      QVERIFY(host.wait(60000));
      QTRY_COMPARE_WITH_TIMEOUT(cancelled.count(), 1, 5000);
      QCOMPARE(ready.count(), 0);
      QVERIFY(window.endpointUrl().isEmpty());
    }
    EngineHost host(tinyConfig(dir.path()));
    QStringList steps;
    connect(&host, &EngineHost::progress, &host, [&](double, const QString& what) {
      steps << what;
      if (what.startsWith("packing layer 1 of")) host.cancelLoad();
    }, Qt::DirectConnection);
    QSignalSpy cancelled(&host, &EngineHost::loadCancelled);
    QSignalSpy ready(&host, &EngineHost::ready);
    host.start();
    QVERIFY(host.wait(60000));
    QTRY_COMPARE_WITH_TIMEOUT(cancelled.count(), 1, 5000);
    QCOMPARE(ready.count(), 0);
    QVERIFY2(steps.last().startsWith("packing layer 1 of"), qPrintable(steps.join(" | ")));
  }

  // Server > Endpoint…: the endpoint moves to another port (the old one refuses, the new one answers and
  // the chat goes on there); a port in use is refused and the endpoint stays; off stops it (the chat
  // says so) and on again serves at the address the dialog offers, the last one.
  void theEndpointMovesStopsAndStarts() {
    QTemporaryDir dir;
    QVERIFY(dir.isValid());
    EngineHost host(tinyConfig(dir.path()));
    MainWindow window(&host);
    QSignalSpy ready(&host, &EngineHost::ready);
    QSignalSpy changed(&host, &EngineHost::endpointChanged);
    QSignalSpy finished(&host, &EngineHost::chatFinished);
    host.start();
    QTRY_COMPARE_WITH_TIMEOUT(ready.count(), 1, 60000);
    const auto health = [](const QUrl& url) {
      httplib::Client client(url.host().toStdString(), url.port());
      client.set_connection_timeout(2);
      client.set_read_timeout(2);
      const auto r = client.Get("/health");
      return r ? r->status : r.error() == httplib::Error::Connection ? -1 : -2;  // -1: refused; -2: no answer
    };
    const auto chat = [&] {
      host.sendChat("endpoint-test", QJsonArray{QJsonObject{{"role", "user"}, {"content", "Hello there"}}}, QJsonObject{{"max_tokens", 3}, {"temperature", 0}});
    };
    const auto dialog_apply = [&](bool on, int port) {
      QCoreApplication::sendPostedEvents(nullptr, QEvent::DeferredDelete);  // the last dialog, closed
      window.showEndpointDialog();
      auto* dialog = window.findChild<QDialog*>("endpointDialog");
      QVERIFY(dialog != nullptr);
      dialog->findChild<QCheckBox*>("endpointOn")->setChecked(on);
      if (port >= 0) dialog->findChild<QSpinBox*>("endpointPort")->setValue(port);
      dialog->findChild<QDialogButtonBox*>()->button(QDialogButtonBox::Ok)->click();
    };
    QTRY_VERIFY_WITH_TIMEOUT(!window.endpointUrl().isEmpty(), 5000);  // onReady runs on this thread, after the spy
    const auto settle = [&](int n) {  // the spy counts on the host thread; the window's slot runs on this one after it
      QTRY_COMPARE_WITH_TIMEOUT(changed.count(), n, 10000);
      QTRY_COMPARE_WITH_TIMEOUT(window.endpointUrl(), changed[n - 1][0].toBool() ? changed[n - 1][1].toString() : QString(), 5000);
    };
    const QUrl first(window.endpointUrl());
    QCOMPARE(health(first), 200);
    dialog_apply(true, 0);  // any free port
    settle(1);
    QCOMPARE(changed[0][2].toString(), QString());
    const QUrl second(window.endpointUrl());
    QVERIFY2(second.port() > 0 && second.port() != first.port(), qPrintable(second.toString()));
    QCOMPARE(health(second), 200);
    QCOMPARE(health(first), -1);  // the old socket is closed, not left to hang
    chat();
    QTRY_COMPARE_WITH_TIMEOUT(finished.count(), 1, 20000);
    QVERIFY2(finished[0][0].value<ChatTurnStats>().ok, qPrintable(finished[0][0].value<ChatTurnStats>().error));

    httplib::Server blocker;
    const int busy = blocker.bind_to_any_port("127.0.0.1");
    QVERIFY(busy > 0);
    host.setEndpoint(true, "127.0.0.1", busy);
    settle(2);
    QVERIFY2(changed[1][2].toString().contains("in use"), qPrintable(changed[1][1].toString() + " " + changed[1][2].toString()));
    QVERIFY2(changed[1][0].toBool(), qPrintable(changed[1][1].toString()));
    QCOMPARE(window.endpointUrl(), second.toString());
    QCOMPARE(health(second), 200);
    QVERIFY(window.logText().contains("the endpoint did not change"));
    // Beyond loopback without the admin token is refused as at start; the endpoint stays.
    host.setEndpoint(true, "0.0.0.0", 0);
    settle(3);
    QVERIFY2(changed[2][2].toString().contains("needs --admin-token"), qPrintable(changed[2][2].toString()));
    QCOMPARE(window.endpointUrl(), second.toString());
    QCOMPARE(health(second), 200);

    dialog_apply(false, -1);
    settle(4);
    QVERIFY(!changed[3][0].toBool());
    QVERIFY(window.endpointUrl().isEmpty());
    QCOMPARE(health(second), -1);
    chat();
    QTRY_COMPARE_WITH_TIMEOUT(finished.count(), 2, 10000);
    QVERIFY(!finished[1][0].value<ChatTurnStats>().ok);
    QVERIFY2(finished[1][0].value<ChatTurnStats>().error.contains("endpoint is off"), qPrintable(finished[1][0].value<ChatTurnStats>().error));

    dialog_apply(true, -1);  // the dialog offers the last address
    settle(5);
    QCOMPARE(window.endpointUrl(), second.toString());
    QCOMPARE(health(second), 200);
    chat();
    QTRY_COMPARE_WITH_TIMEOUT(finished.count(), 3, 20000);
    QVERIFY(finished[2][0].value<ChatTurnStats>().ok);
    host.drain();
    QVERIFY(host.wait(20000));
  }

  void chatJournalMemorySettingsClearAndDrain() {
    QTemporaryDir dir;
    QVERIFY(dir.isValid());
    EngineHost host(tinyConfig(dir.path()));
    host.setPollIntervalMs(100);
    MainWindow window(&host);
    QAbstractItemModelTester t1(window.cacheModel(), QAbstractItemModelTester::FailureReportingMode::QtTest);
    QAbstractItemModelTester t2(window.journalModel(), QAbstractItemModelTester::FailureReportingMode::QtTest);
    QAbstractItemModelTester t3(window.settingsModel(), QAbstractItemModelTester::FailureReportingMode::QtTest);
    QAbstractItemModelTester t4(window.memoryHistory(), QAbstractItemModelTester::FailureReportingMode::QtTest);
    QSignalSpy progress(&host, &EngineHost::progress);
    window.show();
    host.start();
    QTRY_VERIFY_WITH_TIMEOUT(!window.endpointUrl().isEmpty(), 120000);
    QVERIFY(window.endpointUrl().startsWith("http://127.0.0.1:"));
    QVERIFY(progress.count() >= 3);
    QCOMPARE(progress.last()[0].toDouble(), 1.0);
    QTRY_VERIFY_WITH_TIMEOUT(window.settingsModel()->version() >= 1, 10000);

    // At the default window size every editor on every screen is at least as tall as its size hint (no clipped text).
    window.resize(1280, 800);
    for (int tab = 0; tab < window.tabs()->count(); ++tab) {
      window.tabs()->setCurrentIndex(tab);
      QApplication::processEvents();
      for (QWidget* editor : window.tabs()->widget(tab)->findChildren<QWidget*>()) {
        if (!editor->isVisible() || !(qobject_cast<QAbstractSpinBox*>(editor) || qobject_cast<QComboBox*>(editor) || qobject_cast<QLineEdit*>(editor)))
          continue;
        if (qobject_cast<QLineEdit*>(editor) && qobject_cast<QAbstractSpinBox*>(editor->parentWidget())) continue;  // a spin box's own line
        QVERIFY2(editor->height() >= editor->sizeHint().height(),
                 qPrintable(QString("%1 on tab %2: %3 px of %4").arg(editor->objectName(), window.tabs()->tabText(tab)).arg(editor->height()).arg(editor->sizeHint().height())));
      }
    }

    // A chat from the Chat tab, streamed.
    ChatScreen* chat = window.chatScreen();
    window.tabs()->setCurrentWidget(chat);
    QTRY_VERIFY_WITH_TIMEOUT(chat->generatedModelNotice()->isVisible(), 5000);  // no model folder: the generated one, said so
    chat->input()->setPlainText("Hello, what is an anchor?");
    QSignalSpy deltas(&host, &EngineHost::chatDelta);
    QTest::mouseClick(chat->sendButton(), Qt::LeftButton);
    ChatModel* conversation = chat->currentModel();
    QCOMPARE(conversation->rowCount(), 2);
    QVERIFY(chat->input()->toPlainText().isEmpty());
    QTRY_VERIFY_WITH_TIMEOUT(!conversation->streaming(), 120000);
    const QModelIndex answer = conversation->index(1);
    QCOMPARE(answer.data(ChatModel::ErrorRole).toString(), QString());
    QVERIFY(!(answer.data(ChatModel::ContentRole).toString() + answer.data(ChatModel::ReasoningRole).toString()).isEmpty());
    QVERIFY2(answer.data(ChatModel::StatsRole).toString().startsWith("cold · 0 cached / "), qPrintable(answer.data(ChatModel::StatsRole).toString()));
    QVERIFY2(deltas.count() >= 2, "the answer arrives as a stream of deltas");
    QTRY_VERIFY_WITH_TIMEOUT(chat->transcript()->toPlainText().contains("TTFT"), 5000);

    // Ctrl+Return in the input sends the next turn of the same conversation.
    chat->input()->setFocus();
    chat->input()->setPlainText("And the end anchor?");
    QTest::keyClick(chat->input(), Qt::Key_Return, Qt::ControlModifier);
    QCOMPARE(conversation->rowCount(), 4);
    QTRY_VERIFY_WITH_TIMEOUT(!conversation->streaming(), 120000);
    QCOMPARE(conversation->index(3).data(ChatModel::ErrorRole).toString(), QString());

    // Esc stops a streaming answer: the request is aborted and the turn says so.
    chat->findChild<QSpinBox*>("maxTokens")->setValue(20000);
    chat->input()->setPlainText("Write a very long story.");
    QMetaObject::Connection once = connect(&host, &EngineHost::chatDelta, &window, [&] {
      disconnect(once);
      QTest::keyClick(chat->input(), Qt::Key_Escape);
    });
    QTest::mouseClick(chat->sendButton(), Qt::LeftButton);
    QTRY_VERIFY_WITH_TIMEOUT(!conversation->streaming(), 120000);
    QVERIFY2(conversation->index(5).data(ChatModel::StatsRole).toString().endsWith("stopped"),
             qPrintable(conversation->index(5).data(ChatModel::StatsRole).toString()));
    QCOMPARE(conversation->index(5).data(ChatModel::ErrorRole).toString(), QString());

    // A second conversation with options of its own: a system prompt, greedy, 12 tokens at most.
    QTest::mouseClick(chat->findChild<QPushButton*>("newConversationButton"), Qt::LeftButton);
    ChatModel* second = chat->currentModel();
    QVERIFY(second != conversation);
    const QString secondId = second->conversation();
    chat->systemPrompt()->setText("Answer in one line.");
    chat->temperature()->setValue(0.0);
    chat->maxTokens()->setValue(12);
    QSignalSpy sent(chat, &ChatScreen::sendRequested);
    chat->input()->setPlainText("Name a tier.");
    QTest::mouseClick(chat->sendButton(), Qt::LeftButton);
    QCOMPARE(sent.count(), 1);
    QCOMPARE(sent[0][1].toJsonArray()[0].toObject(), QJsonObject({{"role", "system"}, {"content", "Answer in one line."}}));
    QCOMPARE(sent[0][2].toJsonObject(), QJsonObject({{"max_tokens", 12}, {"temperature", 0.0}}));
    QTRY_VERIFY_WITH_TIMEOUT(!second->streaming(), 120000);
    auto answerText = [&] { return second->index(1).data(ChatModel::ReasoningRole).toString() + second->index(1).data(ChatModel::ContentRole).toString(); };
    const QString greedy = answerText();
    QVERIFY(!greedy.isEmpty());
    QVERIFY2(second->index(1).data(ChatModel::StatsRole).toString().contains("12 tokens"), qPrintable(second->index(1).data(ChatModel::StatsRole).toString()));
    chat->copyAnswer(1);
    QCOMPARE(QApplication::clipboard()->text(), second->index(1).data(ChatModel::ContentRole).toString());
    // Regenerate asks the same messages again in place of the answer; greedy, the same answer comes back.
    QTRY_VERIFY_WITH_TIMEOUT(chat->transcript()->toHtml().contains("#regenerate"), 5000);
    chat->regenerate();
    QCOMPARE(sent.count(), 2);
    QCOMPARE(sent[1][1].toJsonArray(), sent[0][1].toJsonArray());
    QTRY_VERIFY_WITH_TIMEOUT(!second->streaming(), 120000);
    QCOMPARE(second->rowCount(), 2);
    QCOMPARE(answerText(), greedy);
    // Sampling, a regeneration carries a fresh seed (the endpoint's default seed would repeat the last sample).
    chat->temperature()->setValue(1.5);
    chat->regenerate();
    QCOMPARE(sent.count(), 3);
    const QJsonObject sampling = sent[2][2].toJsonObject();
    QVERIFY(sampling.contains("seed") && sampling["temperature"].toDouble() == 1.5);
    QTRY_VERIFY_WITH_TIMEOUT(!second->streaming(), 120000);
    QVERIFY2(second->index(1).data(ChatModel::StatsRole).toString().contains("12 tokens"), qPrintable(second->index(1).data(ChatModel::StatsRole).toString()));
    // An image pasted on the message goes after its text as an image_url part; the tiny model's tower reads it.
    QImage picture(64, 48, QImage::Format_RGB32);
    picture.fill(QColor(40, 120, 200));
    QApplication::clipboard()->setImage(picture);
    chat->input()->setFocus();
    QTest::keySequence(chat->input(), QKeySequence::Paste);
    QCOMPARE(chat->attachedImages().size(), 1);
    QVERIFY(!chat->findChild<QLabel*>("attachedImages")->isHidden());
    QVERIFY(!chat->attachImage("not an image"));
    chat->temperature()->setValue(0.0);
    chat->input()->setPlainText("What is in it?");
    QTest::mouseClick(chat->sendButton(), Qt::LeftButton);
    QCOMPARE(sent.count(), 4);
    const QJsonArray parts = sent[3][1].toJsonArray().last().toObject()["content"].toArray();
    QCOMPARE(parts[0].toObject()["text"].toString(), QString("What is in it?"));
    QVERIFY(parts[1].toObject()["image_url"].toObject()["url"].toString().startsWith("data:image/png;base64,"));
    QVERIFY(chat->attachedImages().isEmpty());
    QTRY_VERIFY_WITH_TIMEOUT(!second->streaming(), 120000);
    QCOMPARE(second->index(3).data(ChatModel::ErrorRole).toString(), QString());
    QTRY_VERIFY(chat->transcript()->toPlainText().contains("[an image]"));
    // Each conversation keeps its options: the first one's come back with it.
    chat->conversationList()->setCurrentRow(1);
    QCOMPARE(chat->currentModel(), conversation);
    QCOMPARE(chat->maxTokens()->value(), 20000);
    QVERIFY(chat->systemPrompt()->text().isEmpty());
    // Renamed in the list; deleted after the question.
    chat->conversationList()->item(0)->setText("Tiers");
    QCOMPARE(second->title(), QString("Tiers"));
    chat->conversationList()->setCurrentRow(0);
    QCOMPARE(chat->systemPrompt()->text(), QString("Answer in one line."));
    int deleteAsked = 0;
    chat->setConfirmFunction([&](QWidget*, const QString&, const QString& text) { return ++deleteAsked, text.contains("Tiers"); });
    const int conversations = chat->conversationCount();
    QTest::mouseClick(chat->findChild<QPushButton*>("deleteConversationButton"), Qt::LeftButton);
    QCOMPARE(deleteAsked, 1);
    QCOMPARE(chat->conversationCount(), conversations - 1);
    QCOMPARE(chat->currentModel(), conversation);

    // The journal got the request and its cache events; the memory screen's numbers moved.
    QTableView* journalTable = window.journalScreen()->table();
    QTRY_VERIFY_WITH_TIMEOUT(journalTable->model()->rowCount() >= 2, 10000);
    bool sawRequest = false;
    for (int r = 0; r < journalTable->model()->rowCount(); ++r) {
      const QModelIndex kind = journalTable->model()->index(r, JournalModel::KindColumn);
      if (kind.data().toString() == "request") {
        sawRequest = true;
        QCOMPARE(kind.data(JournalModel::StatusRole).toInt(), 200);
        const QString session = journalTable->model()->index(r, JournalModel::SessionColumn).data().toString();
        QVERIFY2(session == conversation->conversation() || session == secondId, qPrintable(session));
      }
    }
    QVERIFY(sawRequest);
    // The charts plot it: a TTFT point and a re-read point of its source, and its slice.
    QChart* ttft = window.journalScreen()->ttftChart();
    QTRY_VERIFY_WITH_TIMEOUT(!ttft->series().isEmpty(), 10000);
    auto* points = qobject_cast<QScatterSeries*>(ttft->series().first());
    QVERIFY(points != nullptr && points->count() >= 1 && points->at(0).y() > 0);
    QVERIFY(!window.journalScreen()->rereadChart()->series().isEmpty());
    auto* pie = qobject_cast<QPieSeries*>(window.journalScreen()->sourceChart()->series().first());
    QVERIFY(pie != nullptr && pie->sum() >= 1);
    // The charts plot the rows the filter shows, and say so when none is a request.
    auto* sessionFilter = window.journalScreen()->findChild<QLineEdit*>("sessionFilter");
    sessionFilter->setText("no-such-session");
    QVERIFY(ttft->series().isEmpty());
    QVERIFY2(ttft->title().contains("no request among the rows shown"), qPrintable(ttft->title()));
    sessionFilter->setText(secondId);
    const auto plotted = [&] {
      int points = 0;
      for (QAbstractSeries* s : ttft->series()) points += qobject_cast<QScatterSeries*>(s)->count();
      return points;
    };
    // The second conversation's turn, its two regenerations and the turn with an image (its row may come with the next poll).
    QTRY_COMPARE_WITH_TIMEOUT(plotted(), 4, 10000);
    sessionFilter->clear();
    QCOMPARE(ttft->title(), QString("Time to first token (ms)"));
    CacheTierModel* tiers = window.cacheModel();
    QTRY_VERIFY_WITH_TIMEOUT(tierValue(tiers, "resident", CacheTierModel::BytesColumn) > 0, 10000);
    QVERIFY(tierValue(tiers, "resident", CacheTierModel::EntriesColumn) > 0);
    QCOMPARE(tierValue(tiers, "end", CacheTierModel::EntriesColumn), 1);
    QVERIFY(window.memoryHistory()->rowCount() >= 1);
    QVERIFY(window.findChild<QLabel*>("phaseLabel")->text().startsWith("idle · last: "));
    // The slots (two on the CPU): the Memory screen lists them, the status bar counts the busy ones.
    QLabel* slotList = window.memoryScreen()->findChild<QLabel*>("slotList");
    QTRY_VERIFY_WITH_TIMEOUT(slotList->text().count("Slot ") == 2, 10000);
    QVERIFY2(slotList->text().contains("Slot 0 · idle · session " + conversation->conversation()), qPrintable(slotList->text()));
    QTRY_COMPARE_WITH_TIMEOUT(window.findChild<QLabel*>("queueLabel")->text(), QString("queue 0 · slots 0/2 busy"), 10000);
    // Help > About names the version, what runs the model and the data folder.
    const QString about = window.aboutText();
    QVERIFY2(about.startsWith("Anchorage 0.") && about.contains(" · 2 slots") && about.contains(" · bf16 K/V rows · ") &&
                 about.contains("generated tiny model") &&
                 about.contains("Data folder: " + dir.path()) && about.contains(window.endpointUrl()),
             qPrintable(about));

    // Edit a limit: applied as the next version, in the engine's document and on disk.
    MemoryScreen* memory = window.memoryScreen();
    SettingsModel* settings = window.settingsModel();
    const qint64 version = settings->version();
    double wanted = 0;
    applyCeilingEdit(window, &wanted);
    if (QTest::currentTestFailed()) return;
    QDoubleSpinBox* ceiling = memory->limitEditor("memory.ceiling_gb");
    QFile file(dir.filePath("settings.json"));
    QVERIFY(file.open(QIODevice::ReadOnly));
    const QJsonObject stored = QJsonDocument::fromJson(file.readAll()).object();
    QCOMPARE(stored["version"].toInteger(), version + 1);
    QCOMPARE(stored["memory"].toObject()["ceiling_gb"].toDouble(), wanted);
    QLabel* message = memory->findChild<QLabel*>("limitsMessage");
    QVERIFY(message->text().startsWith("Applied"));

    // A stale edit is refused with 409 and shown; a peak below the ceiling is caught before sending.
    QJsonObject stale = settings->documentWith({{"memory.ceiling_gb", 1.0}});
    stale["version"] = version;
    host.replaceSettings(stale);
    QTRY_VERIFY_WITH_TIMEOUT(message->text().startsWith("Refused (HTTP 409)"), 10000);
    QCOMPARE(settings->version(), version + 1);
    QDoubleSpinBox* peak = memory->limitEditor("memory.prefill_peak_gb");
    peak->setValue(ceiling->value() - 0.25);
    memory->applyLimits();
    QVERIFY(message->text().startsWith("Peak during prefill"));
    QCOMPARE(settings->version(), version + 1);

    // Clear a tier from its screen; a declined confirmation clears nothing.
    int asked = 0;
    QString asked_text;
    memory->setConfirmFunction([&](QWidget*, const QString&, const QString& text) { return asked_text = text, ++asked, false; });
    QSignalSpy requested(memory, &MemoryScreen::clearTierRequested);
    QTest::mouseClick(memory->findChild<QPushButton*>("clear_end"), Qt::LeftButton);
    QCOMPARE(asked, 1);
    QVERIFY2(asked_text.startsWith("Clear the end tier (1 entry, ") && asked_text.contains("KiB)"), qPrintable(asked_text));  // what will be lost
    QCOMPARE(requested.count(), 0);
    memory->setConfirmFunction([&](QWidget*, const QString&, const QString&) { return ++asked, true; });
    QSignalSpy cleared(&host, &EngineHost::tierCleared);
    QTest::mouseClick(memory->findChild<QPushButton*>("clear_end"), Qt::LeftButton);
    QCOMPARE(asked, 2);
    QTRY_COMPARE_WITH_TIMEOUT(cleared.count(), 1, 10000);
    QCOMPARE(cleared[0][0].toString(), QString("end"));
    QVERIFY(cleared[0][1].toBool());
    QTRY_COMPARE_WITH_TIMEOUT(tierValue(tiers, "end", CacheTierModel::EntriesColumn), 0, 10000);
    QVERIFY(tierValue(tiers, "resident", CacheTierModel::EntriesColumn) > 0);
    QTest::mouseClick(memory->findChild<QPushButton*>("clear_resident"), Qt::LeftButton);
    QTRY_COMPARE_WITH_TIMEOUT(tierValue(tiers, "resident", CacheTierModel::EntriesColumn), 0, 10000);
    QCOMPARE(tierValue(tiers, "resident", CacheTierModel::BytesColumn), 0);
    QTRY_VERIFY_WITH_TIMEOUT(window.journalModel()->index(0, JournalModel::KindColumn).data().toString() == "clear", 10000);

    // The Disk cache screen: the tier is open in the data folder; a budget edit applies; a clear asks first.
    DiskScreen* disk = window.diskScreen();
    window.tabs()->setCurrentWidget(disk);
    QTRY_VERIFY_WITH_TIMEOUT(disk->summaryText().contains("readwrite"), 10000);
    QVERIFY2(disk->summaryText().contains("cache/disk"), qPrintable(disk->summaryText()));
    const qint64 before_disk = settings->version();
    disk->editor("disk_cache.budget_gb")->setValue(3);
    QTest::mouseClick(disk->findChild<QPushButton*>("applyDiskButton"), Qt::LeftButton);
    QTRY_COMPARE_WITH_TIMEOUT(settings->version(), before_disk + 1, 10000);
    QCOMPARE(settings->value("disk_cache.budget_gb").toDouble(), 3.0);
    QVERIFY(disk->findChild<QLabel*>("diskMessage")->text().startsWith("Applied"));
    int disk_asked = 0;
    QString disk_question;
    disk->setConfirmFunction([&](QWidget*, const QString&, const QString& text) { return disk_question = text, ++disk_asked, false; });
    QSignalSpy disk_cleared(&host, &EngineHost::tierCleared);
    QTest::mouseClick(disk->findChild<QPushButton*>("clear_disk"), Qt::LeftButton);
    QCOMPARE(disk_asked, 1);
    QVERIFY2(QRegularExpression("^Delete the disk tier's \\d+ anchors and \\d+ chunks \\([0-9.]+ (B|KiB|MiB|GiB)\\)").match(disk_question).hasMatch(),
             qPrintable(disk_question));  // what will be lost, before it is
    QCOMPARE(disk_cleared.count(), 0);
    disk->setConfirmFunction([&](QWidget*, const QString&, const QString&) { return ++disk_asked, true; });
    QTest::mouseClick(disk->findChild<QPushButton*>("clear_disk"), Qt::LeftButton);
    QTRY_COMPARE_WITH_TIMEOUT(disk_cleared.count(), 1, 10000);
    QCOMPARE(disk_cleared[0][0].toString(), QString("disk"));
    QVERIFY(disk_cleared[0][1].toBool());
    QTRY_VERIFY_WITH_TIMEOUT(disk->summaryText().contains("of its 3.00 GiB budget"), 10000);  // a command between requests applies the settings
    QVERIFY2(disk->summaryText().contains("Written today"), qPrintable(disk->summaryText()));
    QVERIFY2(disk->prefixesEmptyText().contains("at least 4096 tokens"), qPrintable(disk->prefixesEmptyText()));  // empty, and why
    // The session spill beside it: open, editable, cleared only after a yes.
    QVERIFY2(disk->spillSummaryText().contains("conversations"), qPrintable(disk->spillSummaryText()));
    const qint64 before_spill = settings->version();
    disk->editor("spill.min_tokens")->setValue(20000);
    QTest::mouseClick(disk->findChild<QPushButton*>("applyDiskButton"), Qt::LeftButton);
    QTRY_COMPARE_WITH_TIMEOUT(settings->version(), before_spill + 1, 10000);
    QCOMPARE(settings->value("spill.min_tokens").toDouble(), 20000.0);
    QTest::mouseClick(disk->findChild<QPushButton*>("clear_spill"), Qt::LeftButton);
    QTRY_COMPARE_WITH_TIMEOUT(disk_cleared.count(), 2, 10000);
    QCOMPARE(disk_cleared[1][0].toString(), QString("spill"));
    QVERIFY(disk_cleared[1][1].toBool());
    QTRY_VERIFY_WITH_TIMEOUT(disk->spillEntriesEmptyText().contains("at least 20000 tokens"), 10000);
    QTRY_VERIFY_WITH_TIMEOUT(disk->spillEventTable()->rowCount() >= 1, 10000);
    QCOMPARE(disk->spillEventTable()->item(0, 1)->text(), QString("cleared"));  // in words; the engine's kind in the tooltip
    QCOMPARE(disk->spillEventTable()->item(0, 1)->toolTip(), QString("clear"));

    // The Shadow screen: the chat's conversation is read by the generated shadow model; a ration edit applies; a clear asks first.
    ShadowScreen* shadow = window.shadowScreen();
    window.tabs()->setCurrentWidget(shadow);
    QTRY_VERIFY_WITH_TIMEOUT(shadow->summaryText().contains("Reading"), 10000);
    QTRY_VERIFY_WITH_TIMEOUT(shadow->sessionTable()->rowCount() >= 1, 10000);
    QVERIFY(shadow->sessionTable()->item(0, 1)->text().toLongLong() >= 0);
    const qint64 before_shadow = settings->version();
    shadow->editor("shadow.ration")->setValue(0.05);
    QTest::mouseClick(shadow->findChild<QPushButton*>("applyShadowButton"), Qt::LeftButton);
    QTRY_COMPARE_WITH_TIMEOUT(settings->version(), before_shadow + 1, 10000);
    QCOMPARE(settings->value("shadow.ration").toDouble(), 0.05);
    int shadow_asked = 0;
    QString shadow_question;
    shadow->setConfirmFunction([&](QWidget*, const QString&, const QString& text) { return shadow_question = text, ++shadow_asked, true; });
    QTest::mouseClick(shadow->findChild<QPushButton*>("clear_shadow"), Qt::LeftButton);
    QCOMPARE(shadow_asked, 1);
    QVERIFY2(QRegularExpression("^Drop [1-9]\\d* session\\(s\\)' shadow states \\([0-9.]+ \\w+ in memory, [0-9.]+ \\w+ on disk\\)").match(shadow_question).hasMatch(),
             qPrintable(shadow_question));
    QTRY_COMPARE_WITH_TIMEOUT(disk_cleared.count(), 3, 10000);
    QCOMPARE(disk_cleared[2][0].toString(), QString("shadow"));
    QVERIFY(disk_cleared[2][1].toBool());
    QTRY_COMPARE_WITH_TIMEOUT(shadow->sessionTable()->rowCount(), 0, 10000);

    // The Backends tab: the one backend, down (nobody listens on port 9); the chat's picker lists it
    // after the embedded model, and a turn sent to it ends with the mapped error.
    BackendsScreen* backends = window.backendsScreen();
    QTRY_COMPARE_WITH_TIMEOUT(backends->table()->rowCount(), 1, 10000);
    QTRY_COMPARE_WITH_TIMEOUT(backends->table()->item(0, 2)->text(), QString("down"), 20000);
    QVERIFY(backends->summaryText().contains("0 of 1 backends up"));
    QComboBox* picker = chat->modelPicker();
    QTRY_COMPARE_WITH_TIMEOUT(picker->count(), 2, 10000);
    QCOMPARE(picker->itemText(1), QString("elsewhere"));
    picker->setCurrentIndex(1);
    window.tabs()->setCurrentWidget(chat);
    chat->input()->setPlainText("Are you there?");
    QTest::mouseClick(chat->sendButton(), Qt::LeftButton);
    ChatModel* forwarded = chat->currentModel();
    QTRY_VERIFY_WITH_TIMEOUT(!forwarded->streaming(), 30000);
    const QString forwardError = forwarded->index(forwarded->rowCount() - 1).data(ChatModel::ErrorRole).toString();
    QVERIFY2(forwardError.contains("unreachable"), qPrintable(forwardError));
    picker->setCurrentIndex(0);
    QTest::keyClick(&window, Qt::Key_6, Qt::ControlModifier);
    QCOMPARE(window.tabs()->currentWidget(), static_cast<QWidget*>(backends));
    // A backend added from the screen lands in the settings document and shows up beside the flag's;
    // the flag's cannot be removed here, the added one can.
    const qint64 before_backend = settings->version();
    backends->findChild<QLineEdit*>("backendName")->setText("added");
    backends->findChild<QLineEdit*>("backendUrl")->setText("http://127.0.0.1:10");
    QTest::mouseClick(backends->findChild<QPushButton*>("addBackendButton"), Qt::LeftButton);
    QTRY_COMPARE_WITH_TIMEOUT(settings->version(), before_backend + 1, 10000);
    QCOMPARE(settings->value("backends.upstreams").toString(), QString("added=http://127.0.0.1:10"));
    QTRY_COMPARE_WITH_TIMEOUT(backends->table()->rowCount(), 2, 10000);
    auto* remove = backends->findChild<QPushButton*>("removeBackendButton");
    auto rowOf = [&](const QString& name) {
      for (int r = 0; r < backends->table()->rowCount(); ++r)
        if (backends->table()->item(r, 0)->text() == name) return r;
      return -1;
    };
    backends->table()->selectRow(rowOf("elsewhere"));
    QVERIFY(!remove->isEnabled());
    QVERIFY2(remove->toolTip().contains("--backend"), qPrintable(remove->toolTip()));
    backends->table()->selectRow(rowOf("added"));
    QVERIFY(remove->isEnabled());
    QTest::mouseClick(remove, Qt::LeftButton);
    QTRY_COMPARE_WITH_TIMEOUT(settings->version(), before_backend + 2, 10000);
    QCOMPARE(settings->value("backends.upstreams").toString(), QString());
    QTRY_COMPARE_WITH_TIMEOUT(backends->table()->rowCount(), 1, 10000);
    QCOMPARE(backends->table()->item(0, 0)->text(), QString("elsewhere"));

    // The engine log: the start's progress and notes, the settings applied and the clears, opened with Ctrl+L.
    const QString log = window.logText();
    for (const char* said : {"loading: packing layer 1 of", "note: backend elsewhere at http://127.0.0.1:9", "settings version", "cleared disk"})
      QVERIFY2(log.contains(said), said);
    QTest::keyClick(&window, Qt::Key_L, Qt::ControlModifier);
    auto* logView = window.findChild<QPlainTextEdit*>("engineLog");
    QVERIFY(logView != nullptr && logView->isVisible());
    QCOMPARE(logView->toPlainText(), window.logText());
    window.findChild<QDialog*>("engineLogDialog")->close();

    // Shortcuts switch tabs.
    QTest::keyClick(&window, Qt::Key_4, Qt::ControlModifier);
    QCOMPARE(window.tabs()->currentWidget(), static_cast<QWidget*>(window.journalScreen()));

    // Closing drains the engine, then the window closes.
    QSignalSpy drained(&host, &EngineHost::drained);
    window.close();
    QTRY_VERIFY_WITH_TIMEOUT(!host.isRunning(), 30000);
    QCOMPARE(drained.count(), 1);
    QTRY_VERIFY_WITH_TIMEOUT(!window.isVisible(), 5000);
  }
};

QTEST_MAIN(TestConsoleGui)
#include "test_console_gui.moc"
