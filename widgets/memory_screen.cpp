#include "widgets/memory_screen.h"

#include <cmath>

#include <QChart>
#include <QChartView>
#include <QDateTime>
#include <QDoubleSpinBox>
#include <QFormLayout>
#include <QGroupBox>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QLineSeries>
#include <QPushButton>
#include <QTableView>
#include <QValueAxis>
#include <QVBoxLayout>

#include <iterator>

#include "models/cache_tier_model.h"
#include "models/format.h"
#include "models/journal_filter_model.h"
#include "models/journal_model.h"
#include "models/memory_history.h"
#include "models/settings_model.h"
#include "models/settings_words.h"
#include "widgets/screen_parts.h"
#include "widgets/settings_editors.h"

namespace {

const char* kLimitKeys[] = {"memory.ceiling_gb", "memory.prefill_peak_gb", "memory.allocator_slack_gb"};

}  // namespace

MemoryScreen::MemoryScreen(CacheTierModel* tiers, MemoryHistory* history, SettingsModel* settings, JournalModel* journal, QWidget* parent)
    : QWidget(parent), m_tiers(tiers), m_history(history), m_settings(settings) {
  // Limits.
  auto* limits = new QGroupBox(tr("Memory limits"), this);
  auto* form = new QFormLayout;
  for (int i = 0; i < 3; ++i) {
    auto* spin = new QDoubleSpinBox(limits);
    spin->setObjectName(QString(kLimitKeys[i]).replace('.', '_'));
    const SettingWords words = WordsForSetting(kLimitKeys[i]);
    spin->setDecimals(words.decimals);
    spin->setSuffix(words.unit);
    spin->setSingleStep(0.5);
    spin->setMinimumWidth(120);
    keepFullHeight(spin);
    connect(spin, &QDoubleSpinBox::valueChanged, this, [this] {
      m_dirty = true;
      SetAdminButtonEnabled(m_apply, true);
      m_revert->setEnabled(true);
    });
    m_editors[kLimitKeys[i]] = spin;
    form->addRow(words.label, spin);
  }
  m_versionLabel = new QLabel(limits);
  form->addRow(tr("Settings version"), m_versionLabel);
  m_apply = new QPushButton(tr("Apply"), limits);
  m_apply->setObjectName("applyLimitsButton");
  m_revert = new QPushButton(tr("Revert"), limits);
  auto* buttons = new QHBoxLayout;
  buttons->addStretch();
  buttons->addWidget(m_revert);
  buttons->addWidget(m_apply);
  m_message = new QLabel(limits);
  m_message->setObjectName("limitsMessage");
  m_message->setWordWrap(true);
  m_message->setTextInteractionFlags(Qt::TextSelectableByMouse);
  auto* limitsLayout = new QVBoxLayout(limits);
  limitsLayout->addLayout(form);
  limitsLayout->addLayout(buttons);
  limitsLayout->addWidget(m_message);
  limitsLayout->addStretch();
  connect(m_apply, &QPushButton::clicked, this, &MemoryScreen::applyLimits);
  connect(m_revert, &QPushButton::clicked, this, [this] {
    m_dirty = false;
    loadLimits();
    setMessage({}, false);
  });

  // Tiers.
  auto* tierBox = new QGroupBox(tr("What each tier holds now"), this);
  m_tierView = new QTableView(tierBox);
  m_tierView->setObjectName("tierTable");
  m_tierView->setModel(tiers);
  m_tierView->verticalHeader()->hide();
  m_tierView->setSelectionMode(QAbstractItemView::NoSelection);
  m_tierView->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
  m_tierView->horizontalHeader()->setSectionResizeMode(CacheTierModel::TierColumn, QHeaderView::Stretch);
  m_tierView->setMinimumHeight(200);
  m_totals = new QLabel(tierBox);
  m_totals->setObjectName("memoryTotals");
  m_totals->setWordWrap(true);
  m_slots = new QLabel(tierBox);
  m_slots->setObjectName("slotList");
  m_slots->setTextFormat(Qt::PlainText);
  m_slots->hide();
  auto* tierLayout = new QVBoxLayout(tierBox);
  tierLayout->addWidget(m_tierView);
  tierLayout->addWidget(m_totals);
  tierLayout->addWidget(m_slots);
  connect(tiers, &QAbstractItemModel::dataChanged, this, &MemoryScreen::updateTotals);
  connect(tiers, &QAbstractItemModel::modelReset, this, &MemoryScreen::updateTotals);
  connect(tiers, &QAbstractItemModel::modelReset, this, &MemoryScreen::rebuildClearButtons);

  // Chart.
  m_chart = new QChart;
  m_chart->setTitle(tr("Bytes held by tier (up to the last %1 minutes)").arg(history->windowMs() / 60000));
  m_chart->legend()->setAlignment(Qt::AlignRight);
  m_axisX = new QValueAxis;
  m_axisX->setTitleText(tr("seconds ago"));
  m_axisX->setRange(-history->windowMs() / 1000.0, 0);
  m_axisX->setLabelFormat("%d");
  m_axisY = new QValueAxis;
  m_axisY->setLabelFormat("%.1f");
  m_chart->addAxis(m_axisX, Qt::AlignBottom);
  m_chart->addAxis(m_axisY, Qt::AlignLeft);
  m_chartView = new QChartView(m_chart, this);
  m_chartView->setRenderHint(QPainter::Antialiasing);
  m_chartView->setMinimumHeight(170);
  connect(history, &QAbstractItemModel::rowsInserted, this, &MemoryScreen::updateChart);
  connect(history, &QAbstractItemModel::modelReset, this, &MemoryScreen::updateChart);

  // Sheds and 503s.
  auto* alertBox = new QGroupBox(tr("Last sheds and 503 answers"), this);
  auto* alerts = new JournalFilterModel(this);
  alerts->setAlertsOnly(true);
  alerts->setSourceModel(journal);
  m_alertView = new QTableView(alertBox);
  m_alertView->setObjectName("alertTable");
  m_alertView->setModel(alerts);
  m_alertView->verticalHeader()->hide();
  m_alertView->horizontalHeader()->setStretchLastSection(true);
  m_alertView->setSelectionBehavior(QAbstractItemView::SelectRows);
  m_alertEmpty = new QLabel(alertBox);
  m_alertEmpty->setObjectName("alertEmpty");
  auto* alertLayout = new QVBoxLayout(alertBox);
  alertLayout->addWidget(m_alertEmpty);
  alertLayout->addWidget(m_alertView);
  auto updateAlerts = [this, alerts] {
    m_alertEmpty->setText(m_journalRefusal.isEmpty() ? tr("None in the journal's newest rows: every prefill fitted its budget.")
                                                     : tr("The journal cannot be read (%1): sheds and 503 answers are not known.").arg(m_journalRefusal));
    m_alertEmpty->setVisible(alerts->rowCount() == 0 || !m_journalRefusal.isEmpty());
    m_alertView->setVisible(alerts->rowCount() > 0 && m_journalRefusal.isEmpty());
  };
  m_updateAlerts = updateAlerts;
  connect(alerts, &QAbstractItemModel::rowsInserted, this, updateAlerts);
  connect(alerts, &QAbstractItemModel::rowsRemoved, this, updateAlerts);
  connect(alerts, &QAbstractItemModel::modelReset, this, updateAlerts);
  updateAlerts();
  alertBox->setMaximumHeight(200);

  auto* top = new QHBoxLayout;
  top->addWidget(limits, 2);
  top->addWidget(tierBox, 3);
  auto* layout = new QVBoxLayout(this);
  layout->addLayout(top, 0);
  layout->addWidget(m_chartView, 1);
  layout->addWidget(alertBox, 0);

  connect(settings, &QAbstractItemModel::modelReset, this, &MemoryScreen::loadLimits);
  connect(settings, &QAbstractItemModel::dataChanged, this, &MemoryScreen::loadLimits);
  loadLimits();
  rebuildClearButtons();
}

