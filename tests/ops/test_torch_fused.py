"""The fused path on the PyTorch backend: `keras.ops.dot_product_attention`
(PyTorch's `scaled_dot_product_attention`, fused CPU kernels) chosen
automatically when no weights or dropout are requested, against a NumPy
reference and the dense path: padding, causal, combined masks, grouped-query
attention, fully masked rows (zeros, never NaN; finite gradients), and the
masks it hands to the kernel (structural where possible)."""

import keras
import numpy as np
import pytest
from keras import ops
from references import masked_softmax as np_masked_softmax

import keras_attention
from keras_attention.ops.attention import dot_product_attention
from keras_attention.ops.attention import memory_efficient_implementation

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "torch",
    reason="tests the PyTorch backend's fused path (KERAS_BACKEND=torch)",
)

RNG = np.random.default_rng(0)


def np_attention(q, k, v, mask):
    """softmax(q k^T / sqrt(d)) v; q (b,i,h,d), k/v (b,j,g,.), mask
    broadcastable to (b,h,i,j); rows with no key give zeros."""
    h, g = q.shape[2], k.shape[2]
    k, v = np.repeat(k, h // g, axis=2), np.repeat(v, h // g, axis=2)
    scores = np.einsum("bihd,bjhd->bhij", q, k) / np.sqrt(q.shape[-1])
    weights = np_masked_softmax(scores, np.broadcast_to(mask, scores.shape))
    return np.einsum("bhij,bjhe->bihe", weights, v)


def inputs(b=2, tq=11, tk=11, h=4, g=4, d=8, e=8):
    return (
        RNG.normal(size=(b, tq, h, d)).astype("float32"),
        RNG.normal(size=(b, tk, g, d)).astype("float32"),
        RNG.normal(size=(b, tk, g, e)).astype("float32"),
    )


def value_and_grads(fn, args):
    """`fn(*args)` and the gradients of `sum(sin(y) * y)` (NumPy)."""
    import torch

    args = [torch.tensor(a, requires_grad=True) for a in args]
    y = fn(*args)
    torch.sum(torch.sin(y) * y).backward()
    return y.detach().numpy(), [a.grad.numpy() for a in args]


class KernelCalls:
    """Records the calls `dot_product_attention` makes to
    `keras.ops.dot_product_attention` (the fused kernel)."""

    def __init__(self, monkeypatch):
        self.calls = []
        original = keras.ops.dot_product_attention

        def spy(*args, **kwargs):
            mask = kwargs.get("mask")
            self.calls.append(
                dict(
                    is_causal=kwargs.get("is_causal", False),
                    mask_shape=None if mask is None else tuple(mask.shape),
                )
            )
            return original(*args, **kwargs)

        monkeypatch.setattr(keras.ops, "dot_product_attention", spy)


def padding_masks(b, tq, tk):
    key_padding = np.ones((b, tk), bool)
    key_padding[0, -3:] = False
    key_padding[1, :2] = False
    query_padding = np.ones((b, tq), bool)
    query_padding[1, -4:] = False
    return key_padding, query_padding


@pytest.mark.parametrize(
    "case",
    [
        "key_padding",
        "query_padding",
        "causal",
        "causal_query_padding",
        "causal_key_padding",
        "causal_offset",
        "dense_mask",
        "all_combined",
    ],
)
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (4, 1)], ids=str)
def test_fused_matches_numpy_and_dense_gradients(case, heads):
    h, g = heads
    tq, tk = (7, 11) if case == "causal_offset" else (11, 11)
    q, k, v = inputs(tq=tq, tk=tk, h=h, g=g)
    key_padding, query_padding = padding_masks(2, tq, tk)
    kwargs = {}
    expected = np.ones((2, h, tq, tk), bool)
    if "causal" in case or case == "all_combined":
        offset = 4 if case == "causal_offset" else 0
        kwargs.update(is_causal=True, causal_offset=offset)
        expected &= np.arange(tk)[None, :] <= np.arange(tq)[:, None] + offset
    if case in ("key_padding", "causal_key_padding", "all_combined"):
        kwargs["key_padding"] = key_padding
        expected &= key_padding[:, None, None, :]
    if case in ("query_padding", "causal_query_padding", "all_combined"):
        kwargs["query_padding"] = query_padding
        expected &= query_padding[:, None, :, None]
    if case in ("dense_mask", "all_combined"):
        mask = RNG.random((2, h, tq, tk)) > 0.3
        mask[0, 1, 2] = False  # a fully masked row
        kwargs["mask"] = mask
        expected &= mask

    def run(impl):
        return lambda a, b, c: dot_product_attention(
            a, b, c, implementation=impl, **kwargs
        )

    out, grads = value_and_grads(run(None), (q, k, v))  # automatic: fused
    np.testing.assert_allclose(out, np_attention(q, k, v, expected), atol=1e-5)
    ref_out, ref_grads = value_and_grads(run("dense"), (q, k, v))
    np.testing.assert_allclose(out, ref_out, atol=1e-5)
    for got, want in zip(grads, ref_grads):
        assert np.all(np.isfinite(got))
        np.testing.assert_allclose(got, want, atol=1e-4)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_fully_masked_rows_give_zeros_not_nan(dtype):
    q, k, v = inputs(b=1, tq=6, tk=5)
    # Through Keras, the kernel gets an additive mask: a row that may
    # attend to nothing gets uniform weights (the mean value), not zeros
    # (torch's own boolean mask gives NaN or zeros depending on the kernel).
    raw = keras.ops.dot_product_attention(
        q, k, v, mask=np.zeros((1, 1, 6, 5), bool)
    )
    expected = np.repeat(v.mean(axis=1, keepdims=True), 6, axis=1)
    np.testing.assert_allclose(ops.convert_to_numpy(raw), expected, atol=1e-5)
    cast = [ops.convert_to_numpy(ops.cast(x, "float32")) for x in (q, k, v)]

    def attend(**kwargs):
        return lambda a, b, c: ops.cast(
            dot_product_attention(
                *(ops.cast(x, dtype) for x in (a, b, c)),
                implementation="fused",
                **kwargs,
            ),
            "float32",
        )

    no_key = np.zeros((1, 5), bool)
    out, grads = value_and_grads(attend(key_padding=no_key), cast)
    np.testing.assert_array_equal(out, 0.0)
    for grad in grads:
        np.testing.assert_array_equal(grad, 0.0)
    # Causal with a negative offset: the first two queries see no key.
    out, grads = value_and_grads(attend(is_causal=True, causal_offset=-2), cast)
    np.testing.assert_array_equal(out[:, :2], 0.0)
    assert np.all(np.abs(out[:, 2:]) > 0)
    assert all(np.all(np.isfinite(grad)) for grad in grads)
    # A dense mask with one empty row in one head only.
    mask = np.ones((1, 4, 6, 5), bool)
    mask[0, 2, 3] = False
    out, grads = value_and_grads(attend(mask=mask), cast)
    np.testing.assert_array_equal(out[0, 3, 2], 0.0)
    assert np.all(np.abs(out[0, 3, :2]) > 0)
    assert all(np.all(np.isfinite(grad)) for grad in grads)


