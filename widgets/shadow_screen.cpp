#include "widgets/shadow_screen.h"

#include <QChart>
#include <QChartView>
#include <QDateTime>
#include <QGraphicsLayout>
#include <QGroupBox>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QJsonArray>
#include <QJsonDocument>
#include <QLabel>
#include <QLineSeries>
#include <QPushButton>
#include <QTableWidget>
#include <QValueAxis>
#include <QVBoxLayout>

#include "models/chart_scale.h"
#include "models/format.h"
#include "models/settings_words.h"
#include "widgets/screen_parts.h"
#include "widgets/settings_panel.h"

namespace {

qint64 N(const QJsonObject& o, const char* key) { return static_cast<qint64>(o.value(key).toDouble()); }

QString SessionName(const QJsonValue& v) {
  if (v.isString()) return v.toString().isEmpty() ? QObject::tr("(no session id)") : v.toString();
  return QObject::tr("hex %1").arg(v.toObject().value("hex").toString());
}

QString AnswerText(const QJsonValue& v) {
  if (!v.isObject()) return QObject::tr("—");
  const QJsonObject a = v.toObject();
  return QObject::tr("%1 (%2)").arg(a.value("choice").toString()).arg(a.value("probability").toDouble(), 0, 'f', 2);
}

}  // namespace

ShadowScreen::ShadowScreen(SettingsModel* settings, QWidget* parent) : QWidget(parent) {
  m_startMs = QDateTime::currentMSecsSinceEpoch();
  m_clear = new QPushButton(tr("Clear the shadow…"));
  m_clear->setEnabled(false);  // until a snapshot says a shadow model is loaded
  m_clear->setObjectName("clear_shadow");
  m_clear->setToolTip(tr("Drop every session's shadow state, in memory and on disk"));
  connect(m_clear, &QPushButton::clicked, this, &ShadowScreen::requestClear);
  auto* status = makeSummaryBox(tr("Shadow reader"), "shadowSummary", &m_summary, m_clear, this);

  m_panel = new SettingsPanel(settings, "applyShadowButton", "shadowMessage", tr("the reader uses it from its next read"), this);
  m_panel->addSwitch("shadow.enabled", WordsForSetting("shadow.enabled").label, tr("Read every session"));
  m_panel->addNumbers({"shadow.ration", "shadow.budget_gb", "shadow.disk_gb", "shadow.min_tokens"});
  m_panel->addText("shadow.question", WordsForSetting("shadow.question").label);
  m_panel->addText("shadow.choices", WordsForSetting("shadow.choices").label);
  m_panel->finish();
  connect(m_panel, &SettingsPanel::settingsReplaceRequested, this, &ShadowScreen::settingsReplaceRequested);

  auto* sessionBox = new QGroupBox(tr("Sessions (token counts only)"), this);
  m_sessions = makeTable({tr("Session"), tr("Read"), tr("Backlog"), tr("Bytes"), tr("Checkpoints"), tr("Where"), tr("Last used")}, "shadowSessionTable", sessionBox);
  (new QVBoxLayout(sessionBox))->addWidget(m_sessions);

  auto* chartBox = new QGroupBox(tr("Agreement with the main model: waiting for the first compared turn"), this);
  m_chartBox = chartBox;
  m_chart = new QChart;
  m_chart->legend()->hide();
  m_series = new QLineSeries;
  m_chart->addSeries(m_series);
  m_chart->setMargins(QMargins(2, 2, 2, 2));
  m_chart->layout()->setContentsMargins(0, 0, 0, 0);
  auto* x = new QValueAxis;
  x->setTitleText(tr("minutes since the console started"));
  x->setRange(0, 10);
  x->setTickType(QValueAxis::TicksDynamic);
  x->setTickAnchor(0);
  x->setTickInterval(2);
  x->setLabelFormat("%.0f");
  auto* y = new QValueAxis;
  y->setRange(0, 105);  // a point at 100 % sits inside the frame, not on it
  y->setTickType(QValueAxis::TicksDynamic);
  y->setTickAnchor(0);
  y->setTickInterval(25);
  y->setLabelFormat("%.0f %%");
  m_series->setPointsVisible(true);
  m_chart->addAxis(x, Qt::AlignBottom);
  m_chart->addAxis(y, Qt::AlignLeft);
  m_series->attachAxis(x);
  m_series->attachAxis(y);
  m_chartView = new QChartView(m_chart, chartBox);
  m_chartView->setObjectName("shadowAgreementChart");
  m_chartView->setMinimumHeight(160);
  (new QVBoxLayout(chartBox))->addWidget(m_chartView);

  auto* answerBox = new QGroupBox(tr("Last answers"), this);
  m_answers = makeTable({tr("Time"), tr("Session"), tr("At"), tr("Shadow"), tr("Main"), tr("Agree"), tr("Behind"), tr("Lag"), tr("Note")}, "shadowAnswerTable", answerBox);
  (new QVBoxLayout(answerBox))->addWidget(m_answers);

  auto* top = new QHBoxLayout;
  top->addWidget(status, 3);
  top->addWidget(m_panel, 2);
  auto* middle = new QHBoxLayout;
  middle->addWidget(sessionBox, 3);
  middle->addWidget(chartBox, 2);
  auto* layout = new QVBoxLayout(this);
  layout->addLayout(top, 0);
  layout->addLayout(middle, 1);
  layout->addWidget(answerBox, 1);
}

