// The console's style draws a header's sort arrow the way its rows run: down when the newest (largest)
// come first, up when the smallest do, where Qt's own header asks Fusion for the opposite.
#include <QHeaderView>
#include <QStandardItemModel>
#include <QStyleFactory>
#include <QTableView>
#include <QtTest>

#include "widgets/sort_arrow_style.h"

namespace {

// Where the arrow's mass sits in its own box, from 0 (top) to 1 (bottom): below 0.5 it is wide at the
// top, a down arrow. Only the arrow is dark: the header has no text.
double ArrowMassOf(QStyle* style, Qt::SortOrder order) {
  QStandardItemModel model(3, 1);
  model.setHorizontalHeaderLabels({QString()});
  for (int r = 0; r < 3; ++r) model.setItem(r, 0, new QStandardItem(QString::number(r)));
  QTableView view;
  view.setStyle(style);
  view.horizontalHeader()->setStyle(style);
  view.setModel(&model);
  view.setSortingEnabled(true);
  view.sortByColumn(0, order);
  view.resize(200, 120);
  view.show();
  const QImage image = view.horizontalHeader()->grab().toImage();
  int top = image.height(), bottom = -1;
  double sum = 0;
  int count = 0;
  for (int y = 0; y < image.height(); ++y)
    for (int x = 0; x < image.width(); ++x)
      if (qGray(image.pixel(x, y)) < 110) {
        top = std::min(top, y);
        bottom = std::max(bottom, y);
        sum += y;
        ++count;
      }
  if (count == 0 || bottom <= top) return -1;
  return (sum / count - top) / (bottom - top);
}

}  // namespace

class TestSortArrowStyle : public QObject {
  Q_OBJECT
 private slots:
  void arrowsPointTheWayTheRowsRun() {
    QScopedPointer<QStyle> fusion(QStyleFactory::create("Fusion")), console(new SortArrowStyle(QStyleFactory::create("Fusion")));
    const double plain_descending = ArrowMassOf(fusion.data(), Qt::DescendingOrder);
    const double descending = ArrowMassOf(console.data(), Qt::DescendingOrder);
    const double ascending = ArrowMassOf(console.data(), Qt::AscendingOrder);
    qInfo("arrow mass (0 top, 1 bottom): Fusion descending %.2f; console descending %.2f, ascending %.2f", plain_descending, descending, ascending);
    QVERIFY(plain_descending > 0.5);  // Fusion as Qt asks it: an up arrow over rows that run down
    QVERIFY(descending >= 0 && descending < 0.5);
    QVERIFY(ascending > 0.5);
  }
};

QTEST_MAIN(TestSortArrowStyle)
#include "test_sort_arrow_style.moc"
