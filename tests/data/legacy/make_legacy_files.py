"""Writes the `.keras` files that `tests/blocks/test_legacy_files.py` loads.

Run once, from the repository root, with the code BEFORE a refactor that
moves or changes public layers (issue 11: the blocks move to
`keras_attention.blocks`, the seq2seq attention base gets its own module):

    KERAS_BACKEND=tensorflow python tests/data/legacy/make_legacy_files.py

(the committed files were written with the package of commit 73f4a7d,
extracted with `git archive 73f4a7d keras_attention` and put first on
`PYTHONPATH`).

Each model `NAME` is saved as `NAME.keras` with `NAME.npz` holding the
inputs it was called with (`input_0`, ...) and the outputs it produced
(`output_0`, ...). The test loads each file with the current code and
compares. Tiny sizes and a re-deflated zip (Keras stores the weights
uncompressed, mostly empty HDF5 space) keep each file a few KB; no
dropout, so outputs are deterministic.
"""

import os
import zipfile

import keras
import numpy as np

import keras_attention

HERE = os.path.dirname(os.path.abspath(__file__))
VOCAB, LENGTH, DIM = 20, 6, 8
rng = np.random.default_rng(0)


def _token_ids(batch=2, length=LENGTH):
    ids = rng.integers(1, VOCAB, size=(batch, length)).astype("int32")
    ids[0, -2:] = 0  # padding, read through the Keras mask
    return ids


def _embedded(ids_input, name):
    return keras_attention.layers.TokenAndPositionEmbedding(
        VOCAB, LENGTH, DIM, mask_zero=True, name=name
    )(ids_input)


def encoder_block_model(name, **kwargs):
    ids = keras.Input((LENGTH,), dtype="int32")
    block = keras_attention.layers.TransformerEncoderBlock(
        num_heads=2, intermediate_dim=16, name="block", **kwargs
    )
    y, w = block(_embedded(ids, "embedding"), return_attention_scores=True)
    return keras.Model(ids, [y, w], name=name), [_token_ids()]


def decoder_block_model():
    ids = keras.Input((LENGTH,), dtype="int32")
    src = keras.Input((LENGTH,), dtype="int32")
    context = keras_attention.layers.TransformerEncoderBlock(
        2, 16, name="encoder_block"
    )(_embedded(src, "source_embedding"))
    x = _embedded(ids, "target_embedding")
    y, w_self, w_cross = keras_attention.layers.TransformerDecoderBlock(
        2, 16, norm_first=True, rotary_max_wavelength=100, name="decoder"
    )(x, context, return_attention_scores=True)
    lm = keras_attention.layers.TransformerDecoderBlock(
        2, 16, cross_attention=False, window_size=2, name="lm_block"
    )(x)
    model = keras.Model([ids, src], [y, w_self, w_cross, lm], name="decoder")
    return model, [_token_ids(), _token_ids()]


def rnn_model():
    src = keras.Input((LENGTH,), dtype="int32")
    tgt = keras.Input((LENGTH,), dtype="int32")
    x = keras.layers.Embedding(VOCAB, DIM, mask_zero=True)(src)
    memory, fwd, bwd = keras.layers.Bidirectional(
        keras.layers.GRU(4, return_sequences=True, return_state=True),
        name="encoder",
    )(x)
    state = keras_attention.layers.EncoderBridge(6, name="bridge")(fwd, bwd)
    y = keras.layers.Embedding(VOCAB, DIM, mask_zero=True)(tgt)
    bahdanau = keras_attention.layers.AttentionRNNDecoder(
        6,
        keras_attention.layers.BahdanauAttention(5, normalize=True),
        return_attention_scores=True,
        name="bahdanau_decoder",
    )(y, memory, initial_state=state)
    luong = keras_attention.layers.AttentionRNNDecoder(
        6,
        keras_attention.layers.LuongAttention(
            "general", alignment="local-p", window=2
        ),
        attention_style="luong",
        return_attention_scores=True,
        name="luong_decoder",
    )(y, memory, initial_state=state)
    model = keras.Model([src, tgt], list(bahdanau) + list(luong), name="rnn")
    return model, [_token_ids(), _token_ids()]


def multi_head_model():
    x_in = keras.Input((LENGTH, DIM))
    c_in = keras.Input((LENGTH - 1, DIM - 2))
    mha = keras_attention.layers.MultiHeadAttention(
        num_heads=2, key_dim=4, name="mha"
    )(x_in, c_in)
    self_out = keras_attention.layers.SelfAttention(
        num_heads=2, key_dim=4, causal=True, name="self_attention"
    )(x_in)
    cross_out = keras_attention.layers.CrossAttention(
        num_heads=2, key_dim=4, num_key_value_heads=1, name="cross_attention"
    )(x_in, c_in)
    model = keras.Model([x_in, c_in], [mha, self_out, cross_out], name="mha")
    inputs = [
        rng.normal(size=(2, LENGTH, DIM)).astype("float32"),
        rng.normal(size=(2, LENGTH - 1, DIM - 2)).astype("float32"),
    ]
    return model, inputs


def models():
    yield "encoder_plain", encoder_block_model("encoder_plain")
    yield (
        "encoder_causal",
        encoder_block_model(
            "encoder_causal",
            causal=True,
            norm_first=True,
            num_key_value_heads=1,
            rotary_max_wavelength=100,
            activation="gelu",
        ),
    )
    yield (
        "encoder_local",
        encoder_block_model("encoder_local", window_size=(2, 1)),
    )
    yield "decoder", decoder_block_model()
    yield "rnn", rnn_model()
    yield "multi_head", multi_head_model()


def _deflate(path):
    """Re-zips a `.keras` file with compression (Keras reads either)."""
    with zipfile.ZipFile(path) as source:
        members = [(i.filename, source.read(i)) for i in source.infolist()]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, 9) as target:
        for filename, data in members:
            target.writestr(filename, data)


def main():
    keras.utils.set_random_seed(0)
    for name, (model, inputs) in models():
        feed = inputs[0] if len(inputs) == 1 else inputs
        outputs = model.predict(feed, verbose=0)
        outputs = outputs if isinstance(outputs, list) else [outputs]
        path = os.path.join(HERE, f"{name}.keras")
        model.save(path)
        _deflate(path)
        arrays = {f"input_{i}": x for i, x in enumerate(inputs)}
        arrays.update({f"output_{i}": y for i, y in enumerate(outputs)})
        np.savez(os.path.join(HERE, f"{name}.npz"), **arrays)
        print(name, [tuple(y.shape) for y in outputs])


if __name__ == "__main__":
    main()