QString ShadowScreen::summaryText() const { return m_summary->text(); }

QDoubleSpinBox* ShadowScreen::editor(const QString& key) const { return m_panel->number(key); }

void ShadowScreen::onSettingsOutcome(const SettingsOutcome& outcome) { m_panel->onSettingsOutcome(outcome); }

void ShadowScreen::onTierCleared(const QString& tier, bool ok, const QString& message) {
  if (tier != "shadow") return;
  m_panel->setMessage(ok ? tr("Cleared the shadow: every session is read again from its next turn.") : tr("Clearing the shadow failed: %1").arg(message), !ok);
}

void ShadowScreen::requestClear() {
  if (!m_confirm(this, tr("Clear the shadow"),
                 tr("Drop %n session(s)' shadow states (%1 in memory, %2 on disk)? Questions about a session wait until its next turn is read again.", nullptr,
                    m_sessions->rowCount())
                     .arg(fmt::bytes(m_residentBytes), fmt::bytes(m_diskBytes))))
    return;
  emit clearTierRequested("shadow");
}

void ShadowScreen::setSnapshot(const ShadowSnapshot& snapshot) {
  const QJsonObject s = QJsonDocument::fromJson(snapshot.json).object();
  const bool loaded = s.value("loaded").toBool();
  SetAdminButtonEnabled(m_clear, loaded);
  if (!loaded) {
    m_summary->setText(tr("No shadow model is loaded: %1").arg(s.value("reason").toString().toHtmlEscaped()));
    m_sessions->setRowCount(0);
    m_answers->setRowCount(0);
    return;
  }
  m_residentBytes = N(s, "resident_bytes");
  m_diskBytes = N(s, "disk_bytes");
  const QJsonObject agreement = s.value("agreement").toObject();
  const qint64 compared = N(agreement, "compared"), agreed = N(agreement, "agreed");
  QString text = tr("<b>%1</b> on %2 (grid %3)<br>")
                     .arg(s.value("enabled").toBool() ? tr("Reading") : tr("Paused"), s.value("model").toString().toHtmlEscaped())
                     .arg(N(s, "grid_tokens"));
  text += tr("Resident %1 of its %2 budget; %3 on disk in %4 files.<br>")
              .arg(fmt::bytes(N(s, "resident_bytes")), fmt::bytes(N(s, "budget_bytes")), fmt::bytes(N(s, "disk_bytes")))
              .arg(N(s, "disk_files"));
  text += tr("Read %1 tokens in %2 chunks (%3 ms per 1,000 tokens); %4 rollbacks re-read %5 tokens; %6 evictions, %7 disk loads.<br>")
              .arg(N(s, "tokens_read"))
              .arg(N(s, "chunks_read"))
              .arg(s.value("ms_per_1000_tokens").toDouble(), 0, 'f', 1)
              .arg(N(s, "rollbacks"))
              .arg(N(s, "reread_tokens"))
              .arg(N(s, "evictions"))
              .arg(N(s, "disk_loads"));
  text += compared > 0 ? tr("Agreement: %1 of %2 turns (%3%) on “%4”.").arg(agreed).arg(compared).arg(100.0 * agreed / compared, 0, 'f', 0).arg(agreement.value("question").toString().toHtmlEscaped())
                       : tr("Agreement: no turn compared yet (asked at turns of at least the shortest prompt set below).");
  if (!s.value("last_error").isNull()) text += tr("<br><span style='color:#b00020'>Last error: %1</span>").arg(s.value("last_error").toString().toHtmlEscaped());
  m_summary->setText(text);

  const QJsonArray sessions = s.value("sessions").toArray();
  m_sessions->setRowCount(static_cast<int>(sessions.size()));
  for (int i = 0; i < sessions.size(); ++i) {
    const QJsonObject e = sessions[i].toObject();
    QStringList checkpoints;
    for (const QJsonValue& c : e.value("checkpoints").toArray()) checkpoints << QString::number(static_cast<qint64>(c.toDouble()));
    m_sessions->setItem(i, 0, tableCell(SessionName(e.value("session"))));
    m_sessions->setItem(i, 1, tableCell(QString::number(N(e, "read_tokens")), true));
    m_sessions->setItem(i, 2, tableCell(QString::number(N(e, "backlog_tokens")), true));
    m_sessions->setItem(i, 3, tableCell(fmt::bytes(N(e, "bytes")), true));
    m_sessions->setItem(i, 4, tableCell(checkpoints.join(", ")));
    m_sessions->setItem(i, 5, tableCell(e.value("on_disk").toBool() ? tr("disk") : tr("memory")));
    m_sessions->setItem(i, 6, tableCell(fmt::timeOfDay(N(e, "last_used_ms"))));
  }

  const QJsonArray answers = s.value("last_answers").toArray();
  m_answers->setRowCount(static_cast<int>(answers.size()));
  for (int i = 0; i < answers.size(); ++i) {
    const QJsonObject a = answers[i].toObject();
    const QJsonValue agree = a.value("agree");
    m_answers->setItem(i, 0, tableCell(fmt::timeOfDay(N(a, "time_ms"))));
    m_answers->setItem(i, 1, tableCell(SessionName(a.value("session"))));
    m_answers->setItem(i, 2, tableCell(QString::number(N(a, "insertion_tokens")), true));
    m_answers->setItem(i, 3, tableCell(AnswerText(a.value("shadow"))));
    m_answers->setItem(i, 4, tableCell(AnswerText(a.value("main"))));
    m_answers->setItem(i, 5, tableCell(agree.isBool() ? (agree.toBool() ? tr("yes") : tr("no")) : tr("—")));
    m_answers->setItem(i, 6, tableCell(QString::number(N(a, "behind_tokens")), true));
    m_answers->setItem(i, 7, tableCell(tr("%1 ms").arg(a.value("lag_ms").toDouble(), 0, 'f', 0), true));
    m_answers->setItem(i, 8, tableCell(a.value("note").toString()));
  }

  if (compared > 0 && compared != m_lastCompared) {
    const double minutes = static_cast<double>(snapshot.timeMs - m_startMs) / 60000.0;
    m_points.append(QPointF(minutes, 100.0 * static_cast<double>(agreed) / static_cast<double>(compared)));
    m_series->replace(m_points);
    m_chartBox->setTitle(tr("Agreement with the main model"));
    if (auto* x = qobject_cast<QValueAxis*>(m_chart->axes(Qt::Horizontal).value(0))) {
      const ChartScale scale = RoundScale(0, std::max(10.0, minutes * 1.05), 5);
      x->setRange(scale.min, scale.max);
      x->setTickInterval(scale.step);
      x->setLabelFormat(scale.labelFormat());
    }
  }
  m_lastCompared = compared;
}

