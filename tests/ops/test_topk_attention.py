"""`keras_attention.ops.topk_attention` (top-k sparse attention) against an
independent NumPy reference: outputs, log-sum-exp and gradients, the
package's masking rules, and results that do not depend on the tiles."""

import importlib

import keras
import numpy as np
import pytest
from harness import float64_enabled
from keras import ops

from keras_attention.ops.topk_attention import topk_attention

# The module (`keras_attention.ops.topk_attention` is the function).
topk_module = importlib.import_module("keras_attention.ops.topk_attention")

BACKEND = keras.backend.backend()


def np_(x):
    return ops.convert_to_numpy(x)


# The reference ---------------------------------------------------------------


def reference(q, k, v, indices, scale, allowed, d_out, d_lse):
    """Output, log-sum-exp `(b, h, i)` and the gradients of `sum(out *
    d_out) + sum(lse * d_lse)` (finite rows) w.r.t. q, k and v, from the
    formula in float64: each query's softmax over the keys its valid
    entries name (`allowed` `(b, i, k)`), zeros on rows with none."""
    q, k, v = (x.astype("float64") for x in (q, k, v))
    b, tq, h, _ = q.shape
    r = h // k.shape[2]
    out = np.zeros(q.shape[:3] + (v.shape[-1],))
    lse = np.full((b, h, tq), -np.inf)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for n in range(b):
        for i in range(tq):
            keys = indices[n, i][allowed[n, i]]
            if len(keys) == 0:
                continue
            for head in range(h):
                g = head // r
                kk, vv = k[n, keys, g], v[n, keys, g]
                s = scale * kk @ q[n, i, head]
                m = s.max()
                p = np.exp(s - m) / np.exp(s - m).sum()
                out[n, i, head] = p @ vv
                lse[n, head, i] = m + np.log(np.exp(s - m).sum())
                do = d_out[n, i, head].astype("float64")
                dp = vv @ do
                ds = p * (dp - p @ dp) + p * d_lse[n, head, i]
                dq[n, i, head] = scale * ds @ kk
                np.add.at(
                    dk[n, :, g], keys, scale * ds[:, None] * q[n, i, head]
                )
                np.add.at(dv[n, :, g], keys, p[:, None] * do)
    return out, lse, (dq, dk, dv)


def allowed_slots(
    indices, tk, causal=False, offset=0, qm=None, km=None, im=None
):
    """The NumPy rule of which entries may be attended to."""
    ok = (indices >= 0) & (indices < tk)
    if causal:
        ok &= indices <= (np.arange(indices.shape[1]) + offset)[None, :, None]
    if km is not None:
        ok &= np.take_along_axis(
            km,
            np.clip(indices, 0, tk - 1).reshape(indices.shape[0], -1),
            axis=1,
        ).reshape(indices.shape)
    if qm is not None:
        ok &= qm[..., None]
    if im is not None:
        ok &= im
    return ok


def distinct_indices(rng, b, tq, tk, top_k, missing=0.2):
    """Distinct key positions per query (some -1 or past the end)."""
    out = np.stack(
        [
            np.stack([rng.permutation(tk)[:top_k] for _ in range(tq)])
            for _ in range(b)
        ]
    )
    holes = rng.random(out.shape) < missing
    out[holes] = rng.choice([-1, tk, tk + 3], size=int(holes.sum()))
    return out.astype("int32")


# Gradients on each backend ---------------------------------------------------


