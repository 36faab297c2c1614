#include "app/main_window.h"

#include <QAction>
#include <QApplication>
#include <QBoxLayout>
#include <QCheckBox>
#include <QComboBox>
#include <QDialogButtonBox>
#include <QFormLayout>
#include <QClipboard>
#include <QCloseEvent>
#include <QDateTime>
#include <QDialog>
#include <QDir>
#include <QFileDialog>
#include <QFontDatabase>
#include <QGridLayout>
#include <QHBoxLayout>
#include <QInputDialog>
#include <QLabel>
#include <QLineEdit>
#include <QMenuBar>
#include <QMessageBox>
#include <QPlainTextEdit>
#include <QProcess>
#include <QProgressBar>
#include <QPushButton>
#include <QSettings>
#include <QShortcut>
#include <QSpinBox>
#include <QStatusBar>
#include <QStyle>
#include <QTabWidget>
#include <QTimer>
#include <QToolButton>
#include <QUrl>
#include <QVBoxLayout>

#include <iterator>

#include "app/engine_host.h"
#include "engine/model/model.h"
#include "models/cache_tier_model.h"
#include "models/journal_model.h"
#include "models/memory_history.h"
#include "models/settings_model.h"
#include "widgets/backends_screen.h"
#include "widgets/chat_screen.h"
#include "widgets/disk_screen.h"
#include "widgets/journal_screen.h"
#include "widgets/memory_screen.h"
#include "widgets/model_library.h"
#include "widgets/screen_parts.h"
#include "widgets/settings_screen.h"
#include "widgets/shadow_screen.h"

namespace {
const char* kTabNames[] = {"memory", "disk-cache", "shadow", "journal", "chat", "backends", "settings"};
constexpr int kTabCount = static_cast<int>(std::size(kTabNames));
// The routes each tab's figures come from (over --connect), the server's own first.
const QStringList kTabRoutes[] = {{"/health", "/v1/cache/stats"}, {"/health", "/v1/cache/stats"}, {"/health", "/v1/shadow/status"},
                                  {"/health", "/v1/journal"},     {"/health"},                   {"/health"},
                                  {"/health", "/v1/settings/schema", "/v1/settings"}};

// "3 min ago" from a time in Unix ms.
QString AgeText(qint64 thenMs, qint64 nowMs) {
  const qint64 s = std::max<qint64>(0, (nowMs - thenMs) / 1000);
  if (s < 60) return QObject::tr("%1 s ago").arg(s);
  if (s < 3600) return QObject::tr("%1 min ago").arg(s / 60);
  return QObject::tr("%1 h %2 min ago").arg(s / 3600).arg(s / 60 % 60);
}
}  // namespace