void MemoryScreen::setJournalRefusal(const QString& why) {
  m_journalRefusal = why;
  m_updateAlerts();
}

void MemoryScreen::loadLimits() {
  m_versionLabel->setText(m_settings->version() > 0 ? QString::number(m_settings->version()) : tr("(loading)"));
  if (m_dirty) return;  // keep the operator's edit
  loadEditors(m_editors, *m_settings);
  SetAdminButtonEnabled(m_apply, false);
  m_revert->setEnabled(false);
}

void MemoryScreen::applyLimits() {
  const double ceiling = m_editors["memory.ceiling_gb"]->value();
  const double peak = m_editors["memory.prefill_peak_gb"]->value();
  if (peak < ceiling) {
    setMessage(tr("Peak during prefill (%1 GiB) must be at least the ceiling (%2 GiB).").arg(peak).arg(ceiling), true);
    return;
  }
  QVariantMap values;
  for (auto it = m_editors.begin(); it != m_editors.end(); ++it) values[it.key()] = it.value()->value();
  setMessage(tr("Applying as version %1…").arg(m_settings->version() + 1), false);
  emit settingsReplaceRequested(m_settings->documentWith(values));
}

void MemoryScreen::onSettingsOutcome(const SettingsOutcome& outcome) {
  if (outcome.ok) {
    m_dirty = false;
    loadLimits();
    setMessage(tr("Applied: settings version %1; the engine uses it from the next request.").arg(outcome.version), false);
  } else {
    setMessage(tr("Refused (HTTP %1): %2").arg(outcome.httpStatus).arg(outcome.message), true);
  }
}

