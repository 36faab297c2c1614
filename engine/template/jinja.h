// A Jinja interpreter for the subset Hugging Face chat templates use, rendering as Python jinja2 does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/core/status.h"

namespace anchorage::jinja {

struct Stmt;

// Rendering limits; exceeding one is a kResourceExhausted error.
struct RenderLimits {
  int64_t max_steps = 20'000'000;       // statements executed plus loop iterations
  int max_call_depth = 64;              // nested macro calls
  size_t max_output_bytes = 64u << 20;  // rendered text, macro bodies included
  int64_t max_range_items = 1'000'000;  // length of a range() result
};

// A parsed template; immutable and safe to render from several threads at once.
class Template {
 public:
  Template() = default;
  // Parses with trim_blocks and lstrip_blocks as transformers does; `name` prefixes every error.
  static Result<Template> Parse(const std::string& source, const std::string& name);

  // Renders with `context` (a JSON object) as the top-level variables; keys keep insertion order.
  // Errors name the template and line; raise_exception(msg) yields kInvalidArgument containing msg.
  Result<std::string> Render(const nlohmann::ordered_json& context, const RenderLimits& limits = {}) const;

  const std::string& name() const { return name_; }

 private:
  std::string name_;
  std::shared_ptr<const std::vector<std::shared_ptr<const Stmt>>> body_;
};

}  // namespace anchorage::jinja
