"""JAX on a GPU: the fused path hands causal masks, padding masks (as
sequence lengths, when they are prefixes) and left windows to cuDNN's
kernel, `jax.nn.dot_product_attention(implementation="cudnn")`.

Without a GPU: a spy stands for that function (the machine is told it
has a GPU, and float32 counts as a cuDNN dtype so that results compare
to 1e-5). The spy records the arguments the path passes and runs JAX's
XLA implementation with them: its results must equal the dense path and
a NumPy reference, and what cuDNN cannot take (a window with keys after
the query, padding that is not a prefix, an offset) must reach the other
kernels.
"""

import keras
import numpy as np
import pytest
from keras import ops

from keras_attention import mods
from keras_attention.ops import _backend
from keras_attention.ops.attention import dot_product_attention

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "jax",
    reason="cuDNN's kernel through jax.nn (KERAS_BACKEND=jax)",
)
RNG = np.random.default_rng(57)
B, T, H, G, D = 2, 16, 4, 2, 8


@pytest.fixture
def spy(monkeypatch):
    """The calls made to cuDNN's kernel: `(implementation, kwargs)`."""
    import jax

    calls = []
    original = jax.nn.dot_product_attention

    def record(query, key, value, implementation=None, **kwargs):
        calls.append((implementation, kwargs))
        return original(query, key, value, implementation="xla", **kwargs)

    monkeypatch.setattr(jax.nn, "dot_product_attention", record)
    monkeypatch.setattr(_backend, "has_gpu", lambda: True)
    monkeypatch.setattr(
        _backend, "CUDNN_DTYPES", _backend.CUDNN_DTYPES + ("float32",)
    )
    return calls


def _inputs():
    q = RNG.normal(size=(B, T, H, D)).astype("float32")
    k = RNG.normal(size=(B, T, G, D)).astype("float32")
    v = RNG.normal(size=(B, T, G, D)).astype("float32")
    return q, k, v


