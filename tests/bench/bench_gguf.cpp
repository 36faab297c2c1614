// Writes a model folder (or a generated one: tiny, small) as a GGUF file of llama.cpp's qwen35 architecture,
// for running llama-server on the same weights as a benchmark's Anchorage server.
// --visible-padding: the padding rows past the tokenizer become normal tokens "[PADn]", so every token
// llama-server samples streams as text (a benchmark counts them; biasing 30,000 ids away slows its requests).
// usage: anchorage-bench-gguf [--visible-padding] MODEL_FOLDER|tiny|small OUT.gguf
#include <cstdio>
#include <string>

#include "bench_util.h"
#include "gguf_export.h"

int main(int argc, char** argv) {
  const bool visible_padding = argc > 1 && std::string(argv[1]) == "--visible-padding";
  if (visible_padding) ++argv, --argc;
  if (argc != 3) {
    std::fprintf(stderr, "usage: anchorage-bench-gguf [--visible-padding] MODEL_FOLDER|tiny|small OUT.gguf\n");
    return 2;
  }
  const std::string from = argv[1];
  const std::string dir = from == "tiny" || from == "small" ? anchorage::bench::ModelFolder(from) : from;
  const anchorage::Status s = anchorage::ExportGguf(dir, argv[2], visible_padding);
  if (!s.ok()) return anchorage::bench::Fail(s);
  std::printf("%s -> %s\n", dir.c_str(), argv[2]);
  return 0;
}
