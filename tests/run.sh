#!/usr/bin/env bash
# The whole test suite: everything on the TensorFlow backend, then the layer,
# block, ops, mask-matrix, harness and doctest tests again on the JAX backend
# (examples, generation and memory tests are TensorFlow programs: tf.data,
# SavedModel, XLA-compiled tf.function loops); two pytest-xdist workers (one
# per core), each taking whole test files.
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
    tests/layers tests/blocks tests/ops tests/properties tests/test_harness.py \
    tests/test_doctests.py "$@"
