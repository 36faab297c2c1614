// CPU detection by cpuid and XCR0 agrees with what the kernel reports in /proc/cpuinfo.
#include <QtTest>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "engine/compute/cpu/cpu_features.h"

class TestCpuFeatures : public QObject {
  Q_OBJECT

 private slots:
  void agreesWithProcCpuinfo() {
    std::ifstream in("/proc/cpuinfo");
    if (!in) QSKIP("no /proc/cpuinfo on this system");
    std::set<std::string> flags;
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("flags", 0) != 0) continue;
      std::istringstream words(line.substr(line.find(':') + 1));
      for (std::string w; words >> w;) flags.insert(w);
      break;
    }
    QVERIFY2(!flags.empty(), "no flags line in /proc/cpuinfo");
    const anchorage::cpu::CpuFeatures& f = anchorage::cpu::DetectCpu();
    qInfo("cpu: %s (%s, family %d model %d); kernel families: %s", f.brand.c_str(), f.vendor.c_str(), f.family, f.model,
          anchorage::cpu::DescribeKernelFamilies(f).c_str());
    QCOMPARE(f.avx2, flags.count("avx2") == 1);
    QCOMPARE(f.fma, flags.count("fma") == 1);
    QCOMPARE(f.f16c, flags.count("f16c") == 1);
    QCOMPARE(f.avx512f, flags.count("avx512f") == 1);
    QCOMPARE(f.avx512bw, flags.count("avx512bw") == 1);
    QCOMPARE(f.avx512vl, flags.count("avx512vl") == 1);
    QCOMPARE(f.avx512_bf16, flags.count("avx512_bf16") == 1);
    QCOMPARE(f.avx512_vnni, flags.count("avx512_vnni") == 1);
    QCOMPARE(f.amx_tile, flags.count("amx_tile") == 1);
    QCOMPARE(f.amx_bf16, flags.count("amx_bf16") == 1);
    QVERIFY(!f.vendor.empty());
    QVERIFY(anchorage::cpu::DescribeKernelFamilies(f).find("portable") != std::string::npos);
    if (!f.amx_tile) QVERIFY(!f.amx_permitted);
  }
};

QTEST_APPLESS_MAIN(TestCpuFeatures)
#include "test_cpu_features.moc"
