// SettingsPanel: a screen's settings box. Fields of the settings document (numbers, choices,
// switches, text) in a form, filled from the settings model unless the operator is editing; Apply
// sends the whole document as the next version, Revert drops the edit, and the line below says
// how it went.
#pragma once

#include <QGroupBox>
#include <QJsonObject>
#include <QMap>
#include <QStringList>

#include "app/snapshots.h"

class SettingsModel;
class QCheckBox;
class QComboBox;
class QDoubleSpinBox;
class QFormLayout;
class QLabel;
class QLineEdit;
class QPushButton;

// GUI thread only. Each field's object name is its key with '.' as '_' ("disk_cache.mode" -> "disk_cache_mode").
class SettingsPanel : public QGroupBox {
  Q_OBJECT

 public:
  // applyName and messageName name the Apply button and the message line; appliedText says where the
  // change takes effect ("the disk tier uses it from the next request").
  SettingsPanel(SettingsModel* settings, const QString& applyName, const QString& messageName, const QString& appliedText, QWidget* parent);

  QDoubleSpinBox* addNumber(const QString& key, const QString& label, const QString& suffix, int decimals);
  // Numbers labelled in the settings vocabulary (WordsForSetting).
  void addNumbers(std::initializer_list<const char*> keys);
  QComboBox* addChoice(const QString& key, const QString& label, const QStringList& values);
  QCheckBox* addSwitch(const QString& key, const QString& label, const QString& text);
  QLineEdit* addText(const QString& key, const QString& label, const QString& tooltip = {});
  // Call once every field is added.
  void finish();

  QDoubleSpinBox* number(const QString& key) const { return m_numbers.value(key); }
  QComboBox* choice(const QString& key) const { return m_choices.value(key); }
  // Shown after a 409: applies the same edit on top of the version that won.
  QPushButton* reapplyButton() const { return m_reapply; }
  void setMessage(const QString& text, bool error);

 signals:
  void settingsReplaceRequested(const QJsonObject& document);

 public slots:
  void load();
  void apply();
  void onSettingsOutcome(const SettingsOutcome& outcome);

 private:
  void markDirty();
  // A field's label says whether its editor holds a value not applied yet ("•" and bold).
  void markChanged();

  SettingsModel* m_settings;
  QString m_appliedText;
  QFormLayout* m_form;
  QMap<QString, QDoubleSpinBox*> m_numbers;
  QMap<QString, QComboBox*> m_choices;
  QMap<QString, QCheckBox*> m_switches;
  QMap<QString, QLineEdit*> m_texts;
  QPushButton* m_apply;
  QPushButton* m_revert;
  QPushButton* m_reapply;
  QLabel* m_message;
  bool m_dirty = false;
};
