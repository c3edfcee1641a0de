"""float64 against float64 NumPy at 1e-12, every op that takes float64,
under Hypothesis.

Draws: the key dim (3 to 8: scales `1 / sqrt(d)` that are no float32,
and 4, whose scale is), a scale given as a Python float or the default,
the lengths, heads, `causal`, key padding (whole rows at times), and per
op: `dot_product_attention` on the dense, blockwise (drawn tiles) and
fused paths, with the log-sum-exp and sink logits given as Python
floats; `local_attention` (drawn window, sinks); `merge_attention` of
a drawn split of the keys (sinks as Python floats); `linear_attention`
(chunk size, feature map, normalised form, decays); `gated_delta_rule`
(chunk size, decays, write strengths).

Property: the output (and log-sum-exp, final state) equals a float64
NumPy reference to 1e-12 relative and absolute (a constant that passes
through float32 on the way, as `ops.cast(<python float>, "float64")`
does on TensorFlow, is ~1e-8 off; `tests/ops/test_float64_constants.py`
has the fixed cases).

Cost: tiny shapes; on JAX every draw compiles anew (new shapes): a
third of the profile's draws there, each call one `jax.jit`.
"""

import gated_delta_reference as gdr
import keras
import linear_attention_reference as lar
import numpy as np
from harness import float64_enabled
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from keras import ops

import keras_attention as ka
from keras_attention.ops.attention import implementation_scope

BACKEND = keras.backend.backend()
DRAWS = settings(
    max_examples=max(
        3, settings.default.max_examples // (3 if BACKEND == "jax" else 1)
    ),
    deadline=None,
)
TOL = 1e-12


def np_(x):
    return np.asarray(ops.convert_to_numpy(x))


def run(fn, *arrays):
    """`fn(*arrays)` as NumPy (a tuple for several results), on JAX as
    one jitted call, float64 enabled."""
    with float64_enabled():
        if BACKEND == "jax":
            import jax

            result = jax.jit(fn)(*arrays)
        else:
            result = fn(*arrays)
    if isinstance(result, (tuple, list)):
        return tuple(np_(x) for x in result)
    return np_(result)


def close(got, want):
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=TOL, atol=TOL)


def np_softmax_attention(q, k, v, allowed, scale=None, sinks=None):
    """`(output (b, i, h, e), lse (b, h, i))`, float64: softmax over the
    `allowed` pairs (broadcast to `(b, h, i, j)`) and the sinks; a row
    with nothing: zeros, `lse = -inf` (the sink's logit with sinks)."""
    r = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, r, axis=2), np.repeat(v, r, axis=2)
    if scale is None:
        scale = 1.0 / np.sqrt(q.shape[-1])
    s = np.einsum("bihd,bjhd->bhij", q, k) * scale
    allowed = np.broadcast_to(allowed, s.shape)
    if sinks is not None:
        z = np.broadcast_to(np.asarray(sinks)[None, :, None, None], s.shape)
        s = np.concatenate([s, z[..., :1]], axis=-1)
        allowed = np.concatenate([allowed, np.ones_like(allowed[..., :1])], -1)
    s = np.where(allowed, s, -np.inf)
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


