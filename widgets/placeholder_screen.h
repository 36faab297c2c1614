// PlaceholderScreen: the screen of a tier that is not built yet, saying so plainly.
#pragma once

#include <QWidget>

class PlaceholderScreen : public QWidget {
  Q_OBJECT

 public:
  PlaceholderScreen(const QString& title, const QString& text, QWidget* parent = nullptr);

  // The screens of tiers not built yet.
  static PlaceholderScreen* shadow(QWidget* parent);
};