MainWindow::MainWindow(EngineHost* host, QWidget* parent) : QMainWindow(parent), m_host(host) {
  setWindowTitle(tr("Anchorage"));
  setMinimumSize(900, 600);
  resize(1280, 800);

  m_cacheModel = new CacheTierModel(this);
  m_journalModel = new JournalModel(this);
  m_settingsModel = new SettingsModel(this);
  m_history = new MemoryHistory(this);

  m_memory = new MemoryScreen(m_cacheModel, m_history, m_settingsModel, m_journalModel, this);
  m_disk = new DiskScreen(m_settingsModel, this);
  m_shadow = new ShadowScreen(m_settingsModel, this);
  m_journalScreen = new JournalScreen(m_journalModel, this);
  m_chat = new ChatScreen(this);
  m_backends = new BackendsScreen(m_settingsModel, this);
  m_settingsScreen = new SettingsScreen(m_settingsModel, this);
  m_tabs = new QTabWidget(this);
  m_tabs->setObjectName("tabs");
  m_tabs->addTab(m_memory, tr("&Memory"));
  m_tabs->addTab(m_disk, tr("&Disk cache"));
  m_tabs->addTab(m_shadow, tr("S&hadow"));
  m_tabs->addTab(m_journalScreen, tr("&Journal"));
  m_tabs->addTab(m_chat, tr("&Chat"));
  m_tabs->addTab(m_backends, tr("&Backends"));
  m_tabs->addTab(m_settingsScreen, tr("Se&ttings"));
  // Each screen's first line says when the routes it shows do not answer (the screen is greyed then).
  for (int i = 0; i < kTabCount; ++i) {
    auto* line = new QLabel(m_tabs->widget(i));
    line->setObjectName(QString("unavailable-") + kTabNames[i]);
    line->setWordWrap(true);
    line->setStyleSheet("background: #fdecea; color: #8a1c12; padding: 4px;");
    line->hide();
    if (auto* box = qobject_cast<QBoxLayout*>(m_tabs->widget(i)->layout())) box->insertWidget(0, line);
    m_unavailableLines.append(line);
  }
  m_ageTimer = new QTimer(this);
  m_ageTimer->setInterval(5000);
  connect(m_ageTimer, &QTimer::timeout, this, &MainWindow::showAvailability);

  // The loading banner: shown until the engine is ready (or says why it is not).
  m_banner = new QWidget(this);
  m_bannerText = new QLabel(tr("Starting the engine…"), m_banner);
  m_bannerText->setWordWrap(true);
  m_bannerText->setTextInteractionFlags(Qt::TextSelectableByMouse);
  m_loadBar = new QProgressBar(m_banner);
  m_loadBar->setObjectName("loadProgress");
  m_loadBar->setRange(0, 100);
  m_cancelLoadButton = new QPushButton(tr("Cancel"), m_banner);
  m_cancelLoadButton->setObjectName("cancelLoadButton");
  m_cancelLoadButton->setToolTip(tr("Stop loading the model (at its next step or layer)"));
  m_cancelLoadButton->setVisible(!host->isRemote());
  connect(m_cancelLoadButton, &QPushButton::clicked, this, [this] {
    m_cancelLoadButton->setEnabled(false);
    m_cancelLoadButton->setText(tr("Cancelling…"));
    m_host->cancelLoad();
  });
  // Several notes at once show as the first and a count; Details lists them all (in the tooltip too).
  m_bannerDetails = new QToolButton(m_banner);
  m_bannerDetails->setObjectName("bannerDetails");
  m_bannerDetails->setText(tr("Details"));
  m_bannerDetails->setCheckable(true);
  m_bannerDetails->hide();
  m_bannerAll = new QLabel(m_banner);
  m_bannerAll->setObjectName("bannerAll");
  m_bannerAll->setTextInteractionFlags(Qt::TextSelectableByMouse);
  m_bannerAll->hide();
  connect(m_bannerDetails, &QToolButton::toggled, m_bannerAll, &QWidget::setVisible);
  auto* bannerLayout = new QGridLayout(m_banner);
  bannerLayout->setContentsMargins(4, 0, 4, 0);
  bannerLayout->addWidget(m_bannerText, 0, 0);
  bannerLayout->addWidget(m_bannerDetails, 0, 1);
  bannerLayout->addWidget(m_loadBar, 0, 2);
  bannerLayout->addWidget(m_cancelLoadButton, 0, 3);
  bannerLayout->addWidget(m_bannerAll, 1, 0, 1, 4);
  bannerLayout->setColumnStretch(0, 1);
  bannerLayout->setColumnStretch(2, 1);
  auto* central = new QWidget(this);
  auto* layout = new QVBoxLayout(central);
  layout->setContentsMargins(4, 4, 4, 4);
  layout->addWidget(m_banner);
  layout->addWidget(m_tabs, 1);
  setCentralWidget(central);

  buildStatusBar();
  buildMenus();
  if (host->isRemote()) {
    m_bannerText->setText(tr("Connecting to %1…").arg(host->remote().url));
    m_loadBar->setRange(0, 0);
    m_modelLabel->setText(tr("model: connecting"));
  }

  for (int i = 0; i < kTabCount; ++i) {
    auto* s = new QShortcut(QKeySequence(Qt::CTRL | Qt::Key(Qt::Key_1 + i)), this);
    connect(s, &QShortcut::activated, this, [this, i] { m_tabs->setCurrentIndex(i); });
  }
  auto* sendShortcut = new QShortcut(QKeySequence(Qt::CTRL | Qt::Key_Return), this);
  connect(sendShortcut, &QShortcut::activated, this, [this] {
    m_tabs->setCurrentWidget(m_chat);
    m_chat->send();
  });
  auto* sendShortcut2 = new QShortcut(QKeySequence(Qt::CTRL | Qt::Key_Enter), this);
  connect(sendShortcut2, &QShortcut::activated, sendShortcut, &QShortcut::activated);
  auto* stopShortcut = new QShortcut(QKeySequence(Qt::Key_Escape), this);
  connect(stopShortcut, &QShortcut::activated, m_chat, &ChatScreen::stop);

  // Engine -> models (snapshots, queued from the host thread).
  connect(host, &EngineHost::progress, this, &MainWindow::onProgress);
  connect(host, &EngineHost::ready, this, &MainWindow::onReady);
  connect(host, &EngineHost::endpointChanged, this, &MainWindow::onEndpoint);
  connect(host, &EngineHost::startFailed, this, &MainWindow::onStartFailed);
  connect(host, &EngineHost::connectionChanged, this, &MainWindow::onConnection);
  connect(host, &EngineHost::tierCleared, this, [this](const QString& tier, bool ok, const QString& message) {
    logLine(ok ? tr("cleared %1").arg(tier) : tr("warning: clearing %1 failed: %2").arg(tier, message));
  });
  connect(host, &EngineHost::settingsOutcome, this, [this](const SettingsOutcome& o) {
    logLine(o.ok ? tr("settings version %1 applied").arg(o.version) : tr("warning: a settings change was refused (HTTP %1): %2").arg(o.httpStatus).arg(o.message));
  });
  connect(host, &EngineHost::availabilityChanged, this, [this](const AvailabilitySnapshot& a) {
    m_availability = a;
    SetAdminRefusal(this, a.adminRefusal);
    showAvailability();
    if (!a.adminRefusal.isEmpty() && a.reachable && !m_askedForToken) askForAdminToken();
  });
  connect(host, &EngineHost::loadCancelled, this, &MainWindow::onLoadCancelled);
  connect(host, &EngineHost::statusChanged, this, &MainWindow::onStatus);
  connect(host, &EngineHost::cacheChanged, m_cacheModel, &CacheTierModel::setSnapshot);
  connect(host, &EngineHost::cacheChanged, m_history, &MemoryHistory::addSnapshot);
  connect(host, &EngineHost::journalChanged, m_journalModel, &JournalModel::setSnapshot);
  connect(host, &EngineHost::settingsChanged, m_settingsModel, &SettingsModel::setSnapshot);
  connect(host, &EngineHost::settingsOutcome, m_memory, &MemoryScreen::onSettingsOutcome);
  connect(host, &EngineHost::tierCleared, m_memory, &MemoryScreen::onTierCleared);
  connect(host, &EngineHost::cacheChanged, m_disk, &DiskScreen::setSnapshot);
  connect(host, &EngineHost::settingsOutcome, m_disk, &DiskScreen::onSettingsOutcome);
  connect(host, &EngineHost::tierCleared, m_disk, &DiskScreen::onTierCleared);
  connect(host, &EngineHost::chatDelta, m_chat, &ChatScreen::onDelta);
  connect(host, &EngineHost::chatFinished, m_chat, &ChatScreen::onFinished);
  connect(host, &EngineHost::backendsChanged, m_backends, &BackendsScreen::setSnapshot);
  connect(m_backends, &BackendsScreen::settingsReplaceRequested, host, &EngineHost::replaceSettings);
  connect(host, &EngineHost::settingsOutcome, m_backends, &BackendsScreen::onSettingsOutcome);
  connect(host, &EngineHost::backendsChanged, m_chat, [this](const BackendsSnapshot& b) { m_chat->setModels(b.models); });
  // Screens -> commands (EngineHost queues them to the host thread).
  connect(m_memory, &MemoryScreen::clearTierRequested, host, &EngineHost::clearTier);
  connect(m_memory, &MemoryScreen::settingsReplaceRequested, host, &EngineHost::replaceSettings);
  connect(m_disk, &DiskScreen::clearTierRequested, host, &EngineHost::clearTier);
  connect(m_disk, &DiskScreen::settingsReplaceRequested, host, &EngineHost::replaceSettings);
  connect(host, &EngineHost::shadowChanged, m_shadow, &ShadowScreen::setSnapshot);
  connect(host, &EngineHost::settingsOutcome, m_shadow, &ShadowScreen::onSettingsOutcome);
  connect(host, &EngineHost::tierCleared, m_shadow, &ShadowScreen::onTierCleared);
  connect(m_shadow, &ShadowScreen::clearTierRequested, host, &EngineHost::clearTier);
  connect(m_shadow, &ShadowScreen::settingsReplaceRequested, host, &EngineHost::replaceSettings);
  connect(m_chat, &ChatScreen::sendRequested, host, &EngineHost::sendChat);
  connect(m_settingsScreen, &SettingsScreen::settingsReplaceRequested, host, &EngineHost::replaceSettings);
  connect(host, &EngineHost::settingsOutcome, m_settingsScreen, &SettingsScreen::onSettingsOutcome);
  connect(m_chat, &ChatScreen::stopRequested, host, &EngineHost::stopChat);
  connect(host, &QThread::finished, this, [this] {
    m_chat->setEngineReady(false);
    if (m_draining) close();
  });
}