def value_and_grads(fn, args, d_out, d_lse):
    """`fn(q, k, v) -> (out, lse)` and the gradients of `sum(out * d_out)
    + sum(where(finite, lse, 0) * d_lse)` w.r.t. q, k, v."""

    def loss_of(out, lse):
        finite = ops.isfinite(lse)
        lse0 = ops.where(finite, lse, ops.zeros_like(lse))
        d_o = ops.convert_to_tensor(d_out, out.dtype)
        d_l = ops.convert_to_tensor(d_lse, lse0.dtype)
        return ops.sum(ops.cast(out * d_o, "float64")) + ops.sum(
            ops.cast(lse0 * d_l, "float64")
        )

    if BACKEND == "jax":
        import jax

        def loss(*a):
            out, lse = fn(*a)
            return loss_of(out, lse), (out, lse)

        (_, (out, lse)), g = jax.jit(
            jax.value_and_grad(loss, (0, 1, 2), has_aux=True)
        )(*args)
        return np_(out), np_(lse), [np_(x) for x in g]
    if BACKEND == "torch":
        args = [ops.convert_to_tensor(a).requires_grad_(True) for a in args]
        out, lse = fn(*args)
        loss_of(out, lse).backward()
        return np_(out.detach()), np_(lse.detach()), [np_(a.grad) for a in args]
    import tensorflow as tf

    args = [tf.constant(a) for a in args]
    with tf.GradientTape() as tape:
        tape.watch(args)
        out, lse = fn(*args)
        loss = loss_of(out, lse)
    return np_(out), np_(lse), [np_(x) for x in tape.gradient(loss, args)]


def _case(seed, b=2, tq=7, tk=9, h=4, g=2, top_k=5, dtype="float32"):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(b, tq, h, 8)).astype(dtype)
    k = rng.normal(size=(b, tk, g, 8)).astype(dtype)
    v = rng.normal(size=(b, tk, g, 6)).astype(dtype)
    indices = distinct_indices(rng, b, tq, tk, top_k)
    d_out = rng.normal(size=(b, tq, h, 6)).astype(dtype)
    d_lse = rng.normal(size=(b, h, tq)).astype(dtype)
    return rng, (q, k, v), indices, d_out, d_lse


@pytest.mark.parametrize(
    "options",
    [
        dict(causal=True, offset=2, masks=True, query_block=3),
        # The backward's tiles (1 row) smaller than the forward's (8).
        dict(causal=False, offset=0, masks=False, query_block=None, small=1),
        # One key/value head for all four query heads (MQA).
        dict(causal=True, offset=0, masks=False, query_block=16, g=1),
        dict(causal=True, offset=2, masks=True, query_block=3, xla=True),
    ],
    ids=["causal-offset-masks-tiles", "plain", "causal-one-tile-mqa", "xla"],
)
def test_matches_numpy_reference_with_gradients(options, monkeypatch):
    if options.get("xla"):
        # The backward loop as large inputs run it on TensorFlow: compiled
        # with XLA (elsewhere the same loop as the first case).
        if BACKEND != "tensorflow":
            pytest.skip("XLA compiles the backward on TensorFlow only")
        monkeypatch.setattr(topk_module, "XLA_MIN_PAIRS", 0)
    if options.get("small"):
        for name in ("BACKWARD_TILE_ELEMENTS", "EAGER_BACKWARD_TILE_ELEMENTS"):
            monkeypatch.setattr(topk_module, name, 2**8)
    rng, (q, k, v), indices, d_out, d_lse = _case(0, g=options.get("g", 2))
    b, tq, tk = q.shape[0], q.shape[1], k.shape[1]
    qm = km = im = None
    if options["masks"]:
        qm = rng.random((b, tq)) > 0.2
        qm[0, 1] = False
        km = rng.random((b, tk)) > 0.3
        im = rng.random(indices.shape) > 0.2
        im[1, 3] = False  # a query with nothing to attend to
    allowed = allowed_slots(
        indices, tk, options["causal"], options["offset"], qm, km, im
    )
    assert allowed.any(axis=-1).sum() > 4
    assert not options["masks"] or not allowed[1, 3].any()
    scale = 0.4

    def fn(a, b_, c):
        return topk_attention(
            a,
            b_,
            c,
            indices,
            scale=scale,
            causal=options["causal"],
            query_offset=options["offset"],
            query_mask=qm,
            key_mask=km,
            index_mask=im,
            return_lse=True,
            query_block=options["query_block"],
        )

    out, lse, grads = value_and_grads(fn, (q, k, v), d_out, d_lse)
    want_out, want_lse, want_grads = reference(
        q, k, v, indices, scale, allowed, d_out, d_lse
    )
    np.testing.assert_allclose(out, want_out, atol=2e-5)
    np.testing.assert_array_equal(np.isfinite(lse), np.isfinite(want_lse))
    finite = np.isfinite(want_lse)
    np.testing.assert_allclose(lse[finite], want_lse[finite], atol=2e-5)
    for got, want in zip(grads, want_grads):
        assert np.all(np.isfinite(got))
        np.testing.assert_allclose(got, want, atol=5e-5)