void MemoryScreen::onTierCleared(const QString& tier, bool ok, const QString& message) {
  setMessage(ok ? tr("Cleared %1.").arg(tier) : tr("Clearing %1 failed: %2").arg(tier, message), !ok);
}

void MemoryScreen::requestClear(const QString& tier) {
  // What will be lost: the tier's entries and bytes (every RAM tier's and the resident rows, for "ram").
  qint64 entries = 0, bytes = 0, rows = 0;
  for (const CacheTierSnapshot& t : m_tiers->snapshot().tiers) {
    if (t.tier == "resident") rows = t.entries;
    if (tier == "ram" ? t.tier != "resident" : t.tier == tier) {
      entries += t.entries;
      bytes += t.bytes;
    }
  }
  const QString lost = (entries == 1 ? tr("1 entry, %1") : tr("%1 entries, %2").arg(entries)).arg(fmt::bytes(bytes));
  QString text;
  if (tier == "ram") {
    text = tr("Clear the resident rows (%1 tokens) and every resident tier (%2)? The next request prefills cold.").arg(rows).arg(lost);
  } else {
    text = tr("Clear the %1 tier (%2)? Requests that would resume from it prefill from a colder tier.").arg(tier, lost);
  }
  if (!m_confirm(this, tr("Clear cache tier"), text)) return;
  emit clearTierRequested(tier);
}

void MemoryScreen::rebuildClearButtons() {
  const int rowHeight = std::max(m_tierView->verticalHeader()->defaultSectionSize(), m_tierView->fontMetrics().height() * 2);
  m_tierView->verticalHeader()->setDefaultSectionSize(rowHeight);
  m_tierView->setMinimumHeight(m_tierView->horizontalHeader()->sizeHint().height() + rowHeight * std::max(6, m_tiers->rowCount()) + 4);
  for (int row = 0; row < m_tiers->rowCount(); ++row) {
    const QString tier = m_tiers->index(row, 0).data(CacheTierModel::TierRole).toString();
    const QString command = tier == "resident" ? QString("ram") : tier;
    auto* button = new QPushButton(tier == "resident" ? tr("Clear all") : tr("Clear"));
    button->setObjectName("clear_" + tier);
    button->setToolTip(tier == "resident" ? tr("Empty the resident rows and every RAM tier") : tr("Empty the %1 tier").arg(tier));
    connect(button, &QPushButton::clicked, this, [this, command] { requestClear(command); });
    m_tierView->setIndexWidget(m_tiers->index(row, CacheTierModel::ActionColumn), button);
    SetAdminButtonEnabled(button, true);  // in its window now, whose refusal it follows
  }
}

