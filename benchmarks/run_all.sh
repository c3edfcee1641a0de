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
# CPU time stolen by the host (virtual machines): "steal total" jiffies.
cpu_steal() { awk '/^cpu /{print $9, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat; }
run() {
  local name=$1 rc before after
  shift
  echo "== $name $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/log"
  before=$(cpu_steal)
  "$@" >"$OUT/$name.out" 2>&1
  rc=$?
  after=$(cpu_steal)
  echo "   rc=$rc $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" \
    "steal $(echo "$before $after" | awk '{d=$4-$2; printf "%.1f", d ? 100*($3-$1)/d : 0}')%" \
    | tee -a "$OUT/log"
}
run core_tf "$PYTHON" benchmarks/attention_core.py --sizes 128,512,2048 \
  --bf16-max 2048 --scores-max 0 --repeats 5 \
  --memory 8192:1:1,32768:1:1 --markdown "$OUT/core_tf.md"
run global "$PYTHON" benchmarks/global_attention.py --repeats 3 \
  --markdown "$OUT/global.md"
run translate_program "$PYTHON" benchmarks/translate_program.py \
  --markdown "$OUT/translate_program.md"
run local "$PYTHON" benchmarks/local_attention.py --lengths 2048 8192 \
  --repeats 3 --markdown "$OUT/local.md"
run programmable "$PYTHON" benchmarks/programmable_attention.py \
  --repeats 3 --markdown "$OUT/programmable.md"
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
run interop "$PYTHON" benchmarks/interop_training.py --sizes 512,2048 \
  --batch 2 --repeats 5 --markdown "$OUT/interop.md"
run modern_tf "$PYTHON" benchmarks/modern_attention.py --sizes 2048 \
  --repeats 12 --markdown "$OUT/modern_tf.md"
run modern_jax env KERAS_BACKEND=jax "$PYTHON" benchmarks/modern_attention.py \
  --sizes 2048 --repeats 12 --markdown "$OUT/modern_jax.md"
run mixed_cache "$PYTHON" benchmarks/mixed_cache.py --max-length 32768 \
  --markdown "$OUT/mixed_cache.md"
run mla_tf "$PYTHON" benchmarks/mla_decoding.py --cache-length 8192 \
  --repeats 15 --markdown "$OUT/mla_tf.md"
run mla_jax env KERAS_BACKEND=jax "$PYTHON" benchmarks/mla_decoding.py \
  --cache-length 8192 --repeats 15 --markdown "$OUT/mla_jax.md"
run interop_modern "$PYTHON" benchmarks/interop_training.py \
  --families gemma3,gpt_oss --sizes 512,2048 --batch 2 --repeats 5 \
  --markdown "$OUT/interop_modern.md"
run gated_delta_tf "$PYTHON" benchmarks/gated_delta_rule.py --length 4096 \
  --repeats 7 --markdown "$OUT/gated_delta_tf.md"
run gated_delta_jax env KERAS_BACKEND=jax "$PYTHON" benchmarks/gated_delta_rule.py \
  --length 4096 --repeats 7 --markdown "$OUT/gated_delta_jax.md"
run ring_attention env KERAS_BACKEND=jax "$PYTHON" benchmarks/ring_attention.py \
  --repeats 3 --markdown "$OUT/ring_attention.md"
run linear_tf "$PYTHON" benchmarks/linear_attention.py \
  --markdown "$OUT/linear_tf.md"
run linear_decoding "$PYTHON" benchmarks/linear_decoding.py --repeats 2 \
  --markdown "$OUT/linear_decoding.md"
echo "== done $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/log"
