# CPU kernels: the reference backend, always built.
list(APPEND ANCHORAGE_COMPUTE_SOURCES
  cpu/attention.cpp
  cpu/gated_delta.cpp
  cpu/matmul.cpp
)
