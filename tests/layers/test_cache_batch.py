"""A cache built for another batch size is refused before any
computation, with a `ValueError` naming the cache and both batch sizes
(it used to die in a backend error: TensorFlow's `InvalidArgumentError`
from a batched matrix product, or, for `LinearAttention`, a message
about the op's `initial_state`), on every layer that takes a cache; a
cache of the inputs' batch size still runs, and a batch size unknown at
trace time is not compared."""

import keras
import numpy as np
import pytest

from keras_attention import blocks
from keras_attention import layers as L

B, WRONG = 2, 3
RNG = np.random.default_rng(0)
STEP = RNG.normal(size=(B, 1, 8)).astype("float32")
MEMORY = RNG.normal(size=(B, 5, 8)).astype("float32")


def _zeros(*shape):
    return np.zeros(shape, "float32")


def _built(layer, *inputs):
    layer(*inputs)
    return layer


def _cross(batch):
    layer = _built(L.CrossAttention(2, 4), STEP, MEMORY)
    return lambda: layer(STEP, None, cache=_zeros(batch, 2, 5, 2, 4))


# (id, call(batch) -> a function calling the layer with a cache of that
# batch size, for inputs of batch size B; the name the error gives).
CASES = [
    (
        "mha-cache-update-index",
        lambda b: (
            lambda: L.MultiHeadAttention(2, 4)(
                STEP, STEP, cache=_zeros(b, 2, 6, 2, 4), cache_update_index=2
            )
        ),
        "cache",
    ),
    (
        "mha-precomputed",
        lambda b: (
            lambda: L.MultiHeadAttention(2, 4, num_key_value_heads=1)(
                STEP, STEP, cache=_zeros(b, 2, 6, 1, 4)
            )
        ),
        "cache",
    ),
    (
        "mha-rolling",
        lambda b: (
            lambda: L.MultiHeadAttention(2, 4, sliding_window=2)(
                STEP,
                STEP,
                cache=_zeros(b, 2, 6, 2, 4),
                cache_update_index=2,
                cache_sink_tokens=1,
                use_causal_mask=True,
            )
        ),
        "cache",
    ),
    (
        "local-self-attention",
        lambda b: (
            lambda: L.LocalSelfAttention(2, 4, 2, causal=True)(
                STEP, cache=_zeros(b, 2, 6, 2, 4), cache_update_index=2
            )
        ),
        "cache",
    ),
    ("cross-attention-precomputed", _cross, "cache"),
    (
        "decoder-block",
        lambda b: (
            lambda: blocks.TransformerDecoderBlock(
                2, 16, cross_attention=False
            )(
                STEP,
                self_attention_cache=_zeros(b, 2, 6, 2, 4),
                self_attention_cache_update_index=2,
            )
        ),
        "cache",
    ),
    (
        "multi-head-latent-attention",
        lambda b: (
            lambda: L.MultiHeadLatentAttention(2, 4, 2, 2, 3)(
                STEP, cache=_zeros(b, 6, 6), cache_update_index=2
            )
        ),
        "cache",
    ),
    (
        "linear-attention",
        lambda b: (
            lambda: L.LinearAttention(2, 4)(
                STEP, cache=_zeros(b, 2, 4, 4), use_causal_mask=True
            )
        ),
        "cache",
    ),
    (
        "gated-delta-net-conv-state",
        lambda b: (
            lambda: L.GatedDeltaNet(8, 1, 2, 4, 3)(
                STEP, cache=(_zeros(b, 3, 14), _zeros(B, 2, 4, 3))
            )
        ),
        r"cache\[0\]",
    ),
    (
        "gated-delta-net-recurrent-state",
        lambda b: (
            lambda: L.GatedDeltaNet(8, 1, 2, 4, 3)(
                STEP, cache=(_zeros(B, 3, 14), _zeros(b, 2, 4, 3))
            )
        ),
        r"cache\[1\]",
    ),
]


@pytest.mark.parametrize(
    "name,call,cache_name", CASES, ids=[c[0] for c in CASES]
)
def test_cache_of_another_batch_is_refused_naming_both_sizes(
    name, call, cache_name
):
    call(B)()  # The inputs' batch size runs.
    with pytest.raises(
        ValueError,
        match=f"`{cache_name}` has batch size {WRONG} and `.*` batch size {B}",
    ):
        call(WRONG)()


@pytest.mark.parametrize(
    "shape",
    [(B, 3, 6, 2, 4), (B, 2, 6, 1, 4), (B, 2, 6, 2, 5), (B, 6, 2, 4)],
    ids=["three-parts", "heads", "width", "rank"],
)
def test_multi_head_attention_refuses_a_cache_of_another_shape(shape):
    """The other axes of a key/value cache are checked too (a cache of
    three parts on axis 1 used to run silently, a wrong width or head
    count died in the backend)."""
    with pytest.raises(ValueError, match=r"`cache` must have shape"):
        L.MultiHeadAttention(2, 4)(
            STEP, STEP, cache=_zeros(*shape), cache_update_index=2
        )


@pytest.mark.tf_only("a symbolic batch size: a tf.function's None axis")
def test_unknown_batch_size_is_not_compared():
    import tensorflow as tf

    layer = L.MultiHeadAttention(2, 4)
    cache = _zeros(B, 2, 6, 2, 4)

    @tf.function(
        input_signature=[
            tf.TensorSpec((None, 1, 8)),
            tf.TensorSpec((None, 2, 6, 2, 4)),
        ]
    )
    def step(x, cache):
        return layer(x, x, cache=cache, cache_update_index=2)

    out, _ = step(STEP, cache)
    expected, _ = layer(STEP, STEP, cache=cache, cache_update_index=2)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(out),
        keras.ops.convert_to_numpy(expected),
        rtol=1e-6,
        atol=1e-6,
    )
