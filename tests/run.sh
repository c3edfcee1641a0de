#!/usr/bin/env bash
# The whole test suite, on the three Keras backends, two pytest-xdist workers
# (one per core), each taking whole test files. Each part prints its 25
# slowest tests (`--durations=25`) and its wall time. What repeats where
# (the whole of `.ci/run` must stay under 25 minutes on 2 cores; measured
# in a clean-clone CI run on the idle 2-core machine, 2026-12-02: TF 14.5
# min, JAX 13.8 min, PyTorch 4.0 min, whole CI 34.6 min; 2026-12-03, same
# suite, a slower day: TF 19.1, JAX 19.5, PyTorch 4.7, whole CI 46.1 min;
# later that day, JAX with the older fusion emitters (tests/xla_flags.py):
# TF 16.3, JAX 12.6, PyTorch 4.4, whole CI 36.6 min: still over budget;
# ef30756 with the parts overlapped (see below), whole CI 35.0 min, all
# parts passing; b4a832f, 2026-12-04, idle, `--durations=0`: TF 12.2,
# JAX 9.4, PyTorch 3.1 min, the CI machine's whole CI 31.2 min; then
# PyTorch with one thread per worker (tests/conftest.py) 2.5 min; the
# landed stop 47: the CI machine's whole CI 21.8 min; a050617 (issue 38's
# layers, converters and properties: TF 3,291 collected), 2026-12-04,
# idle, clean clone: TF 13.1, JAX 9.7, PyTorch 1.2 min, whole CI 26.1 min
# on this machine):
#   TensorFlow: everything (examples, memory and graph-rank tests are
#     TensorFlow programs: tf.data, SavedModel, XLA-compiled tf.function
#     loops, TensorFlow's own memory and graph inspection).
#   JAX: the backend-neutral library tests: layers, blocks, ops, the mask
#     matrix, the harness self-tests and the doctests. The converted
#     families (tests/interop) run in the fast tier on TensorFlow only,
#     on JAX and PyTorch in the slow tier (tests/interop/tiers.py; issue
#     55: each family once on TensorFlow).
#   PyTorch: the same, plus generation (cached decoding with the keras_hub
#     samplers runs eagerly on torch: cheap). The harness runs `fit` eagerly
#     only and no SavedModel export on torch (tests/harness.py BACKEND_GAPS
#     says why; printed at the end of the run); tests Keras cannot run on
#     torch are skipped with their reason (`pytest -rs`).
# Examples run in the TensorFlow part only (tests/examples).
#
# TensorFlow's oneDNN CPU kernels are forced ON (TF_ENABLE_ONEDNN_OPTS=1),
# whatever the CPU: TensorFlow enables them by default only on some x86 CPUs
# (AVX-512 VNNI/BF16, AMX), and they reject tensors of rank > 5, so a suite
# run without them can miss a crash users hit. Override with ONEDNN=0 to run
# the TensorFlow part with them off (the suite must pass both ways):
#     ONEDNN=0 bash tests/run.sh
#
# The slow tier (tests marked `slow(reason)`, see tests/conftest.py, and
# the JAX part's Hypothesis properties) runs only with SLOW=1:
#     SLOW=1 bash tests/run.sh
# 2026-12-04 (issue 38's families, the mixed cache): a clean-clone CI took
# 1,871 s (TF 1,025, JAX 621, PyTorch 101 s): the slow tier and fewer
# Hypothesis examples (tests/conftest.py) are what keep it near 25 min.
# 2026-12-04, 1a933bf (issues 39/40's ops, layers and ring attention
# added; the sampled files of tests/conftest.py `SAMPLED`), idle, clean
# clone: TF 730, JAX 385, PyTorch 78 s, whole CI 1,298 s (21.6 min).
# 2026-12-04, 3c151f6 (hybrid mixers, Qwen 3.5, the ring's refusals),
# idle, clean clone: TF 621, JAX 385, PyTorch 70 s, whole CI 1,154 s.
# 2026-12-05, 1949420 (issues 53 and 54: the correctness pass, one cache
# protocol, blocks by composition), idle, clean clone: TF 639, JAX 532,
# PyTorch 72 s, whole CI 1,324 s; JAX's costliest new test, the composed
# blocks' generation (68 s), then moved to tests/generation, which the JAX
# part does not run (TensorFlow and PyTorch do).
# 2026-12-06, 48c5b70 (issues 55-57: 22 keras-hub families, the Hugging
# Face loader, the flex path, KDA, DeepSeek sparse attention), clean
# clone, NOT idle (a helper's tests ran beside it, load 3-4): TF 1,468 s
# (4,389 passed, 2 failed, mended in 498f940 and 08d4f6b); the examples
# ran about 2x their idle time, so about 750 s idle; then on 08d4f6b in
# the same clone and load, JAX 861 s (2,404 passed; about 500 s idle).
# The converted families run on TensorFlow only in the fast tier
# (tests/interop/tiers.py). Measure the whole CI idle next.
# 2026-12-06, a00ddea (issues 55-57: 22 Hugging Face model types, Gemma
# 4, Llama 4, the mask matrix's new layers), idle, clean clone: TF 849 s
# (4,257 passed), JAX 462, PyTorch 82, whole CI 1,485 s (24.8 min), after
# three trims of the fast tier: `slow_on_jax` tests, the mask matrix's
# graph modes sampled, 10 Hypothesis examples (0f61798 had TF 966 s).
# 2026-12-06, 3ec2dab (the costliest files first, see below), idle, clean
# clone: TF 782 s (4,263 passed), JAX 446, PyTorch 80, whole CI 1,391 s
# (23.2 min).
# 2026-12-06, df22829 (prefill chunks, decoding-step matmuls, top-k's
# XLA backward, the flex path's copies), idle, clean clone: TF 772 s
# (4,275 passed), JAX 486 (2,240), PyTorch 86 (3,083), whole CI 1,422 s
# (23.7 min).
# 2026-12-06, 5193fd9 (top-k's PyTorch backward, prefill bounded by its
# scores, the adversarial pass's tests, the measured relative_sdpa
# crossover), idle, clean clone, ON ANOTHER MACHINE (a 2-core AMD EPYC,
# no AMX): install 86 s, TF 948 s (4,304 passed), JAX 479 (2,262),
# PyTorch 115 (3,117), whole CI 1,633 s (27.2 min): over the budget
# there; a TF run of the same suite without the background wheel job and
# a fresh venv took 840 s (`--durations=0`: the examples 455 worker-s,
# interop 250, layers 274, generation 166 of 1,613). The landed CI of
# f631a4e took 1,455 s on the CI machine; the same commit here 1,530 s.
# 2026-12-06, d38f267 (FlexAttention's 64-blocks on a CPU, the prefill
# tests sampled on TensorFlow), idle, clean clone, the AMD EPYC: install
# 99 s, TF 857 s (4,300 passed), JAX 455 (2,262), PyTorch 98 (3,124),
# whole CI 1,514 s (25.2 min here; about 0.95x that on the CI machine).
# 41b973e (one PyTorch test more), the same machine an hour later,
# slower (single tests stalled 3-5x, the kernel's kdamond busy): TF 981,
# JAX 491, PyTorch 101, whole CI 1,679 s: this machine's spread.
set -euo pipefail
cd "$(dirname "$0")/.."
ONEDNN="${ONEDNN:-1}"
if [[ "$ONEDNN" != 0 && "$ONEDNN" != 1 ]]; then
    echo "ONEDNN must be 0 or 1, got '$ONEDNN'" >&2
    exit 2
