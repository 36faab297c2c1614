// anchorage-tool subcommands: each takes the arguments after its name and returns the exit code.
#pragma once

#include <string>
#include <vector>

namespace anchorage::tool {

using Args = std::vector<std::string>;

int MakeModel(const Args& args);
int Tokenize(const Args& args);
int Detokenize(const Args& args);
int Render(const Args& args);
int Inspect(const Args& args);
int Generate(const Args& args);  // tool_runtime.cpp
int Logits(const Args& args);    // tool_runtime.cpp

}  // namespace anchorage::tool