def np_attention(q, k, v, mask):
    k, v = np.repeat(k, H // G, axis=2), np.repeat(v, H // G, axis=2)
    s = np.einsum("bihd,bjhd->bhij", q, k) / np.sqrt(D)
    s = np.where(np.broadcast_to(mask, s.shape), s, -np.inf)
    top = np.max(s, axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    p = np.exp(s - top)
    total = p.sum(-1, keepdims=True)
    p = np.divide(p, total, out=np.zeros_like(p), where=total > 0)
    return np.einsum("bhij,bjhe->bihe", p, v)


def _lengths_mask(lengths):
    return np.arange(T)[None, :] < np.asarray(lengths)[:, None]


def _cudnn_calls(calls):
    return [kw for impl, kw in calls if impl == "cudnn"]


QI, KJ = np.arange(T)[:, None], np.arange(T)[None, :]
CASES = {
    # name: (kwargs, expected cuDNN arguments or None, reference mask)
    "causal, key and query padding": (
        dict(
            causal=True,
            key_mask=_lengths_mask([16, 0]),  # Example 1: no key at all.
            query_mask=_lengths_mask([9, 16]),
        ),
        dict(is_causal=True, local_window_size=None, lengths=("kv", "q")),
        (KJ <= QI)[None, None]
        & _lengths_mask([16, 0])[:, None, None, :]
        & _lengths_mask([9, 16])[:, None, :, None],
    ),
    "causal window object, key padding": (
        dict(
            mask_mod=mods.SlidingWindowMask(3, causal=True),
            key_mask=_lengths_mask([5, 12]),
        ),
        dict(is_causal=True, local_window_size=(3, 0), lengths=("kv",)),
        ((KJ <= QI) & (KJ >= QI - 3))[None, None]
        & _lengths_mask([5, 12])[:, None, None, :],
    ),
    "causal and Keras's window": (
        dict(
            mask_mod=mods.and_masks(
                mods.CausalMask(), mods.KerasSlidingWindowMask(4)
            )
        ),
        dict(is_causal=True, local_window_size=(3, 0), lengths=()),
        ((KJ <= QI) & (KJ >= QI - 3))[None, None],
    ),
    "padding alone": (
        dict(key_mask=_lengths_mask([7, 16])),
        dict(is_causal=False, lengths=("kv",)),
        _lengths_mask([7, 16])[:, None, None, :],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_cudnn_arguments_and_results(spy, case):
    kwargs, expected, mask = CASES[case]
    q, k, v = _inputs()
    out = dot_product_attention(q, k, v, implementation="fused", **kwargs)
    passed = _cudnn_calls(spy)
    assert passed, "cuDNN's kernel was not called"
    arguments = passed[-1]
    assert arguments["is_causal"] is expected["is_causal"]
    if "local_window_size" in expected:
        assert (
            arguments.get("local_window_size")
            == (expected["local_window_size"])
        )
    names = {"kv": "key_value_seq_lengths", "q": "query_seq_lengths"}
    given = {n for n in names.values() if n in arguments}
    assert given == {names[n] for n in expected["lengths"]}
    for short, values in (("kv", "key_mask"), ("q", "query_mask")):
        if short in expected["lengths"]:
            np.testing.assert_array_equal(
                np.asarray(arguments[names[short]]),
                kwargs[values].sum(axis=1),
            )
    dense = dot_product_attention(q, k, v, implementation="dense", **kwargs)
    out, dense = ops.convert_to_numpy(out), ops.convert_to_numpy(dense)
    np.testing.assert_allclose(out, dense, atol=1e-5, rtol=0)
    np.testing.assert_allclose(out, np_attention(q, k, v, mask), atol=1e-5)


def test_padding_that_is_no_prefix_runs_the_other_kernels(spy):
    """Sequence lengths cannot say it: checked when run (`ops.cond`),
    also under `jax.jit`."""
    import jax

    q, k, v = _inputs()
    key_mask = _lengths_mask([10, 16])
    key_mask[1, 3] = False  # A hole.

    def attend(q, k, v, key_mask):
        return dot_product_attention(
            q, k, v, causal=True, key_mask=key_mask, implementation="fused"
        )

    out = jax.jit(attend)(q, k, v, key_mask)
    mask = (KJ <= QI)[None, None] & key_mask[:, None, None, :]
    np.testing.assert_allclose(
        np.asarray(out), np_attention(q, k, v, mask), atol=1e-5
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(mask_mod=mods.SlidingWindowMask(3)),  # Keys after the query.
        dict(causal=True, query_offset=4),  # Not aligned at the top left.
        dict(attention_mask=RNG.random((B, 1, T, T)) < 0.5),  # Dense.
    ],
    ids=["two-sided window", "offset", "dense mask"],
)
def test_what_cudnn_cannot_take_runs_the_other_kernels(spy, kwargs):
    q, k, v = _inputs()
    out = dot_product_attention(q, k, v, implementation="fused", **kwargs)
    assert _cudnn_calls(spy) == []
    dense = dot_product_attention(q, k, v, implementation="dense", **kwargs)
    np.testing.assert_allclose(
        ops.convert_to_numpy(out), ops.convert_to_numpy(dense), atol=1e-5
    )


def test_without_a_gpu_cudnn_is_never_called(monkeypatch):
    import jax

    calls = []
    original = jax.nn.dot_product_attention

    def record(*args, implementation=None, **kwargs):
        calls.append(implementation)
        return original(*args, implementation=implementation, **kwargs)

    monkeypatch.setattr(jax.nn, "dot_product_attention", record)
    monkeypatch.setattr(_backend, "has_gpu", lambda: False)
    q, k, v = (ops.cast(x, "bfloat16") for x in _inputs())
    dot_product_attention(q, k, v, causal=True, implementation="fused")
    assert "cudnn" not in calls
