#include "widgets/journal_screen.h"

#include <QChart>
#include <QChartView>
#include <QCheckBox>
#include <QComboBox>
#include <QDateTime>
#include <QDateTimeAxis>
#include <QFontDatabase>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QLineEdit>
#include <QLogValueAxis>
#include <QPieSeries>
#include <QPlainTextEdit>
#include <QScatterSeries>
#include <QSplitter>
#include <QTableView>
#include <QVBoxLayout>
#include <QValueAxis>

#include <algorithm>
#include <cmath>

#include "models/chart_scale.h"
#include "models/journal_charts.h"
#include "models/journal_filter_model.h"
#include "models/journal_model.h"

namespace {

// One colour a cache source, the same on every chart.
QColor SourceColor(const QString& source) {
  static const QMap<QString, QColor> known = {{"cold", QColor(0x9e, 0x9e, 0x9e)},     {"resident", QColor(0x1f, 0x77, 0xb4)},
                                              {"end", QColor(0x2c, 0xa0, 0x2c)},      {"pin", QColor(0x94, 0x67, 0xbd)},
                                              {"park", QColor(0x8c, 0x56, 0x4b)},     {"store", QColor(0xff, 0x7f, 0x0e)},
                                              {"disk", QColor(0xd6, 0x27, 0x28)},     {"spill", QColor(0xe3, 0x77, 0xc2)},
                                              {"response", QColor(0x17, 0xbe, 0xcf)}, {"request", QColor(0xbc, 0xbd, 0x22)},
                                              {"continuation", QColor(0x39, 0x3b, 0x79)}, {"prepared", QColor(0x63, 0x79, 0x39)}};
  return known.value(source, QColor(0x44, 0x44, 0x44));
}

QChart* NewChart(const QString& title) {
  auto* chart = new QChart;
  chart->setTitle(title);
  chart->legend()->setAlignment(Qt::AlignBottom);
  return chart;
}

}  // namespace

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
  connect(m_kind, &QComboBox::currentIndexChanged, this, [this] { m_filter->setKind(m_kind->currentData().toString()); updateCount(), updateCharts(); });
  connect(m_tier, &QLineEdit::textChanged, this, [this](const QString& t) { m_filter->setTier(t); updateCount(), updateCharts(); });
  connect(m_session, &QLineEdit::textChanged, this, [this](const QString& t) { m_filter->setSession(t); updateCount(), updateCharts(); });
  connect(m_text, &QLineEdit::textChanged, this, [this](const QString& t) { m_filter->setText(t); updateCount(), updateCharts(); });

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
  // Widths in character cells, so every column but the text fits beside the detail pane at 1280 x 800.
  const int cell = m_table->fontMetrics().horizontalAdvance('0');
  const std::pair<int, int> widths[] = {{JournalModel::TimeColumn, 19}, {JournalModel::KindColumn, 8},    {JournalModel::RouteColumn, 17},
                                        {JournalModel::SlotColumn, 5},  {JournalModel::WaitColumn, 11},    {JournalModel::TierColumn, 6},
                                        {JournalModel::SessionColumn, 8}, {JournalModel::TokensColumn, 7}, {JournalModel::OutputColumn, 7},
                                        {JournalModel::TtftColumn, 9},  {JournalModel::RateColumn, 6},     {JournalModel::StatusColumn, 6},
                                        {JournalModel::FinishColumn, 7}};
  for (auto [column, cells] : widths) m_table->setColumnWidth(column, cells * cell);

  m_detail = new QPlainTextEdit(this);
  m_detail->setObjectName("journalDetail");
  m_detail->setReadOnly(true);
  m_detail->setFont(QFontDatabase::systemFont(QFontDatabase::FixedFont));
  m_detail->setPlaceholderText(tr("Select a row to see all its columns."));
  m_raw = new QCheckBox(tr("Raw JSON"), this);
  m_raw->setObjectName("journalRawJson");
  m_raw->setToolTip(tr("The row as the journal stores it, instead of its summary"));
  auto* detail = new QWidget(this);
  auto* detailColumn = new QVBoxLayout(detail);
  detailColumn->setContentsMargins(0, 0, 0, 0);
  detailColumn->addWidget(m_detail, 1);
  detailColumn->addWidget(m_raw);

  auto* split = new QSplitter(Qt::Horizontal, this);
  split->addWidget(m_table);
  split->addWidget(detail);
  split->setStretchFactor(0, 3);
  split->setStretchFactor(1, 1);

  m_ttft = NewChart(tr("Time to first token (ms)"));
  m_reread = NewChart(tr("Re-read tokens"));
  m_sources = NewChart(tr("Requests per cache source"));
  auto* charts = new QWidget(this);
  auto* chartRow = new QHBoxLayout(charts);
  chartRow->setContentsMargins(0, 0, 0, 0);
  for (auto [chart, name] : {std::pair{m_ttft, "ttftChart"}, std::pair{m_reread, "rereadChart"}, std::pair{m_sources, "sourceChart"}}) {
    auto* view = new QChartView(chart, charts);
    view->setObjectName(name);
    view->setRenderHint(QPainter::Antialiasing);
    view->setMinimumHeight(200);
    chartRow->addWidget(view, chart == m_sources ? 2 : 3);
  }
  auto* rowsAndCharts = new QSplitter(Qt::Vertical, this);
  rowsAndCharts->addWidget(split);
  rowsAndCharts->addWidget(charts);
  rowsAndCharts->setStretchFactor(0, 3);
  rowsAndCharts->setStretchFactor(1, 2);

  auto* layout = new QVBoxLayout(this);
  layout->addLayout(filters);
  layout->addWidget(rowsAndCharts, 1);

  connect(m_table->selectionModel(), &QItemSelectionModel::currentRowChanged, this, &JournalScreen::showDetail);
  connect(m_raw, &QCheckBox::toggled, this, &JournalScreen::showDetail);
  connect(m_filter, &QAbstractItemModel::rowsInserted, this, &JournalScreen::updateCount);
  connect(m_filter, &QAbstractItemModel::rowsRemoved, this, &JournalScreen::updateCount);
  connect(m_filter, &QAbstractItemModel::modelReset, this, &JournalScreen::updateCount);
  connect(m_filter, &QAbstractItemModel::rowsInserted, this, &JournalScreen::updateCharts);  // the charts plot the rows shown
  connect(m_filter, &QAbstractItemModel::rowsRemoved, this, &JournalScreen::updateCharts);
  connect(m_filter, &QAbstractItemModel::modelReset, this, &JournalScreen::updateCharts);
  updateCount();
  updateCharts();
}

