// BackendsScreen: the upstreams this endpoint forwards to (--backend): each one's URL, state, since
// when it is down, its models, requests, errors, mean time to first bytes and last error; and the
// ones the settings document lists (backends.upstreams), which it adds and removes.
#pragma once

#include <QWidget>

#include "app/snapshots.h"

class QLabel;
class QLineEdit;
class QPushButton;
class QTableWidget;
class SettingsModel;

// GUI thread only. Reads the backends snapshot.
class BackendsScreen : public QWidget {
  Q_OBJECT

 public:
  explicit BackendsScreen(SettingsModel* settings, QWidget* parent = nullptr);

  QTableWidget* table() const { return m_table; }
  QString summaryText() const;
  // The settings document's upstreams, one spec each ("NAME=URL[,key=ENVVAR]").
  QStringList documentSpecs() const;

 signals:
  void settingsReplaceRequested(const QJsonObject& document);

 public slots:
  void setSnapshot(const BackendsSnapshot& snapshot);
  void onSettingsOutcome(const SettingsOutcome& outcome);
  // Adds the editors' NAME=URL[,key=ENVVAR] to the document's upstreams (the server checks it).
  void addBackend();
  // Removes the selected backend from the document's upstreams (one --backend set cannot be).
  void removeBackend();

 private:
  void replaceSpecs(const QStringList& specs, const QString& what);
  void updateButtons();

  SettingsModel* m_settings;
  QLabel* m_summary;
  QTableWidget* m_table;
  QLineEdit* m_name;
  QLineEdit* m_url;
  QLineEdit* m_keyEnv;
  QPushButton* m_add;
  QPushButton* m_remove;
  QLabel* m_message;
  bool m_waiting = false;  // an add or remove was sent; its outcome goes to m_message
};
