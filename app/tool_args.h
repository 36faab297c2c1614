// Flag parsing shared by anchorage-tool's commands: --name VALUE pairs and positional words.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "app/tool_commands.h"

namespace anchorage::tool {

struct ParsedArgs {
  std::map<std::string, std::string> values;  // --name VALUE
  std::set<std::string> switches;             // --name with no value
  std::vector<std::string> positional;
  std::string error;

  std::optional<std::string> Get(const std::string& name) const {
    auto it = values.find(name);
    return it == values.end() ? std::nullopt : std::optional<std::string>(it->second);
  }
  bool Has(const std::string& name) const { return switches.count(name) > 0; }
};

// value_flags take a value; switch_flags do not; anything else starting with -- is an error.
ParsedArgs ParseArgs(const Args& args, const std::set<std::string>& value_flags, const std::set<std::string>& switch_flags);

// Reads all of stdin.
std::string ReadStdin();

}  // namespace anchorage::tool