void MainWindow::buildStatusBar() {
  m_modelLabel = new QLabel(tr("model: loading"), this);
  m_modelLabel->setObjectName("modelLabel");
  m_urlButton = new QToolButton(this);
  m_urlButton->setObjectName("urlButton");
  m_urlButton->setAutoRaise(true);
  m_urlButton->setText(tr("endpoint: not yet bound"));
  m_urlButton->setToolTip(tr("Copy the endpoint URL"));
  m_urlButton->setEnabled(false);
  connect(m_urlButton, &QToolButton::clicked, this, &MainWindow::copyEndpointUrl);
  m_queueLabel = new QLabel(tr("queue 0"), this);
  m_queueLabel->setObjectName("queueLabel");
  m_queueLabel->setToolTip(tr("Requests waiting while one runs"));
  m_phaseLabel = new QLabel(tr("idle"), this);
  m_phaseLabel->setObjectName("phaseLabel");
  m_phaseBar = new QProgressBar(this);
  m_phaseBar->setRange(0, 0);
  m_phaseBar->setMaximumWidth(100);
  m_phaseBar->setMaximumHeight(fontMetrics().height());
  m_phaseBar->setTextVisible(false);
  m_phaseBar->hide();
  statusBar()->addWidget(m_modelLabel);
  statusBar()->addWidget(m_urlButton);
  statusBar()->addWidget(m_queueLabel);
  m_journalLabel = new QLabel(this);
  m_journalLabel->setObjectName("journalHealth");
  m_journalLabel->setStyleSheet("color: #b00020;");
  m_journalLabel->hide();
  statusBar()->addWidget(m_journalLabel);
  m_warningsButton = new QToolButton(this);
  m_warningsButton->setObjectName("warningsButton");
  m_warningsButton->setAutoRaise(true);
  m_warningsButton->setStyleSheet("color: #8a5a00;");
  m_warningsButton->setToolTip(tr("Open the engine log (Ctrl+L)"));
  m_warningsButton->hide();
  connect(m_warningsButton, &QToolButton::clicked, this, &MainWindow::showLog);
  statusBar()->addWidget(m_warningsButton);
  statusBar()->addPermanentWidget(m_phaseBar);
  statusBar()->addPermanentWidget(m_phaseLabel);
}

