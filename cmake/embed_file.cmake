# Script mode: writes the bytes of IN as a C++ array named SYMBOL into OUT.
file(READ ${IN} hex HEX)
string(LENGTH "${hex}" hex_length)
math(EXPR byte_count "${hex_length} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "'\\\\x\\1'," body "${hex}")
string(REGEX REPLACE "(('\\\\x[0-9a-f][0-9a-f]',){32})" "\\1\n" body "${body}")
file(WRITE ${OUT} "#include <string_view>\nnamespace anchorage::embedded {\nstatic const char kData[] = {\n${body}'\\0'};\nextern const std::string_view ${SYMBOL};\nconst std::string_view ${SYMBOL}(kData, ${byte_count});\n}  // namespace anchorage::embedded\n")