def test_results_do_not_depend_on_the_tiles():
    _, (q, k, v), indices, _, _ = _case(1, tq=11)
    outs = [
        np_(topk_attention(q, k, v, indices, causal=True, query_block=n))
        for n in (1, 4, 11, 64)
    ]
    for out in outs[1:]:
        np.testing.assert_allclose(out, outs[0], atol=1e-6)


def test_gathers_in_tiles_of_queries():
    # The tile size: a power of two whose gathered keys and values fit the
    # budget, never more rows than the queries rounded up.
    rows = topk_module.query_block_size(16384, 256, 4, 128)
    assert rows * 256 * 4 * 128 <= topk_module.TILE_ELEMENTS
    assert rows & (rows - 1) == 0 and rows < 16384
    assert topk_module.query_block_size(5, 256, 4, 128) == 8
    assert topk_module.query_block_size(1, 2048, 1, 576) == 1


def test_float64_stays_float64():
    rng, (q, k, v), indices, d_out, d_lse = _case(2, dtype="float64")
    allowed = allowed_slots(indices, k.shape[1])
    with float64_enabled():
        out, lse = topk_attention(q, k, v, indices, return_lse=True, scale=0.3)
        out = np_(out)
    assert keras.backend.standardize_dtype(out.dtype) == "float64"
    assert keras.backend.standardize_dtype(lse.dtype) == "float64"
    want, want_lse, _ = reference(q, k, v, indices, 0.3, allowed, d_out, d_lse)
    np.testing.assert_allclose(out, want, atol=1e-12)


def test_low_precision_is_finite_and_close():
    # Outputs and gradients (the hand-written backward's, on every
    # backend) of float16 / bfloat16 inputs near float32's.
    _, (q, k, v), indices, d_out, d_lse = _case(3)

    def fn(a, b_, c):
        return topk_attention(a, b_, c, indices, return_lse=True)

    allowed = allowed_slots(indices, k.shape[1])
    scale = 8**-0.5
    full, _, full_grads = reference(
        q, k, v, indices, scale, allowed, d_out, d_lse
    )
    for dtype in ("float16", "bfloat16"):
        low = [np_(ops.cast(x, dtype)) for x in (q, k, v)]
        out, lse, grads = value_and_grads(fn, low, d_out, d_lse)
        assert keras.backend.standardize_dtype(out.dtype) == dtype
        assert keras.backend.standardize_dtype(lse.dtype) == "float32"
        out = out.astype("float32")
        np.testing.assert_allclose(out, full, atol=0.05)
        for got, want in zip(grads, full_grads):
            assert keras.backend.standardize_dtype(got.dtype) == dtype
            got = got.astype("float32")
            assert np.all(np.isfinite(got))
            np.testing.assert_allclose(got, want, atol=0.1, rtol=0.05)


def test_a_row_with_no_entry_is_zero():
    _, (q, k, v), _, d_out, d_lse = _case(4, b=1, tq=3)
    indices = np.array([[[-1, -1], [0, 9], [2, 2]]])

    def fn(a, b_, c):
        return topk_attention(a, b_, c, indices, return_lse=True)

    out, lse, grads = value_and_grads(fn, (q, k, v), d_out, d_lse)
    np.testing.assert_array_equal(out[0, 0], 0.0)
    assert np.all(np.isneginf(lse[0, :, 0]))
    # Past the end selects nothing: key 0 alone.
    np.testing.assert_allclose(out[0, 1], np.repeat(v[0, 0], 2, axis=0), 1e-6)
    # Zero gradients for the empty row, never NaN; the rest the formula's.
    np.testing.assert_array_equal(grads[0][0, 0], 0.0)
    allowed = allowed_slots(indices, k.shape[1])
    want = reference(q, k, v, indices, 8**-0.5, allowed, d_out, d_lse)[2]
    for got, want in zip(grads, want):
        assert np.all(np.isfinite(got))
        np.testing.assert_allclose(got, want, atol=5e-5)


