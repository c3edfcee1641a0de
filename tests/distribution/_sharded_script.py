"""Trains and generates with the library's layers on 4 virtual CPU devices.

Run by `test_layout_map.py` in its own process, with
`XLA_FLAGS=--xla_force_host_platform_device_count=4 KERAS_BACKEND=jax` set
before JAX starts. The same models (same initial weights, same data) run on
one device, under `DataParallel` over 4 devices and under `ModelParallel`
with `get_layout_map` on a 2x2 `("batch", "model")` mesh. Prints one JSON
line: losses, the largest weight/logit differences to the one-device run,
generated tokens, and every weight's global and per-device shapes.
"""

import json
import sys

# A JAX program: TensorFlow (installed for the TensorFlow backend) is kept
# out; `keras.utils.set_random_seed` would import it to seed it (~2 s CPU).
sys.modules["tensorflow"] = None

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_attention import distribution as ka_distribution  # noqa: E402
from keras_attention.blocks import TransformerDecoderBlock  # noqa: E402
from keras_attention.blocks import TransformerEncoderBlock  # noqa: E402
from keras_attention.generation import CausalLMGenerator  # noqa: E402
from keras_attention.layers import BahdanauAttention  # noqa: E402
from keras_attention.layers import CrossAttention  # noqa: E402
from keras_attention.layers import FeedForward  # noqa: E402
from keras_attention.layers import LocalSelfAttention  # noqa: E402
from keras_attention.layers import LuongAttention  # noqa: E402
from keras_attention.layers import MultiHeadAttention  # noqa: E402

VOCAB, HIDDEN, HEADS, STEPS, BATCH = 32, 16, 4, 3, 8


def build_lm():
    """Decoder-only LM: a full causal block, then a sliding-window one
    (`LocalSelfAttention`); both with grouped-query attention (2 key/value
    heads for 4 query heads: one cache shape)."""
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    embedding = keras.layers.Embedding(VOCAB, HIDDEN, name="embedding")
    blocks = [
        TransformerDecoderBlock(
            HEADS,
            4 * HIDDEN,
            cross_attention=False,
            norm_first=True,
            num_key_value_heads=2,
            rotary_max_wavelength=100,
            name="decoder_block_0",
        ),
        TransformerDecoderBlock(
            HEADS,
            4 * HIDDEN,
            cross_attention=False,
            norm_first=True,
            num_key_value_heads=2,
            window_size=3,
            rotary_max_wavelength=100,
            name="decoder_block_1",
        ),
    ]
    head = [
        keras.layers.LayerNormalization(name="final_norm"),
        keras.layers.Dense(VOCAB, name="logits"),
    ]
    x = embedding(ids)
    for block in blocks:
        x = block(x)
    for layer in head:
        x = layer(x)
    model = keras.Model(ids, x, name="lm")
    generator = CausalLMGenerator(
        embedding, blocks, head, pad_token_id=0, jit_compile=False
    )
    return model, generator


def build_seq2seq():
    """Encoder block; the target attends to it with cross-attention (with a
    gate), Bahdanau and Luong (general, concat) attention."""
    source = keras.Input((None,), dtype="int32", name="source")
    target = keras.Input((None,), dtype="int32", name="target")
    embed = keras.layers.Embedding(VOCAB, HIDDEN, name="embedding")
    memory = TransformerEncoderBlock(HEADS, 4 * HIDDEN, name="encoder_block")(
        embed(source)
    )
    query = embed(target)
    parts = [
        CrossAttention(HEADS, 4, name="cross")(query, memory),
        MultiHeadAttention(HEADS, 4, use_gate=True, name="gated")(
            query, memory
        ),
        BahdanauAttention(8, normalize=True, name="bahdanau")(query, memory),
        LuongAttention("general", scale="learned", name="luong")(query, memory),
        LuongAttention("concat", units=8, name="luong_concat")(query, memory),
    ]
    x = FeedForward(4 * HIDDEN, name="ffn")(keras.layers.Concatenate()(parts))
    logits = keras.layers.Dense(VOCAB, name="logits")(x)
    return keras.Model([source, target], logits, name="seq2seq")


def data(seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, VOCAB, size=(BATCH * STEPS, 9)).astype("int32")
    return ids[:, :-1], ids[:, 1:]


