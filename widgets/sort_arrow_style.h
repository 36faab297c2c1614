// The console's style: the platform's, with a header's sort arrow pointing the way its rows run (up for
// ascending, down for descending); Qt's header asks for the opposite arrow, which Fusion draws as asked.
#pragma once

#include <QProxyStyle>

class SortArrowStyle : public QProxyStyle {
 public:
  using QProxyStyle::QProxyStyle;
  void drawPrimitive(PrimitiveElement element, const QStyleOption* option, QPainter* painter, const QWidget* widget = nullptr) const override;
};