def test_torch_keeps_residuals_alone_for_the_backward():
    # PyTorch runs the hand-written backward (`torch.autograd.Function`):
    # autograd keeps the inputs, the selected rows, the output and the
    # log-sum-exp, never a tile's gathered keys and values (`(b q g, k,
    # d)`, each larger here than everything kept) nor its scores. An
    # unused log-sum-exp gets zeros for its gradient; without gradients
    # the forward runs unrecorded.
    if BACKEND != "torch":
        pytest.skip("PyTorch's autograd")
    import torch

    rng = np.random.default_rng(9)
    q = rng.normal(size=(1, 8, 2, 8)).astype("float32")
    k = rng.normal(size=(1, 64, 2, 8)).astype("float32")
    v = rng.normal(size=(1, 64, 2, 8)).astype("float32")
    indices = distinct_indices(rng, 1, 8, 64, 32)
    d_out = rng.normal(size=q.shape).astype("float32")
    leaves = [torch.tensor(x, requires_grad=True) for x in (q, k, v)]
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out, lse = topk_attention(*leaves, indices, return_lse=True)
    tile = 8 * 2 * 32 * 8  # One tile of gathered keys.
    kept = q.size * 2 + k.size + v.size + indices.size * 2 + lse.numel()
    assert max(saved) < tile and sum(saved) <= kept, saved
    (out * torch.tensor(d_out)).sum().backward()  # `lse` unused
    allowed = allowed_slots(indices, 64)
    no_lse = np.zeros((1, 2, 8))
    want = reference(q, k, v, indices, 8**-0.5, allowed, d_out, no_lse)
    np.testing.assert_allclose(np_(out.detach()), want[0], atol=1e-5)
    for leaf, grad in zip(leaves, want[2]):
        np.testing.assert_allclose(np_(leaf.grad), grad, atol=5e-5)
    with torch.no_grad():
        plain = topk_attention(*leaves, indices)
    assert plain.grad_fn is None and not plain.requires_grad
    np.testing.assert_allclose(np_(plain), want[0], atol=1e-5)


def test_empty_lengths():
    _, (q, k, v), _, _, _ = _case(5)
    out, lse = topk_attention(
        q[:, :0], k, v, np.zeros((2, 0, 3), "int32"), return_lse=True
    )
    assert tuple(out.shape) == (2, 0, 4, 6) and tuple(lse.shape) == (2, 4, 0)
    out = topk_attention(q, k, v, np.zeros((2, 7, 0), "int32"))
    np.testing.assert_array_equal(np_(out), 0.0)


def test_array_likes_are_taken():
    _, (q, k, v), indices, _, _ = _case(6)
    want = np_(topk_attention(q, k, v, indices))
    got = topk_attention(q.tolist(), k.tolist(), v.tolist(), indices.tolist())
    np.testing.assert_allclose(np_(got), want, atol=1e-6)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(indices=np.zeros((2, 7), "int32")), ValueError, "indices.shape"),
        (dict(indices=np.zeros((2, 6, 3), "int32")), ValueError, "one row"),
        (dict(indices=np.zeros((2, 7, 3), "float32")), TypeError, "float32"),
        (dict(value=np.zeros((2, 9, 3, 6), "float32")), ValueError, "heads"),
        (dict(value=np.zeros((2, 8, 2, 6), "float32")), ValueError, "length"),
        (dict(query_block=0), ValueError, "query_block=0"),
        (dict(causal="yes"), ValueError, "causal='yes'"),
        (dict(scale=float("nan")), ValueError, "scale=nan"),
        (dict(key_mask=np.ones((2, 8), bool)), ValueError, r"\(2, 8\)"),
        (dict(index_mask=np.ones((2, 7), bool)), ValueError, "index_mask"),
    ],
)
def test_argument_errors_name_the_value(kwargs, error, match):
    _, (q, k, v), indices, _, _ = _case(7)
    arguments = dict(query=q, key=k, value=v, indices=indices)
    arguments.update(kwargs)
    with pytest.raises(error, match=match):
        topk_attention(**arguments)