def test_the_automatic_choice_is_fused_without_weights_or_dropout(
    monkeypatch,
):
    spy = KernelCalls(monkeypatch)
    q, k, v = inputs(tq=300, tk=300)  # blockwise on TensorFlow and JAX
    assert memory_efficient_implementation() == "fused"
    dot_product_attention(q, k, v)
    dot_product_attention(q[:, :3], k[:, :3], v[:, :3])  # small too
    assert len(spy.calls) == 2
    # Weights or dropout: the dense path, the kernel is not called.
    dot_product_attention(q, k, v, return_weights=True)
    dot_product_attention(q, k, v, dropout_fn=lambda w: w)
    assert len(spy.calls) == 2


def test_masks_stay_structural(monkeypatch):
    spy = KernelCalls(monkeypatch)
    q, k, v = inputs(tq=9, tk=9)
    key_padding, query_padding = padding_masks(2, 9, 9)
    # Causal (with or without query padding): is_causal, no mask at all.
    dot_product_attention(q, k, v, is_causal=True)
    dot_product_attention(q, k, v, is_causal=True, query_padding=query_padding)
    # Key padding: a (b, 1, 1, j) mask, never (b, h, i, j).
    dot_product_attention(q, k, v, key_padding=key_padding)
    # Causal with key padding cannot be structural in the kernel.
    dot_product_attention(q, k, v, is_causal=True, key_padding=key_padding)
    assert spy.calls == [
        dict(is_causal=True, mask_shape=None),
        dict(is_causal=True, mask_shape=None),
        dict(is_causal=False, mask_shape=(2, 1, 1, 9)),
        dict(is_causal=False, mask_shape=(2, 1, 9, 9)),
    ]


def test_layer_uses_the_fused_path_and_matches_dense(monkeypatch):
    layer = keras_attention.layers.MultiHeadAttention(
        num_heads=4, key_dim=8, num_key_value_heads=2, dropout=0.1
    )
    x = RNG.normal(size=(2, 10, 16)).astype("float32")
    mask = np.ones((2, 10), bool)
    mask[1, 6:] = False
    call = dict(query_mask=mask, value_mask=mask, use_causal_mask=True)
    with keras_attention.ops.implementation_scope("dense"):
        expected = ops.convert_to_numpy(layer(x, x, **call))
    spy = KernelCalls(monkeypatch)
    out = ops.convert_to_numpy(layer(x, x, **call))
    assert len(spy.calls) == 1
    np.testing.assert_allclose(out, expected, atol=1e-5)
    layer(x, x, training=True, **call)  # dropout on the weights: dense
    layer(x, x, return_attention_scores=True, **call)
    assert len(spy.calls) == 1
