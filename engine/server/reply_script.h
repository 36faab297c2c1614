// Testing aid behind --test-replies: scripted replies forced through the real forward, so a random
// model can make a tool call. Consulted by the scheduler where a job's tokens are chosen.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/core/status.h"
#include "engine/text/tokenizer.h"

namespace anchorage {

class ReplyScript {
 public:
  // entries: [{"match": TEXT, "reply": TEXT}]; the first whose match the prompt's newest user turn
  // contains decodes exactly that reply, then <|im_end|>.
  static Result<ReplyScript> FromJson(const nlohmann::json& entries, const Tokenizer& tokenizer);

  // The forced ids for a prompt, or none when no entry matches.
  std::optional<std::vector<int32_t>> ReplyFor(const std::vector<int32_t>& prompt) const;

 private:
  struct Entry {
    std::string match;
    std::vector<int32_t> reply;
  };
  const Tokenizer* tokenizer_ = nullptr;
  std::vector<Entry> entries_;
};

}  // namespace anchorage
