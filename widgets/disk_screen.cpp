#include "widgets/disk_screen.h"

#include <QGroupBox>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QJsonArray>
#include <QJsonDocument>
#include <QLabel>
#include <QPushButton>
#include <QTableWidget>
#include <QVBoxLayout>

#include "models/cache_event_words.h"
#include "models/format.h"
#include "models/settings_model.h"
#include "models/settings_words.h"
#include "widgets/screen_parts.h"
#include "widgets/settings_panel.h"

namespace {

// Events, newest first: time, what happened, tokens, bytes, why; in words, the engine's own in the tooltips.
void FillEventTable(QTableWidget* table, const QJsonArray& events) {
  table->setRowCount(static_cast<int>(events.size()));
  for (int i = 0; i < events.size(); ++i) {
    const QJsonObject e = events[events.size() - 1 - i].toObject();
    const QString kind = e["kind"].toString(), reason = e["reason"].toString();
    const CacheEventWords words = DescribeCacheEvent(kind, reason);
    table->setItem(i, 0, tableCell(fmt::timeOfDay(static_cast<qint64>(e["time_ms"].toDouble()))));
    table->setItem(i, 1, tableCell(words.what));
    table->item(i, 1)->setToolTip(kind);
    table->setItem(i, 2, tableCell(QString::number(static_cast<qint64>(e["tokens"].toDouble())), true));
    table->setItem(i, 3, tableCell(fmt::bytes(static_cast<qint64>(e["bytes"].toDouble())), true));
    table->setItem(i, 4, tableCell(words.why));
    table->item(i, 4)->setToolTip(reason);
  }
}

// A line over an empty table's rows (it takes no room of its own).
QLabel* EmptyLine(const QString& name, QTableWidget* table) {
  auto* line = new QLabel(table->viewport());
  line->setObjectName(name);
  line->setWordWrap(true);
  line->setStyleSheet("color: gray;");
  auto* over = new QVBoxLayout(table->viewport());
  over->addWidget(line, 0, Qt::AlignTop);
  return line;
}

}  // namespace