def train(build, inputs, targets, initial):
    """Builds with `initial` weights, trains STEPS steps; returns the model
    (and generator), the losses and the weights after training."""
    keras.utils.set_random_seed(0)
    built = build()
    model = built[0] if isinstance(built, tuple) else built
    model.set_weights(initial)
    model.compile(
        keras.optimizers.SGD(0.5),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    history = model.fit(
        inputs, targets, batch_size=BATCH, epochs=1, shuffle=False, verbose=0
    )
    losses = history.history["loss"]
    return built, losses, [np.asarray(w) for w in model.get_weights()]


def shard_shapes(model):
    return {
        w.path: [list(w.shape), list(w.value.addressable_shards[0].data.shape)]
        for w in model.weights
    }


def max_diff(a, b):
    """Largest difference of corresponding arrays, relative to the
    reference's scale where that exceeds 1 (float32 logits of size ~10
    differ by a few ULPs, ~1e-5, when the reductions are ordered
    differently across devices)."""
    return max(
        float(np.abs(np.asarray(x) - np.asarray(y)).max())
        / max(1.0, float(np.abs(np.asarray(y)).max()))
        for x, y in zip(a, b)
    )


def run_lm(distribution, initial, inputs, targets):
    scope = distribution.scope() if distribution else _nullscope()
    with scope:
        (model, generator), losses, weights = train(
            build_lm, inputs, targets, initial
        )
        prompts = np.zeros((4, 12), "int32")
        prompts[:, :3] = inputs[:4, :3]
        tokens, _ = generator.generate(prompts, sampler="greedy")
        tokens = np.asarray(tokens)
        # Cached logits: the whole sequence through the cache, then one
        # incremental step at position 5.
        hidden, cache = generator.build_cache(tokens)
        full = np.asarray(generator.logits(hidden))
        step, _, _ = generator.call_with_cache(tokens[:, 5:6], cache, 5)
        logits = [full, np.asarray(step), np.asarray(model(tokens))]
    return model, losses, weights, tokens, logits


class _nullscope:
    def __enter__(self):
        return self

    def __exit__(self, *args):
        return False


def main():
    devices = jax.devices()
    if len(devices) != 4:
        raise SystemExit(f"needs 4 devices, got {devices}")
    mesh = keras.distribution.DeviceMesh(
        (2, 2), ("batch", "model"), keras.distribution.list_devices()
    )
    distributions = {
        "data": keras.distribution.DataParallel(
            devices=keras.distribution.list_devices()
        ),
        "model": keras.distribution.ModelParallel(
            layout_map=ka_distribution.get_layout_map(mesh),
            batch_dim_name="batch",
        ),
    }
    report = {"devices": len(devices)}

    inputs, targets = data(0)
    keras.utils.set_random_seed(1)
    initial = build_lm()[0].get_weights()
    ref = run_lm(None, initial, inputs, targets)
    report["lm"] = {"one": {"losses": ref[1], "tokens": ref[3].tolist()}}
    for name, dist in distributions.items():
        model, losses, weights, tokens, logits = run_lm(
            dist, initial, inputs, targets
        )
        report["lm"][name] = {
            "losses": losses,
            "weight_diff": max_diff(weights, ref[2]),
            "logit_diff": max_diff(logits, ref[4]),
            "tokens": tokens.tolist(),
            "shards": shard_shapes(model),
        }

    src, tgt = data(1)
    s2s_inputs, s2s_targets = [src, tgt], np.roll(tgt, 1, axis=1)
    keras.utils.set_random_seed(2)
    initial = build_seq2seq().get_weights()
    ref_model, ref_losses, ref_weights = train(
        build_seq2seq, s2s_inputs, s2s_targets, initial
    )
    ref_logits = np.asarray(ref_model(s2s_inputs))
    report["seq2seq"] = {"one": {"losses": ref_losses}}
    for name, dist in distributions.items():
        with dist.scope():
            model, losses, weights = train(
                build_seq2seq, s2s_inputs, s2s_targets, initial
            )
            logits = np.asarray(model(s2s_inputs))
        report["seq2seq"][name] = {
            "losses": losses,
            "weight_diff": max_diff(weights, ref_weights),
            "logit_diff": max_diff([logits], [ref_logits]),
            "shards": shard_shapes(model),
        }

    # GQA with fewer key/value heads (1) than the model axis (2).
    one_kv = {}
    for shard_key_value in (True, False):
        dist = keras.distribution.ModelParallel(
            layout_map=ka_distribution.get_layout_map(
                mesh, shard_key_value=shard_key_value
            ),
            batch_dim_name="batch",
        )
        try:
            with dist.scope():
                layer = MultiHeadAttention(
                    HEADS, 4, num_key_value_heads=1, name="mqa"
                )
                x = np.ones((2, 3, HIDDEN), "float32")
                layer(x, x)
            one_kv[str(shard_key_value)] = shard_shapes(layer)
        except Exception as e:  # noqa: BLE001 - reported to the test
            one_kv[str(shard_key_value)] = f"{type(e).__name__}: {e}"[:300]
    report["one_kv_head"] = one_kv

    # Global tokens with Longformer's own projections: sharded by heads,
    # and the same result as on one device.
    def build_global():
        return LocalSelfAttention(
            HEADS,
            4,
            window_size=1,
            global_projections=True,
            max_global_tokens=1,
            name="global_local",
        )

    x = np.random.default_rng(3).normal(size=(BATCH, 6, HIDDEN))
    x = x.astype("float32")
    is_global = np.zeros((BATCH, 6), bool)
    is_global[:, 0] = True
    keras.utils.set_random_seed(3)
    one = build_global()
    reference = np.asarray(one(x, global_mask=is_global))
    with distributions["model"].scope():
        layer = build_global()
        layer(x, global_mask=is_global)
        layer.set_weights(one.get_weights())
        output = np.asarray(layer(x, global_mask=is_global))
    report["global_projections"] = {
        "shards": shard_shapes(layer),
        "diff": max_diff([output], [reference]),
    }
    print("RESULT " + json.dumps(report))


if __name__ == "__main__":
    sys.exit(main())