QStringList ArgumentsWithModel(const QStringList& arguments, const QString& dir) {
  QStringList out;
  for (int i = 0; i < arguments.size(); ++i) {
    if (i > 0 && arguments[i] == "--model") {
      ++i;  // and its value
      continue;
    }
    if (i > 0 && arguments[i].startsWith("--model=")) continue;
    out << arguments[i];
  }
  out << "--model" << dir;
  return out;
}

bool MainWindow::openModelFolder(const QString& dir) {
  QApplication::setOverrideCursor(Qt::WaitCursor);
  const anchorage::Status checked = anchorage::CheckModelFolder(dir.toStdString());
  QApplication::restoreOverrideCursor();
  if (!checked.ok()) {
    QMessageBox::warning(this, tr("Not a model folder"), tr("%1 cannot be served:\n%2").arg(dir, QString::fromStdString(checked.message())));
    return false;
  }
  QSettings s;
  QStringList recent = s.value("models/recent").toStringList();
  recent.removeAll(dir);
  recent.prepend(dir);
  s.setValue("models/recent", recent.mid(0, 8));
  rebuildRecentModels();
  m_restartArguments = ArgumentsWithModel(QCoreApplication::arguments(), dir);
  statusBar()->showMessage(tr("Opening %1: draining the engine, then starting on it…").arg(dir));
  close();
  return true;
}

void MainWindow::showModelLibrary() {
  QSettings s;
  QHash<QString, QString> fingerprints;
  const QVariantMap known = s.value("models/fingerprints").toMap();
  for (auto it = known.begin(); it != known.end(); ++it) fingerprints[it.key()] = it.value().toString();
  auto* dialog = new ModelLibraryDialog(s.value("models/recent").toStringList(), fingerprints, this);
  dialog->setAttribute(Qt::WA_DeleteOnClose);
  connect(dialog, &ModelLibraryDialog::openRequested, this, [this, dialog](const QString& dir) {
    if (openModelFolder(dir)) dialog->accept();
  });
  connect(dialog, &ModelLibraryDialog::forgetRequested, this, [this](const QString& dir) {
    QSettings settings;
    QStringList recent = settings.value("models/recent").toStringList();
    recent.removeAll(dir);
    settings.setValue("models/recent", recent);
    QVariantMap known = settings.value("models/fingerprints").toMap();
    known.remove(dir);
    settings.setValue("models/fingerprints", known);
    rebuildRecentModels();
  });
  dialog->open();
}

void MainWindow::rebuildRecentModels() {
  if (m_recentMenu == nullptr) return;
  m_recentMenu->clear();
  const QStringList recent = QSettings().value("models/recent").toStringList();
  for (const QString& dir : recent) m_recentMenu->addAction(dir, this, [this, dir] { openModelFolder(dir); });
  m_recentMenu->setEnabled(!recent.isEmpty());
}

