// anchorage-tool: model-folder utilities (make-model, tokenize, detokenize, render, inspect, generate, logits).
#include <cstdio>
#include <cstring>
#include <map>
#include <string>

#include "app/tool_commands.h"

namespace {

const char* kUsage =
    "usage: anchorage-tool COMMAND [ARGS]\n"
    "  make-model --size tiny|small|shadow --seed N [--tokenizer-of SIZE] [--dtype bf16|fp8] DIR\n"
    "                                              generate a random Qwen3.5-structured model folder\n"
    "  tokenize --model DIR [--no-special]         text on stdin, JSON ids out (DIR may hold only tokenizer.json)\n"
    "  detokenize --model DIR [--skip-special]     JSON ids on stdin, text out\n"
    "  render --model DIR                          OpenAI chat body on stdin, rendered prompt out\n"
    "  inspect DIR                                 config, tensors, bytes and fingerprint as JSON\n"
    "  generate --model DIR [options]              prompt or chat body on stdin, generated text out\n"
    "  logits --model DIR --ids FILE               last position's logits as a JSON array\n";

}  // namespace

int main(int argc, char** argv) {
  using namespace anchorage::tool;
  const std::map<std::string, int (*)(const Args&)> commands = {
      {"make-model", MakeModel}, {"tokenize", Tokenize}, {"detokenize", Detokenize}, {"render", Render},
      {"inspect", Inspect},      {"generate", Generate}, {"logits", Logits}};
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  auto it = commands.find(argv[1]);
  if (it == commands.end()) {
    std::fprintf(stderr, "anchorage-tool: unknown command '%s'\n%s", argv[1], kUsage);
    return 2;
  }
  return it->second(Args(argv + 2, argv + argc));
}
