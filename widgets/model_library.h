// The model library: the folders the console has opened, each with its weights' size and dtype and
// the fingerprint it had when it last loaded; open one from the list or forget it.
#pragma once

#include <QDialog>
#include <QHash>
#include <QStringList>

class QPushButton;
class QTableWidget;
class QTableWidgetItem;

// GUI thread only.
class ModelLibraryDialog : public QDialog {
  Q_OBJECT

 public:
  // fingerprints: folder -> the model fingerprint of its last load (absent: never loaded here).
  ModelLibraryDialog(const QStringList& folders, const QHash<QString, QString>& fingerprints, QWidget* parent = nullptr);

  QTableWidget* table() const { return m_table; }

 signals:
  void openRequested(const QString& dir);
  void forgetRequested(const QString& dir);

 private:
  // The selected row's folder cell (its text the folder, UserRole whether it holds a model); nullptr: none.
  QTableWidgetItem* selectedFolder() const;

  QTableWidget* m_table;
  QPushButton* m_open;
  QPushButton* m_forget;
};
