#include "engine/compute/cpu/cpu_features.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

namespace anchorage::cpu {

namespace {

constexpr long kArchReqXcompPerm = 0x1023;  // arch_prctl: ask for an extended state component
constexpr long kXfeatureXtileData = 18;     // AMX tile data

uint64_t ReadXcr0() {
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

CpuFeatures Detect() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return f;
  const unsigned max_leaf = a;
  char vendor[13] = {0};
  std::memcpy(vendor, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &c, 4);
  f.vendor = vendor;
  __get_cpuid(1, &a, &b, &c, &d);
  const unsigned base_family = (a >> 8) & 0xf, base_model = (a >> 4) & 0xf;
  f.family = static_cast<int>(base_family == 0xf ? base_family + ((a >> 20) & 0xff) : base_family);
  f.model = static_cast<int>(base_family == 0x6 || base_family == 0xf ? base_model + (((a >> 16) & 0xf) << 4) : base_model);
  const bool osxsave = (c >> 27) & 1;
  const bool fma = (c >> 12) & 1;
  const bool f16c = (c >> 29) & 1;
  const uint64_t xcr0 = osxsave ? ReadXcr0() : 0;
  const bool os_avx = (xcr0 & 0x6) == 0x6;             // SSE and AVX state
  const bool os_avx512 = os_avx && (xcr0 & 0xe0) == 0xe0;  // opmask, ZMM high halves, high ZMM
  const bool os_amx = (xcr0 & (3ull << 17)) == (3ull << 17);  // tile config and tile data
  if (max_leaf >= 7) {
    __get_cpuid_count(7, 0, &a, &b, &c, &d);
    f.avx2 = os_avx && ((b >> 5) & 1);
    f.fma = os_avx && fma;
    f.f16c = os_avx && f16c;
    f.avx512f = os_avx512 && ((b >> 16) & 1);
    f.avx512bw = os_avx512 && ((b >> 30) & 1);
    f.avx512vl = os_avx512 && ((b >> 31) & 1);
    f.avx512_vnni = os_avx512 && ((c >> 11) & 1);
    f.amx_bf16 = os_amx && ((d >> 22) & 1);
    f.amx_tile = os_amx && ((d >> 24) & 1);
    unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
    __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1);
    f.avx512_bf16 = os_avx512 && ((a1 >> 5) & 1);
  }
  char brand[49] = {0};
  __get_cpuid(0x80000000, &a, &b, &c, &d);
  if (a >= 0x80000004) {
    for (unsigned leaf = 0; leaf < 3; ++leaf) {
      __get_cpuid(0x80000002 + leaf, &a, &b, &c, &d);
      std::memcpy(brand + 16 * leaf, &a, 4);
      std::memcpy(brand + 16 * leaf + 4, &b, 4);
      std::memcpy(brand + 16 * leaf + 8, &c, 4);
      std::memcpy(brand + 16 * leaf + 12, &d, 4);
    }
  }
  f.brand = brand;
  while (!f.brand.empty() && f.brand.back() == ' ') f.brand.pop_back();
  if (f.amx_tile) f.amx_permitted = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtileData) == 0;
  return f;
}

}  // namespace

const CpuFeatures& DetectCpu() {
  static const CpuFeatures features = Detect();
  return features;
}

std::string DescribeKernelFamilies(const CpuFeatures& f) {
  std::string out;
  auto add = [&](bool have, const char* name) {
    if (!have) return;
    if (!out.empty()) out += ' ';
    out += name;
  };
  add(f.amx_bf16 && f.amx_permitted, "amx-bf16");
  add(f.avx512_bf16, "avx512-bf16");
  add(f.avx512f && f.avx512bw, "avx512f");
  add(f.avx2 && f.fma && f.f16c, "avx2-fma");
  add(true, "portable");
  return out;
}

}  // namespace anchorage::cpu
