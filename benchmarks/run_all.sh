#!/usr/bin/env bash
# Runs every table of BENCHMARKS.md, one benchmark at a time, and writes
# each table to $OUT/<name>.md (default /tmp/bench), with the load average
# before and after each run in $OUT/log. Run it on an idle machine only
# (nothing else running; 1-minute load average below ~1 before it starts):
#
#   bash benchmarks/run_all.sh [OUT]      # about 16 minutes on 2 cores
set -u
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
OUT=${1:-/tmp/bench}
mkdir -p "$OUT"
run() {
  local name=$1
  shift
  echo "== $name $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/log"
  "$@" >"$OUT/$name.out" 2>&1
  echo "   rc=$? $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/log"
}
run core_tf "$PYTHON" benchmarks/attention_core.py --sizes 128,512,2048 \
  --bf16-max 2048 --scores-max 0 --repeats 3 \
  --memory 8192:1:1,32768:1:1 --markdown "$OUT/core_tf.md"
run global "$PYTHON" benchmarks/global_attention.py --repeats 3 \
  --markdown "$OUT/global.md"
run translate_program "$PYTHON" benchmarks/translate_program.py \
  --markdown "$OUT/translate_program.md"
run local "$PYTHON" benchmarks/local_attention.py --lengths 2048 8192 \
  --repeats 3 --markdown "$OUT/local.md"
run encoder_block "$PYTHON" benchmarks/encoder_block.py \
  --markdown "$OUT/encoder_block.md"
run core_jax env KERAS_BACKEND=jax "$PYTHON" benchmarks/attention_core.py \
  --sizes 128,512,2048 --bf16-max 0 --scores-max 0 --repeats 3 --memory "" \
  --markdown "$OUT/core_jax.md"
run core_torch env KERAS_BACKEND=torch "$PYTHON" benchmarks/attention_core.py \
  --sizes 512,2048 --bf16-max 0 --scores-max 0 --repeats 3 --memory "" \
  --markdown "$OUT/core_torch.md"
run distribution "$PYTHON" benchmarks/distribution_steps.py --steps 10 \
  --markdown "$OUT/distribution.md"
echo "== done $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/log"