void MainWindow::buildMenus() {
  QMenu* file = menuBar()->addMenu(tr("&File"));
  QAction* open = file->addAction(tr("&Open model folder…"), this, [this] {
    const QString dir = QFileDialog::getExistingDirectory(this, tr("Open a model folder (config.json, *.safetensors, tokenizer.json)"));
    if (!dir.isEmpty()) openModelFolder(dir);
  });
  open->setShortcut(QKeySequence::Open);
  m_recentMenu = file->addMenu(tr("Recent &models"));
  rebuildRecentModels();
  QAction* library = file->addAction(tr("Model &library…"), this, &MainWindow::showModelLibrary);
  if (m_host->isRemote()) {  // the server on the other end chose its model
    open->setEnabled(false);
    m_recentMenu->setEnabled(false);
    library->setEnabled(false);
    file->addAction(tr("Admin &token…"), this, &MainWindow::askForAdminToken);
  }
  file->addSeparator();
  QAction* copy = file->addAction(tr("&Copy endpoint URL"), this, &MainWindow::copyEndpointUrl);
  copy->setShortcut(QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_C));
  file->addSeparator();
  QAction* quit = file->addAction(m_host->isRemote() ? tr("&Quit (the server keeps running)") : tr("&Quit (drain and stop)"), this, &QWidget::close);
  quit->setShortcut(QKeySequence::Quit);
  QMenu* view = menuBar()->addMenu(tr("&View"));
  const char* names[] = {"Memory", "Disk cache", "Shadow", "Journal", "Chat", "Backends", "Settings"};
  for (int i = 0; i < kTabCount; ++i) {
    QAction* a = view->addAction(tr(names[i]), this, [this, i] { m_tabs->setCurrentIndex(i); });
    a->setShortcut(QKeySequence(Qt::CTRL | Qt::Key(Qt::Key_1 + i)));
    a->setShortcutContext(Qt::WidgetShortcut);  // the window's QShortcuts fire; the menu shows the keys
  }
  view->addSeparator();
  QAction* log = view->addAction(tr("Engine &log"), this, &MainWindow::showLog);
  log->setShortcut(QKeySequence(Qt::CTRL | Qt::Key_L));
  QMenu* server = menuBar()->addMenu(tr("&Server"));
  QAction* endpoint = server->addAction(tr("&Endpoint…"), this, &MainWindow::showEndpointDialog);
  if (m_host->isRemote()) {
    endpoint->setEnabled(false);
    endpoint->setToolTip(tr("The server on the other end keeps its own address"));
  }
  QMenu* help = menuBar()->addMenu(tr("&Help"));
  help->addAction(tr("&About Anchorage"), this, [this] { QMessageBox::about(this, tr("About Anchorage"), aboutText()); });
}

QString MainWindow::aboutText() const {
  const EngineStatusSnapshot& s = m_lastStatus;
  QStringList lines;
  lines << tr("Anchorage %1").arg(QStringLiteral(ANCHORAGE_VERSION));
  lines << tr("An operator console and OpenAI-compatible endpoint for Qwen3.5-family models, with exact caches.");
  if (s.ready) {
    lines << tr("Model: %1%2").arg(s.modelId, s.generatedModel ? tr(" (the generated tiny model: random weights)") : QString());
    lines << tr("Runs on: %1 · %2 weights · %3 K/V rows · %4 precision · %5 threads · %6 slots")
                 .arg(s.kernelPath, s.weights, s.kvDtype, s.precision.isEmpty() ? tr("exact") : s.precision)
                 .arg(s.threads)
                 .arg(s.slotCount);
  } else {
    lines << tr("Model: not loaded yet");
  }
  if (!m_url.isEmpty()) lines << tr("Endpoint: %1").arg(m_url);
  if (m_host->isRemote()) lines << tr("Server: %1 (over --connect; its data folder is its own)").arg(m_host->remote().url);
  else lines << tr("Data folder: %1").arg(QString::fromStdString(m_host->config().data_dir));
  return lines.join('\n');
}

void MainWindow::setPersistState(bool on) {
  m_persist = on;
  if (!on) return;
  QSettings s;
  if (s.contains("window/geometry")) restoreGeometry(s.value("window/geometry").toByteArray());
  m_tabs->setCurrentIndex(s.value("window/tab", 0).toInt());
}

void MainWindow::copyEndpointUrl() {
  if (m_url.isEmpty()) return;
  QApplication::clipboard()->setText(m_url);
  statusBar()->showMessage(tr("Copied %1").arg(m_url), 3000);
}

void MainWindow::logLine(const QString& text) {
  const QString line = QDateTime::currentDateTime().toString("HH:mm:ss") + "  " + text;
  if (!m_log.isEmpty() && m_log.last().mid(10) == text) return;  // the same line again (a retried route)
  m_log.append(line);
  while (m_log.size() > 2000) m_log.removeFirst();
  if (text.contains("warning", Qt::CaseInsensitive) || text.startsWith(tr("did not start"))) ++m_warnings;
  m_warningsButton->setVisible(m_warnings > 0);
  m_warningsButton->setText(tr("%n warning(s)", nullptr, m_warnings));
  if (m_logView != nullptr) m_logView->appendPlainText(line);
}

QString MainWindow::logText() const { return m_log.join('\n'); }

void MainWindow::showLog() {
  if (m_logDialog == nullptr) {
    m_logDialog = new QDialog(this);
    m_logDialog->setObjectName("engineLogDialog");
    m_logDialog->setWindowTitle(tr("Engine log"));
    m_logDialog->resize(900, 500);
    m_logView = new QPlainTextEdit(m_logDialog);
    m_logView->setObjectName("engineLog");
    m_logView->setReadOnly(true);
    m_logView->setFont(QFontDatabase::systemFont(QFontDatabase::FixedFont));
    m_logView->setPlainText(logText());
    auto* intro = new QLabel(tr("What the engine and the console said this session: the start's progress and notes (warnings, "
                                "overrides), connection changes, settings and clears. The journal keeps requests and cache events."),
                             m_logDialog);
    intro->setWordWrap(true);
    auto* layout = new QVBoxLayout(m_logDialog);
    layout->addWidget(intro);
    layout->addWidget(m_logView, 1);
  }
  m_logDialog->show();
  m_logDialog->raise();
}