DiskScreen::DiskScreen(SettingsModel* settings, QWidget* parent) : QWidget(parent), m_settings(settings) {
  m_clear = new QPushButton(tr("Clear the disk tier…"));
  m_clear->setEnabled(false);  // until a snapshot says the tier is open
  m_clear->setObjectName("clear_disk");
  m_clear->setToolTip(tr("Delete every chunk and anchor file and the cold-read counts"));
  connect(m_clear, &QPushButton::clicked, this, &DiskScreen::requestClear);
  auto* status = makeSummaryBox(tr("Disk tier"), "diskSummary", &m_summary, m_clear, this);

  m_panel = new SettingsPanel(settings, "applyDiskButton", "diskMessage", tr("the disk tier uses it from the next request"), this);
  m_panel->addChoice("disk_cache.mode", WordsForSetting("disk_cache.mode").label, {"off", "read", "readwrite"});
  m_panel->addChoice("spill.mode", WordsForSetting("spill.mode").label, {"off", "on"});
  m_panel->addNumbers({"disk_cache.budget_gb", "disk_cache.ttl_days", "disk_cache.min_free_gb", "disk_cache.admit_after", "disk_cache.min_tokens",
                       "disk_cache.write_budget_gb", "spill.budget_gb", "spill.min_tokens", "spill.ttl_hours"});
  m_panel->finish();
  connect(m_panel, &SettingsPanel::settingsReplaceRequested, this, &DiskScreen::settingsReplaceRequested);

  auto* prefixBox = new QGroupBox(tr("Most-hit prefixes (token counts; no text is kept here)"), this);
  m_prefixes = makeTable({tr("Tokens"), tr("Bytes"), tr("Hits"), tr("Last used")}, "diskPrefixTable", prefixBox);
  m_prefixesEmpty = EmptyLine("diskPrefixesEmpty", m_prefixes);
  (new QVBoxLayout(prefixBox))->addWidget(m_prefixes);
  auto* eventBox = new QGroupBox(tr("Last events"), this);
  m_events = makeTable({tr("Time"), tr("Event"), tr("Tokens"), tr("Bytes"), tr("Why")}, "diskEventTable", eventBox);
  (new QVBoxLayout(eventBox))->addWidget(m_events);

  auto* spillBox = new QGroupBox(tr("Session spill (whole conversations; each titled by its first user message)"), this);
  m_spillSummary = new QLabel(tr("Waiting for the engine…"), spillBox);
  m_spillSummary->setObjectName("spillSummary");
  m_spillSummary->setWordWrap(true);
  m_spillSummary->setTextInteractionFlags(Qt::TextSelectableByMouse);
  m_clearSpill = new QPushButton(tr("Clear the spill…"), spillBox);
  m_clearSpill->setEnabled(false);
  m_clearSpill->setObjectName("clear_spill");
  m_clearSpill->setToolTip(tr("Delete every saved conversation"));
  connect(m_clearSpill, &QPushButton::clicked, this, &DiskScreen::requestClearSpill);
  m_spillEntries = makeTable({tr("Session"), tr("Title"), tr("Tokens"), tr("Stored"), tr("Raw"), tr("End at"), tr("Last used")}, "spillEntryTable", spillBox);
  m_spillEntriesEmpty = EmptyLine("spillEntriesEmpty", m_spillEntries);
  m_spillEvents = makeTable({tr("Time"), tr("Event"), tr("Tokens"), tr("Bytes"), tr("Why")}, "spillEventTable", spillBox);
  auto* spillHead = new QHBoxLayout;
  spillHead->addWidget(m_spillSummary, 1);
  spillHead->addWidget(m_clearSpill, 0, Qt::AlignTop);
  auto* spillTables = new QHBoxLayout;
  spillTables->addWidget(m_spillEntries, 2);
  spillTables->addWidget(m_spillEvents, 3);
  auto* spillLayout = new QVBoxLayout(spillBox);
  spillLayout->addLayout(spillHead);
  spillLayout->addLayout(spillTables);

  auto* top = new QHBoxLayout;
  top->addWidget(status, 3);
  top->addWidget(m_panel, 2);
  auto* bottom = new QHBoxLayout;
  bottom->addWidget(prefixBox, 2);
  bottom->addWidget(eventBox, 3);
  auto* layout = new QVBoxLayout(this);
  layout->addLayout(top, 0);
  layout->addLayout(bottom, 1);
  layout->addWidget(spillBox, 1);
}

QString DiskScreen::summaryText() const { return m_summary->text(); }
QString DiskScreen::prefixesEmptyText() const { return m_prefixesEmpty->isHidden() ? QString() : m_prefixesEmpty->text(); }
QString DiskScreen::spillEntriesEmptyText() const { return m_spillEntriesEmpty->isHidden() ? QString() : m_spillEntriesEmpty->text(); }

void DiskScreen::showEmpty(QLabel* line, const QTableWidget* table, const QString& why) {
  line->setText(why);
  line->setVisible(table->rowCount() == 0 && !why.isEmpty());
}
QString DiskScreen::spillSummaryText() const { return m_spillSummary->text(); }

QDoubleSpinBox* DiskScreen::editor(const QString& key) const { return m_panel->number(key); }
QComboBox* DiskScreen::modeEditor() const { return m_panel->choice("disk_cache.mode"); }

void DiskScreen::onSettingsOutcome(const SettingsOutcome& outcome) { m_panel->onSettingsOutcome(outcome); }

void DiskScreen::onTierCleared(const QString& tier, bool ok, const QString& message) {
  if (tier != "disk" && tier != "spill") return;
  const QString what = tier == "disk" ? tr("the disk tier") : tr("the session spill");
  m_panel->setMessage(ok ? tr("Cleared %1.").arg(what) : tr("Clearing %1 failed: %2").arg(what, message), !ok);
}

void DiskScreen::requestClearSpill() {
  if (!m_confirm(this, tr("Clear the session spill"),
                 tr("Delete %n saved conversation(s) (%1 on disk)? Their next turns read everything past the disk tier's heads again.", nullptr,
                    static_cast<int>(m_spillCount))
                     .arg(fmt::bytes(m_spillBytes))))
    return;
  emit clearTierRequested("spill");
}

