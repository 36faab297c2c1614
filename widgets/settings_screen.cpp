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

#include "models/settings_model.h"
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
  QStringList order;  // areas in the schema's order
  for (int row = 0; row < m_settings->rowCount(); ++row) {
    const QModelIndex index = m_settings->index(row, 0);
    const QString key = index.data(SettingsModel::KeyRole).toString();
    const QString area = key.section('.', 0, 0), name = key.section('.', 1);
    SettingsPanel* panel = m_panels.value(area);
    if (panel == nullptr) {
      const QString when = area == "engine" ? tr("the engine uses it from its next start") : tr("the engine uses it from the next request");
      panel = new SettingsPanel(m_settings, "apply_" + area, "message_" + area, when, this);
      panel->setTitle(area);
      m_panels[area] = panel;
      order << area;
    }
    const QJsonObject field = m_settings->field(key);
    const QString type = field["type"].toString(), description = field["description"].toString();
    QWidget* editor = nullptr;
    if (type == "integer" || type == "number") {
      editor = panel->addNumber(key, name, {}, type == "integer" ? 0 : 3);
    } else if (type == "enum") {
      QStringList values;
      for (const QJsonValue& v : field["values"].toArray()) values << v.toString();
      editor = panel->addChoice(key, name, values);
    } else if (type == "boolean") {
      editor = panel->addSwitch(key, name, tr("on"));
    } else {
      editor = panel->addText(key, name, description);
    }
    editor->setToolTip(description);
  }
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
