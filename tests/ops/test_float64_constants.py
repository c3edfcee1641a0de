"""float64 stays float64 through the ops' constants.

Every op that takes float64 inputs equals a float64 NumPy reference to
1e-12, with `key_dim=8`: its scale `1 / sqrt(8)` is no float32, so a
constant that passes through float32 (`ops.cast(<python float>,
"float64")` does on TensorFlow: `ops.cast(0.1, "float64") - 0.1` is
1.5e-9) shows as a relative error of ~1.5e-8 (`key_dim=4`, whose scale
0.5 is exact in float32, hides it). Ops: `dot_product_attention` on the
dense, blockwise and fused paths (output and log-sum-exp, and with
learned sinks), `local_attention`, `global_local_attention`,
`merge_attention`, `linear_attention` (chunked, recurrent, normalised,
global) and `gated_delta_rule` (chunked, recurrent). Random layouts:
`tests/properties/test_float64_property.py`.
"""

import gated_delta_reference as gdr
import keras
import linear_attention_reference as lar
import numpy as np
import pytest
from harness import float64_enabled
from keras import ops

import keras_attention as ka
from keras_attention.ops.attention import implementation_scope

BACKEND = keras.backend.backend()
RNG = np.random.default_rng(53)
B, T, H, G, D = 2, 9, 4, 2, 8
TOL = 1e-12


def np_(x):
    return np.asarray(ops.convert_to_numpy(x))


@pytest.fixture(autouse=True)
def x64():
    with float64_enabled():
        yield


def inputs(t=T, h=H, g=G, d=D, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(B, t, h, d))
    k = rng.normal(size=(B, t, g, d))
    v = rng.normal(size=(B, t, g, 3))
    return q, k, v


def np_softmax_attention(q, k, v, allowed, scale=None, sinks=None):
    """`(output (b, i, h, e), lse (b, h, i))` of softmax attention over
    the `allowed` pairs `(b|1, 1, i, j)`, float64; a row with no allowed
    key: zeros and `lse = -inf` (the sink's logit with sinks)."""
    r = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, r, axis=2), np.repeat(v, r, axis=2)
    if scale is None:
        scale = 1.0 / np.sqrt(q.shape[-1])
    s = np.einsum("bihd,bjhd->bhij", q, k) * scale
    allowed = np.broadcast_to(allowed, s.shape)
    s = np.where(allowed, s, -np.inf)
    if sinks is not None:
        z = np.broadcast_to(np.asarray(sinks)[None, :, None, None], s.shape)
        s = np.concatenate([s, z[..., :1]], axis=-1)
        allowed = np.concatenate([allowed, np.ones_like(allowed[..., :1])], -1)
    m = np.max(s, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.where(allowed, np.exp(s - m), 0.0)
    total = e.sum(-1, keepdims=True)
    w = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    with np.errstate(divide="ignore"):
        lse = (np.log(total) + m)[..., 0]
    if sinks is not None:
        w = w[..., :-1]
    return np.einsum("bhij,bjhe->bihe", w, v), lse


KEY_MASK = np.ones((B, T), bool)
KEY_MASK[1, :3] = False  # the first rows of example 1 attend to nothing


def causal_allowed(t=T, key_mask=KEY_MASK):
    steps = np.arange(t)
    return (steps[:, None] >= steps[None, :])[None, None] & key_mask[
        :, None, None, :
    ]


def close(got, want):
    got = np_(got)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=TOL, atol=TOL)


@pytest.mark.parametrize("path", ["dense", "blockwise", "fused"])
def test_dot_product_attention(path):
    q, k, v = inputs()
    options = dict(query_block=4, key_block=4) if path == "blockwise" else {}
    with implementation_scope(path, **options):
        out, lse = ka.ops.dot_product_attention(
            q, k, v, causal=True, key_mask=KEY_MASK, return_lse=True
        )
    want, want_lse = np_softmax_attention(q, k, v, causal_allowed())
    close(out, want)
    close(lse, want_lse)


@pytest.mark.parametrize("path", ["dense", "blockwise"])
def test_dot_product_attention_given_scale_and_sinks(path):
    """A scale and sink logits given as Python floats."""
    q, k, v = inputs()
    sinks = [0.1, -0.7, 1.3, 0.3]
    with implementation_scope(path):
        out, lse = ka.ops.dot_product_attention(
            q, k, v, causal=True, scale=0.3, sink_logits=sinks, return_lse=True
        )
    allowed = causal_allowed(key_mask=np.ones((B, T), bool))
    want, want_lse = np_softmax_attention(
        q, k, v, allowed, scale=0.3, sinks=sinks
    )
    close(out, want)
    close(lse, want_lse)


