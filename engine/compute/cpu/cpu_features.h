// What this CPU can run, from cpuid and the OS's saved-state mask, never from a library's guess.
#pragma once

#include <string>

namespace anchorage::cpu {

struct CpuFeatures {
  std::string vendor;      // "GenuineIntel", "AuthenticAMD", ...
  std::string brand;       // the processor's brand string
  int family = 0, model = 0;
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512_bf16 = false, avx512_vnni = false;
  bool amx_tile = false, amx_bf16 = false;
  bool amx_permitted = false;  // the kernel granted this process the AMX tile data state
};

// Detected once (thread-safe); AMX permission is requested from the kernel the first time.
const CpuFeatures& DetectCpu();

// The instruction families this CPU and OS can run, best first: "amx-bf16 avx512-bf16 avx512f avx2-fma portable".
std::string DescribeKernelFamilies(const CpuFeatures& features);

}  // namespace anchorage::cpu
