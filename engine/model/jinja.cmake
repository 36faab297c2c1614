list(APPEND ANCHORAGE_MODEL_SOURCES
  chat_template.cpp
  jinja.cpp
  jinja_parser.cpp
  jinja_value.cpp
)
