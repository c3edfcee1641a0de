"""Tests of `keras_attention.distribution.ring_attention` and
`ContextParallel`.

The ring needs JAX with 8 devices, fixed before JAX starts: the cases run
in `_ring_script.py`, one subprocess with the suite's XLA flags and
`--xla_force_host_platform_device_count=8` (`xla_flags.jax_environment`),
which prints one line per case and a JSON summary; each test here checks
one group of cases and names every failing case with its error. The
backend checks run in this process, on the current backend.
"""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import xla_flags

from keras_attention.distribution import ContextParallel
from keras_attention.distribution import ring_attention
from keras_attention.layers import LocalSelfAttention
from keras_attention.layers import SelfAttention
from keras_attention.ops import dot_product_attention
from keras_attention.ops import implementation_scope
from keras_attention.ops import paths

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TOLERANCE = 1e-5
BACKEND = keras.backend.backend()
SUBPROCESS = pytest.mark.tf_only(
    reason="starts its own JAX process with 8 virtual devices; runs once"
)
# Groups of the script's cases and how many each holds (a case that went
# missing fails the test of its group).
GROUPS = {
    "layouts": 3,
    "masks": 8,
    "scores": 4,
    "padding": 2,
    "mesh 2x4": 2,
    "keras": 1,
}


@pytest.fixture(scope="module")
def ring():
    out = subprocess.run(
        [sys.executable, os.path.join(HERE, "_ring_script.py")],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=ROOT,
        env=xla_flags.jax_environment(8, PYTHONPATH=ROOT),
    )
    lines = [s for s in out.stdout.splitlines() if s.startswith("RESULT ")]
    assert out.returncode == 0 and lines, (
        out.stdout[-3000:] + "\n" + out.stderr[-3000:]
    )
    return json.loads(lines[0][len("RESULT ") :])


@SUBPROCESS
def test_the_script_ran_on_eight_devices(ring):
    assert ring["devices"] == 8


@SUBPROCESS
@pytest.mark.parametrize("group", sorted(GROUPS))
def test_outputs_and_gradients_equal_one_device(ring, group):
    # Output and the gradients of sum(output * w) w.r.t. query, key, value
    # (and a score layer's weights), float32, against one-device
    # `dot_product_attention` with the same masks and scores.
    cases = ring[group]
    failed = {
        name: result
        for name, result in cases.items()
        if "error" in result or max(result.values()) > TOLERANCE
    }
    report = "\n".join(f"{name}: {result}" for name, result in failed.items())
    assert not failed, f"failed cases of {group!r}:\n{report}"
    assert len(cases) == GROUPS[group], sorted(cases)


@SUBPROCESS
def test_a_sharded_training_step_needs_a_fraction_of_the_memory(ring):
    # A decoder's training step at T = 1,024 (XLA's compiled memory
    # analysis, per device): 8 devices under ContextParallel against one.
    (result,) = ring["memory"].values()
    assert "error" not in result, result
    assert result["sharded MiB"] <= result["one device MiB"] / 4, result


def _inputs(shape=(2, 6, 2, 4)):
    return np.zeros(shape, "float32")


@pytest.mark.skipif(BACKEND == "jax", reason="the JAX backend runs the ring")
def test_other_backends_refuse_naming_the_backend():
    x = _inputs()
    with pytest.raises(NotImplementedError, match=f"{BACKEND!r}"):
        ring_attention(x, x, x, mesh=None)


@pytest.mark.skipif(BACKEND != "jax", reason="argument checks of the JAX path")
@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"mesh": "mesh"}, TypeError, "mesh='mesh'"),
        ({"layout": "ring"}, ValueError, "layout='ring'"),
        ({"sequence_axis": "seq"}, ValueError, "sequence_axis='seq'"),
        ({"causal": "yes"}, ValueError, "causal='yes'"),
        ({"mask_mod": 3}, TypeError, "mask_mod=3"),
        ({"key": _inputs((2, 5, 2, 4))}, ValueError, "must share"),
        ({"segment_ids": np.zeros((2, 5))}, ValueError, "segment_ids.shape"),
    ],
)
def test_invalid_arguments(kwargs, error, message):
    devices = keras.distribution.list_devices()[:1]
    mesh = keras.distribution.DeviceMesh((1,), ["sequence"], devices)
    x = _inputs()
    arguments = {"query": x, "key": x, "value": x, "mesh": mesh, **kwargs}
    with pytest.raises(error, match=message):
        ring_attention(**arguments)


def _one_device_mesh(names=("sequence",)):
    devices = keras.distribution.list_devices()[:1]
    return keras.distribution.DeviceMesh((1,) * len(names), names, devices)