void MemoryScreen::updateChart() {
  const QStringList& names = m_history->tiers();
  if (m_series.size() != names.size()) {
    for (QLineSeries* s : m_series) m_chart->removeSeries(s), delete s;
    m_series.clear();
    // One colour a tier, none repeated (the tiers are nine and may grow).
    static const QColor colors[] = {QColor("#1f77b4"), QColor("#2ca02c"), QColor("#ff7f0e"), QColor("#9467bd"), QColor("#d62728"), QColor("#8c564b"),
                                    QColor("#17becf"), QColor("#7f7f7f"), QColor("#bcbd22"), QColor("#e377c2"), QColor("#393b79"), QColor("#637939")};
    for (const QString& name : names) {
      auto* s = new QLineSeries;
      s->setName(name);
      QPen pen(colors[m_series.size() % std::size(colors)]);
      pen.setWidthF(2);
      s->setPen(pen);
      m_chart->addSeries(s);
      s->attachAxis(m_axisX);
      s->attachAxis(m_axisY);
      m_series << s;
    }
  }
  const qint64 maxBytes = m_history->maxBytes();
  const char* units[] = {"bytes", "KiB", "MiB", "GiB"};
  int u = 0;
  double scale = 1;
  while (u < 3 && maxBytes / scale >= 1024 * 4) scale *= 1024, ++u;
  m_axisY->setTitleText(tr("held, %1").arg(units[u]));
  m_axisY->setRange(0, std::max(1.0, maxBytes / scale * 1.1));
  m_axisY->applyNiceNumbers();
  const qint64 now = m_history->rowCount() ? m_history->timeMs(m_history->rowCount() - 1) : QDateTime::currentMSecsSinceEpoch();
  const double span = m_history->rowCount() ? (now - m_history->timeMs(0)) / 1000.0 : 0;
  const double range = std::min(m_history->windowMs() / 1000.0, std::max(30.0, std::ceil(span / 30) * 30));
  m_axisX->setRange(-range, 0);
  m_axisX->setTickType(QValueAxis::TicksDynamic);
  m_axisX->setTickAnchor(0);
  m_axisX->setTickInterval(range <= 30 ? 5 : range <= 60 ? 10 : range <= 180 ? 30 : 60);
  for (int t = 0; t < m_series.size(); ++t) {
    QList<QPointF> points;
    points.reserve(m_history->rowCount());
    for (int r = 0; r < m_history->rowCount(); ++r) points.append({(m_history->timeMs(r) - now) / 1000.0, m_history->bytes(r, t) / scale});
    m_series[t]->replace(points);
  }
}

void MemoryScreen::updateTotals() {
  const CacheSnapshot& c = m_tiers->snapshot();
  if (c.ceilingBytes == 0 && c.engineBytes == 0) {
    m_totals->clear();
    return;
  }
  QString totals = tr("Engine holds %1 of a %2 ceiling (%3 during prefill) · %4 sheds · %5 refused (503) since start")
                       .arg(fmt::bytes(c.engineBytes), fmt::bytes(c.ceilingBytes), fmt::bytes(c.peakBytes))
                       .arg(c.sheds)
                       .arg(c.refused);
  if (c.deviceBytes > 0) totals += tr(" · GPU holds %1").arg(fmt::bytes(c.deviceBytes));
  m_totals->setText(totals);
  // The slots (tiers above are slot 0's; the disk, spill and response cache serve every slot).
  QStringList lines;
  if (c.slotRows.size() > 1)
    for (const SlotRowSnapshot& slot : c.slotRows)
      lines << tr("Slot %1 · %2 · %3 · %4 tokens · %5 · %6 requests")
                   .arg(slot.slot)
                   .arg(slot.state, slot.session.isEmpty() ? tr("no session") : tr("session %1").arg(slot.session))
                   .arg(slot.tokens)
                   .arg(fmt::bytes(slot.bytes))
                   .arg(slot.requests);
  m_slots->setText(lines.join('\n'));
  m_slots->setVisible(!lines.isEmpty());
}

void MemoryScreen::setMessage(const QString& text, bool error) { showMessage(m_message, text, error); }
