#include "widgets/disk_cache_screen.h"

#include <QLabel>
#include <QVBoxLayout>

DiskCacheScreen::DiskCacheScreen(QWidget* parent) : QWidget(parent) {
  auto* title = new QLabel(tr("<h2>Disk cache</h2>"), this);
  auto* text = new QLabel(tr("The disk tier (chunk files of K/V rows and anchor files on NVMe, admitted after repeated cold "
                             "reads) is not built yet. Nothing is written to disk and there is nothing to clear here. "
                             "Its knobs already live in the settings document under <code>disk_cache</code> "
                             "(mode off, read, readwrite) and take effect once the tier exists."),
                          this);
  text->setObjectName("placeholderText");
  text->setWordWrap(true);
  auto* layout = new QVBoxLayout(this);
  layout->addWidget(title);
  layout->addWidget(text);
  layout->addStretch();
}
