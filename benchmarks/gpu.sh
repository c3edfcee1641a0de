#!/usr/bin/env bash
# The GPU benchmark, JAX and PyTorch only (the GPU machine has no
# TensorFlow), planned for under 5 minutes on one H100 or H200:
#
#   bash benchmarks/gpu.sh                   # on the GPU machine
#   bash benchmarks/gpu.sh --markdown out.md # the tables appended there too
#   bash benchmarks/gpu.sh --dry-run         # tiny sizes on a CPU (CI)
#
# 1. JAX: ours (keras_attention.ops.dot_product_attention) against
#    jax.nn.dot_product_attention(implementation="cudnn");
# 2. PyTorch: ours against scaled_dot_product_attention (flash) and
#    flex_attention called directly;
#    both at T = 2k, 8k, 32k, causal and with a causal document mask,
#    bfloat16, forward + backward: ms, TFLOP/s, ratio, peak memory
#    (benchmarks/gpu_attention.py says how each is measured);
# 3. 50 steps of model.fit of the language-model example on JAX:
#    tokens/s.
# Each part is one process (ours and the native kernels interleaved in
# it); the card and the libraries are printed first.
#
# The machine needs Keras and keras-hub (the example's model imports
# it), which the GPU image lacks: carry their wheels in .whl/ (ignored
# by git) and this script installs them into /tmp/site. Fetch them where
# pip reaches PyPI (here), for the machine's Python (3.12):
#
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: \
#       --python-version 3.12 --implementation cp \
#       --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#       -d .whl keras==3.15.1 namex optree keras-hub==0.32.0 \
#       kagglehub kagglesdk
#
# and run with `carry: [".whl"]`. Environment: PYTHON (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
args=()
dry=()
for arg in "$@"; do
    case "$arg" in
    --dry-run) dry=(--dry-run --no-tensorflow) ;;
    *) args+=("$arg") ;;
    esac
done
# Found, not imported: importing keras_hub imports TensorFlow where it is
# installed (14 s of the dry run's CI smoke test on a loaded 2-core CPU).
if ! "$PYTHON" -c "import importlib.util as u, sys
sys.exit(not all(u.find_spec(m) for m in ('keras', 'keras_hub')))"; then
    if compgen -G ".whl/*.whl" >/dev/null; then
        "$PYTHON" -m pip install -q --no-index --no-deps --no-compile \
            --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
        export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
    else
        echo "Keras or keras-hub is missing and .whl/ holds no wheels:" \
            "see the top of $0" >&2
        exit 2
    fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
# JAX and PyTorch share the card one after the other: no preallocation.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
start=$SECONDS
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
fi
"$PYTHON" -c "
import platform, jax, torch
print('Python', platform.python_version(), '| jax', jax.__version__,
      jax.devices(), '| torch', torch.__version__,
      torch.cuda.get_device_name() if torch.cuda.is_available() else 'CPU')
"
part() {
    local backend="$1" name="$2" t=$SECONDS
    echo
    echo "=== $name ($backend)"
    KERAS_BACKEND="$backend" "$PYTHON" benchmarks/gpu_attention.py \
        --part "$name" ${dry[@]+"${dry[@]}"} ${args[@]+"${args[@]}"}
    echo "=== $name: $((SECONDS - t)) s"
}
part jax jax
part torch torch
part jax fit
echo "=== whole benchmark: $((SECONDS - start)) s"
