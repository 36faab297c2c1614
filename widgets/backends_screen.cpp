#include "widgets/backends_screen.h"

#include <QDateTime>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QLabel>
#include <QTableWidget>
#include <QVBoxLayout>

#include "widgets/screen_parts.h"

BackendsScreen::BackendsScreen(QWidget* parent) : QWidget(parent) {
  m_summary = new QLabel(tr("Waiting for the engine…"), this);
  m_summary->setObjectName("backendsSummary");
  m_summary->setWordWrap(true);
  m_summary->setTextInteractionFlags(Qt::TextSelectableByMouse);
  m_table = makeTable({tr("Backend"), tr("URL"), tr("State"), tr("Down since"), tr("Models"), tr("Requests"), tr("Errors"), tr("Mean TTFT"),
                       tr("Last error")},
                      "backendTable", this);
  auto* layout = new QVBoxLayout(this);
  layout->addWidget(m_summary);
  layout->addWidget(m_table, 1);
}

QString BackendsScreen::summaryText() const { return m_summary->text(); }

void BackendsScreen::setSnapshot(const BackendsSnapshot& snapshot) {
  const QJsonArray backends = QJsonDocument::fromJson(snapshot.json).array();
  int up = 0;
  m_table->setRowCount(static_cast<int>(backends.size()));
  for (int row = 0; row < backends.size(); ++row) {
    const QJsonObject b = backends[row].toObject();
    up += b["state"].toString() == "up";
    QStringList models;
    for (const QJsonValue& m : b["models"].toArray()) models << m.toString();
    const qint64 since = static_cast<qint64>(b["down_since_ms"].toDouble());
    const QString cells[] = {b["name"].toString(),
                             b["url"].toString(),
                             b["state"].toString(),
                             since > 0 ? QDateTime::fromMSecsSinceEpoch(since).toString("yyyy-MM-dd hh:mm:ss") : QString(),
                             models.join(", "),
                             QString::number(b["requests"].toInteger()),
                             QString::number(b["errors"].toInteger()),
                             b["mean_ttft_ms"].toDouble() > 0 ? tr("%1 ms").arg(b["mean_ttft_ms"].toDouble(), 0, 'f', 1) : QString(),
                             b["last_error"].toString()};
    for (int col = 0; col < 9; ++col) m_table->setItem(row, col, tableCell(cells[col], col >= 5 && col <= 7));
  }
  m_summary->setText(backends.isEmpty()
                         ? tr("No backends. Start with --backend NAME=URL[,key=ENVVAR] to serve models that live on vLLM, SGLang or "
                              "another anchorage-server behind this endpoint (docs/operations.md, \"Backends\").")
                         : tr("%1 of %2 backends up; their models are in the Chat tab's model list, and the Journal's tier filter "
                              "takes a backend's name.")
                               .arg(up)
                               .arg(backends.size()));
}
