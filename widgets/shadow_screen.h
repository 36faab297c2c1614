// ShadowScreen: the shadow reader's screen; the reader is not built yet and says so.
#pragma once

#include <QWidget>

class ShadowScreen : public QWidget {
  Q_OBJECT

 public:
  explicit ShadowScreen(QWidget* parent = nullptr);
};
