"""Tests of `keras_attention.distribution.get_layout_map`.

The sharded runs need JAX with 4 devices, fixed before JAX starts: they run
`_sharded_script.py` in a subprocess with
`XLA_FLAGS=--xla_force_host_platform_device_count=4 KERAS_BACKEND=jax`
(4 virtual CPU devices), and `_multiprocess_script.py` twice on loopback
(two JAX processes joined by `keras.distribution.initialize`; the first
also trains the one-device reference after its part).
"""

import json
import os
import socket
import subprocess
import sys

import keras
import numpy as np
import pytest
import xla_flags

from keras_attention.distribution import get_layout_map
from keras_attention.layers import LocalSelfAttention
from keras_attention.layers import MultiHeadAttention

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TOLERANCE = 1e-5
SUBPROCESS = pytest.mark.tf_only(
    reason="starts its own JAX processes with 4 virtual devices; runs once"
)


def _mesh(shape=(2, 2), names=("batch", "model")):
    devices = [f"cpu:{i}" for i in range(int(np.prod(shape)))]
    return keras.distribution.DeviceMesh(shape, names, devices)


def test_patterns_match_the_library_weight_paths():
    layout_map = get_layout_map(_mesh())
    expected = {
        "lm/decoder_block_0/self_attention/query/kernel": (None, "model"),
        "x/mha/value/bias": ("model",),
        "mha/gate/kernel": (None, "model"),
        "enc/self_attention/attention_output/kernel": ("model",),
        "enc/feed_forward/intermediate_dense/kernel": (None, "model"),
        "enc/feed_forward/intermediate_dense/bias": ("model",),
        "enc/feed_forward/output_dense/kernel": ("model",),
        "bahdanau_attention/attention_v": ("model",),
        "luong/concat_kernel": (None, "model"),
        "enc/self_attention/attention_output/bias": None,
        "enc/feed_forward/output_dense/bias": None,
        "enc/self_attention_norm/gamma": None,
        "bahdanau_attention/attention_g": None,
        "embedding/embeddings": None,
    }
    for path, axes in expected.items():
        layout = layout_map[path]
        assert (layout and layout.axes) == axes, path
    # Names of the mesh are used as given.
    renamed = get_layout_map(_mesh(names=("data", "tp")), "tp", "data")
    assert renamed["a/query/kernel"].axes == (None, "tp")


def _attention_layers():
    """Attention layers with every projection they can have."""
    return [
        MultiHeadAttention(4, 2, num_key_value_heads=2, use_gate=True),
        LocalSelfAttention(
            4,
            2,
            window_size=1,
            num_key_value_heads=2,
            use_gate=True,
            global_projections=True,
        ),
    ]


@pytest.mark.parametrize("shard_key_value", [True, False])
def test_every_attention_projection_is_sharded_by_heads(shard_key_value):
    # Every weight with a heads axis (projection kernels (d, h, k), their
    # biases (h, k), the output kernel (h, k, d)) is sharded over it, also
    # Longformer's global projections (issue 23); key/value-side ones
    # follow `shard_key_value`. Only the output bias (d,) is replicated.
    layout_map = get_layout_map(_mesh(), shard_key_value=shard_key_value)
    x = np.zeros((1, 5, 8), "float32")
    for layer in _attention_layers():
        layer(x) if isinstance(layer, LocalSelfAttention) else layer(x, x)
        for w in layer.weights:
            name = "/".join(w.path.split("/")[-2:])
            if len(w.shape) == 1:
                expected = None
            elif name == "attention_output/kernel":
                expected = ("model",)
            elif not shard_key_value and name.startswith(("key", "value")):
                expected = None
            elif name.endswith("/kernel"):
                expected = (None, "model")
            else:
                expected = ("model",)
            layout = layout_map[w.path]
            assert (layout and layout.axes) == expected, w.path


def test_key_value_can_be_replicated():
    layout_map = get_layout_map(_mesh(), shard_key_value=False)
    assert layout_map["mha/key/kernel"] is None
    assert layout_map["mha/value/bias"] is None
    assert layout_map["mha/query/kernel"].axes == (None, "model")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"device_mesh": "mesh"}, "device_mesh='mesh'"),
        ({"model_parallel_dim_name": "tp"}, "model_parallel_dim_name='tp'"),
        ({"data_parallel_dim_name": "data"}, "data_parallel_dim_name='data'"),
        ({"data_parallel_dim_name": None}, "data_parallel_dim_name=None"),
        ({"data_parallel_dim_name": "model"}, "must name different"),
        ({"shard_key_value": "no"}, "shard_key_value='no'"),
    ],
)
def test_invalid_arguments(kwargs, message):
    kwargs = {"device_mesh": _mesh(), **kwargs}
    with pytest.raises(ValueError, match=message):
        get_layout_map(**kwargs)


def _env(devices=4):
    return xla_flags.jax_environment(devices, PYTHONPATH=ROOT)


