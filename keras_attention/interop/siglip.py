"""keras-hub's `SigLIPBackbone` rebuilt from `keras_attention` blocks."""

import keras
import numpy as np

from keras_attention.interop import _common
from keras_attention.interop import _image_text
from keras_attention.interop import _vision
from keras_attention.layers.contrastive_logits import ContrastiveLogits
from keras_attention.layers.cross_attention import CrossAttention
from keras_attention.layers.feed_forward import FeedForward
from keras_attention.layers.token_and_position_embedding import (
    TokenAndPositionEmbedding,
)
from keras_attention.layers.token_pooling import TokenPooling

# Their weight path prefix within a tower -> ours; `{i}`: the layer index
# (both from 0). The towers name their layers alike: each is matched on
# its own (`_image_text.tower_pairs`).
_BLOCK = (
    ("encoder_block_{i}/layer_norm1", "self_attention_norm"),
    ("encoder_block_{i}/self_attn", "self_attention"),
    ("encoder_block_{i}/layer_norm2", "feed_forward_norm"),
    ("encoder_block_{i}/mlp/fc1", "feed_forward/intermediate_dense"),
    ("encoder_block_{i}/mlp/fc2", "feed_forward/output_dense"),
)
VISION_TABLE = (
    ("embedding/patch_embedding", "vision_patch_embedding"),
    (
        "embedding/position_embedding/embeddings",
        "vision_position_embedding/embeddings",
    ),
    *((t, f"vision_transformer_layer_{{i}}/{o}") for t, o in _BLOCK),
    ("post_layer_norm", "vision_post_layer_norm"),
    ("head/variable", "vision_probe/embeddings"),
    ("head/attention", "vision_head_attention"),
    ("head/layernorm", "vision_head_norm"),
    ("head/mlp/fc1", "vision_head_feed_forward/intermediate_dense"),
    ("head/mlp/fc2", "vision_head_feed_forward/output_dense"),
)
TEXT_TABLE = (
    ("embedding/token_embedding", "text_embedding/token_embedding"),
    (
        "embedding/position_embedding/embeddings",
        "text_embedding/position_embedding/embeddings",
    ),
    *((t, f"text_transformer_layer_{{i}}/{o}") for t, o in _BLOCK),
    ("post_layer_norm", "text_post_layer_norm"),
    ("head", "text_projection"),
)
# The backbone's own weights (outside its towers): theirs -> ours.
HEAD_TABLE = (("siglip_head", "siglip_head"),)

_VISION = (
    "patch_size",
    "hidden_dim",
    "num_layers",
    "num_heads",
    "intermediate_dim",
    "intermediate_activation",
    "layer_norm_epsilon",
    "image_shape",
)
_TEXT = (
    "vocabulary_size",
    "embedding_dim",
    "hidden_dim",
    "num_layers",
    "num_heads",
    "intermediate_dim",
    "intermediate_activation",
    "layer_norm_epsilon",
    "max_sequence_length",
    "projection_dim",
)


def _attention_pooling(x, images, config, dtype):
    """SigLIP's head: a learned probe (an `Embedding` row) attends to the
    sequence (`CrossAttention`), then a pre-norm `FeedForward` with its
    residual; the probe's state `(batch, hidden)`."""
    hidden, heads = config["hidden_dim"], config["num_heads"]
    epsilon = config["layer_norm_epsilon"]
    probe = _vision.learned_tokens(images, 1, hidden, dtype, "vision_probe")
    attention = CrossAttention(
        heads, hidden // heads, dtype=dtype, name="vision_head_attention"
    )
    h = attention(probe, context=x)
    y = keras.layers.LayerNormalization(
        epsilon=epsilon, dtype=dtype, name="vision_head_norm"
    )(h)
    y = FeedForward(
        config["intermediate_dim"],
        activation=_image_text.activation(config["intermediate_activation"]),
        dtype=dtype,
        name="vision_head_feed_forward",
    )(y)
    h = keras.layers.Add(dtype=dtype)([h, y])
    return TokenPooling("first", dtype=dtype, name="vision_pooling")(h)


def _vision_tower(images, config, dtype):
    x = _vision.patch_embedding(
        images,
        config["hidden_dim"],
        config["patch_size"],
        True,
        dtype,
        name="vision_patch_embedding",
    )
    x = _vision.add_positions(x, dtype, name="vision_position_embedding")
    x = _image_text.stack(
        x,
        "vision",
        config,
        causal=False,
        activation=_image_text.activation(config["intermediate_activation"]),
        epsilon=config["layer_norm_epsilon"],
        dtype=dtype,
    )
    x = keras.layers.LayerNormalization(
        epsilon=1e-6, dtype=dtype, name="vision_post_layer_norm"
    )(x)
    return _attention_pooling(x, images, config, dtype)


