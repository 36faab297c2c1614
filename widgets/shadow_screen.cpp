#include "widgets/shadow_screen.h"

#include <QLabel>
#include <QVBoxLayout>

ShadowScreen::ShadowScreen(QWidget* parent) : QWidget(parent) {
  auto* title = new QLabel(tr("<h2>Shadow reader</h2>"), this);
  auto* text = new QLabel(tr("The shadow reader (a second, small engine that keeps each session's exact state and answers "
                             "questions about it) is not built yet. No session is shadowed and there is nothing to clear "
                             "here. Its knobs already live in the settings document under <code>shadow</code> "
                             "(enabled is false) and take effect once the reader exists."),
                          this);
  text->setObjectName("placeholderText");
  text->setWordWrap(true);
  auto* layout = new QVBoxLayout(this);
  layout->addWidget(title);
  layout->addWidget(text);
  layout->addStretch();
}
