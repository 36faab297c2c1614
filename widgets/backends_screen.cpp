#include "widgets/backends_screen.h"

#include <QDateTime>
#include <QGroupBox>
#include <QHBoxLayout>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QLabel>
#include <QLineEdit>
#include <QPushButton>
#include <QTableWidget>
#include <QVBoxLayout>

#include <algorithm>

#include "models/settings_model.h"
#include "widgets/screen_parts.h"
#include "widgets/settings_editors.h"

BackendsScreen::BackendsScreen(SettingsModel* settings, QWidget* parent) : QWidget(parent), m_settings(settings) {
  m_summary = new QLabel(tr("Waiting for the engine…"), this);
  m_summary->setObjectName("backendsSummary");
  m_summary->setWordWrap(true);
  m_summary->setTextInteractionFlags(Qt::TextSelectableByMouse);
  m_table = makeTable({tr("Backend"), tr("URL"), tr("State"), tr("Down since"), tr("Models"), tr("Requests"), tr("Errors"), tr("Mean TTFT"),
                       tr("Last error")},
                      "backendTable", this);
  m_table->setSelectionMode(QAbstractItemView::SingleSelection);
  auto* editBox = new QGroupBox(tr("Add or remove (the settings document's backends.upstreams, applied at once)"), this);
  m_name = new QLineEdit(editBox);
  m_name->setObjectName("backendName");
  m_name->setPlaceholderText(tr("name (as clients ask for it)"));
  m_url = new QLineEdit(editBox);
  m_url->setObjectName("backendUrl");
  m_url->setPlaceholderText(tr("http://host:port"));
  m_keyEnv = new QLineEdit(editBox);
  m_keyEnv->setObjectName("backendKeyEnv");
  m_keyEnv->setPlaceholderText(tr("API key from env var (optional)"));
  m_add = new QPushButton(tr("Add"), editBox);
  m_add->setObjectName("addBackendButton");
  m_remove = new QPushButton(tr("Remove selected"), editBox);
  m_remove->setObjectName("removeBackendButton");
  m_message = new QLabel(editBox);
  m_message->setObjectName("backendsMessage");
  m_message->setWordWrap(true);
  auto* row = new QHBoxLayout;
  row->addWidget(m_name, 2);
  row->addWidget(m_url, 3);
  row->addWidget(m_keyEnv, 2);
  row->addWidget(m_add);
  row->addWidget(m_remove);
  auto* editLayout = new QVBoxLayout(editBox);
  editLayout->addLayout(row);
  editLayout->addWidget(m_message);
  auto* layout = new QVBoxLayout(this);
  layout->addWidget(m_summary);
  layout->addWidget(m_table, 1);
  layout->addWidget(editBox);
  connect(m_add, &QPushButton::clicked, this, &BackendsScreen::addBackend);
  connect(m_remove, &QPushButton::clicked, this, &BackendsScreen::removeBackend);
  connect(m_table, &QTableWidget::itemSelectionChanged, this, &BackendsScreen::updateButtons);
  connect(m_settings, &QAbstractItemModel::modelReset, this, &BackendsScreen::updateButtons);
  updateButtons();
}

QStringList BackendsScreen::documentSpecs() const {
  return m_settings->value("backends.upstreams").toString().split(' ', Qt::SkipEmptyParts);
}

void BackendsScreen::updateButtons() {
  const QList<QTableWidgetItem*> picked = m_table->selectedItems();
  const QString name = picked.isEmpty() ? QString() : m_table->item(picked.first()->row(), 0)->text();
  bool listed = false;
  for (const QString& spec : documentSpecs()) listed = listed || spec.section('=', 0, 0) == name;
  SetAdminButtonEnabled(m_add, m_settings->version() > 0 && !m_waiting);
  SetAdminButtonEnabled(m_remove, listed && !m_waiting);
  if (!name.isEmpty() && !listed) m_remove->setToolTip(tr("%1 was set by --backend at start: restart without it to remove it").arg(name));
}

void BackendsScreen::addBackend() {
  const QString name = m_name->text().trimmed(), url = m_url->text().trimmed(), key = m_keyEnv->text().trimmed();
  if (name.isEmpty() || url.isEmpty()) {
    showMessage(m_message, tr("A backend needs a name and a URL."), true);
    return;
  }
  QStringList specs = documentSpecs();
  specs << name + "=" + url + (key.isEmpty() ? QString() : ",key=" + key);
  replaceSpecs(specs, tr("Adding %1").arg(name));
}

void BackendsScreen::removeBackend() {
  const QList<QTableWidgetItem*> picked = m_table->selectedItems();
  if (picked.isEmpty()) return;
  const QString name = m_table->item(picked.first()->row(), 0)->text();
  QStringList specs = documentSpecs();
  specs.erase(std::remove_if(specs.begin(), specs.end(), [&](const QString& spec) { return spec.section('=', 0, 0) == name; }), specs.end());
  replaceSpecs(specs, tr("Removing %1").arg(name));
}

void BackendsScreen::replaceSpecs(const QStringList& specs, const QString& what) {
  m_waiting = true;
  updateButtons();
  showMessage(m_message, tr("%1: applying as settings version %2…").arg(what).arg(m_settings->version() + 1), false);
  emit settingsReplaceRequested(m_settings->documentWith({{"backends.upstreams", specs.join(' ')}}));
}

void BackendsScreen::onSettingsOutcome(const SettingsOutcome& outcome) {
  if (!m_waiting) return;  // another screen's change
  m_waiting = false;
  updateButtons();
  if (outcome.ok) {
    m_name->clear();
    m_url->clear();
    m_keyEnv->clear();
    showMessage(m_message, tr("Applied: settings version %1; the list above follows at the next poll.").arg(outcome.version), false);
  } else {
    showMessage(m_message, tr("Refused (HTTP %1): %2").arg(outcome.httpStatus).arg(outcome.message), true);
  }
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
                         ? tr("No backends. Add one below (or start with --backend NAME=URL[,key=ENVVAR]) to serve models that live on vLLM, "
                              "SGLang or another anchorage-server behind this endpoint (docs/operations.md, \"Backends\").")
                         : tr("%1 of %2 backends up; their models are in the Chat tab's model list, and the Journal's tier filter "
                              "takes a backend's name.")
                               .arg(up)
                               .arg(backends.size()));
}
