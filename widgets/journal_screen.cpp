#include "widgets/journal_screen.h"

#include <QComboBox>
#include <QFontDatabase>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QLineEdit>
#include <QPlainTextEdit>
#include <QSplitter>
#include <QTableView>
#include <QVBoxLayout>

#include "models/journal_filter_model.h"
#include "models/journal_model.h"

JournalScreen::JournalScreen(JournalModel* journal, QWidget* parent) : QWidget(parent), m_journal(journal) {
  m_filter = new JournalFilterModel(this);
  m_filter->setSourceModel(journal);

  m_kind = new QComboBox(this);
  m_kind->setObjectName("kindFilter");
  m_kind->addItem(tr("all kinds"), QString());
  for (const char* k : {"request", "cache_event", "shadow", "hit", "write", "eviction", "shed", "drop", "failed_restore", "clear"}) m_kind->addItem(k, QString(k));
  m_tier = new QLineEdit(this);
  m_tier->setPlaceholderText(tr("tier"));
  m_tier->setObjectName("tierFilter");
  m_session = new QLineEdit(this);
  m_session->setPlaceholderText(tr("session"));
  m_session->setObjectName("sessionFilter");
  m_text = new QLineEdit(this);
  m_text->setPlaceholderText(tr("text in any column"));
  m_text->setObjectName("textFilter");
  m_text->setClearButtonEnabled(true);
  m_count = new QLabel(this);
  auto* filters = new QHBoxLayout;
  filters->addWidget(new QLabel(tr("Filter:"), this));
  filters->addWidget(m_kind);
  filters->addWidget(m_tier);
  filters->addWidget(m_session);
  filters->addWidget(m_text, 1);
  filters->addWidget(m_count);
  connect(m_kind, &QComboBox::currentIndexChanged, this, [this] { m_filter->setKind(m_kind->currentData().toString()); updateCount(); });
  connect(m_tier, &QLineEdit::textChanged, this, [this](const QString& t) { m_filter->setTier(t); updateCount(); });
  connect(m_session, &QLineEdit::textChanged, this, [this](const QString& t) { m_filter->setSession(t); updateCount(); });
  connect(m_text, &QLineEdit::textChanged, this, [this](const QString& t) { m_filter->setText(t); updateCount(); });

  m_table = new QTableView(this);
  m_table->setObjectName("journalTable");
  m_table->setModel(m_filter);
  m_table->setSortingEnabled(true);
  m_table->sortByColumn(JournalModel::TimeColumn, Qt::DescendingOrder);
  m_table->setSelectionBehavior(QAbstractItemView::SelectRows);
  m_table->setSelectionMode(QAbstractItemView::SingleSelection);
  m_table->verticalHeader()->hide();
  m_table->horizontalHeader()->setStretchLastSection(true);
  m_table->setAlternatingRowColors(true);
  m_table->setColumnWidth(JournalModel::TimeColumn, 110);
  m_table->setColumnWidth(JournalModel::SessionColumn, 200);

  m_detail = new QPlainTextEdit(this);
  m_detail->setObjectName("journalDetail");
  m_detail->setReadOnly(true);
  m_detail->setFont(QFontDatabase::systemFont(QFontDatabase::FixedFont));
  m_detail->setPlaceholderText(tr("Select a row to see all its columns."));

  auto* split = new QSplitter(Qt::Horizontal, this);
  split->addWidget(m_table);
  split->addWidget(m_detail);
  split->setStretchFactor(0, 3);
  split->setStretchFactor(1, 1);

  auto* layout = new QVBoxLayout(this);
  layout->addLayout(filters);
  layout->addWidget(split, 1);

  connect(m_table->selectionModel(), &QItemSelectionModel::currentRowChanged, this, &JournalScreen::showDetail);
  connect(m_filter, &QAbstractItemModel::rowsInserted, this, &JournalScreen::updateCount);
  connect(m_filter, &QAbstractItemModel::rowsRemoved, this, &JournalScreen::updateCount);
  connect(m_filter, &QAbstractItemModel::modelReset, this, &JournalScreen::updateCount);
  updateCount();
}

void JournalScreen::updateCount() {
  m_count->setText(tr("%1 shown of %2 newest (%3 in the journal)").arg(m_filter->rowCount()).arg(m_journal->rowCount()).arg(m_journal->total()));
}

void JournalScreen::showDetail() {
  const QModelIndex i = m_table->selectionModel()->currentIndex();
  m_detail->setPlainText(i.isValid() ? i.data(JournalModel::JsonRole).toString() : QString());
}