void DiskScreen::requestClear() {
  if (!m_confirm(this, tr("Clear the disk tier"),
                 tr("Delete the disk tier's %1 anchors and %2 chunks (%3) and its cold-read counts? Sessions whose heads it holds prefill them cold again.")
                     .arg(m_diskAnchors)
                     .arg(m_diskChunks)
                     .arg(fmt::bytes(m_diskBytes))))
    return;
  emit clearTierRequested("disk");
}

void DiskScreen::setSnapshot(const CacheSnapshot& snapshot) {
  const QJsonObject doc = QJsonDocument::fromJson(snapshot.json).object();
  const QJsonObject d = doc.value("disk").toObject();
  m_open = d.value("open").toBool();
  SetAdminButtonEnabled(m_clear, m_open);
  setSpill(doc.value("spill").toObject());
  if (!m_open) {
    m_summary->setText(tr("This engine runs without a disk tier (started with --disk-cache off)."));
    m_prefixes->setRowCount(0);
    m_events->setRowCount(0);
    showEmpty(m_prefixesEmpty, m_prefixes, tr("No disk tier: nothing is written."));
    return;
  }
  auto n = [&](const char* key) { return static_cast<qint64>(d.value(key).toDouble()); };
  m_diskAnchors = n("anchors");
  m_diskChunks = n("chunks");
  m_diskBytes = n("bytes");
  const qint64 free = n("free_bytes");
  const double rate = d.value("read_bytes_per_s").toDouble();
  QString text = tr("<b>%1</b> in %2<br>").arg(d.value("mode").toString().toHtmlEscaped(), d.value("dir").toString().toHtmlEscaped());
  text += tr("Holds %1 of its %2 budget: %3 anchors, %4 chunks.<br>").arg(fmt::bytes(n("bytes")), fmt::bytes(n("budget_bytes"))).arg(n("anchors")).arg(n("chunks"));
  text += tr("Free on the disk: %1 (the tier leaves %2).<br>").arg(free >= 0 ? fmt::bytes(free) : tr("unknown"), fmt::bytes(n("min_free_bytes")));
  text += tr("Hit rate %1%: %2 hits, %3 misses; %4 failed restores.<br>")
              .arg(100.0 * d.value("hit_rate").toDouble(), 0, 'f', 1)
              .arg(n("hits"))
              .arg(n("misses"))
              .arg(n("failed_restores"));
  text += tr("Written %1 (%2 anchors, %3 chunks); %4 jobs dropped; %5 files evicted, %6 expired.")
              .arg(fmt::bytes(n("bytes_written")))
              .arg(n("anchors_written"))
              .arg(n("chunks_written"))
              .arg(n("dropped_jobs"))
              .arg(n("evicted_files"))
              .arg(n("expired_files"));
  if (rate > 0) text += tr("<br>Restores read at %1/s.").arg(fmt::bytes(static_cast<qint64>(rate)));
  if (const QJsonObject w = doc.value("disk_writes").toObject(); !w.isEmpty())
    text += tr("<br>Written today (tier and spill): %1 of %2 a day, level <b>%3</b>; %4 writes skipped for the budget.")
                .arg(fmt::bytes(static_cast<qint64>(w.value("today_gb").toDouble() * 1073741824.0)))
                .arg(fmt::bytes(static_cast<qint64>(w.value("budget_gb").toDouble() * 1073741824.0)))
                .arg(w.value("level").toString())
                .arg(static_cast<qint64>(w.value("skips").toDouble()));
  m_summary->setText(text);

  const QJsonArray top = d.value("top_prefixes").toArray();
  m_prefixes->setRowCount(static_cast<int>(top.size()));
  for (int i = 0; i < top.size(); ++i) {
    const QJsonObject p = top[i].toObject();
    m_prefixes->setItem(i, 0, tableCell(QString::number(static_cast<qint64>(p["tokens"].toDouble())), true));
    m_prefixes->setItem(i, 1, tableCell(fmt::bytes(static_cast<qint64>(p["bytes"].toDouble())), true));
    m_prefixes->setItem(i, 2, tableCell(QString::number(static_cast<qint64>(p["hits"].toDouble())), true));
    m_prefixes->setItem(i, 3, tableCell(fmt::timeOfDay(static_cast<qint64>(p["last_used_ms"].toDouble()))));
  }
  FillEventTable(m_events, d.value("recent_events").toArray());
  const QString mode = d.value("mode").toString();
  showEmpty(m_prefixesEmpty, m_prefixes,
            mode == "readwrite" ? tr("No prefix on disk yet: a prompt's head of at least %1 tokens is written once it has been read cold %2 times (the settings at the right).")
                                      .arg(m_settings->value("disk_cache.min_tokens").toInteger())
                                      .arg(m_settings->value("disk_cache.admit_after").toInteger())
                                : tr("No prefix on disk, and the tier in mode %1 writes none (readwrite writes).").arg(mode));
}

