# CPU kernels: the reference backend, always built. Each gemm_<path>.cpp compiles its tile for its
# own instruction set; which one runs is decided at run time.
list(APPEND ANCHORAGE_COMPUTE_SOURCES
  cpu/attention.cpp
  cpu/cpu_features.cpp
  cpu/gated_delta.cpp
  cpu/gemm_amx_bf16.cpp
  cpu/gemm_avx2.cpp
  cpu/gemm_avx512.cpp
  cpu/gemm_avx512_vnni.cpp
  cpu/gemm_avx512_bf16.cpp
  cpu/gemm_portable.cpp
  cpu/matmul.cpp
  cpu/packed_bf16.cpp
  cpu/packed_q8.cpp
)