void MainWindow::onProgress(double fraction, const QString& what) {
  logLine(tr("loading: %1").arg(what));
  m_loadBar->setValue(static_cast<int>(fraction * 100));
  m_bannerText->setText(tr("Loading the model: %1").arg(what));
}

void MainWindow::onReady(const QString& url) {
  logLine(tr("serving on %1").arg(url));
  m_url = url;
  m_banner->hide();
  m_cancelLoadButton->hide();
  m_urlButton->setText(url);
  m_urlButton->setEnabled(true);
  m_chat->setEngineReady(true);
}

void MainWindow::showEndpointDialog() {
  auto* dialog = new QDialog(this);
  dialog->setObjectName("endpointDialog");
  dialog->setWindowTitle(tr("Endpoint"));
  dialog->setAttribute(Qt::WA_DeleteOnClose);
  auto* on = new QCheckBox(tr("Serve the OpenAI-compatible endpoint (the Chat tab talks through it too)"), dialog);
  on->setObjectName("endpointOn");
  on->setChecked(!m_url.isEmpty());
  const QUrl now(m_url.isEmpty() ? m_lastEndpoint : m_url);
  auto* host = new QComboBox(dialog);
  host->setObjectName("endpointHost");
  host->setEditable(true);
  host->addItems({"127.0.0.1", "0.0.0.0", "::1", "::"});
  host->setCurrentText(now.host().isEmpty() ? QString::fromStdString(m_host->config().host) : now.host());
  host->setToolTip(tr("127.0.0.1: this machine only. 0.0.0.0 (or ::): every network this machine is on, which needs --admin-token "
                      "as at start; clients then send an API key (--api-key) or that token"));
  auto* port = new QSpinBox(dialog);
  port->setObjectName("endpointPort");
  port->setRange(0, 65535);
  port->setSpecialValueText(tr("any free port"));
  port->setValue(now.port() > 0 ? now.port() : m_host->config().port);
  auto* form = new QFormLayout;
  form->addRow(on);
  form->addRow(tr("Bind address"), host);
  form->addRow(tr("Port"), port);
  auto* note = new QLabel(tr("Applies now, for this run: requests in flight finish first. The next start takes --host and --port again."), dialog);
  note->setWordWrap(true);
  form->addRow(note);
  auto* buttons = new QDialogButtonBox(QDialogButtonBox::Ok | QDialogButtonBox::Cancel, dialog);
  form->addRow(buttons);
  dialog->setLayout(form);
  connect(on, &QCheckBox::toggled, host, &QWidget::setEnabled);
  connect(on, &QCheckBox::toggled, port, &QWidget::setEnabled);
  host->setEnabled(on->isChecked());
  port->setEnabled(on->isChecked());
  connect(buttons, &QDialogButtonBox::rejected, dialog, &QDialog::reject);
  connect(buttons, &QDialogButtonBox::accepted, dialog, [this, dialog, on, host, port] {
    m_urlButton->setText(on->isChecked() ? tr("endpoint: moving to %1:%2…").arg(host->currentText()).arg(port->value()) : tr("endpoint: stopping…"));
    m_host->setEndpoint(on->isChecked(), host->currentText().trimmed(), port->value());
    dialog->accept();
  });
  dialog->open();
}

void MainWindow::onEndpoint(bool serving, const QString& url, const QString& error) {
  if (!m_url.isEmpty()) m_lastEndpoint = m_url;
  m_url = serving ? url : QString();
  m_urlButton->setText(serving ? url : tr("endpoint: off (Server > Endpoint…)"));
  m_urlButton->setEnabled(serving);
  if (!error.isEmpty()) {
    logLine(tr("warning: the endpoint did not change: %1").arg(error));
    statusBar()->showMessage(tr("The endpoint did not change: %1").arg(error), 10000);
  } else {
    logLine(serving ? tr("serving on %1").arg(url) : tr("the endpoint is off"));
  }
}

void MainWindow::onLoadCancelled() {
  m_loadBar->hide();
  m_cancelLoadButton->hide();
  m_bannerText->setText(tr("Loading was cancelled; no model is served. Open a model folder (File > Open model folder) to load one."));
  m_modelLabel->setText(tr("model: not loaded"));
}

void MainWindow::onStartFailed(const QString& error) {
  logLine(tr("did not start: %1").arg(error));
  m_loadBar->hide();
  m_cancelLoadButton->hide();
  m_bannerText->setText(tr("The engine did not start: %1").arg(error));
  m_bannerText->setStyleSheet("color: #b00020;");
  m_modelLabel->setText(tr("model: not loaded"));
}

