#include "widgets/placeholder_screen.h"

#include <QLabel>
#include <QVBoxLayout>

PlaceholderScreen::PlaceholderScreen(const QString& title, const QString& text, QWidget* parent) : QWidget(parent) {
  auto* heading = new QLabel("<h2>" + title + "</h2>", this);
  auto* body = new QLabel(text, this);
  body->setObjectName("placeholderText");
  body->setWordWrap(true);
  auto* layout = new QVBoxLayout(this);
  layout->addWidget(heading);
  layout->addWidget(body);
  layout->addStretch();
}

PlaceholderScreen* PlaceholderScreen::shadow(QWidget* parent) {
  return new PlaceholderScreen(tr("Shadow reader"),
                               tr("The shadow reader (a second, small engine that keeps each session's exact state and answers "
                             "questions about it) is not built yet. No session is shadowed and there is nothing to clear "
                             "here. Its knobs already live in the settings document under <code>shadow</code> "
                             "(enabled is false) and take effect once the reader exists."),
                               parent);
}
