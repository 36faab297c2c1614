#include "engine/server/decide_api.h"

#include <algorithm>
#include <cmath>

#include "engine/core/text_split.h"

namespace anchorage {

namespace {

using ojson = nlohmann::ordered_json;

// A non-empty array of non-empty strings, at most `most`; false with *error naming the field.
bool StringList(const ojson& v, const std::string& field, size_t most, std::vector<std::string>* out, ApiError* error) {
  if (!v.is_array() || v.empty() || v.size() > most) {
    *error = {400, "'" + field + "' must be an array of 1 to " + std::to_string(most) + " strings", "invalid_request_error", field, "invalid_value"};
    return false;
  }
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string() || v[i].get<std::string>().empty()) {
      *error = {400, "'" + field + "[" + std::to_string(i) + "]' must be a non-empty string", "invalid_request_error", field, "invalid_value"};
      return false;
    }
    out->push_back(v[i].get<std::string>());
  }
  return true;
}

}  // namespace

std::optional<DecideRequest> ParseDecideRequest(const ojson& body, ApiError* error) {
  auto bad = [&](const std::string& message, const std::string& param) {
    *error = {400, message, "invalid_request_error", param, "invalid_value"};
    return std::nullopt;
  };
  if (!body.is_object()) return bad("the body must be a JSON object", "");
  DecideRequest r;
  if (body.contains("model")) {
    if (!body["model"].is_string()) return bad("'model' must be a string", "model");
    r.model = body["model"].get<std::string>();
  }
  const bool has_messages = body.contains("messages"), has_prompt = body.contains("prompt");
  if (has_messages == has_prompt) return bad("give the observation as 'messages' (an array) or 'prompt' (a string), one of them", "messages");
  if (has_messages) {
    if (!body["messages"].is_array()) return bad("'messages' must be an array of messages", "messages");
    r.messages = body["messages"];
  } else {
    if (!body["prompt"].is_string()) return bad("'prompt' must be a string", "prompt");
    r.messages = ojson::array({{{"role", "user"}, {"content", body["prompt"]}}});
  }
  if (!body.contains("questions") || !body["questions"].is_array() || body["questions"].empty() || body["questions"].size() > kDecideMaxQuestions)
    return bad("'questions' must be an array of 1 to " + std::to_string(kDecideMaxQuestions) + " questions", "questions");
  size_t branches = 0;
  for (size_t i = 0; i < body["questions"].size(); ++i) {
    const ojson& q = body["questions"][i];
    const std::string at = "questions[" + std::to_string(i) + "]";
    if (!q.is_object()) return bad("'" + at + "' must be an object with 'question' and 'choices' or 'candidates'", "questions");
    if (!q.contains("question") || !q["question"].is_string() || IsBlank(q["question"].get<std::string>()))
      return bad("'" + at + ".question' must be a non-empty string", "questions");
    DecideQuestion question;
    question.text = q["question"].get<std::string>();
    const bool choices = q.contains("choices"), candidates = q.contains("candidates");
    if (choices == candidates) return bad("'" + at + "' needs 'choices' or 'candidates', one of them", "questions");
    if (choices && !StringList(q["choices"], at + ".choices", kDecideMaxChoices, &question.choices, error)) return std::nullopt;
    if (candidates && !StringList(q["candidates"], at + ".candidates", kDecideMaxCandidates, &question.candidates, error)) return std::nullopt;
    branches += choices ? 1 : question.candidates.size();
    r.questions.push_back(std::move(question));
  }
  if (branches > kDecideMaxBranches) return bad("the questions make " + std::to_string(branches) + " branches; at most " + std::to_string(kDecideMaxBranches), "questions");
  if (body.contains("max_batch") && (!body["max_batch"].is_number_integer() || body["max_batch"].get<int64_t>() < 1 || body["max_batch"].get<int64_t>() > 1024))
    return bad("'max_batch' must be an integer in [1, 1024]", "max_batch");
  if (body.contains("max_batch")) r.max_batch = body["max_batch"].get<int64_t>();
  if (body.contains("reuse")) {
    if (!body["reuse"].is_boolean()) return bad("'reuse' must be true or false", "reuse");
    r.reuse = body["reuse"].get<bool>();
  }
  return r;
}

ojson DecideChatBody(const DecideRequest& request, const DecideQuestion& question) {
  std::string text = question.text;
  for (size_t i = 0; i < question.choices.size(); ++i) text += std::string("\n") + static_cast<char>('A' + i) + ") " + question.choices[i];
  ojson messages = request.messages;
  messages.push_back({{"role", "user"}, {"content", text}});
  return {{"messages", messages}, {"chat_template_kwargs", {{"enable_thinking", false}}}};
}

std::vector<double> ChoiceProbabilities(std::span<const float> row, std::span<const int32_t> letter_ids) {
  double top = -INFINITY;
  for (int32_t id : letter_ids) top = std::max(top, static_cast<double>(row[static_cast<size_t>(id)]));
  std::vector<double> p;
  double sum = 0;
  for (int32_t id : letter_ids) sum += p.emplace_back(std::exp(static_cast<double>(row[static_cast<size_t>(id)]) - top));
  for (double& v : p) v /= sum;
  return p;
}

CandidateScore ScoreCandidate(std::span<const float> rows, std::span<const int32_t> ids, int64_t vocab, int64_t vocab_limit) {
  CandidateScore s;
  for (size_t r = 0; r < ids.size(); ++r) {
    const float* row = rows.data() + r * static_cast<size_t>(vocab);
    double top = -INFINITY, sum = 0;
    for (int64_t v = 0; v < vocab_limit; ++v) top = std::max(top, static_cast<double>(row[v]));
    for (int64_t v = 0; v < vocab_limit; ++v) sum += std::exp(static_cast<double>(row[v]) - top);
    s.sum += static_cast<double>(row[ids[r]]) - top - std::log(sum);
  }
  s.tokens = static_cast<int64_t>(ids.size());
  s.mean = s.tokens > 0 ? s.sum / static_cast<double>(s.tokens) : 0;
  return s;
}

}  // namespace anchorage
