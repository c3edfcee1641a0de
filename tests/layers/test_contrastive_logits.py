"""`ContrastiveLogits` (CLIP's and SigLIP's heads) against a NumPy
reference: normalized embeddings, the learned scale and bias, float64,
mixed precision, refusals, the shared harness."""

import contextlib
import math
import re

import keras
import numpy as np
import pytest
from harness import run_layer_test
from keras.ops import convert_to_numpy as to_numpy

from keras_attention.layers import ContrastiveLogits

RNG = np.random.default_rng(0)
IMAGES = RNG.normal(size=(3, 4)).astype("float32")
TEXTS = RNG.normal(size=(2, 4)).astype("float32")


@contextlib.contextmanager
def x64():
    """JAX computes in float64 only with x64 enabled."""
    if keras.backend.backend() != "jax":
        yield
        return
    import jax

    with jax.enable_x64(True):
        yield


def reference(images, texts, scale, bias=0.0):
    v = images / np.linalg.norm(images, axis=-1, keepdims=True)
    t = texts / np.linalg.norm(texts, axis=-1, keepdims=True)
    text_logits = np.exp(scale) * t @ v.T + bias
    return text_logits.T, text_logits


def test_clip_defaults():
    head = ContrastiveLogits()
    image_logits, text_logits = head(IMAGES, TEXTS)
    want = reference(IMAGES, TEXTS, math.log(1 / 0.07))
    np.testing.assert_allclose(to_numpy(image_logits), want[0], rtol=1e-5)
    np.testing.assert_allclose(to_numpy(text_logits), want[1], rtol=1e-5)
    # The layer's name is numbered by how many came before it.
    assert [w.path for w in head.weights] == [f"{head.name}/logit_scale"]


def test_siglip_scale_and_bias_are_learned_weights():
    head = ContrastiveLogits(math.log(10.0), use_bias=True, logit_bias=-10.0)
    head.build((3, 4), (2, 4))
    head.logit_scale_weight.assign(0.5)
    head.logit_bias_weight.assign(-2.0)
    image_logits, text_logits = head(IMAGES, TEXTS)
    want = reference(IMAGES, TEXTS, 0.5, -2.0)
    np.testing.assert_allclose(to_numpy(text_logits), want[1], atol=1e-5)
    np.testing.assert_allclose(to_numpy(image_logits), want[0], atol=1e-5)
    assert len(head.trainable_weights) == 2


def test_float64_stays_float64():
    with x64():
        head = ContrastiveLogits(0.3, dtype="float64")
        images, texts = IMAGES.astype("float64"), TEXTS.astype("float64")
        _, text_logits = head(images, texts)
        assert keras.backend.standardize_dtype(text_logits.dtype) == "float64"
        np.testing.assert_allclose(
            to_numpy(text_logits), reference(images, texts, 0.3)[1], rtol=1e-12
        )


def test_zero_embedding_gives_zero_logits_not_nan():
    images = IMAGES.copy()
    images[1] = 0.0
    image_logits, _ = ContrastiveLogits()(images, TEXTS)
    np.testing.assert_array_equal(to_numpy(image_logits)[1], 0.0)


def test_keras_round_trip(tmp_path):
    images, texts = keras.Input((4,)), keras.Input((4,))
    head = ContrastiveLogits(use_bias=True, logit_bias=-1.0)
    model = keras.Model([images, texts], head(images, texts))
    head.logit_scale_weight.assign(1.5)
    path = str(tmp_path / "head.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path, safe_mode=True)
    for ours, theirs in zip(reloaded([IMAGES, TEXTS]), model([IMAGES, TEXTS])):
        np.testing.assert_allclose(to_numpy(ours), to_numpy(theirs))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(logit_scale=float("inf")), "logit_scale=inf"),
        (dict(logit_scale="1"), "logit_scale='1'"),
        (dict(use_bias=1), "use_bias=1"),
        (dict(logit_bias=-10.0), "logit_bias=-10.0"),
        (dict(use_bias=True, logit_bias=True), "logit_bias=True"),
    ],
)
def test_bad_arguments_are_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=re.escape(match)):
        ContrastiveLogits(**kwargs)


def test_bad_shapes_are_refused_by_name():
    with pytest.raises(ValueError, match="text_embeddings"):
        ContrastiveLogits()(IMAGES, TEXTS[:, :3])
    with pytest.raises(ValueError, match="image_embeddings_shape"):
        ContrastiveLogits()(IMAGES[None], TEXTS)


def test_harness():
    run_layer_test(
        ContrastiveLogits,
        dict(use_bias=True, logit_bias=-1.0),
        dict(image_embeddings=IMAGES, text_embeddings=TEXTS),
        expected_output_shape=((3, 2), (2, 3)),
        expected_num_trainable_weights=2,
        vary_sequence_length=False,
        run_fit=False,
    )
