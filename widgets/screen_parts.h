// Parts the screens share: read-only tables and their cells, and the status box (a summary and a clear button).
#pragma once

#include <QString>
#include <QStringList>

class QGroupBox;
class QLabel;
class QPushButton;
class QTableWidget;
class QTableWidgetItem;
class QWidget;

QTableWidget* makeTable(const QStringList& headers, const QString& objectName, QWidget* parent);
// A cell's item; numbers align right.
QTableWidgetItem* tableCell(const QString& text, bool number = false);

// Buttons whose routes need the admin token (clears, settings edits): enabled only where the
// console's credentials pass them, else disabled with the reason as their tooltip.
void SetAdminButtonEnabled(QPushButton* button, bool enabled);
// Every admin button under root: disabled with why (non-empty), or back to what its screen asked.
void SetAdminRefusal(QWidget* root, const QString& why);

// A box titled title with a selectable rich-text summary (named summaryName, "Waiting for the
// engine…" until the first snapshot) and the clear button right below it.
QGroupBox* makeSummaryBox(const QString& title, const QString& summaryName, QLabel** summary, QPushButton* clear, QWidget* parent);
