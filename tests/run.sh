#!/usr/bin/env bash
# The whole test suite: everything on the TensorFlow backend, then the layer
# and ops tests again on the JAX backend; two pytest-xdist workers (one per
# core), each taking whole test files.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pytest -q -n 2 --dist loadfile tests "$@"
KERAS_BACKEND=jax python -m pytest -q -n 2 --dist loadfile tests/layers tests/ops "$@"
