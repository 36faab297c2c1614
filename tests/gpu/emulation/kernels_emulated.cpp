// kernels.cu compiled as C++ for the SIMT emulator: launches run the kernel on every emulated thread.
#include "simt.h"

#define ANCHORAGE_LAUNCH(kernel, grid, block, shared, stream) ::simt::Launch(kernel, grid, block, shared)
#define ANCHORAGE_DYNAMIC_SHARED(type, name) type* name = static_cast<type*>(::simt::DynamicShared())
#define ANCHORAGE_UNROLL

#include "engine/compute/cuda/kernels.cu"
