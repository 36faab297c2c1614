// The confirmation a screen asks before it empties a cache tier; tests replace it.
#pragma once

#include <QString>
#include <functional>

class QWidget;

// Returns true when the operator accepts; the default asks with a QMessageBox.
using ConfirmFunction = std::function<bool(QWidget* parent, const QString& title, const QString& text)>;
bool askConfirmation(QWidget* parent, const QString& title, const QString& text);
