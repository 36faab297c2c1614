// anchorage-icons DIR: draws the application icon as PNGs (48, 128, 256 px) for the package.
#include <QDir>
#include <QImage>
#include <QPainter>
#include <QPainterPath>

#include <cstdio>

namespace {

// The same drawing as packaging/icons/anchorage.svg, on a 256-unit canvas.
QImage Draw(int size) {
  QImage image(size, size, QImage::Format_ARGB32_Premultiplied);
  image.fill(Qt::transparent);
  QPainter p(&image);
  p.setRenderHint(QPainter::Antialiasing);
  p.scale(size / 256.0, size / 256.0);
  p.setPen(Qt::NoPen);
  p.setBrush(QColor("#1f4e79"));
  p.drawRoundedRect(QRectF(8, 8, 240, 240), 48, 48);
  QPen pen(Qt::white, 16, Qt::SolidLine, Qt::RoundCap, Qt::RoundJoin);
  p.setPen(pen);
  p.setBrush(Qt::NoBrush);
  p.drawEllipse(QPointF(128, 56), 18, 18);
  p.drawLine(QPointF(128, 74), QPointF(128, 212));
  p.drawLine(QPointF(88, 104), QPointF(168, 104));
  QPainterPath arc(QPointF(56, 156));
  arc.quadTo(QPointF(64, 212), QPointF(128, 212));
  arc.quadTo(QPointF(192, 212), QPointF(200, 156));
  p.drawPath(arc);
  p.drawPolyline(QPolygonF({QPointF(44, 170), QPointF(56, 152), QPointF(72, 168)}));
  p.drawPolyline(QPolygonF({QPointF(184, 168), QPointF(200, 152), QPointF(212, 170)}));
  return image;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {  // raster painting on a QImage needs no application object

    std::fprintf(stderr, "usage: anchorage-icons DIR\n");
    return 2;
  }
  const QDir dir(QString::fromLocal8Bit(argv[1]));
  if (!QDir().mkpath(dir.path())) return 1;
  for (int size : {48, 128, 256})
    if (!Draw(size).save(dir.filePath(QString("anchorage-%1.png").arg(size)))) {
      std::fprintf(stderr, "anchorage-icons: cannot write %s\n", qPrintable(dir.filePath(QString("anchorage-%1.png").arg(size))));
      return 1;
    }
  return 0;
}
