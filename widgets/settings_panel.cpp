#include "widgets/settings_panel.h"

#include <QCheckBox>
#include <QComboBox>
#include <QDoubleSpinBox>
#include <QFormLayout>
#include <QHBoxLayout>
#include <QLabel>
#include <QLineEdit>
#include <QPushButton>
#include <QSignalBlocker>
#include <QVBoxLayout>

#include <cmath>

#include "models/settings_model.h"
#include "models/settings_words.h"
#include "widgets/screen_parts.h"
#include "widgets/settings_editors.h"

namespace {
QString ObjectName(const QString& key) { return QString(key).replace('.', '_'); }
}  // namespace

SettingsPanel::SettingsPanel(SettingsModel* settings, const QString& applyName, const QString& messageName, const QString& appliedText, QWidget* parent)
    : QGroupBox(tr("Settings"), parent), m_settings(settings), m_appliedText(appliedText), m_form(new QFormLayout) {
  m_apply = new QPushButton(tr("Apply"), this);
  m_apply->setObjectName(applyName);
  m_revert = new QPushButton(tr("Revert"), this);
  m_reapply = new QPushButton(tr("Reapply on the new version"), this);
  m_reapply->setObjectName(applyName + "_reapply");
  m_reapply->setToolTip(tr("The settings changed elsewhere since this edit began: apply the same edit on top of the stored version"));
  m_reapply->hide();
  m_message = new QLabel(this);
  m_message->setObjectName(messageName);
  m_message->setWordWrap(true);
  connect(m_apply, &QPushButton::clicked, this, &SettingsPanel::apply);
  connect(m_reapply, &QPushButton::clicked, this, &SettingsPanel::apply);
  connect(m_revert, &QPushButton::clicked, this, [this] {
    m_dirty = false;
    m_reapply->hide();
    load();
    setMessage({}, false);
  });
}

QDoubleSpinBox* SettingsPanel::addNumber(const QString& key, const QString& label, const QString& suffix, int decimals) {
  auto* spin = new QDoubleSpinBox(this);
  spin->setObjectName(ObjectName(key));
  spin->setDecimals(decimals);
  spin->setSuffix(suffix);
  spin->setMinimumWidth(140);
  keepFullHeight(spin);
  connect(spin, &QDoubleSpinBox::valueChanged, this, &SettingsPanel::markDirty);
  m_numbers[key] = spin;
  m_form->addRow(label, spin);
  return spin;
}

void SettingsPanel::addNumbers(std::initializer_list<const char*> keys) {
  for (const char* key : keys) {
    const SettingWords w = WordsForSetting(key);
    addNumber(key, w.label, w.unit, w.decimals);
  }
}

QComboBox* SettingsPanel::addChoice(const QString& key, const QString& label, const QStringList& values) {
  auto* box = new QComboBox(this);
  box->setObjectName(ObjectName(key));
  box->addItems(values);
  keepFullHeight(box);
  connect(box, &QComboBox::currentIndexChanged, this, &SettingsPanel::markDirty);
  m_choices[key] = box;
  m_form->addRow(label, box);
  return box;
}

QCheckBox* SettingsPanel::addSwitch(const QString& key, const QString& label, const QString& text) {
  auto* box = new QCheckBox(text, this);
  box->setObjectName(ObjectName(key));
  connect(box, &QCheckBox::toggled, this, &SettingsPanel::markDirty);
  m_switches[key] = box;
  m_form->addRow(label, box);
  return box;
}

QLineEdit* SettingsPanel::addText(const QString& key, const QString& label, const QString& tooltip) {
  auto* edit = new QLineEdit(this);
  edit->setObjectName(ObjectName(key));
  if (!tooltip.isEmpty()) edit->setToolTip(tooltip);
  keepFullHeight(edit);
  connect(edit, &QLineEdit::textEdited, this, &SettingsPanel::markDirty);
  m_texts[key] = edit;
  m_form->addRow(label, edit);
  return edit;
}

void SettingsPanel::finish() {
  auto* buttons = new QHBoxLayout;
  buttons->addStretch();
  buttons->addWidget(m_reapply);
  buttons->addWidget(m_revert);
  buttons->addWidget(m_apply);
  auto* layout = new QVBoxLayout(this);
  layout->addLayout(m_form);
  layout->addLayout(buttons);
  layout->addWidget(m_message);
  layout->addStretch();
  connect(m_settings, &QAbstractItemModel::modelReset, this, &SettingsPanel::load);
  connect(m_settings, &QAbstractItemModel::dataChanged, this, &SettingsPanel::load);
  load();
}

