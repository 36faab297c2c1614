#!/bin/bash
# llama-server -np N against Anchorage with N slots on the same weights, the same clients and prompts, in one
# run on this machine: anchorage-bench-server's rounds (TTFT, per-stream and aggregate decode) for each; then
# the engines alone, llama-bench's pp512 and tg128 beside anchorage-bench-engine's prefill 512 and decode.
# llama.cpp comes from node-llama-cpp's npm package, whose llama/gitRelease.bundle is a git bundle of the
# llama.cpp release it binds; it is built here for this CPU (GGML_NATIVE) and kept in LLAMA_DIR. The weights
# are the generated model's, written as GGUF by anchorage-bench-gguf (BF16 matrices, as Anchorage reads them);
# its padding rows past the tokenizer are visible tokens there, so llama-server streams every token it samples
# (Anchorage samples only the tokenizer's ids; the products, the whole lm_head included, are the same).
# The engines alone run Anchorage in each of PRECISIONS (fast multiplies on the CPU's bf16 units where it has them).
# usage: tests/bench/compare-llama-server.sh [BUILD_DIR]
# env: SIZE (small), TOKENS (256), CLIENTS (1,4), PARALLEL (4), THREADS (2), PROMPT_WORDS (0),
#      LLAMA_DIR (/tmp/anchorage-bench/llama.cpp), NODE_LLAMA_CPP (3.22.1), ENGINES_ONLY (0: 1 skips the servers),
#      PRECISIONS ("exact fast"), REPEATS (1: engine rounds, llama-bench and Anchorage taking turns)
set -euo pipefail
build=$(realpath "${1:-build}")
size=${SIZE:-small} tokens=${TOKENS:-256} clients=${CLIENTS:-1,4} parallel=${PARALLEL:-4} threads=${THREADS:-2}
prompt_words=${PROMPT_WORDS:-0} engines_only=${ENGINES_ONLY:-0} precisions=${PRECISIONS:-exact fast} repeats=${REPEATS:-1}
llama=${LLAMA_DIR:-/tmp/anchorage-bench/llama.cpp}
work=/tmp/anchorage-bench
mkdir -p "$work"

if [ ! -x "$llama/build/bin/llama-server" ] || [ ! -x "$llama/build/bin/llama-bench" ]; then
  if [ ! -d "$llama/.git" ]; then
    pack=$(mktemp -d)
    (cd "$pack" && npm pack --silent "node-llama-cpp@${NODE_LLAMA_CPP:-3.22.1}" >/dev/null && tar xzf node-llama-cpp-*.tgz package/llama)
    git clone -q "$pack/package/llama/gitRelease.bundle" "$llama"
    rm -rf "$pack"
  fi
  cmake -S "$llama" -B "$llama/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF >/dev/null
  ninja -C "$llama/build" llama-server llama-bench >/dev/null
fi
echo "llama.cpp $(git -C "$llama" log -1 --format='%h %cd' --date=short) ($(git -C "$llama" describe --tags --always 2>/dev/null || true))"

gguf="$work/$size-seed1-visible-padding.gguf"
[ -f "$gguf" ] || "$build/tests/bench/anchorage-bench-gguf" --visible-padding "$size" "$gguf"

if [ "$engines_only" != 1 ]; then
  port=$((20000 + RANDOM % 20000))
  ctx=$(( (tokens + 256 + 8 * prompt_words) * parallel ))
  "$llama/build/bin/llama-server" -m "$gguf" -np "$parallel" -t "$threads" -tb "$threads" -c "$ctx" --port "$port" \
    --jinja --no-webui >"$work/llama-server.log" 2>&1 &
  server=$!
  trap 'kill $server 2>/dev/null || true' EXIT
  for _ in $(seq 1 120); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
    kill -0 $server 2>/dev/null || { tail -20 "$work/llama-server.log"; exit 1; }
    sleep 1
  done
  grep -m1 -o "system_info:.*" "$work/llama-server.log" || true

  echo "== llama-server -np $parallel -t $threads"
  "$build/tests/bench/anchorage-bench-server" --port "$port" --size "$size" --tokens "$tokens" --clients "$clients" --prompt-words "$prompt_words"
  kill $server
  wait $server 2>/dev/null || true
  trap - EXIT

  echo "== Anchorage --parallel $parallel --threads $threads"
  "$build/tests/bench/anchorage-bench-server" --size "$size" --tokens "$tokens" --threads "$threads" --parallel "$parallel" \
    --clients "$clients" --prompt-words "$prompt_words" | sed '/^through a front/d'
fi

echo "== the engines alone: llama-bench -p 512,2048 -n 128 -t $threads, then anchorage-bench-engine --precision ($precisions)"
for _ in $(seq 1 "$repeats"); do
  "$llama/build/bin/llama-bench" -m "$gguf" -t "$threads" -p 512,2048 -n 128 -r 3 | grep -E "pp512|pp2048|tg128"
  for precision in $precisions; do
    "$build/tests/bench/anchorage-bench-engine" --model-dir "$work/$size-seed1" --no-accuracy --threads "$threads" --max-tokens 2048 \
      --kv-dtype bf16 --batches 1 --precision "$precision" |
      grep -E "^(kernel path|limits|prefill +(512|2048) |decode at +512 )"
  done
done
