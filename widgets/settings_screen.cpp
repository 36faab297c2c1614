#include "widgets/settings_screen.h"

#include <QCheckBox>
#include <QComboBox>
#include <QDoubleSpinBox>
#include <QGridLayout>
#include <QJsonArray>
#include <QLabel>
#include <QLineEdit>
#include <QScrollArea>
#include <QVBoxLayout>

#include <algorithm>

#include "models/settings_model.h"
#include "models/settings_words.h"
#include "widgets/settings_panel.h"

SettingsScreen::SettingsScreen(SettingsModel* settings, QWidget* parent) : QWidget(parent), m_settings(settings) {
  auto* intro = new QLabel(tr("Every knob of the settings document, as its schema describes it (docs/operations.md). Each group's Apply "
                              "stores the whole document as the next version; the engine applies it from the next request."),
                           this);
  intro->setWordWrap(true);
  auto* inner = new QWidget;
  m_grid = new QGridLayout(inner);
  auto* scroll = new QScrollArea(this);
  scroll->setWidgetResizable(true);
  scroll->setWidget(inner);
  auto* layout = new QVBoxLayout(this);
  layout->addWidget(intro);
  layout->addWidget(scroll, 1);
  connect(m_settings, &QAbstractItemModel::modelReset, this, &SettingsScreen::build);
  build();
}

void SettingsScreen::build() {
  if (!m_panels.isEmpty() || m_settings->rowCount() == 0) return;
  QStringList order;  // areas in the schema's order, then grouped by the screen they belong to
  for (int row = 0; row < m_settings->rowCount(); ++row) {
    const QModelIndex index = m_settings->index(row, 0);
    const QString key = index.data(SettingsModel::KeyRole).toString();
    const QString area = key.section('.', 0, 0);
    SettingsPanel* panel = m_panels.value(area);
    if (panel == nullptr) {
      const QString when = area == "engine" ? tr("the engine uses it from its next start") : tr("the engine uses it from the next request");
      panel = new SettingsPanel(m_settings, "apply_" + area, "message_" + area, when, this);
      panel->setTitle(SettingsAreaTitle(area));
      m_panels[area] = panel;
      order << area;
    }
    const QJsonObject field = m_settings->field(key);
    const QString type = field["type"].toString(), description = field["description"].toString();
    const SettingWords words = WordsForSetting(key);
    QWidget* editor = nullptr;
    if (type == "integer" || type == "number") {
      editor = panel->addNumber(key, words.label, words.unit, type == "integer" ? 0 : std::max(words.decimals, 2));
    } else if (type == "enum") {
      QStringList values;
      for (const QJsonValue& v : field["values"].toArray()) values << v.toString();
      editor = panel->addChoice(key, words.label, values);
    } else if (type == "boolean") {
      editor = panel->addSwitch(key, words.label, tr("on"));
    } else {
      editor = panel->addText(key, words.label, description);
    }
    editor->setToolTip(tr("%1 (%2)").arg(description, key));  // the document's key, for the API and the file
  }
  std::stable_sort(order.begin(), order.end(), [](const QString& a, const QString& b) { return SettingsAreaRank(a) < SettingsAreaRank(b); });
  for (int i = 0; i < order.size(); ++i) {
    SettingsPanel* panel = m_panels[order[i]];
    panel->finish();
    connect(panel, &SettingsPanel::settingsReplaceRequested, this, &SettingsScreen::settingsReplaceRequested);
    m_grid->addWidget(panel, i / 2, i % 2);
  }
}

void SettingsScreen::onSettingsOutcome(const SettingsOutcome& outcome) {
  for (SettingsPanel* panel : m_panels) panel->onSettingsOutcome(outcome);
}
