#include "widgets/model_library.h"

#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QPushButton>
#include <QTableWidget>
#include <QVBoxLayout>

#include "models/format.h"
#include "models/model_folder_info.h"
#include "widgets/screen_parts.h"

ModelLibraryDialog::ModelLibraryDialog(const QStringList& folders, const QHash<QString, QString>& fingerprints, QWidget* parent)
    : QDialog(parent) {
  setObjectName("modelLibrary");
  setWindowTitle(tr("Model library"));
  resize(1000, 360);
  auto* intro = new QLabel(tr("Model folders this console has opened, newest first. Open one to drain the engine and start it on that folder "
                              "(the same flags); the fingerprint is the one the folder had when it last loaded here."),
                           this);
  intro->setWordWrap(true);
  m_table = makeTable({tr("Folder"), tr("Weights"), tr("Dtype"), tr("Model type"), tr("Fingerprint")}, "modelLibraryTable", this);
  m_table->setSelectionMode(QAbstractItemView::SingleSelection);
  m_table->setRowCount(static_cast<int>(folders.size()));
  for (int row = 0; row < folders.size(); ++row) {
    const QString& dir = folders[row];
    const ModelFolderInfo info = DescribeModelFolder(dir);
    const QString fingerprint = fingerprints.value(dir);
    m_table->setItem(row, 0, tableCell(dir));
    m_table->item(row, 0)->setData(Qt::UserRole, info.exists);  // read once: selecting a row reads no file
    m_table->setItem(row, 1, tableCell(info.exists ? fmt::bytes(info.weightBytes) : tr("missing"), info.exists));
    m_table->setItem(row, 2, tableCell(info.exists ? (info.dtype.isEmpty() ? tr("not said") : info.dtype) : QString()));
    m_table->setItem(row, 3, tableCell(info.modelType));
    m_table->setItem(row, 4, tableCell(fingerprint.isEmpty() ? tr("not loaded here yet") : fingerprint.left(12)));
    m_table->item(row, 4)->setToolTip(fingerprint);
    if (!info.exists) m_table->item(row, 0)->setToolTip(tr("No config.json there any more"));
  }
  m_open = new QPushButton(tr("Open"), this);
  m_open->setObjectName("openModelButton");
  m_forget = new QPushButton(tr("Forget"), this);
  m_forget->setObjectName("forgetModelButton");
  m_forget->setToolTip(tr("Take the folder off this list (nothing is deleted)"));
  auto* close = new QPushButton(tr("Close"), this);
  auto* buttons = new QHBoxLayout;
  buttons->addWidget(m_forget);
  buttons->addStretch();
  buttons->addWidget(close);
  buttons->addWidget(m_open);
  auto* layout = new QVBoxLayout(this);
  layout->addWidget(intro);
  layout->addWidget(m_table, 1);
  layout->addLayout(buttons);
  auto update = [this] {
    const QTableWidgetItem* folder = selectedFolder();
    m_open->setEnabled(folder != nullptr && folder->data(Qt::UserRole).toBool());
    m_forget->setEnabled(folder != nullptr);
  };
  connect(m_table, &QTableWidget::itemSelectionChanged, this, update);
  connect(m_open, &QPushButton::clicked, this, [this] {
    if (const QTableWidgetItem* folder = selectedFolder()) emit openRequested(folder->text());
  });
  connect(m_table, &QTableWidget::cellDoubleClicked, this, [this](int row) {
    if (m_table->item(row, 0)->data(Qt::UserRole).toBool()) emit openRequested(m_table->item(row, 0)->text());
  });
  connect(m_forget, &QPushButton::clicked, this, [this] {
    const QTableWidgetItem* folder = selectedFolder();
    if (folder == nullptr) return;
    const QString dir = folder->text();
    m_table->removeRow(folder->row());
    emit forgetRequested(dir);
  });
  connect(close, &QPushButton::clicked, this, &QDialog::reject);
  update();
}

QTableWidgetItem* ModelLibraryDialog::selectedFolder() const {
  const QList<QTableWidgetItem*> picked = m_table->selectedItems();
  return picked.isEmpty() ? nullptr : m_table->item(picked.first()->row(), 0);
}