void MainWindow::onConnection(bool reachable, const QString& message) {
  const QStringList lines = message.split('\n', Qt::SkipEmptyParts);
  if (lines.isEmpty() && !m_url.isEmpty() && !m_lastConnectionMessage.isEmpty()) logLine(tr("every route answers again"));
  for (const QString& line : lines)
    if (!m_lastConnectionMessage.contains(line)) logLine(line);
  m_lastConnectionMessage = message;
  m_banner->setVisible(!message.isEmpty() || m_url.isEmpty());
  m_loadBar->setVisible(m_url.isEmpty() && reachable);
  if (!lines.isEmpty()) {
    m_bannerText->setWordWrap(false);
    m_bannerText->setText(lines.size() == 1 ? lines[0] : tr("%1 (and %n more)", nullptr, static_cast<int>(lines.size() - 1)).arg(lines[0]));
    m_bannerText->setToolTip(message);
    m_bannerAll->setText(message);
  }
  m_bannerDetails->setVisible(lines.size() > 1);
  if (lines.size() <= 1) m_bannerDetails->setChecked(false);
  m_bannerText->setStyleSheet(reachable ? QString() : QString("color: #b00020;"));
}

void MainWindow::askForAdminToken() {
  m_askedForToken = true;
  if (findChild<QInputDialog*>("adminTokenDialog") != nullptr) return;
  auto* dialog = new QInputDialog(this);
  dialog->setObjectName("adminTokenDialog");
  dialog->setAttribute(Qt::WA_DeleteOnClose);
  dialog->setWindowTitle(tr("Admin token"));
  dialog->setLabelText(tr("%1 needs its admin token for the journal, clears and settings edits.\nAdmin token (kept for this session only):")
                           .arg(m_host->remote().url));
  dialog->setTextEchoMode(QLineEdit::Password);
  connect(dialog, &QInputDialog::textValueSelected, this, [this](const QString& token) {
    if (!token.trimmed().isEmpty()) m_host->setAdminToken(token.trimmed());
  });
  dialog->open();
}

QString MainWindow::unavailableText(int tab) const {
  const qint64 now = QDateTime::currentMSecsSinceEpoch();
  for (const QString& route : kTabRoutes[tab]) {
    const QString why = m_availability.failing.value(route);
    if (why.isEmpty()) continue;
    const qint64 ok = m_availability.lastOkMs.value(route);
    const QString age = ok > 0 ? tr("What shows was read %1 (%2).").arg(AgeText(ok, now), QDateTime::fromMSecsSinceEpoch(ok).toString("HH:mm:ss"))
                               : tr("Nothing has been read from it yet.");
    return tr("Unavailable: %1 %2").arg(why.endsWith('.') ? why : why + '.', age);
  }
  return {};
}

void MainWindow::showAvailability() {
  bool any = false;
  for (int i = 0; i < kTabCount; ++i) {
    const QString text = unavailableText(i);
    any = any || !text.isEmpty();
    QLabel* line = m_unavailableLines[i];
    line->setText(text);
    line->setVisible(!text.isEmpty());
    for (QWidget* part : m_tabs->widget(i)->findChildren<QWidget*>(Qt::FindDirectChildrenOnly))
      if (part != line) part->setEnabled(text.isEmpty());
    m_tabs->setTabIcon(i, text.isEmpty() ? QIcon() : style()->standardIcon(QStyle::SP_MessageBoxWarning));
    m_tabs->setTabToolTip(i, text);
  }
  m_memory->setJournalRefusal(m_availability.failing.value("/v1/journal"));
  if (!m_availability.reachable && m_host->isRemote()) {
    const qint64 ok = m_availability.lastOkMs.value("/health");
    m_modelLabel->setText(ok > 0 ? tr("disconnected: no answer from %1 since %2").arg(m_host->remote().url, QDateTime::fromMSecsSinceEpoch(ok).toString("HH:mm:ss"))
                                 : tr("disconnected: no answer from %1").arg(m_host->remote().url));
    m_modelLabel->setStyleSheet("color: #b00020;");
    m_queueLabel->setText(tr("queue ?"));
  }
  if (any && !m_ageTimer->isActive()) m_ageTimer->start();
  if (!any) m_ageTimer->stop();
}

