// The Debian package: CPack builds it from this tree; its contents, its dependencies, and its
// binaries run from an unpacked root.
#include <QDir>
#include <QImage>
#include <QProcess>
#include <QTemporaryDir>
#include <QtTest>

namespace {

struct Run {
  int code = -1;
  QByteArray out;
};

Run Exec(const QString& program, const QStringList& args, const QString& cwd = QString(), int timeout_ms = 300000) {
  QProcess p;
  p.setProcessChannelMode(QProcess::MergedChannels);
  if (!cwd.isEmpty()) p.setWorkingDirectory(cwd);
  p.start(program, args);
  Run r;
  if (!p.waitForStarted(10000) || !p.waitForFinished(timeout_ms)) return r;
  r.code = p.exitStatus() == QProcess::NormalExit ? p.exitCode() : -1;
  r.out = p.readAll();
  return r;
}

}  // namespace

class TestPackage : public QObject {
  Q_OBJECT

 private:
  QTemporaryDir out_;
  QString deb_;

 private slots:
  void initTestCase() {
    QVERIFY(out_.isValid());
    const Run cpack = Exec("cpack", {"-G", "DEB", "--config", QString(ANCHORAGE_BINARY_DIR) + "/CPackConfig.cmake", "-B", out_.path()});
    QVERIFY2(cpack.code == 0, cpack.out.constData());
    const QStringList debs = QDir(out_.path()).entryList({"anchorage_*_amd64.deb"}, QDir::Files);
    QVERIFY2(debs.size() == 1, cpack.out.constData());
    deb_ = out_.filePath(debs[0]);
    QVERIFY2(debs[0].startsWith("anchorage_0."), qPrintable(debs[0]));
  }

  void contents() {
    const Run list = Exec("dpkg-deb", {"-c", deb_});
    QCOMPARE(list.code, 0);
    for (const char* path : {"./usr/bin/anchorage", "./usr/bin/anchorage-server", "./usr/bin/anchorage-tool",
                             "./usr/share/applications/anchorage.desktop", "./usr/share/icons/hicolor/scalable/apps/anchorage.svg",
                             "./usr/share/icons/hicolor/48x48/apps/anchorage.png", "./usr/share/icons/hicolor/256x256/apps/anchorage.png",
                             "./usr/lib/systemd/user/anchorage-server.service", "./usr/share/doc/anchorage/README.md",
                             "./usr/share/doc/anchorage/api.md"})
      QVERIFY2(list.out.contains(QByteArray(path) + "\n"), path);
    QVERIFY2(!list.out.contains("test_"), "test executables are not packaged");
    const Run fields = Exec("dpkg-deb", {"-f", deb_, "Package", "Version", "Architecture", "Depends"});
    QCOMPARE(fields.code, 0);
    QVERIFY2(fields.out.contains("Package: anchorage"), fields.out.constData());
    QVERIFY2(fields.out.contains("Architecture: amd64"), fields.out.constData());
    for (const char* dep : {"libqt6widgets6", "libqt6charts6", "libsqlite3", "libstdc++6"})  // computed from the binaries
      QVERIFY2(fields.out.contains(dep), (QByteArray(dep) + " missing from " + fields.out).constData());
    QVERIFY2(!fields.out.contains("libopenblas"), fields.out.constData());  // the kernels are our own
  }

  void unpackedBinariesRun() {
    QTemporaryDir root;
    QCOMPARE(Exec("dpkg", {"-x", deb_, root.path()}).code, 0);
    const QString bin = root.filePath("usr/bin");
    const Run server = Exec(bin + "/anchorage-server", {"--help"});
    QCOMPARE(server.code, 0);
    QVERIFY2(server.out.contains("usage: anchorage-server"), server.out.constData());
    const Run console = Exec(bin + "/anchorage", {"--help"});
    QCOMPARE(console.code, 0);
    QVERIFY2(console.out.contains("usage:"), console.out.constData());
    const Run tool = Exec(bin + "/anchorage-tool", {});
    QCOMPARE(tool.code, 2);
    QImage icon(root.filePath("usr/share/icons/hicolor/256x256/apps/anchorage.png"));
    QCOMPARE(icon.size(), QSize(256, 256));
    QVERIFY(icon.pixelColor(128, 128).alpha() == 255);
    QFile desktop(root.filePath("usr/share/applications/anchorage.desktop"));
    QVERIFY(desktop.open(QIODevice::ReadOnly));
    const QByteArray entry = desktop.readAll();
    QVERIFY(entry.contains("Exec=anchorage\n") && entry.contains("Icon=anchorage\n"));
    QFile unit(root.filePath("usr/lib/systemd/user/anchorage-server.service"));
    QVERIFY(unit.open(QIODevice::ReadOnly));
    QVERIFY(unit.readAll().contains("ExecStart=/usr/bin/anchorage-server --config %E/anchorage/server.json"));
  }
};

QTEST_GUILESS_MAIN(TestPackage)
#include "test_package.moc"
