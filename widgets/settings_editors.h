// What the screens that edit settings share: spin boxes filled from the settings model, and the
// one-line message under their buttons.
#pragma once

#include <QMap>
#include <QString>
#include <QVariantMap>

class QDoubleSpinBox;
class QLabel;
class QWidget;
class SettingsModel;

// Sets each "area.field" editor's range, value and tooltip from the stored document, without signals.
void loadEditors(const QMap<QString, QDoubleSpinBox*>& editors, const SettingsModel& settings);
// Puts each editor's value into values, as an integer where the schema says so.
void addEditorValues(const QMap<QString, QDoubleSpinBox*>& editors, const SettingsModel& settings, QVariantMap* values);
// Keeps an editor at least as tall as its size hint, so no layout squeezes its text (descenders clipped).
void keepFullHeight(QWidget* editor);
// Shows text under the buttons, red when it is an error.
void showMessage(QLabel* label, const QString& text, bool error);
