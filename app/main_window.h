// MainWindow: the console's tabs (Memory, Disk cache, Shadow, Journal, Chat) and its status bar,
// wired to one EngineHost.
#pragma once

#include <QMainWindow>
#include <QSet>

#include "app/snapshots.h"

class CacheTierModel;
class DiskScreen;
class ShadowScreen;
class BackendsScreen;
class SettingsScreen;
class ChatScreen;
class EngineHost;
class JournalModel;
class JournalScreen;
class MemoryHistory;
class MemoryScreen;
class SettingsModel;
class QDialog;
class QLabel;
class QPlainTextEdit;
class QProgressBar;
class QPushButton;
class QTabWidget;
class QTimer;
class QToolButton;

// GUI thread only. Closing the window drains the engine (like SIGTERM) before it is accepted.
// The console's arguments with --model DIR in place of any --model they had.
QStringList ArgumentsWithModel(const QStringList& arguments, const QString& dir);

class MainWindow : public QMainWindow {
  Q_OBJECT

 public:
  explicit MainWindow(EngineHost* host, QWidget* parent = nullptr);

  // Restores and saves geometry and the current tab with QSettings (off for tests and screenshots).
  void setPersistState(bool on);
  // Renders every screen to DIR/NN-name.png at 1280 x 800 and to DIR/1920x1080/NN-name.png at
  // 1920 x 1080; returns the files written, empty on failure.
  QStringList grabScreens(const QString& dir);

  QTabWidget* tabs() const { return m_tabs; }
  MemoryScreen* memoryScreen() const { return m_memory; }
  DiskScreen* diskScreen() const { return m_disk; }
  ShadowScreen* shadowScreen() const { return m_shadow; }
  JournalScreen* journalScreen() const { return m_journalScreen; }
  ChatScreen* chatScreen() const { return m_chat; }
  BackendsScreen* backendsScreen() const { return m_backends; }
  SettingsScreen* settingsScreen() const { return m_settingsScreen; }
  CacheTierModel* cacheModel() const { return m_cacheModel; }
  JournalModel* journalModel() const { return m_journalModel; }
  SettingsModel* settingsModel() const { return m_settingsModel; }
  MemoryHistory* memoryHistory() const { return m_history; }
  QString endpointUrl() const { return m_url; }
  // Help > About's text: the version, the model and what runs it (kernel path or GPU, weights,
  // threads, slots), the endpoint and the data folder (or the server over --connect).
  QString aboutText() const;
  // Checks dir as a model folder; on success remembers it among the recent ones, drains the engine
  // and starts the console again on it (the same flags, --model DIR). False, saying why, otherwise.
  bool openModelFolder(const QString& dir);

 public slots:
  void copyEndpointUrl();
  // Server > Endpoint…: on or off, the bind address and the port of the hosted engine's endpoint.
  void showEndpointDialog();
  // View > Engine log (Ctrl+L): the session's log in a window of its own.
  void showLog();

 public:
  // The engine log's lines ("HH:mm:ss  text"): the start's progress and notes, connection changes,
  // settings outcomes and clears.
  QString logText() const;

 protected:
  void closeEvent(QCloseEvent* event) override;

 private:
  void buildStatusBar();
  void buildMenus();
  void rebuildRecentModels();
  // File > Model library: the recent folders with their size, dtype and last fingerprint; open or forget one.
  void showModelLibrary();
  bool m_fingerprintKept = false;
  void onProgress(double fraction, const QString& what);
  void onReady(const QString& url);
  void onEndpoint(bool serving, const QString& url, const QString& error);
  void onStartFailed(const QString& error);
  void onConnection(bool reachable, const QString& message);
  void onLoadCancelled();
  void onStatus(const EngineStatusSnapshot& status);
  // The tab's routes that do not answer, in words with the age of what it shows; empty when they all answer.
  QString unavailableText(int tab) const;
  // Greys the screens whose routes fail, with their reason on their first line and tab.
  void showAvailability();
  // Over --connect: asks for the server's admin token (once by itself, when a route first needs it; File > Admin token after).
  void askForAdminToken();
  bool m_askedForToken = false;
  void logLine(const QString& text);
  QStringList m_log;
  QSet<QString> m_loggedNotes;
  QString m_lastConnectionMessage;
  int m_warnings = 0;
  QToolButton* m_warningsButton = nullptr;
  QDialog* m_logDialog = nullptr;
  QPlainTextEdit* m_logView = nullptr;
  EngineStatusSnapshot m_lastStatus;
  AvailabilitySnapshot m_availability;
  QList<QLabel*> m_unavailableLines;  // a screen's first line, by tab
  QTimer* m_ageTimer = nullptr;       // while a screen is unavailable: its age goes on

  EngineHost* m_host;
  CacheTierModel* m_cacheModel;
  JournalModel* m_journalModel;
  SettingsModel* m_settingsModel;
  MemoryHistory* m_history;
  QTabWidget* m_tabs;
  MemoryScreen* m_memory;
  DiskScreen* m_disk;
  ShadowScreen* m_shadow;
  JournalScreen* m_journalScreen;
  ChatScreen* m_chat;
  BackendsScreen* m_backends;
  SettingsScreen* m_settingsScreen;
  QWidget* m_banner;
  QLabel* m_bannerText;
  QToolButton* m_bannerDetails;
  QLabel* m_bannerAll;
  QProgressBar* m_loadBar;
  QPushButton* m_cancelLoadButton;
  QLabel* m_modelLabel;
  QToolButton* m_urlButton;
  QLabel* m_queueLabel;
  QLabel* m_journalLabel;
  QLabel* m_phaseLabel;
  QProgressBar* m_phaseBar;
  QString m_url;           // the endpoint, empty while it is off or not yet bound
  QString m_lastEndpoint;  // where it served before it went off
  bool m_persist = false;
  bool m_draining = false;
  QStringList m_restartArguments;  // set: after the drain, the console starts again with these
  QMenu* m_recentMenu = nullptr;
};