void MainWindow::onStatus(const EngineStatusSnapshot& s) {
  m_lastStatus = s;
  if (!m_host->isRemote() && !m_host->config().model_dir.empty() && !s.fingerprint.isEmpty() && !m_fingerprintKept) {
    m_fingerprintKept = true;  // the model library names it beside the folder
    QSettings settings;
    QVariantMap known = settings.value("models/fingerprints").toMap();
    known[QString::fromStdString(m_host->config().model_dir)] = s.fingerprint;
    settings.setValue("models/fingerprints", known);
  }
  for (const QString& note : s.notes)
    if (!m_loggedNotes.contains(note)) {
      m_loggedNotes.insert(note);
      logLine(tr("note: %1").arg(note));
    }
  m_modelLabel->setStyleSheet(QString());
  const QString where = m_host->isRemote() ? tr(" · on %1").arg(QUrl(m_host->remote().url).authority()) : QString();
  const QString weights = (s.weights.isEmpty() ? QString() : tr(" · %1 weights").arg(s.weights)) +
                          (s.kvDtype.isEmpty() ? QString() : tr(" · %1 K/V rows").arg(s.kvDtype)) +
                          (s.precision == "fast" ? tr(" · fast precision") : QString());
  const QString threads = s.threads == 1 ? tr("1 thread") : tr("%1 threads").arg(s.threads);
  m_modelLabel->setText(tr("model: %1 · %2%3 · %4%5").arg(s.modelId, s.kernelPath, weights, threads, where));
  setWindowTitle(tr("Anchorage — %1%2").arg(s.modelId, where));
  m_queueLabel->setText(s.slotCount > 1 ? tr("queue %1 · slots %2/%3 busy").arg(s.queueDepth).arg(s.busySlots).arg(s.slotCount) : tr("queue %1").arg(s.queueDepth));
  m_chat->setGeneratedModelNotice(s.ready && s.generatedModel);
  m_journalLabel->setVisible(s.journalErrors > 0);
  if (s.journalErrors > 0) {
    m_journalLabel->setText(tr("journal: %n write error(s)", nullptr, static_cast<int>(s.journalErrors)));
    m_journalLabel->setToolTip(s.journalLastError);
  }
  QString phase;
  if (s.phase == "prefill") phase = tr("prefill · resume: %1").arg(s.resumeHint);
  else if (s.phase == "decode") phase = tr("decode · %1 tok/s").arg(s.liveTokensPerS, 0, 'f', 1);
  else if (s.phase == "busy") phase = tr("serving an endpoint request");
  else if (s.last.prompt_tokens > 0)
    phase = tr("idle · last: %1, %2 cached, TTFT %3 ms, %4 tok/s")
                .arg(QString::fromStdString(s.last.cache_source))
                .arg(s.last.cached_tokens)
                .arg(s.last.ttft_ms, 0, 'f', 1)
                .arg(s.last.decode_tokens_per_s, 0, 'f', 1);
  else phase = tr("idle");
  if (s.phase != "prefill" && s.last.drafted_tokens > 0)
    phase += tr(", drafts %1 of %2 accepted (%3%)")
                 .arg(s.last.accepted_tokens)
                 .arg(s.last.drafted_tokens)
                 .arg(100.0 * static_cast<double>(s.last.accepted_tokens) / static_cast<double>(s.last.drafted_tokens), 0, 'f', 0);
  m_phaseLabel->setText(phase);
  m_phaseBar->setVisible(s.phase == "prefill" || s.phase == "busy");
}

void MainWindow::closeEvent(QCloseEvent* event) {
  if (m_persist) {
    QSettings s;
    s.setValue("window/geometry", saveGeometry());
    s.setValue("window/tab", m_tabs->currentIndex());
  }
  if (!m_host->isRunning() && !m_restartArguments.isEmpty()) {
    const QStringList args = m_restartArguments;
    m_restartArguments.clear();
    if (!QProcess::startDetached(QCoreApplication::applicationFilePath(), args.mid(1)))
      QMessageBox::warning(this, tr("Could not start again"), tr("Start the console with: %1").arg(args.join(' ')));
  }
  if (m_host->isRunning()) {
    event->ignore();
    if (!m_draining) {
      m_draining = true;
      statusBar()->showMessage(m_host->isRemote() ? tr("Disconnecting: stopping the chats…") : tr("Draining: no new requests, waiting for the ones in flight…"));
      m_phaseBar->show();
      m_host->drain();
    }
    return;
  }
  event->accept();
}

QStringList MainWindow::grabScreens(const QString& dir) {
  QStringList files;
  const int current = m_tabs->currentIndex();
  const QSize before = size();
  // The default window size first (the files docs/ links), then a large desktop's in a folder of its own.
  for (const auto& [size, folder] : {std::pair{QSize(1280, 800), QString()}, std::pair{QSize(1920, 1080), QString("1920x1080")}}) {
    const QDir out(folder.isEmpty() ? dir : QDir(dir).filePath(folder));
    if (!QDir().mkpath(out.path())) return {};
    resize(size);
    for (int i = 0; i < m_tabs->count(); ++i) {
      m_tabs->setCurrentIndex(i);
      for (int k = 0; k < 5; ++k) QApplication::processEvents();
      const QString path = out.filePath(QString("%1-%2.png").arg(i + 1).arg(kTabNames[i]));
      if (!grab().save(path)) return {};
      files << path;
    }
  }
  resize(before);
  m_tabs->setCurrentIndex(current);
  return files;
}
