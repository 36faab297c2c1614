// DiskCacheScreen: the NVMe tier's screen; the tier is not built yet and says so.
#pragma once

#include <QWidget>

class DiskCacheScreen : public QWidget {
  Q_OBJECT

 public:
  explicit DiskCacheScreen(QWidget* parent = nullptr);
};
