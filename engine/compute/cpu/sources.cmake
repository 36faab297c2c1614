# CPU kernels: the reference backend, always built.
list(APPEND ANCHORAGE_COMPUTE_SOURCES
  cpu/attention.cpp
  cpu/cpu_features.cpp
  cpu/gated_delta.cpp
  cpu/matmul.cpp
)
