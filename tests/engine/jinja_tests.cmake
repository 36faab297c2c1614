anchorage_add_test(test_jinja SOURCES test_jinja.cpp LIBS anchorage_model)
