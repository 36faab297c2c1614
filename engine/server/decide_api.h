// POST /v1/decide: many questions over one observation. Parsing, the prompt each question renders
// as (what an independent chat request with that question would send), and the answers' arithmetic.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/server/openai_api.h"

namespace anchorage {

inline constexpr size_t kDecideMaxQuestions = 256;
inline constexpr size_t kDecideMaxChoices = 26;        // one letter each
inline constexpr size_t kDecideMaxCandidates = 1024;   // a question's
inline constexpr size_t kDecideMaxBranches = 4096;     // a request's

struct DecideQuestion {
  std::string text;
  std::vector<std::string> choices;     // labels answered by a letter; or
  std::vector<std::string> candidates;  // texts scored after the generation prompt
};

struct DecideRequest {
  std::string model;
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();  // the observation
  std::vector<DecideQuestion> questions;
  bool reuse = true;  // false: every branch runs alone from its first token (for comparison)
  int64_t max_batch = 16;  // branches a batched forward runs together; 1: one at a time
};

// Validates a body; nullopt with *error (400, naming the field) when it is not a decide request.
std::optional<DecideRequest> ParseDecideRequest(const nlohmann::ordered_json& body, ApiError* error);

// The chat body of one question: the observation, then a user message with the question (and its
// choices lettered "A) label", one a line), thinking off.
nlohmann::ordered_json DecideChatBody(const DecideRequest& request, const DecideQuestion& question);

// The softmax over the letters' logits in one row.
std::vector<double> ChoiceProbabilities(std::span<const float> row, std::span<const int32_t> letter_ids);

struct CandidateScore {
  double sum = 0;   // sum of the candidate's tokens' log-probabilities
  double mean = 0;
  int64_t tokens = 0;
};

// rows [ids.size(), vocab]: row r is the logits before ids[r]; log-softmax over ids below vocab_limit.
CandidateScore ScoreCandidate(std::span<const float> rows, std::span<const int32_t> ids, int64_t vocab, int64_t vocab_limit);

}  // namespace anchorage