@pytest.mark.skipif(BACKEND != "jax", reason="the Keras distribution API")
@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"device_mesh": "mesh"}, "device_mesh='mesh'"),
        ({"sequence_axis": "seq"}, "sequence_axis='seq'"),
        ({"batch_axis": "data"}, "batch_axis='data'"),
        ({"layout": "ring"}, "layout='ring'"),
    ],
)
def test_context_parallel_invalid_arguments(kwargs, message):
    kwargs = {"device_mesh": _one_device_mesh(("batch", "sequence")), **kwargs}
    with pytest.raises(ValueError, match=message):
        ContextParallel(**kwargs)


@pytest.mark.skipif(BACKEND != "jax", reason="the Keras distribution API")
def test_context_parallel_shards_batch_and_sequence_inside_its_scope():
    distribution = ContextParallel(_one_device_mesh(("batch", "sequence")))
    # Outside the scope attention would not run as a ring: refused.
    with pytest.raises(ValueError, match="scope"):
        distribution.get_data_layout((2, 8))
    with distribution.scope():
        assert keras.distribution.distribution() is distribution
        assert paths.current_scope().name == "ring"
        tokens = distribution.get_data_layout((2, 8, 3)).axes
        labels = distribution.get_data_layout((2,)).axes
    assert tokens == ("batch", "sequence", None)
    assert labels == ("batch",)
    assert keras.distribution.distribution() is None


@pytest.mark.skipif(BACKEND != "jax", reason="the ring path runs on JAX")
@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"return_weights": True}, "no attention weights"),
        ({"attention_mask": np.ones((6, 6), bool)}, "attention_mask"),
        ({"query_offset": 3}, "cache offset"),
        ({"return_lse": True}, "log-sum-exp"),
    ],
)
def test_ring_path_refuses_what_it_cannot_run(kwargs, message):
    x = _inputs()
    mesh = _one_device_mesh()
    with implementation_scope("ring", mesh=mesh):
        with pytest.raises(ValueError, match=message):
            dot_product_attention(x, x, x, **kwargs)


def _context_parallel():
    return ContextParallel(_one_device_mesh(("batch", "sequence")))


def _refused_calls():
    # (name, make the layer, call keyword arguments, the option named)
    x = _inputs((2, 6, 8))

    def attention(**kwargs):
        return SelfAttention(num_heads=2, key_dim=4, causal=True, **kwargs)

    def local(**kwargs):
        return LocalSelfAttention(
            num_heads=2, key_dim=4, window_size=2, **kwargs
        )

    return [
        ("scores", attention(), {"return_attention_scores": True},
         "return_attention_scores=True"),
        ("dropout", attention(dropout=0.5), {"training": True},
         "dropout=0.5, training=True"),
        ("flash True", attention(flash_attention=True), {},
         "flash_attention=True"),
        ("flash False", attention(flash_attention=False), {},
         "flash_attention=False"),
        ("global tokens", local(), {"global_mask": np.eye(2, 6, dtype=bool)},
         "global_mask=<tensor of shape \\(2, 6\\)>"),
        ("block_size", local(block_size=2), {}, "block_size=2"),
    ], x  # fmt: skip


@pytest.mark.skipif(BACKEND != "jax", reason="the Keras distribution API")
def test_layers_refuse_inside_the_scope_what_would_not_run_as_a_ring():
    # Each would run another kernel on the whole (gathered) sequence.
    calls, x = _refused_calls()
    with _context_parallel().scope():
        for name, layer, kwargs, message in calls:
            with pytest.raises(ValueError, match=message) as error:
                layer(x, **kwargs)
            assert "ring" in str(error.value), name
        q = _inputs()
        with pytest.raises(ValueError, match="implementation='dense'"):
            dot_product_attention(q, q, q, implementation="dense")
        # Dropout layers out of training run as a ring.
        SelfAttention(num_heads=2, key_dim=4, dropout=0.5)(x, training=False)


@pytest.mark.skipif(BACKEND != "jax", reason="the Keras distribution API")
def test_sliding_windows_run_on_the_ring_as_masks():
    # The banded kernels would gather the sequence: inside the scope the
    # window is a mask of ring attention (global positions: the 8-device
    # masks cases), with the same result.
    import jax

    x = np.random.default_rng(0).normal(size=(2, 12, 8)).astype("float32")
    layers = [
        SelfAttention(num_heads=2, key_dim=4, causal=True, sliding_window=3),
        LocalSelfAttention(num_heads=2, key_dim=4, window_size=(2, 1)),
    ]
    for layer in layers:
        expected = np.asarray(layer(x))
        with _context_parallel().scope():
            program = str(jax.make_jaxpr(layer)(x))
            np.testing.assert_allclose(layer(x), expected, atol=1e-6)
        assert "ppermute" in program, layer.name
