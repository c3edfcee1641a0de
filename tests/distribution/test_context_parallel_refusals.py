"""What `ContextParallel`'s scope refuses rather than running off the ring.

Inside the scope every attention must run as ring attention (the
sequence is sharded across devices); a layer or op with its own kernel,
a nested `implementation_scope` of another path, or an option the ring
cannot apply would attend over the whole (gathered) sequence on every
device: each is refused with a `ValueError` naming it. The refusals read
the exclusive scope (`paths.exclusive_scope`), so they are checked on
every backend inside `implementation_scope("ring")`; on JAX, inside a
`ContextParallel` of one device, whose name the errors carry too. The
ring's results themselves are checked on 8 devices in
`test_ring_attention.py`.
"""

import keras
import numpy as np
import pytest

from keras_attention import layers
from keras_attention import ops as ka_ops
from keras_attention.blocks import TransformerDecoderBlock
from keras_attention.distribution import ContextParallel
from keras_attention.ops import dot_product_attention
from keras_attention.ops import implementation_scope
from keras_attention.ops import paths
from keras_attention.visualization import AttentionRecording

BACKEND = keras.backend.backend()
JAX_ONLY = pytest.mark.skipif(
    BACKEND != "jax", reason="the Keras distribution API runs on JAX"
)


def _one_device_mesh():
    devices = keras.distribution.list_devices()[:1]
    return keras.distribution.DeviceMesh((1, 1), ["batch", "sequence"], devices)


def _ring_scope():
    """`ContextParallel`'s scope on JAX; elsewhere the exclusive scope it
    enters (the refusals happen before any ring runs)."""
    if BACKEND == "jax":
        return ContextParallel(_one_device_mesh()).scope()
    return implementation_scope("ring", mesh=None)


def _where():
    # What the errors name: the distribution on JAX, the scope elsewhere.
    return "ContextParallel" if BACKEND == "jax" else r"implementation_scope"


def _x(shape=(2, 6, 8)):
    return np.random.default_rng(0).normal(size=shape).astype("float32")


def _own_kernel_layers():
    # (layer, call arguments): every library attention layer whose
    # attention is not `dot_product_attention`.
    x, memory = _x(), _x((2, 5, 6))
    nodes = _x((3, 5))
    edges = (np.array([0, 1]), np.array([1, 2]))
    return [
        (layers.LinearAttention(num_heads=2, key_dim=4, name="lin"), (x,), {}),
        (
            layers.GatedDeltaNet(
                hidden_size=8,
                linear_num_key_heads=1,
                linear_num_value_heads=2,
                linear_key_head_dim=4,
                linear_value_head_dim=4,
                name="gdn",
            ),
            (x,),
            {},
        ),
        (
            layers.GraphAttention(num_heads=2, units_per_head=4, name="gat"),
            (nodes,),
            {"edges": edges},
        ),
        (layers.BahdanauAttention(units=4, name="bah"), (x, memory), {}),
        (layers.LuongAttention("general", name="luong"), (x, memory), {}),
        (
            layers.AttentionRNNDecoder(
                8, layers.BahdanauAttention(6), name="rnn"
            ),
            (x, memory),
            {},
        ),
    ]


def test_layers_with_their_own_kernel_are_refused_naming_them():
    # (Each runs outside the scope: its own tests. The refusal comes
    # before the layer builds.)
    for layer, args, kwargs in _own_kernel_layers():
        with _ring_scope():
            with pytest.raises(ValueError, match=_where()) as error:
                layer(*args, **kwargs)
        message = str(error.value)
        assert f"{type(layer).__name__} layer {layer.name!r}" in message
        assert "'ring'" in message, message


def test_the_decoder_step_is_refused_too():
    decoder = layers.AttentionRNNDecoder(8, layers.BahdanauAttention(6))
    y, memory = _x((2, 4, 5)), _x((2, 7, 3))
    decoder(y, memory)
    states = decoder.get_initial_state(2)
    decoder.step(y[:, 0], states, memory)
    with _ring_scope():
        with pytest.raises(ValueError, match="AttentionRNNDecoder layer"):
            decoder.step(y[:, 0], states, memory)


class _OwnAttention(AttentionRecording, keras.layers.Layer):
    def call(self, x):
        scores = keras.ops.einsum("bid,bjd->bij", x, x)
        return keras.ops.einsum("bij,bjd->bid", keras.ops.softmax(scores), x)


class _RingAttention(_OwnAttention):
    runs_context_parallel = True  # (its author vouches for it)


def test_a_users_attention_layer_is_refused_unless_it_says_it_runs():
    x = _x()
    with _ring_scope():
        with pytest.raises(ValueError, match="_OwnAttention layer 'own'"):
            _OwnAttention(name="own")(x)
        _RingAttention()(x)