void SettingsPanel::markChanged() {
  auto mark = [&](QWidget* editor, bool changed) {
    auto* label = qobject_cast<QLabel*>(m_form->labelForField(editor));
    if (label == nullptr) return;
    QString text = label->text();
    if (text.endsWith(" •")) text.chop(2);
    label->setText(changed ? text + " •" : text);
    QFont font = label->font();
    font.setBold(changed);
    label->setFont(font);
    label->setToolTip(changed ? tr("Changed here, not applied yet") : QString());
  };
  for (auto it = m_numbers.begin(); it != m_numbers.end(); ++it)
    mark(it.value(), m_dirty && std::abs(it.value()->value() - m_settings->value(it.key()).toDouble()) > 0.5 * std::pow(10.0, -it.value()->decimals()));
  for (auto it = m_choices.begin(); it != m_choices.end(); ++it) mark(it.value(), m_dirty && it.value()->currentText() != m_settings->value(it.key()).toString());
  for (auto it = m_switches.begin(); it != m_switches.end(); ++it) mark(it.value(), m_dirty && it.value()->isChecked() != m_settings->value(it.key()).toBool());
  for (auto it = m_texts.begin(); it != m_texts.end(); ++it) mark(it.value(), m_dirty && it.value()->text() != m_settings->value(it.key()).toString());
}

void SettingsPanel::markDirty() {
  m_dirty = true;
  markChanged();
  SetAdminButtonEnabled(m_apply, true);
  m_revert->setEnabled(true);
}

void SettingsPanel::load() {
  if (m_dirty) return;  // keep the operator's edit
  const bool loaded = m_settings->version() > 0;
  for (auto it = m_choices.begin(); it != m_choices.end(); ++it) {
    QSignalBlocker block(it.value());
    it.value()->setCurrentText(m_settings->value(it.key()).toString());
    it.value()->setEnabled(loaded);
  }
  for (auto it = m_switches.begin(); it != m_switches.end(); ++it) {
    QSignalBlocker block(it.value());
    it.value()->setChecked(m_settings->value(it.key()).toBool());
    it.value()->setEnabled(loaded);
  }
  for (auto it = m_texts.begin(); it != m_texts.end(); ++it) {
    it.value()->setText(m_settings->value(it.key()).toString());
    it.value()->setToolTip(tr("%1 (%2)").arg(m_settings->field(it.key())["description"].toString(), it.key()));
    it.value()->setEnabled(loaded);
  }
  loadEditors(m_numbers, *m_settings);
  SetAdminButtonEnabled(m_apply, false);
  markChanged();
  m_revert->setEnabled(false);
}

void SettingsPanel::apply() {
  QVariantMap values;
  for (auto it = m_choices.begin(); it != m_choices.end(); ++it) values[it.key()] = it.value()->currentText();
  for (auto it = m_switches.begin(); it != m_switches.end(); ++it) values[it.key()] = it.value()->isChecked();
  for (auto it = m_texts.begin(); it != m_texts.end(); ++it) values[it.key()] = it.value()->text();
  addEditorValues(m_numbers, *m_settings, &values);
  setMessage(tr("Applying as version %1…").arg(m_settings->version() + 1), false);
  emit settingsReplaceRequested(m_settings->documentWith(values));
}

void SettingsPanel::onSettingsOutcome(const SettingsOutcome& outcome) {
  if (!m_dirty) return;  // another screen's change
  m_reapply->setVisible(!outcome.ok && outcome.httpStatus == 409);
  if (outcome.ok) {
    m_dirty = false;
    load();
    setMessage(tr("Applied: settings version %1; %2.").arg(outcome.version).arg(m_appliedText), false);
  } else {
    setMessage(outcome.httpStatus == 409 ? tr("Refused (HTTP 409): the settings changed elsewhere (now version %1). Your edit is kept: reapply it on the new version, or revert.")
                                               .arg(m_settings->version())
                                         : tr("Refused (HTTP %1): %2").arg(outcome.httpStatus).arg(outcome.message),
               true);
  }
}

void SettingsPanel::setMessage(const QString& text, bool error) { showMessage(m_message, text, error); }