@pytest.fixture(scope="module")
def sharded():
    out = subprocess.run(
        [sys.executable, os.path.join(HERE, "_sharded_script.py")],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=ROOT,
        env=_env(),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (line,) = [s for s in out.stdout.splitlines() if s.startswith("RESULT ")]
    return json.loads(line[len("RESULT ") :])


def _expected_shard(path, shape):
    """The per-device shape `get_layout_map` gives on a model axis of 2."""
    name = "/".join(path.split("/")[-2:])
    sharded_axis = {
        "query/kernel": 1,
        "key/kernel": 1,
        "value/kernel": 1,
        "gate/kernel": 1,
        "query/bias": 0,
        "key/bias": 0,
        "value/bias": 0,
        "gate/bias": 0,
        "attention_output/kernel": 0,
        "intermediate_dense/kernel": 1,
        "intermediate_dense/bias": 0,
        "output_dense/kernel": 0,
        "bahdanau/attention_v": 0,
        "bahdanau/attention_bias": 0,
        "luong_concat/attention_v": 0,
        "luong_concat/concat_kernel": 1,
    }.get(name)
    if sharded_axis is None:
        return shape
    return [n // 2 if i == sharded_axis else n for i, n in enumerate(shape)]


@SUBPROCESS
@pytest.mark.parametrize("model", ["lm", "seq2seq"])
def test_every_weight_has_its_expected_shard_shape(sharded, model):
    assert sharded["devices"] == 4
    shards = sharded[model]["model"]["shards"]
    halved = 0
    for path, (shape, shard) in shards.items():
        assert shard == _expected_shard(path, shape), path
        halved += shard != shape
    # Not a map that matches nothing: LM: 2 blocks x 10 sharded weights.
    assert halved == {"lm": 20, "seq2seq": 36}[model]
    # DataParallel replicates every weight.
    for shape, shard in sharded[model]["data"]["shards"].values():
        assert shard == shape


@SUBPROCESS
@pytest.mark.parametrize("model", ["lm", "seq2seq"])
@pytest.mark.parametrize("distribution", ["data", "model"])
def test_training_equals_one_device(sharded, model, distribution):
    run, one = sharded[model][distribution], sharded[model]["one"]
    np.testing.assert_allclose(run["losses"], one["losses"], rtol=TOLERANCE)
    assert run["weight_diff"] < TOLERANCE
    assert run["logit_diff"] < TOLERANCE


@SUBPROCESS
@pytest.mark.parametrize("distribution", ["data", "model"])
def test_cached_generation_equals_one_device(sharded, distribution):
    # Logits of the cached path (whole buffer, then one step) and of the
    # model are compared in `logit_diff`: see the training test.
    run = sharded["lm"][distribution]
    assert run["tokens"] == sharded["lm"]["one"]["tokens"]


@SUBPROCESS
def test_fewer_key_value_heads_than_the_model_axis(sharded):
    # 1 key/value head on a model axis of 2: sharding refuses it...
    refused = sharded["one_kv_head"]["True"]
    assert isinstance(refused, str) and "Error" in refused, refused
    # ...shard_key_value=False replicates key and value, shards the rest.
    shards = sharded["one_kv_head"]["False"]
    assert shards["mqa/key/kernel"] == [[16, 1, 4], [16, 1, 4]]
    assert shards["mqa/value/bias"] == [[1, 4], [1, 4]]
    assert shards["mqa/query/kernel"] == [[16, 4, 4], [16, 2, 4]]
    assert shards["mqa/attention_output/kernel"] == [[4, 4, 16], [2, 4, 16]]


@SUBPROCESS
def test_global_projections_are_sharded_by_heads(sharded):
    # LocalSelfAttention(global_projections=True), 4 heads on a model axis
    # of 2: every global projection holds 2 heads per device (issue 23).
    run = sharded["global_projections"]
    for name in ("query_global", "key_global", "value_global"):
        kernel = run["shards"][f"global_local/{name}/kernel"]
        bias = run["shards"][f"global_local/{name}/bias"]
        assert kernel == [[16, 4, 4], [16, 2, 4]], name
        assert bias == [[4, 4], [2, 4]], name
    assert run["diff"] < TOLERANCE


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@SUBPROCESS
def test_two_jax_processes_train_like_one(tmp_path):
    script = os.path.join(HERE, "_multiprocess_script.py")
    port = str(_free_port())
    env = _env(devices=None)
    procs = [
        subprocess.Popen(
            [sys.executable, script, port, str(i), str(tmp_path / f"{i}.npz")],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
            env=env,
        )
        for i in range(2)
    ]
    try:
        logs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:  # a hung collective: kill, never wait forever
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
    # Process 0 also trained the one-device reference, after its part.
    one, *workers = (
        np.load(tmp_path / f"{n}.npz") for n in ("0-ref", "0", "1")
    )
    assert int(workers[0]["devices"]) == 2  # one per process, global
    for worker in workers:
        np.testing.assert_allclose(worker["losses"], one["losses"], rtol=1e-5)
        for key in one.files:
            if key.startswith("w"):
                np.testing.assert_allclose(worker[key], one[key], atol=1e-5)
