// anchorage: the operator console; runs the engine on a worker thread and serves the endpoint.
#include <sys/stat.h>

#include <QApplication>
#include <QDir>
#include <QFile>
#include <QTimer>

#include <cstdio>
#include <string>
#include <vector>

#include "app/engine_host.h"
#include "app/main_window.h"
#include "widgets/sort_arrow_style.h"
#include "widgets/chat_screen.h"
#include "widgets/journal_screen.h"

#include <QTableView>

#include <QPlainTextEdit>

namespace {

const char* kGuiUsage =
    "\nConsole flags:\n"
    "  --screenshots DIR   run a short scripted chat, render every screen to DIR/*.png, exit\n"
    "  --connect URL       operate a running anchorage-server (http://HOST:PORT) instead of hosting an\n"
    "                      engine; with it only --admin-token T (the server's) and --api-key K apply\n";

// The remote-mode flags (--connect URL, --admin-token T, --api-key K) out of args; false, saying why
// in *error, when --connect comes with a flag that only a hosted engine takes.
bool ParseRemoteFlags(const std::vector<char*>& args, RemoteTarget* target, QString* error) {
  QString connect;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string arg = args[i];
    auto value = [&](const char* flag, QString* out) {
      const std::string prefix = std::string(flag) + "=";
      if (arg == flag && i + 1 < args.size()) {
        *out = QString::fromLocal8Bit(args[++i]);
        return true;
      }
      if (arg.rfind(prefix, 0) != 0) return false;
      *out = QString::fromLocal8Bit(arg.c_str() + prefix.size());
      return true;
    };
    if (value("--connect", &connect) || value("--admin-token", &target->adminToken) || value("--api-key", &target->apiKey)) continue;
    if (arg == "--connect" || arg == "--admin-token" || arg == "--api-key") {
      *error = QString("%1 needs a value").arg(QString::fromLocal8Bit(args[i]));
      return false;
    }
    *error = QString("with --connect only --admin-token and --api-key apply; '%1' is a flag of the engine the console hosts").arg(QString::fromLocal8Bit(args[i]));
    return false;
  }
  target->url = ServerBaseUrl(connect, error);
  return !target->url.isEmpty();
}

bool HasConnectFlag(const std::vector<char*>& args) {
  for (size_t i = 1; i < args.size(); ++i)
    if (std::string(args[i]) == "--connect" || std::string(args[i]).rfind("--connect=", 0) == 0) return true;
  return false;
}

// The --screenshots script: two chat turns, a pause for the journal, every screen grabbed.
void runScreenshotScript(MainWindow* window, EngineHost* host, const QString& dir) {
  auto turns = std::make_shared<QStringList>(QStringList{"Hello! What are anchors?", "And what does the end anchor keep?"});
  auto sendNext = [window, turns] {
    ChatScreen* chat = window->chatScreen();
    chat->input()->setPlainText(turns->takeFirst());
    chat->send();
  };
  QObject::connect(host, &EngineHost::ready, window, [sendNext] { QTimer::singleShot(300, sendNext); });
  QObject::connect(host, &EngineHost::chatFinished, window, [window, host, turns, sendNext, dir](const ChatTurnStats& stats) {
    if (!stats.ok) std::fprintf(stderr, "anchorage: scripted chat failed: %s\n", qPrintable(stats.error));
    if (!turns->isEmpty()) {
      QTimer::singleShot(300, sendNext);
      return;
    }
    QTimer::singleShot(2500, window, [window, host, dir] {  // a few polls: journal, chart samples
      window->chatScreen()->setReasoningExpanded(3, true);
      window->journalScreen()->table()->selectRow(0);
      const QStringList files = window->grabScreens(dir);
      for (const QString& f : files) std::printf("anchorage: wrote %s\n", qPrintable(f));
      std::fflush(stdout);
      host->drain();
      host->wait();
      QCoreApplication::exit(files.isEmpty() ? 1 : 0);
    });
  });
  QObject::connect(host, &EngineHost::startFailed, window, [](const QString& error) {
    std::fprintf(stderr, "anchorage: %s\n", qPrintable(error));
    QCoreApplication::exit(1);
  });
}

}  // namespace

