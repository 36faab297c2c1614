# Runtime (engine core) tests: kernels, forward against a double reference, the grid, the sampler.
anchorage_add_test(test_gdn SOURCES test_gdn.cpp LIBS anchorage_runtime)
anchorage_add_test(test_forward SOURCES test_forward.cpp LIBS anchorage_runtime)
anchorage_add_test(test_grid SOURCES test_grid.cpp LIBS anchorage_runtime)
anchorage_add_test(test_sampler SOURCES test_sampler.cpp LIBS anchorage_runtime)
anchorage_add_test(test_generator SOURCES test_generator.cpp LIBS anchorage_runtime)
anchorage_add_test(test_matmul SOURCES test_matmul.cpp LIBS anchorage_runtime)
anchorage_add_test(test_attention SOURCES test_attention.cpp LIBS anchorage_runtime)
anchorage_add_test(test_cpu_features SOURCES test_cpu_features.cpp LIBS anchorage_runtime)