def test_ops_with_their_own_kernel_are_refused():
    q = _x((1, 6, 2, 4))
    decay = np.full((1, 6, 2), 0.9, "float32")
    calls = {
        "linear_attention": lambda: ka_ops.linear_attention(q, q, q),
        "gated_delta_rule": lambda: ka_ops.gated_delta_rule(
            q, q, q, np.log(decay), decay
        ),
        "local_attention": lambda: ka_ops.local_attention(q, q, q, 2),
        "global_local_attention": lambda: ka_ops.global_local_attention(
            q, q, q, 2, np.eye(1, 6, dtype=bool)
        ),
    }
    for name, call in calls.items():
        with _ring_scope():
            with pytest.raises(ValueError, match=f"`{name}` cannot run"):
                call()


@pytest.mark.parametrize("name", [None, "dense", "blockwise", "fused"])
def test_a_nested_implementation_scope_of_another_path_is_refused(name):
    q = _x((1, 6, 2, 4))
    with _ring_scope():
        with pytest.raises(ValueError, match="context parallelism needs ring"):
            with implementation_scope(name):
                dot_product_attention(q, q, q)
        with pytest.raises(ValueError, match=f"name={name!r}"):
            with implementation_scope(name):
                pass
        assert paths.current_scope().name == "ring"
    with implementation_scope(name):  # outside: as before
        dot_product_attention(q, q, q)


@JAX_ONLY
def test_a_nested_ring_scope_and_the_ring_blocks_run():
    # The ring's blocks leave the exclusive scope by
    # `paths.release_exclusive_scope` (the one way out): the ring runs.
    x = _x()
    layer = layers.SelfAttention(num_heads=2, key_dim=4, causal=True)
    expected = np.asarray(layer(x))
    with _ring_scope():
        with implementation_scope("ring", mesh=_one_device_mesh()):
            np.testing.assert_allclose(layer(x), expected, atol=1e-6)


def _latent(**kwargs):
    return layers.MultiHeadLatentAttention(
        num_heads=2,
        kv_lora_rank=4,
        qk_nope_head_dim=4,
        qk_rope_head_dim=2,
        v_head_dim=4,
        **kwargs,
    )


@JAX_ONLY
def test_latent_attention_and_pooling_run_in_the_scope():
    # MLA's attention is `dot_product_attention`: the ring (a `ppermute`
    # in the program), same result; pooling sums over the sequence.
    import jax

    x = _x()
    mla, pool = _latent(), layers.AttentionPooling()
    expected = np.asarray(mla(x, use_causal_mask=True)), np.asarray(pool(x))
    with _ring_scope():
        program = str(jax.make_jaxpr(lambda x: mla(x, use_causal_mask=True))(x))
        got = mla(x, use_causal_mask=True), pool(x)
    assert "ppermute" in program
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_latent_attention_refuses_scores_and_dropout_in_the_scope():
    x = _x()
    plain, dropout = _latent(), _latent(dropout=0.5)
    for layer, kwargs in (
        (plain, {"return_attention_scores": True}),
        (dropout, {"training": True}),
    ):
        layer(x, **kwargs)
        with _ring_scope():
            with pytest.raises(ValueError, match="implementation='dense'"):
                layer(x, **kwargs)


def test_learned_sinks_are_refused_in_the_scope_naming_the_argument():
    x = _x()
    layer = layers.SelfAttention(num_heads=2, key_dim=4, learned_sinks=True)
    layer(x)
    with _ring_scope():
        with pytest.raises(ValueError, match="learned sinks") as error:
            layer(x)
    message = str(error.value)
    assert "learned_sinks=True" in message, message
    assert repr(layer.name) in message, message


@pytest.mark.parametrize(
    "sinks", [[0.5, -1.25], np.array([0.5, -1.25], "float32")]
)
def test_sink_logits_are_refused_naming_the_argument_and_value(sinks):
    q = _x((1, 6, 2, 4))
    with _ring_scope():
        with pytest.raises(ValueError, match="learned sinks") as error:
            dot_product_attention(q, q, q, sink_logits=sinks)
    message = str(error.value)
    assert "Received: sink_logits=" in message, message
    assert "0.5" in message and "-1.25" in message, message


def test_return_lse_is_refused_naming_the_argument_and_value():
    q = _x((1, 6, 2, 4))
    with _ring_scope():
        with pytest.raises(ValueError, match="log-sum-exp") as error:
            dot_product_attention(q, q, q, return_lse=True)
    assert "Received: return_lse=True" in str(error.value), str(error.value)


@pytest.mark.skipif(BACKEND == "jax", reason="JAX runs ContextParallel")
def test_context_parallel_refuses_other_backends_naming_them():
    # (torch has no `keras.distribution.list_devices`)
    mesh = keras.distribution.DeviceMesh((1,), ["sequence"], ["cpu:0"])
    with pytest.raises(NotImplementedError, match=f"{BACKEND!r}"):
        ContextParallel(mesh, batch_axis=None)


def test_a_block_with_a_linear_time_mixer_is_refused():
    # `mixer="linear"` builds a LinearAttention: refused by name (the
    # "gated_delta" mixer's GatedDeltaNet is refused as a layer above).
    x = _x()
    block = TransformerDecoderBlock(
        intermediate_dim=16, num_heads=2, mixer="linear", cross_attention=False
    )
    block(x)
    with _ring_scope():
        with pytest.raises(ValueError, match="LinearAttention layer"):
            block(x)