void DiskScreen::setSpill(const QJsonObject& sp) {
  const bool open = sp.value("open").toBool();
  SetAdminButtonEnabled(m_clearSpill, open);
  if (!open) {
    m_spillSummary->setText(tr("This engine runs without a session spill (it lives in the disk tier's folder)."));
    m_spillEntries->setRowCount(0);
    m_spillEvents->setRowCount(0);
    showEmpty(m_spillEntriesEmpty, m_spillEntries, tr("No session spill: nothing is saved."));
    return;
  }
  auto n = [&](const char* key) { return static_cast<qint64>(sp.value(key).toDouble()); };
  m_spillCount = n("entries");
  m_spillBytes = n("bytes");
  m_spillSummary->setText(tr("%1 conversations, %2 stored for %3 of rows (the codec saves %4%).<br>"
                             "%5 saves, %6 restores, %7 failed restores; %8 evicted for the budget, %9 expired.")
                              .arg(n("entries"))
                              .arg(fmt::bytes(n("bytes")), fmt::bytes(n("raw_bytes")))
                              .arg(100.0 * sp.value("codec_saved_fraction").toDouble(), 0, 'f', 1)
                              .arg(n("saves"))
                              .arg(n("restores"))
                              .arg(n("failed_restores"))
                              .arg(n("evictions"))
                              .arg(n("expired")));
  const QJsonArray list = sp.value("list").toArray();
  m_spillEntries->setRowCount(static_cast<int>(list.size()));
  for (int i = 0; i < list.size(); ++i) {
    const QJsonObject e = list[i].toObject();
    const QString session = e["session"].toString();
    m_spillEntries->setItem(i, 0, tableCell(session.isEmpty() ? tr("(none)") : session));
    // A remote server sends titles to its admin token only.
    const QString title = e.contains("title") ? e["title"].toString() : tr("(sent to the admin token only)");
    m_spillEntries->setItem(i, 1, tableCell(title.isEmpty() && e.contains("title") ? tr("(no user message)") : title));
    m_spillEntries->setItem(i, 2, tableCell(QString::number(static_cast<qint64>(e["tokens"].toDouble())), true));
    m_spillEntries->setItem(i, 3, tableCell(fmt::bytes(static_cast<qint64>(e["bytes"].toDouble())), true));
    m_spillEntries->setItem(i, 4, tableCell(fmt::bytes(static_cast<qint64>(e["raw_bytes"].toDouble())), true));
    m_spillEntries->setItem(i, 5, tableCell(QString::number(static_cast<qint64>(e["end_length"].toDouble())), true));
    m_spillEntries->setItem(i, 6, tableCell(fmt::timeOfDay(static_cast<qint64>(e["used_ms"].toDouble()))));
  }
  FillEventTable(m_spillEvents, sp.value("recent_events").toArray());
  showEmpty(m_spillEntriesEmpty, m_spillEntries,
            tr("No conversation saved yet: one of at least %1 tokens is written when it leaves memory (evicted, another session takes its slot, or a planned stop).")
                .arg(m_settings->value("spill.min_tokens").toInteger()));
}