void JournalScreen::updateCharts() {
  QList<JournalRowSnapshot> rows;
  for (int i = 0; i < m_filter->rowCount(); ++i) rows.append(m_journal->row(m_filter->mapToSource(m_filter->index(i, 0)).row()));
  const QList<RequestPoint> points = RequestPoints(rows);
  const QString waiting = m_journal->rowCount() == 0 ? tr("waiting for the first request") : tr("no request among the rows shown");
  m_ttft->setTitle(points.isEmpty() ? tr("Time to first token (ms): %1").arg(waiting) : tr("Time to first token (ms)"));
  m_reread->setTitle(points.isEmpty() ? tr("Re-read tokens: %1").arg(waiting) : tr("Re-read tokens"));
  m_sources->setTitle(points.isEmpty() ? tr("Requests per cache source: %1").arg(waiting) : tr("Requests per cache source"));
  for (QChart* chart : {m_ttft, m_reread, m_sources}) {
    chart->removeAllSeries();
    for (QAbstractAxis* axis : chart->axes()) {
      chart->removeAxis(axis);
      delete axis;
    }
  }
  // Over time: one scatter series a source, so the legend names the colours.
  for (auto [chart, ttft] : {std::pair{m_ttft, true}, std::pair{m_reread, false}}) {
    auto* x = new QDateTimeAxis;
    x->setFormat("hh:mm:ss");
    double low = 0, top = 0;
    for (const RequestPoint& p : points) {
      const double value = ttft ? p.ttftMs : static_cast<double>(p.rereadTokens);
      low = low == 0 ? value : std::min(low, value);
      top = std::max(top, value);
    }
    QAbstractAxis* y = nullptr;
    if (ttft && SpansDecades(low, top)) {  // a millisecond beside seconds: decades apart
      auto* log = new QLogValueAxis;
      log->setBase(10);
      log->setLabelFormat("%g");
      log->setRange(std::pow(10.0, std::floor(std::log10(low))), std::pow(10.0, std::ceil(std::log10(top))));
      log->setMinorTickCount(-1);
      y = log;
    } else {
      const ChartScale scale = RoundScale(0, std::max(top * 1.05, ttft ? 1.0 : 10.0), 5);
      auto* axis = new QValueAxis;
      axis->setRange(scale.min, scale.max);
      axis->setTickType(QValueAxis::TicksDynamic);
      axis->setTickAnchor(0);
      axis->setTickInterval(scale.step);
      axis->setLabelFormat(scale.labelFormat());
      y = axis;
    }
    chart->addAxis(x, Qt::AlignBottom);
    chart->addAxis(y, Qt::AlignLeft);
    QMap<QString, QScatterSeries*> bySource;
    for (const RequestPoint& p : points) {
      QScatterSeries*& s = bySource[p.source];
      if (s == nullptr) {
        s = new QScatterSeries;
        s->setName(p.source);
        s->setColor(SourceColor(p.source));
        s->setMarkerSize(7);
      }
      const double value = ttft ? p.ttftMs : static_cast<double>(p.rereadTokens);
      s->append(static_cast<double>(p.timeMs), value);
    }
    for (QScatterSeries* s : bySource) {
      chart->addSeries(s);
      s->attachAxis(x);
      s->attachAxis(y);
    }
    const qint64 last = points.isEmpty() ? QDateTime::currentMSecsSinceEpoch() : points.back().timeMs;
    const qint64 first = points.isEmpty() ? last - 60000 : points.front().timeMs;
    const qint64 pad = std::max<qint64>(2000, (last - first) / 20);  // no point on the frame
    x->setRange(QDateTime::fromMSecsSinceEpoch(first - pad), QDateTime::fromMSecsSinceEpoch(last + pad));
  }
  auto* pie = new QPieSeries;
  const QMap<QString, int> shares = SourceShares(points);
  for (auto it = shares.begin(); it != shares.end(); ++it) {
    QPieSlice* slice = pie->append(QString("%1 %2").arg(it.key()).arg(it.value()), it.value());
    slice->setColor(SourceColor(it.key()));
  }
  m_sources->addSeries(pie);
}

void JournalScreen::updateCount() {
  m_count->setText(tr("%1 shown of %2 newest (%3 in the journal)").arg(m_filter->rowCount()).arg(m_journal->rowCount()).arg(m_journal->total()));
}

void JournalScreen::showDetail() {
  const QModelIndex i = m_table->selectionModel()->currentIndex();
  m_detail->setPlainText(i.isValid() ? i.data(m_raw->isChecked() ? JournalModel::JsonRole : JournalModel::SummaryRole).toString() : QString());
}