fi
# Whole files to the workers in collection order (`--no-loadscope-reorder`,
# pytest-xdist >= 3.8): tests/conftest.py puts the costliest files first
# (`COSTLY_FILES`), so that no long file starts when the other worker has
# nothing left.
PYTEST=(python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder
    --durations=25)
part() {
    local name="$1" start=$SECONDS
    shift
    echo
    echo "=== tests, $name part ($(date -u +%H:%M:%S))"
    "$@"
    echo "=== tests, $name part: $((SECONDS - start)) s"
}
# The parts run one after the other. Overlapping them (the JAX and PyTorch
# parts under `nice -n 19` beside the TensorFlow part, which alone keeps
# the 2 cores ~160 % busy) was measured in a clean-clone `.ci/run`
# (2026-12-03, idle 2-core machine) and does not pay: the TensorFlow part
# took 1,153 s instead of ~910 s alone, the tests 1,994 s against ~1,800 s
# for the parts one after the other (six workers on two cores contend
# whatever the nice level). Commit 1057dd4 has that script.
part TensorFlow env TF_ENABLE_ONEDNN_OPTS="$ONEDNN" "${PYTEST[@]}" tests "$@"
# The JAX part compiles thousands of tiny programs (JAX compiles per shape
# and per jitted `fit`), so XLA's compile time dominates it: tests/conftest.py
# turns LLVM's optimization passes off for JAX (tests/xla_flags.py, the one
# place the suite's XLA flags live, also for its JAX subprocesses).
# The JAX part's properties: the mask matrix; the other files of
# tests/properties (Hypothesis properties: each drawn example compiles anew
# on JAX) with SLOW=1 only (TensorFlow and PyTorch run them all).
JAX_PROPERTIES=(tests/properties/test_mask_matrix.py)
if [[ "${SLOW:-0}" == 1 ]]; then
    JAX_PROPERTIES=(tests/properties)
fi
part JAX env KERAS_BACKEND=jax "${PYTEST[@]}" \
    tests/layers tests/blocks tests/ops "${JAX_PROPERTIES[@]}" tests/interop \
    tests/test_harness.py tests/test_doctests.py "$@"
part PyTorch env KERAS_BACKEND=torch "${PYTEST[@]}" \
    tests/layers tests/blocks tests/ops tests/properties tests/generation \
    tests/interop tests/test_harness.py tests/test_doctests.py "$@"
