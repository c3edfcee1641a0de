"""Writes the block `.keras` files of `tests/blocks/test_legacy_block_files.py`.

Run once, from the repository root, with the code BEFORE issue 54 turned
the transformer blocks into compositions of layers (commit 292214a, when
every sublayer was configured by the block's options):

    KERAS_BACKEND=tensorflow python tests/data/legacy/make_block_files.py

Each model `NAME` is saved as `block_NAME.keras` with `block_NAME.npz`
holding its inputs (`input_0`, ...) and outputs (`output_0`, ...), as in
`make_legacy_files.py`. The test loads each file with the current code
(`safe_mode=True`) and compares. Tiny sizes, no dropout.
"""

import os
import sys

import keras
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import make_legacy_files as legacy  # noqa: E402

import keras_attention  # noqa: E402

HERE = legacy.HERE
LENGTH, DIM = 6, 8
rng = np.random.default_rng(1)
Decoder = keras_attention.blocks.TransformerDecoderBlock
Encoder = keras_attention.blocks.TransformerEncoderBlock


def _features(batch=2, length=LENGTH, dim=DIM):
    return rng.normal(size=(batch, length, dim)).astype("float32")


def lm_model(name, **options):
    """A decoder-only block on float features (no cross-attention)."""
    x = keras.Input((LENGTH, DIM))
    y = Decoder(2, 16, cross_attention=False, name="block", **options)(x)
    return keras.Model(x, y, name=name), [_features()]


def seq2seq_model():
    """Token ids through an encoder block and a modern decoder block with
    cross-attention (RMS norms, QK-norm, sinks, gate, sandwich norms,
    SwiGLU, partial rotary, no biases)."""
    ids = keras.Input((LENGTH,), dtype="int32")
    src = keras.Input((LENGTH,), dtype="int32")
    context = Encoder(
        2,
        16,
        norm_first=True,
        normalization="rms_norm",
        rotary_max_wavelength=100,
        name="encoder_block",
    )(legacy._embedded(src, "source_embedding"))
    x = legacy._embedded(ids, "target_embedding")
    y, w_self, w_cross = Decoder(
        2,
        16,
        norm_first=True,
        normalization="rms_norm",
        use_bias=False,
        gated_feed_forward=True,
        activation="silu",
        sandwich_norm=True,
        rotary_max_wavelength=100,
        rotary_fraction=0.5,
        qk_norm="rms",
        learned_sinks=True,
        attention_output_gate=True,
        num_key_value_heads=1,
        name="decoder",
    )(x, context, return_attention_scores=True)
    model = keras.Model([ids, src], [y, w_self, w_cross], name="seq2seq")
    return model, [legacy._token_ids(), legacy._token_ids()]


def encoder_model():
    """Encoder blocks: local with global tokens, and one with score and
    mask objects."""
    x = keras.Input((LENGTH, DIM))
    local = Encoder(
        2,
        16,
        window_size=(2, 1),
        global_projections=True,
        max_global_tokens=2,
        name="local",
    )(x)
    mods = Encoder(
        2,
        16,
        causal=True,
        score_mod=keras_attention.scores.ALiBi(num_heads=2),
        mask_mod=keras_attention.mods.PrefixLMMask(2),
        attention_scale=0.5,
        name="mods",
    )(x)
    return keras.Model(x, [local, mods], name="encoder"), [_features()]


def models():
    yield "seq2seq", seq2seq_model()
    yield "encoder", encoder_model()
    yield (
        "moe",
        lm_model(
            "moe",
            norm_first=True,
            moe={"num_experts": 3, "top_k": 2, "router_aux_loss_coef": 0.01},
        ),
    )
    yield (
        "gated_delta",
        lm_model(
            "gated_delta",
            norm_first=True,
            mixer="gated_delta",
            mixer_options={
                "linear_num_key_heads": 2,
                "linear_num_value_heads": 2,
                "linear_key_head_dim": 4,
                "linear_value_head_dim": 4,
                "linear_conv_kernel_dim": 3,
            },
        ),
    )
    yield (
        "linear",
        lm_model(
            "linear",
            mixer="linear",
            mixer_options={"decay": "gated", "feature_map": "identity"},
        ),
    )
    yield (
        "latent",
        lm_model(
            "latent",
            norm_first=True,
            normalization="rms_norm",
            latent_attention={
                "kv_lora_rank": 4,
                "qk_nope_head_dim": 4,
                "qk_rope_head_dim": 2,
                "v_head_dim": 4,
                "q_lora_rank": 6,
            },
        ),
    )
    yield (
        "windowed",
        lm_model(
            "windowed",
            window_size=2,
            rotary_max_wavelength=100,
            rotary_scaling={"scaling_factor": 2.0},
        ),
    )


def main():
    keras.utils.set_random_seed(0)
    for name, (model, inputs) in models():
        feed = inputs[0] if len(inputs) == 1 else inputs
        outputs = model.predict(feed, verbose=0)
        outputs = outputs if isinstance(outputs, list) else [outputs]
        path = os.path.join(HERE, f"block_{name}.keras")
        model.save(path)
        legacy._deflate(path)
        arrays = {f"input_{i}": x for i, x in enumerate(inputs)}
        arrays.update({f"output_{i}": y for i, y in enumerate(outputs)})
        np.savez(os.path.join(HERE, f"block_{name}.npz"), **arrays)
        print(name, os.path.getsize(path), [tuple(y.shape) for y in outputs])


if __name__ == "__main__":
    main()
