"""AttentionTensorBoard: attention heatmaps written as TensorBoard images
during `fit`, read back from the event files."""

import re

import keras
import numpy as np
import pytest
from tensorboard_events import read_attention_images

from keras_attention import blocks
from keras_attention import layers
from keras_attention.visualization import AttentionTensorBoard

PROBE = np.array([[3, 4, 5, 0], [6, 7, 8, 9]], "int32")
TOKENS = [["the", "cat", "sat"], ["a", "dog", "ran", "home"]]


def tiny_model():
    ids = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(12, 8, mask_zero=True)(ids)
    x = blocks.TransformerEncoderBlock(2, 16, name="encoder_block_1")(x)
    x = layers.AttentionPooling(name="pool")(x)
    model = keras.Model(ids, keras.layers.Dense(1)(x))
    model.compile(keras.optimizers.Adam(0.01), "mse")
    return model


def test_images_per_layer_example_and_epoch(tmp_path):
    model = tiny_model()
    callback = AttentionTensorBoard(
        tmp_path, PROBE, every_n_epochs=1, tokens=TOKENS, max_examples=2
    )
    x = np.random.default_rng(0).integers(1, 12, (8, 4))
    model.fit(x, np.zeros((8, 1)), epochs=2, verbose=0, callbacks=[callback])
    images = read_attention_images(tmp_path)
    tags = [
        f"attention/{name}/example_{i}"
        for name in ("encoder_block_1/self_attention", "pool")
        for i in (0, 1)
    ]
    assert sorted(images) == sorted((t, s) for t in tags for s in (0, 1))
    for (tag, step), image in images.items():
        assert image.ndim == 3 and image.shape[0] > 50 and image.shape[1] > 50
        # Not blank: many distinct colours (heatmap, colour bar, labels).
        colours = np.unique(image.reshape(-1, image.shape[-1]), axis=0)
        assert len(colours) > 20, (tag, step)
    # Weights change with training: the heatmaps of the two epochs differ.
    tag = "attention/encoder_block_1/self_attention/example_1"
    assert not np.array_equal(images[(tag, 0)], images[(tag, 1)])


def test_every_n_epochs_heads_and_layers(tmp_path):
    model = tiny_model()
    callback = AttentionTensorBoard(
        tmp_path,
        PROBE,
        every_n_epochs=2,
        layers="encoder_block_1",
        max_examples=1,
        heads="each",
    )
    x = np.random.default_rng(1).integers(1, 12, (4, 4))
    model.fit(x, np.zeros((4, 1)), epochs=3, verbose=0, callbacks=[callback])
    base = "attention/encoder_block_1/self_attention/example_0"
    expected = [base, f"{base}/head_0", f"{base}/head_1"]
    assert sorted(read_attention_images(tmp_path)) == [
        (t, 1) for t in sorted(expected)
    ]
    assert callback.tags == expected


def test_errors(tmp_path):
    with pytest.raises(ValueError, match="every_n_epochs=0"):
        AttentionTensorBoard(tmp_path, PROBE, every_n_epochs=0)
    with pytest.raises(ValueError, match="heads='all'"):
        AttentionTensorBoard(tmp_path, PROBE, heads="all")
    callback = AttentionTensorBoard(tmp_path, PROBE, tokens=[["a"]])
    callback.set_model(tiny_model())
    with pytest.raises(ValueError, match="one token list per probe"):
        callback.log_attention(0)


@pytest.mark.parametrize("layers_", ["typo", ["pool", "typo"]])
def test_unknown_layer_is_refused_when_training_starts(tmp_path, layers_):
    # Before any batch (issue 23: it was found at the end of the first
    # epoch), naming the argument, the value and the known names.
    model = tiny_model()
    batches = []
    counter = keras.callbacks.LambdaCallback(
        on_train_batch_begin=lambda batch, logs: batches.append(batch)
    )
    callback = AttentionTensorBoard(tmp_path, PROBE, layers=layers_)
    x = np.random.default_rng(2).integers(1, 12, (4, 4))
    with pytest.raises(ValueError) as info:
        model.fit(
            x,
            np.zeros((4, 1)),
            epochs=1,
            verbose=0,
            callbacks=[callback, counter],
        )
    message = str(info.value)
    assert "`layers`" in message
    assert f"layers={layers_!r}" in message
    assert "'encoder_block_1/self_attention', 'pool'" in message
    assert batches == []


@pytest.mark.parametrize(
    "layers_, error",
    [(5, TypeError), ([], ValueError), (["pool", None], TypeError)],
)
def test_layers_of_the_wrong_type_are_refused_at_construction(
    tmp_path, layers_, error
):
    with pytest.raises(error, match=re.escape(f"layers={layers_!r}")):
        AttentionTensorBoard(tmp_path, PROBE, layers=layers_)
