list(APPEND ANCHORAGE_MODEL_SOURCES
  tokenizer.cpp
  pretokenizer.cpp
  unicode_text.cpp
  unicode_tables.cpp
  bpe_trainer.cpp
)