int main(int argc, char** argv) {
  umask(077);  // the data folder (journal, settings, caches) is private to its user
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {  // before Qt needs a display
      std::printf("%s%s", anchorage::ServerUsage(), kGuiUsage);
      return 0;
    }
  }
  QApplication app(argc, argv);  // takes Qt's own flags (-platform, ...) out of argv
  QApplication::setStyle(new SortArrowStyle);  // the platform's style, sort arrows the way the rows run
  QCoreApplication::setOrganizationName("Anchorage");
  QCoreApplication::setApplicationName("anchorage");

  QString screenshots;
  std::vector<char*> args{argv[0]};
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--screenshots" && i + 1 < argc) screenshots = QString::fromLocal8Bit(argv[++i]);
    else if (std::string(argv[i]).rfind("--screenshots=", 0) == 0) screenshots = QString::fromLocal8Bit(argv[i] + 14);
    else args.push_back(argv[i]);
  }
  if (HasConnectFlag(args)) {
    RemoteTarget target;
    QString error;
    if (!screenshots.isEmpty()) error = "--screenshots runs on a hosted engine, not with --connect";
    else ParseRemoteFlags(args, &target, &error);
    if (!error.isEmpty()) {
      std::fprintf(stderr, "anchorage: %s\n", qPrintable(error));
      return 2;
    }
    EngineHost host(target);
    MainWindow window(&host);
    window.setPersistState(true);
    window.show();
    host.start();
    const int rc = app.exec();
    host.drain();
    host.wait();
    return rc;
  }
  auto parsed = anchorage::ParseServerCommandLine(static_cast<int>(args.size()), args.data());
  if (!parsed.ok()) {
    std::fprintf(stderr, "anchorage: %s\n\n%s%s", parsed.status().message().c_str(), anchorage::ServerUsage(), kGuiUsage);
    return 2;
  }
  if (parsed->help) {
    std::printf("%s%s", anchorage::ServerUsage(), kGuiUsage);
    return 0;
  }
  for (const std::string& note : parsed->notes) std::fprintf(stderr, "anchorage: %s\n", note.c_str());
  if (anchorage::Status bind = anchorage::CheckBindAllowed(parsed->host, parsed->admin_token); !bind.ok()) {
    std::fprintf(stderr, "anchorage: %s\n", bind.message().c_str());
    return 2;
  }

  anchorage::ServerConfig config = *parsed;
  if (!screenshots.isEmpty() && config.test_replies_file.empty()) {
    // Scripted answers (forced tokens through the real forward) so the shots show reasoning and text.
    const QString replies = QDir(QString::fromStdString(config.data_dir)).filePath("screenshot-replies.json");
    QDir().mkpath(QString::fromStdString(config.data_dir));
    QFile f(replies);
    if (f.open(QIODevice::WriteOnly | QIODevice::Truncate)) {
      f.write(R"([{"match": "anchors?", "reply": "The operator asks what an anchor is. Keep it short.\n</think>\n\nAn anchor is a copy of every GDN layer's recurrent state and conv tail at a grid line. A later prompt that shares that prefix resumes there instead of prefilling from token 0."},
 {"match": "end anchor", "reply": "They ask about the end anchor.\n</think>\n\nThe state at the end of the last generation, so the follow-up forwards only what is new."}])");
      f.close();
      config.test_replies_file = replies.toStdString();
    }
  }
  EngineHost host(config);
  MainWindow window(&host);
  QObject::connect(&host, &EngineHost::ready, &window, [](const QString& url) {
    std::printf("anchorage: serving on %s\n", qPrintable(url));
    std::fflush(stdout);
  });
  if (!screenshots.isEmpty()) {
    window.resize(1280, 800);
    runScreenshotScript(&window, &host, QDir(screenshots).absolutePath());
  } else {
    window.setPersistState(true);
  }
  window.show();
  host.start();
  const int rc = app.exec();
  if (host.isRunning()) {
    host.drain();
    host.wait();
  }
  return rc;
}
