#include "widgets/screen_parts.h"

#include <QGroupBox>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QPushButton>
#include <QTableWidget>
#include <QVBoxLayout>

QTableWidget* makeTable(const QStringList& headers, const QString& objectName, QWidget* parent) {
  auto* t = new QTableWidget(0, static_cast<int>(headers.size()), parent);
  t->setObjectName(objectName);
  t->setHorizontalHeaderLabels(headers);
  t->verticalHeader()->hide();
  t->setEditTriggers(QAbstractItemView::NoEditTriggers);
  t->setSelectionBehavior(QAbstractItemView::SelectRows);
  t->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
  t->horizontalHeader()->setStretchLastSection(true);
  return t;
}

QTableWidgetItem* tableCell(const QString& text, bool number) {
  auto* item = new QTableWidgetItem(text);
  if (number) item->setTextAlignment(Qt::AlignRight | Qt::AlignVCenter);
  return item;
}

namespace {
constexpr char kWantsEnabled[] = "anchorageWantsEnabled";
constexpr char kOwnToolTip[] = "anchorageOwnToolTip";
constexpr char kAdminRefusal[] = "anchorageAdminRefusal";
}  // namespace

void SetAdminButtonEnabled(QPushButton* button, bool enabled) {
  if (!button->property(kWantsEnabled).isValid()) button->setProperty(kOwnToolTip, button->toolTip());
  button->setProperty(kWantsEnabled, enabled);
  const QString why = button->window()->property(kAdminRefusal).toString();
  button->setEnabled(enabled && why.isEmpty());
  button->setToolTip(why.isEmpty() ? button->property(kOwnToolTip).toString() : why);
}

void SetAdminRefusal(QWidget* root, const QString& why) {
  root->window()->setProperty(kAdminRefusal, why);
  for (QPushButton* button : root->findChildren<QPushButton*>())
    if (button->property(kWantsEnabled).isValid()) SetAdminButtonEnabled(button, button->property(kWantsEnabled).toBool());
}

QGroupBox* makeSummaryBox(const QString& title, const QString& summaryName, QLabel** summary, QPushButton* clear, QWidget* parent) {
  auto* box = new QGroupBox(title, parent);
  *summary = new QLabel(QObject::tr("Waiting for the engine…"), box);
  (*summary)->setObjectName(summaryName);
  (*summary)->setWordWrap(true);
  (*summary)->setTextInteractionFlags(Qt::TextSelectableByMouse);
  clear->setParent(box);
  auto* layout = new QVBoxLayout(box);
  layout->addWidget(*summary);
  auto* clearRow = new QHBoxLayout;
  clearRow->addStretch();
  clearRow->addWidget(clear);
  layout->addLayout(clearRow);
  layout->addStretch();
  return box;
}
