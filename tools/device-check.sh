#!/usr/bin/env bash
# The GPU checks in one run, on the lent GPU machine, from the repository root (issue 19):
#  1. builds the engine-only set (no Qt; nlohmann/json from .device/include, see tools/device-prep.sh),
#  2. runs the GPU tests (kernels and forward against the CPU, resume bit-equality, determinism),
#  3. compares the GPU and CPU logits with Hugging Face transformers' Qwen3.5 on the generated `small`,
#     and greedy decoding on the GPU with the CPU's,
#  4. runs the GPU benchmark on `small` (BF16 and FP8), on random weights of Qwen3.5-0.8B's and 4B's shapes,
#     and on `small` with --weights int8.
# Each step has its own time limit and the script goes on after a failure; the whole stays under 8
# minutes. Every step's whole log goes to $OUT/check.log (one file: the device tool returns few), the
# generated models to $WORK.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/device-check}
WORK=${WORK:-/tmp/device-check-work}
mkdir -p "$OUT" "$WORK"
B=build-gpu
status=0
started=$(date +%s)
step() {  # step NAME SECONDS COMMAND...: runs it with a limit, logs to $WORK/NAME.log and $OUT/check.log, keeps the worst exit code
  local name=$1 limit=$2
  shift 2
  echo "== $name (limit ${limit}s, at $(( $(date +%s) - started ))s)"
  timeout "$limit" "$@" > "$WORK/$name.log" 2>&1
  local rc=$?
  { echo "== $name: exit $rc"; cat "$WORK/$name.log"; } >> "$OUT/check.log"
  tail -n 40 "$WORK/$name.log"
  echo "== $name: exit $rc"
  [ $rc -ne 0 ] && status=1
  return $rc
}

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv 2>&1 | tee "$OUT/check.log"
json=.device/include
[ -f "$json/nlohmann/json.hpp" ] || { echo "missing $json/nlohmann/json.hpp: run tools/device-prep.sh here and carry .device"; exit 1; }

step configure 120 cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DANCHORAGE_ENGINE_ONLY=ON \
  -DANCHORAGE_JSON_INCLUDE="$PWD/$json" -DCMAKE_CUDA_ARCHITECTURES=90 || exit 1
step build 240 cmake --build "$B" -j "$(nproc)" || exit 1
step gpu-tests 150 "$B/tests/gpu/anchorage-test-cuda"
step gpu-tests-simt-gemm 150 env ANCHORAGE_CUDA_GEMM=simt "$B/tests/gpu/anchorage-test-cuda"
# The kernels' cases and a forward under compute-sanitizer's memcheck (bad device accesses); on a
# runtime whose sanitizer refuses the device it says so and counts as no failure.
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer 2>/dev/null | head -n 1)
if [ -n "$sanitizer" ]; then
  before_memcheck=$status
  step memcheck 90 env GPU_CHECK_ONLY="match|fused|same run twice" \
    "$sanitizer" --tool memcheck --error-exitcode 9 "$B/tests/gpu/anchorage-test-cuda"
  grep -q "Device not supported" "$WORK/memcheck.log" && { echo "== memcheck: this runtime's sanitizer refuses the device"; status=$before_memcheck; }
else
  echo "== memcheck: no compute-sanitizer on this machine" | tee -a "$OUT/check.log"
fi

step make-small 60 "$B/anchorage-tool" make-model --size small --seed 1 "$WORK/small"
before_hf=$status
step hf-logits 120 python3 tools/hf_logits.py "$WORK/small" "$WORK/ids.txt" "$WORK/hf-logits.f32"
case $? in
  0) step compare-hf 60 "$B/tests/gpu/anchorage-bench-gpu" --model-dir "$WORK/small" --compare "$WORK/ids.txt" "$WORK/hf-logits.f32" ;;
  3) echo "== transformers does not know this architecture: no comparison (not a failure of ours)"; status=$before_hf ;;
esac

step greedy-small 60 "$B/tests/gpu/anchorage-bench-gpu" --model-dir "$WORK/small" --greedy 64
step bench-small 60 "$B/tests/gpu/anchorage-bench-gpu" --model-dir "$WORK/small" --max-tokens 32768
step make-small-fp8 60 "$B/anchorage-tool" make-model --size small --seed 1 --dtype fp8 "$WORK/small-fp8"
step bench-small-fp8 60 "$B/tests/gpu/anchorage-bench-gpu" --model-dir "$WORK/small-fp8" --max-tokens 8192
step bench-0.8b 90 "$B/tests/gpu/anchorage-bench-gpu" --shape 0.8b --max-tokens 32768
step bench-4b 120 "$B/tests/gpu/anchorage-bench-gpu" --shape 4b --max-tokens 32768
step bench-small-int8 60 "$B/tests/gpu/anchorage-bench-gpu" --model-dir "$WORK/small" --weights int8 --max-tokens 8192
echo "== done in $(( $(date +%s) - started ))s, status $status"
exit $status