@st.composite
def common(draw, grouped=True):
    """Shapes, inputs (float64 NumPy), a scale and key padding."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    b = draw(st.sampled_from([1, 2]))
    t = draw(st.integers(1, 10))
    g = draw(st.sampled_from([1, 2]))
    h = g * (draw(st.sampled_from([1, 2])) if grouped else 1)
    d = draw(st.integers(3, 8), label="key_dim")
    q = rng.normal(size=(b, t, h, d))
    k = rng.normal(size=(b, t, g, d))
    v = rng.normal(size=(b, t, g, draw(st.integers(1, 3))))
    mask = rng.uniform(size=(b, t)) < draw(st.sampled_from([0.0, 0.5, 1.0]))
    mask |= draw(st.booleans())
    scale = draw(st.sampled_from([None, 0.1, 0.3, 1.7]), label="scale")
    return dict(rng=rng, q=q, k=k, v=v, mask=mask, scale=scale, t=t)


@DRAWS
@given(
    common(),
    st.sampled_from(["dense", "blockwise", "fused"]),
    st.booleans(),
    st.booleans(),
    st.integers(1, 6),
    st.integers(1, 6),
)
def test_dot_product_attention(p, path, causal, sinks, tile_q, tile_k):
    q, k, v, mask, scale = p["q"], p["k"], p["v"], p["mask"], p["scale"]
    sinks = p["rng"].normal(size=q.shape[2]).tolist() if sinks else None
    sinks = None if path == "fused" else sinks
    options = {}
    if path == "blockwise":
        options = dict(query_block=tile_q, key_block=tile_k)

    def fn(q, k, v, mask):
        with implementation_scope(path, **options):
            return ka.ops.dot_product_attention(
                q,
                k,
                v,
                causal=causal,
                key_mask=mask,
                scale=scale,
                sink_logits=sinks,
                return_lse=True,
            )

    out, lse = run(fn, q, k, v, mask)
    t = p["t"]
    allowed = mask[:, None, None, :]
    if causal:
        allowed = allowed & np.tri(t, dtype=bool)[None, None]
    want, want_lse = np_softmax_attention(q, k, v, allowed, scale, sinks)
    close(out, want)
    close(lse, want_lse)


@DRAWS
@given(
    common(),
    st.integers(0, 4),
    st.integers(0, 4),
    st.integers(1, 5),
    st.booleans(),
)
def test_local_attention(p, left, right, block, sinks):
    q, k, v, mask, scale = p["q"], p["k"], p["v"], p["mask"], p["scale"]
    sinks = p["rng"].normal(size=q.shape[2]).tolist() if sinks else None

    def fn(q, k, v, mask):
        return ka.ops.local_attention(
            q,
            k,
            v,
            window_size=(left, right),
            key_mask=mask,
            scale=scale,
            block_size=min(block, p["t"]),
            sink_logits=sinks,
            return_lse=True,
        )

    out, lse = run(fn, q, k, v, mask)
    steps = np.arange(p["t"])
    offset = steps[None, :] - steps[:, None]
    band = (offset >= -left) & (offset <= right)
    allowed = band[None, None] & mask[:, None, None, :]
    want, want_lse = np_softmax_attention(q, k, v, allowed, scale, sinks)
    close(out, want)
    close(lse, want_lse)


@DRAWS
@given(common(), st.data())
def test_merge_attention(p, data):
    """Keys split in two (each part on the dense path, with its
    log-sum-exp), merged: one call over all the keys."""
    q, k, v, mask, scale = p["q"], p["k"], p["v"], p["mask"], p["scale"]
    cut = data.draw(st.integers(1, max(1, p["t"] - 1)), label="cut")
    sinks = None
    if data.draw(st.booleans(), label="sinks"):
        sinks = p["rng"].normal(size=q.shape[2]).tolist()

    def fn(q, k, v, mask):
        outs, lses = [], []
        for lo, hi in ((0, cut), (cut, p["t"])):
            with implementation_scope("dense"):
                o, s = ka.ops.dot_product_attention(
                    q,
                    k[:, lo:hi],
                    v[:, lo:hi],
                    key_mask=mask[:, lo:hi],
                    scale=scale,
                    return_lse=True,
                )
            outs.append(o)
            lses.append(s)
        return ka.ops.merge_attention(outs, lses, sink_logits=sinks)

    out, lse = run(fn, q, k, v, mask)
    allowed = mask[:, None, None, :]
    want, want_lse = np_softmax_attention(q, k, v, allowed, scale, sinks)
    close(out, want)
    close(lse, want_lse)


@DRAWS
@given(
    common(grouped=False),
    st.sampled_from([None, 1, 2, 3, 4, 16]),
    st.sampled_from(["elu_plus_one", "relu", "identity"]),
    st.booleans(),
    st.sampled_from([True, True, False]),
)
def test_linear_attention(p, chunk_size, feature_map, normalize, causal):
    q, k, v, mask = p["q"], p["k"], p["v"], p["mask"]
    normalize = normalize and feature_map != "identity"
    decay = None
    if causal:
        decay = -p["rng"].uniform(0, 2, size=q.shape[:3])

    def fn(q, k, v, mask, *decays):
        out, state = ka.ops.linear_attention(
            q,
            k,
            v,
            feature_map=feature_map,
            causal=causal,
            decay=decays[0] if decays else None,
            chunk_size=chunk_size,
            key_mask=mask,
            normalize=normalize,
            return_state=True,
        )
        return out, state[0] if normalize else state

    decays = () if decay is None else (decay,)
    out, state = run(fn, q, k, v, mask, *decays)
    want, want_state, _ = lar.linear_attention(
        q,
        k,
        v,
        feature_map=feature_map,
        causal=causal,
        decay=decay,
        key_mask=mask,
        normalize=normalize,
    )
    close(out, want)
    if causal:
        close(state, want_state)


@DRAWS
@given(common(grouped=False), st.sampled_from([None, 1, 2, 3, 4, 16]))
def test_gated_delta_rule(p, chunk_size):
    q, k, v, mask = p["q"], p["k"], p["v"], p["mask"]
    k = k / np.linalg.norm(k, axis=-1, keepdims=True)
    rng = p["rng"]
    hv = 2 * q.shape[2]
    v = rng.normal(size=v.shape[:2] + (hv, v.shape[-1]))
    g = -rng.uniform(0, 2, size=v.shape[:3])
    beta = rng.uniform(0.05, 0.95, size=v.shape[:3])

    def fn(q, k, v, g, beta, mask):
        return ka.ops.gated_delta_rule(
            q,
            k,
            v,
            g,
            beta,
            chunk_size=chunk_size,
            key_mask=mask,
            return_state=True,
        )

    out, state = run(fn, q, k, v, g, beta, mask)
    want, want_state = gdr.gated_delta_rule(q, k, v, g, beta, key_mask=mask)
    close(out, want)
    close(state, want_state)