@pytest.mark.parametrize("sinks", [None, [0.1, -0.7, 1.3, 0.3]])
def test_local_attention(sinks):
    q, k, v = inputs(g=H)
    out, lse = ka.ops.local_attention(
        q,
        k,
        v,
        window_size=3,
        block_size=4,
        key_mask=KEY_MASK,
        sink_logits=sinks,
        return_lse=True,
    )
    steps = np.arange(T)
    band = np.abs(steps[:, None] - steps[None, :]) <= 3
    allowed = band[None, None] & KEY_MASK[:, None, None, :]
    want, want_lse = np_softmax_attention(q, k, v, allowed, sinks=sinks)
    close(out, want)
    close(lse, want_lse)


def test_global_local_attention():
    q, k, v = inputs(g=H)
    is_global = np.zeros((B, T), bool)
    is_global[:, 0] = is_global[0, 6] = True
    out = ka.ops.global_local_attention(
        q, k, v, window_size=2, global_mask=is_global, block_size=4
    )
    steps = np.arange(T)
    band = (np.abs(steps[:, None] - steps[None, :]) <= 2)[None]
    allowed = band | is_global[:, :, None] | is_global[:, None, :]
    want, _ = np_softmax_attention(q, k, v, allowed[:, None])
    close(out, want)


def test_merge_attention():
    """Two key sets attended apart (dense path) and merged, with sink
    logits given as Python floats, equal one call over all the keys."""
    q, k, v = inputs()
    parts = []
    with implementation_scope("dense"):
        for lo, hi in ((0, 4), (4, T)):
            parts.append(
                ka.ops.dot_product_attention(
                    q, k[:, lo:hi], v[:, lo:hi], return_lse=True
                )
            )
    sinks = [0.1, -0.7, 1.3, 0.3]
    out, lse = ka.ops.merge_attention(
        [o for o, _ in parts], [s for _, s in parts], sink_logits=sinks
    )
    allowed = np.ones((1, 1, T, T), bool)
    want, want_lse = np_softmax_attention(q, k, v, allowed, sinks=sinks)
    close(out, want)
    close(lse, want_lse)


LINEAR_CASES = [
    dict(chunk_size=4),
    dict(chunk_size=None),
    dict(chunk_size=4, normalize=True),
    dict(chunk_size=4, causal=False),
]


@pytest.mark.parametrize(
    "options",
    LINEAR_CASES,
    ids=["chunked", "recurrent", "normalized", "global"],
)
def test_linear_attention(options):
    q, k, v = inputs(g=H)
    causal = options.get("causal", True)
    decay = None
    if causal:
        decay = np.log(np.random.default_rng(1).uniform(0.5, 1, (B, T, H)))
    out, state = ka.ops.linear_attention(
        q, k, v, decay=decay, key_mask=KEY_MASK, return_state=True, **options
    )
    kwargs = {x: y for x, y in options.items() if x != "chunk_size"}
    want, want_state, _ = lar.linear_attention(
        q, k, v, decay=decay, key_mask=KEY_MASK, **kwargs
    )
    close(out, want)
    if causal:
        close(state[0] if options.get("normalize") else state, want_state)


@pytest.mark.parametrize("chunk_size", [4, None], ids=["chunked", "recurrent"])
def test_gated_delta_rule(chunk_size):
    q, k, _ = inputs(h=2, g=2)
    k = k / np.linalg.norm(k, axis=-1, keepdims=True)
    rng = np.random.default_rng(2)
    v = rng.normal(size=(B, T, 4, 3))
    g = np.log(rng.uniform(0.5, 1.0, size=(B, T, 4)))
    beta = rng.uniform(0.1, 0.9, size=(B, T, 4))
    out, state = ka.ops.gated_delta_rule(
        q,
        k,
        v,
        g,
        beta,
        chunk_size=chunk_size,
        key_mask=KEY_MASK,
        return_state=True,
    )
    want, want_state = gdr.gated_delta_rule(q, k, v, g, beta, key_mask=KEY_MASK)
    close(out, want)
    close(state, want_state)