@pytest.mark.tf_only("graph, XLA and unknown lengths are TensorFlow's")
def test_graphs_with_gradients_equal_eager_and_stay_rank_5():
    import tensorflow as tf
    from test_graph_rank import high_rank_tensors

    _, (q, k, v), indices, d_out, _ = _case(8, tq=9)

    def f(q, k, v, indices):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            out = topk_attention(q, k, v, indices, causal=True, query_block=4)
            loss = tf.reduce_sum(out * d_out)
        return (out,) + tuple(tape.gradient(loss, [q, k, v]))

    args = [tf.constant(x) for x in (q, k, v, indices)]
    eager = f(*args)
    dynamic = [tf.TensorSpec((None, None) + x.shape[2:], x.dtype) for x in args]
    runs = [
        tf.function(f, jit_compile=True),
        tf.function(f, input_signature=dynamic),  # one tile, length unknown
    ]
    for run in runs:
        for got, want in zip(run(*args), eager):
            np.testing.assert_allclose(np_(got), np_(want), atol=1e-5)
    # A mask of known length beside a query of unknown length.
    mask = np.ones((2, 9), bool)
    masked = tf.function(
        lambda q, k, i: topk_attention(q, k, k, i, query_mask=mask),
        input_signature=[dynamic[0], dynamic[1], dynamic[3]],
    )
    want = topk_attention(q, k, k, indices, query_mask=mask)
    np.testing.assert_allclose(
        np_(masked(args[0], args[1], args[3])), np_(want), atol=1e-6
    )
    graph = tf.function(f).get_concrete_function(*args).graph
    assert high_rank_tensors(graph) == []


def test_backward_accumulates_in_place_with_repeats_and_afresh():
    # `_backend.scatter_add`, the backward's accumulation of dK and dV:
    # repeated rows add up, and each run of a compiled loop starts from
    # its own zeros (TensorFlow adds into the buffer in place: a shared or
    # constant-folded zeros would carry the last run's sums).
    from keras_attention.ops import _backend

    rng = np.random.default_rng(0)
    ids = np.array([[0, 3, 0, 4], [4, 4, 1, 0]], "int32")
    updates = rng.normal(size=(2, 4, 3)).astype("float32")
    want = np.zeros((5, 3))
    for step in range(2):
        np.add.at(want, ids[step], updates[step])

    def run(ids, updates):
        def body(i, acc):
            return _backend.scatter_add(acc, ids[i], updates[i])

        acc = _backend.zeros_accumulator((5, 3), "float32")
        return ops.fori_loop(0, 2, body, acc)

    runs = [run]
    if BACKEND == "tensorflow":
        import tensorflow as tf

        runs += [tf.function(run), tf.function(run, jit_compile=True)]
    if BACKEND == "jax":
        import jax

        runs.append(jax.jit(run))
    args = (ops.convert_to_tensor(ids), ops.convert_to_tensor(updates))
    for f in runs:
        for _ in range(2):
            np.testing.assert_allclose(np_(f(*args)), want, atol=1e-6)
    if BACKEND == "torch":
        # In place in PyTorch's eager loop (Keras's `slice_update` and an
        # `index_add` copy the whole buffer at every step).
        acc = _backend.zeros_accumulator((5, 3), "float32")
        assert _backend.scatter_add(acc, args[0][0], args[1][0]) is acc
        buffer = ops.zeros((2, 5, 3))
        tile = ops.convert_to_tensor(want[None], "float32")
        assert _backend.write_slice(buffer, (1, 0, 0), tile) is buffer
        np.testing.assert_array_equal(
            np_(buffer), [np.zeros((5, 3)), np_(tile)[0]]
        )


def test_the_paths_table_lists_it():
    from keras_attention.ops import paths

    path = paths.PATHS["topk"]
    assert path.op is topk_attention and path.run is None
    assert "indices" in path.can_run(None)
    assert "topk" not in paths.op_level_paths()  # a request has no indices
