#!/usr/bin/env bash
# The whole test suite, on the three Keras backends, two pytest-xdist workers
# (one per core), each taking whole test files. What repeats where (CI must
# stay under 40 minutes on 2 cores; measured in a clean-clone CI run on the
# idle machine: TF 10.1 min, JAX 10.7 min, PyTorch 1.7 min, whole CI 26 min):
#   TensorFlow: everything (examples, memory and graph-rank tests are
#     TensorFlow programs: tf.data, SavedModel, XLA-compiled tf.function
#     loops, TensorFlow's own memory and graph inspection).
#   JAX: the backend-neutral library tests: layers, blocks, ops, the mask
#     matrix, the keras-hub converters (interop), the harness self-tests
#     and the doctests.
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
set -euo pipefail
cd "$(dirname "$0")/.."
ONEDNN="${ONEDNN:-1}"
if [[ "$ONEDNN" != 0 && "$ONEDNN" != 1 ]]; then
    echo "ONEDNN must be 0 or 1, got '$ONEDNN'" >&2
    exit 2
fi
TF_ENABLE_ONEDNN_OPTS="$ONEDNN" python -m pytest -q -n 2 --dist loadfile tests "$@"
KERAS_BACKEND=jax python -m pytest -q -n 2 --dist loadfile \
    tests/layers tests/blocks tests/ops tests/properties tests/interop \
    tests/test_harness.py tests/test_doctests.py "$@"
KERAS_BACKEND=torch python -m pytest -q -n 2 --dist loadfile \
    tests/layers tests/blocks tests/ops tests/properties tests/generation \
    tests/interop tests/test_harness.py tests/test_doctests.py "$@"