def _text_tower(token_ids, config, dtype):
    x = TokenAndPositionEmbedding(
        config["vocabulary_size"],
        config["max_sequence_length"],
        config["embedding_dim"],
        dtype=dtype,
        name="text_embedding",
    )(token_ids)
    x = _image_text.stack(
        x,
        "text",
        config,
        causal=False,
        activation=_image_text.activation(config["intermediate_activation"]),
        epsilon=config["layer_norm_epsilon"],
        dtype=dtype,
    )
    x = keras.layers.LayerNormalization(
        epsilon=config["layer_norm_epsilon"],
        dtype=dtype,
        name="text_post_layer_norm",
    )(x)
    x = TokenPooling("last", dtype=dtype, name="text_pooling")(x)
    return keras.layers.Dense(
        config["projection_dim"], dtype=dtype, name="text_projection"
    )(x)


def _copy(backbone, model, vision, text):
    ours = {w.path: w for w in model.weights}
    vision_positions = _image_text.positions_transform(backbone.vision_encoder)

    # The probe is an unnamed weight: its path ("head/variable",
    # "head/variable_1", ...) counts the process's unnamed variables.
    probe = backbone.vision_encoder.head.probe.path
    table = tuple(
        (probe if theirs == "head/variable" else theirs, ours)
        for theirs, ours in VISION_TABLE
    )

    def vision_transform(path, value):
        if path == probe:
            return np.reshape(value, value.shape[1:])  # the probe (1, d)
        return vision_positions(path, value)

    pairs = _image_text.tower_pairs(
        backbone.vision_encoder,
        model,
        table,
        vision["num_layers"],
        vision_transform,
    )
    pairs += _image_text.tower_pairs(
        backbone.text_encoder,
        model,
        TEXT_TABLE,
        text["num_layers"],
        _image_text.positions_transform(backbone.text_encoder),
    )
    towers = (backbone.vision_encoder, backbone.text_encoder)
    inside = {id(w) for tower in towers for w in tower.weights}
    for weight in backbone.weights:
        if id(weight) in inside:
            continue
        target = ours.get(_common.our_path(weight.path, dict(HEAD_TABLE)))
        if target is not None:
            pairs.append((weight, target, None))
    ids = [_image_text.position_ids(tower)[1] for tower in towers]
    _common.copy_pairs(backbone, model, pairs, recomputed=ids)


def convert_siglip(backbone):
    """A `keras.Model` of `keras_attention` blocks equal to a keras-hub
    `SigLIPBackbone` (both towers and the head), holding a copy of its
    weights.

    Inputs `images` `(batch, H, W, C)` (channels-last) and `token_ids`
    int `(batch, T)`, outputs `vision_logits` `(images, texts)` and
    `text_logits` `(texts, images)`, as the backbone's. The vision tower:
    the patches (a `Conv2D`) plus learned positions (no class token),
    pre-norm `TransformerEncoderBlock`s (`SelfAttention`, `FeedForward`
    with `gelu_approximate`), a layer norm, then SigLIP's attention
    pooling: a learned probe (an `Embedding` row) attending to the
    patches (`CrossAttention`), a pre-norm `FeedForward` with its
    residual, the probe's state (`TokenPooling("first")`). The text
    tower: a `TokenAndPositionEmbedding`, the same blocks (not causal), a
    layer norm, the last token's state (`TokenPooling("last")`: SigLIP
    ends its texts with the end token and pads none) and a `Dense`
    projection. Then SigLIP's head, `ContrastiveLogits(use_bias=True)`.
    The text tower takes no padding mask, as the backbone; keras-hub's
    takes exactly `max_sequence_length` tokens (its position table is
    added whole), the converted one up to that many.

    Args:
        backbone: a built `keras_hub.models.SigLIPBackbone`,
            channels-last (otherwise `ValueError` naming `data_format`).

    Returns:
        The converted `keras.Model`.

    Example:

    >>> import keras_hub
    >>> from keras_attention.interop.siglip import convert_siglip
    >>> m = keras_hub.models
    >>> backbone = m.SigLIPBackbone(
    ...     m.SigLIPVisionEncoder(4, 8, 1, 2, 16, image_shape=(8, 8, 3)),
    ...     m.SigLIPTextEncoder(20, 8, 8, 1, 2, 16, max_sequence_length=6))
    >>> sorted(convert_siglip(backbone).output)
    ['text_logits', 'vision_logits']

    References:
        - Zhai et al., 2023, "Sigmoid Loss for Language Image
          Pre-Training".
    """
    _vision.check_options(
        backbone.vision_encoder, {"data_format": "channels_last"}
    )
    vision = _image_text.tower_config(backbone.vision_encoder, _VISION)
    text = _image_text.tower_config(backbone.text_encoder, _TEXT)
    dtype = backbone.dtype_policy
    images = _vision.image_input(vision["image_shape"])
    token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    head = ContrastiveLogits(
        0.0, use_bias=True, dtype=dtype, name="siglip_head"
    )
    vision_logits, text_logits = head(
        _vision_tower(images, vision, dtype),
        _text_tower(token_ids, text, dtype),
    )
    model = keras.Model(
        inputs={"images": images, "token_ids": token_ids},
        outputs={"vision_logits": vision_logits, "text_logits": text_logits},
        name=backbone.name,
    )
    _copy(backbone, model, vision, text)
    return model
