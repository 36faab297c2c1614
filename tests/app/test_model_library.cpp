// The model library: a folder's weights size, dtype and model type read from config.json and its
// *.safetensors files; the dialog lists each folder (a missing one says so and cannot be opened),
// opens the selected one and forgets one.
#include <QFile>
#include <QPushButton>
#include <QSignalSpy>
#include <QTableWidget>
#include <QTemporaryDir>
#include <QtTest>

#include "models/model_folder_info.h"
#include "widgets/model_library.h"

namespace {

bool WriteFile(const QString& path, const QByteArray& bytes) {
  QFile f(path);
  return f.open(QIODevice::WriteOnly) && f.write(bytes) == bytes.size();
}

}  // namespace

class TestModelLibrary : public QObject {
  Q_OBJECT

 private slots:
  void foldersAreDescribedOpenedAndForgotten() {
    QTemporaryDir dir;
    QVERIFY(dir.isValid());
    const QString bf16 = dir.filePath("bf16"), fp8 = dir.filePath("fp8"), gone = dir.filePath("gone");
    QVERIFY(QDir().mkpath(bf16) && QDir().mkpath(fp8));
    QVERIFY(WriteFile(bf16 + "/config.json", R"({"model_type": "qwen3_5", "dtype": "bfloat16"})"));
    QVERIFY(WriteFile(bf16 + "/model-00001.safetensors", QByteArray(1000, 'x')));
    QVERIFY(WriteFile(bf16 + "/model-00002.safetensors", QByteArray(24, 'x')));
    QVERIFY(WriteFile(bf16 + "/notes.txt", QByteArray(5000, 'x')));  // not weights
    QVERIFY(WriteFile(fp8 + "/config.json", R"({"text_config": {"model_type": "qwen3_5_text", "torch_dtype": "bfloat16",
                                                 "quantization_config": {"quant_method": "fp8"}}})"));
    const ModelFolderInfo a = DescribeModelFolder(bf16);
    QVERIFY(a.exists);
    QCOMPARE(a.weightBytes, qint64(1024));
    QCOMPARE(a.dtype, QString("bfloat16"));
    QCOMPARE(a.modelType, QString("qwen3_5"));
    const ModelFolderInfo b = DescribeModelFolder(fp8);
    QCOMPARE(b.dtype, QString("fp8"));
    QCOMPARE(b.modelType, QString("qwen3_5_text"));
    QVERIFY(!DescribeModelFolder(gone).exists);

    ModelLibraryDialog library({bf16, gone, fp8}, {{bf16, "0123456789abcdef0123"}}, nullptr);
    QTableWidget* table = library.table();
    QCOMPARE(table->rowCount(), 3);
    QCOMPARE(table->item(0, 1)->text(), QString("1.00 KiB"));
    QCOMPARE(table->item(0, 2)->text(), QString("bfloat16"));
    QCOMPARE(table->item(0, 4)->text(), QString("0123456789ab"));
    QCOMPARE(table->item(0, 4)->toolTip(), QString("0123456789abcdef0123"));
    QCOMPARE(table->item(1, 1)->text(), QString("missing"));
    QCOMPARE(table->item(2, 4)->text(), QString("not loaded here yet"));
    auto* open = library.findChild<QPushButton*>("openModelButton");
    QSignalSpy opened(&library, &ModelLibraryDialog::openRequested);
    table->selectRow(1);
    QVERIFY(!open->isEnabled());  // a missing folder cannot be opened
    table->selectRow(2);
    QVERIFY(open->isEnabled());
    open->click();
    QCOMPARE(opened.count(), 1);
    QCOMPARE(opened[0][0].toString(), fp8);
    QSignalSpy forgotten(&library, &ModelLibraryDialog::forgetRequested);
    table->selectRow(1);
    library.findChild<QPushButton*>("forgetModelButton")->click();
    QCOMPARE(forgotten.count(), 1);
    QCOMPARE(forgotten[0][0].toString(), gone);
    QCOMPARE(table->rowCount(), 2);
  }
};

QTEST_MAIN(TestModelLibrary)
#include "test_model_library.moc"
