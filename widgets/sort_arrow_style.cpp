#include "widgets/sort_arrow_style.h"

#include <QStyleOptionHeader>

void SortArrowStyle::drawPrimitive(PrimitiveElement element, const QStyleOption* option, QPainter* painter, const QWidget* widget) const {
  const auto* header = qstyleoption_cast<const QStyleOptionHeader*>(option);
  if (element != PE_IndicatorHeaderArrow || header == nullptr || header->sortIndicator == QStyleOptionHeader::None)
    return QProxyStyle::drawPrimitive(element, option, painter, widget);
  QStyleOptionHeader flipped(*header);  // QHeaderView asks SortDown for ascending and SortUp for descending
  flipped.sortIndicator = header->sortIndicator == QStyleOptionHeader::SortUp ? QStyleOptionHeader::SortDown : QStyleOptionHeader::SortUp;
  QProxyStyle::drawPrimitive(element, &flipped, painter, widget);
}
