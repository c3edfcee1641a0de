"""keras-hub's `CLIPBackbone` rebuilt from `keras_attention` blocks."""

import keras
import numpy as np

from keras_attention.interop import _common
from keras_attention.interop import _image_text
from keras_attention.interop import _vision
from keras_attention.layers.contrastive_logits import ContrastiveLogits
from keras_attention.layers.token_and_position_embedding import (
    TokenAndPositionEmbedding,
)
from keras_attention.layers.token_pooling import TokenPooling

# Their weight path prefix within a tower -> ours; `{i}`: the layer index
# (both from 0). The towers name their layers alike: each is matched on
# its own (`_image_text.tower_pairs`).
_BLOCK = (
    ("encoder_block_{i}/layer_norm_1", "self_attention_norm"),
    ("encoder_block_{i}/attention", "self_attention"),
    ("encoder_block_{i}/layer_norm_2", "feed_forward_norm"),
    ("encoder_block_{i}/dense_1", "feed_forward/intermediate_dense"),
    ("encoder_block_{i}/dense_2", "feed_forward/output_dense"),
)
VISION_TABLE = (
    ("embedding/class_embedding", "vision_class_token/embeddings"),
    ("embedding/patch_embedding", "vision_patch_embedding"),
    (
        "embedding/position_embedding/embeddings",
        "vision_position_embedding/embeddings",
    ),
    ("pre_layer_norm", "vision_pre_layer_norm"),
    *((t, f"vision_transformer_layer_{{i}}/{o}") for t, o in _BLOCK),
    ("layer_norm", "vision_layer_norm"),
)
TEXT_TABLE = (
    ("embedding/token_embedding", "text_embedding/token_embedding"),
    ("embedding/position_embedding", "text_embedding/position_embedding"),
    *((t, f"text_transformer_layer_{{i}}/{o}") for t, o in _BLOCK),
    ("layer_norm", "text_layer_norm"),
)
# The backbone's own weights (outside its towers): theirs -> ours.
HEAD_TABLE = (
    ("vision_projection", "vision_projection"),
    ("text_projection", "text_projection"),
    ("clip_head/logit_scale", "clip_head/logit_scale"),
)

_VISION = (
    "patch_size",
    "hidden_dim",
    "num_layers",
    "num_heads",
    "intermediate_dim",
    "intermediate_activation",
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
    "max_sequence_length",
)


def _check(backbone):
    for encoder in (backbone.vision_encoder, backbone.text_encoder):
        _vision.check_options(
            encoder,
            {"intermediate_output_index": None, "data_format": "channels_last"},
        )


def _vision_tower(images, config, dtype):
    hidden = config["hidden_dim"]
    patches = _vision.patch_embedding(
        images,
        hidden,
        config["patch_size"],
        False,
        dtype,
        name="vision_patch_embedding",
    )
    token = _vision.learned_tokens(
        images, 1, hidden, dtype, "vision_class_token"
    )
    x = keras.layers.Concatenate(axis=1, dtype=dtype)([token, patches])
    x = _vision.add_positions(x, dtype, name="vision_position_embedding")
    x = keras.layers.LayerNormalization(
        epsilon=1e-5, dtype=dtype, name="vision_pre_layer_norm"
    )(x)
    x = _image_text.stack(
        x,
        "vision",
        config,
        causal=False,
        activation=_image_text.activation(config["intermediate_activation"]),
        epsilon=1e-5,
        dtype=dtype,
    )
    x = keras.layers.LayerNormalization(
        epsilon=1e-5, dtype=dtype, name="vision_layer_norm"
    )(x)
    return TokenPooling("first", dtype=dtype, name="vision_pooling")(x)


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
        causal=True,
        activation=_image_text.activation(config["intermediate_activation"]),
        epsilon=1e-5,
        dtype=dtype,
    )
    x = keras.layers.LayerNormalization(
        epsilon=1e-6, dtype=dtype, name="text_layer_norm"
    )(x)
    pooling = TokenPooling("eos", dtype=dtype, name="text_pooling")
    return pooling(x, token_ids=token_ids)


def _copy(backbone, model, vision, text):
    ours = {w.path: w for w in model.weights}
    vision_transform = _image_text.positions_transform(backbone.vision_encoder)

    def transform(path, value):
        if path == "embedding/class_embedding":
            return value[None]  # one row (1, hidden)
        return vision_transform(path, value)

    pairs = _image_text.tower_pairs(
        backbone.vision_encoder,
        model,
        VISION_TABLE,
        vision["num_layers"],
        transform,
    )
    pairs += _image_text.tower_pairs(
        backbone.text_encoder, model, TEXT_TABLE, text["num_layers"]
    )
    towers = {
        id(w)
        for w in backbone.vision_encoder.weights + backbone.text_encoder.weights
    }
    head = dict(HEAD_TABLE)
    for weight in backbone.weights:
        if id(weight) in towers:
            continue
        target = ours.get(_common.our_path(weight.path, head))
        if target is not None:
            pairs.append((weight, target, None))
    _, ids = _image_text.position_ids(backbone.vision_encoder)
    _common.copy_pairs(backbone, model, pairs, recomputed=[ids])


def convert_clip(backbone):
    """A `keras.Model` of `keras_attention` blocks equal to a keras-hub
    `CLIPBackbone` (both towers, the projections and the head), holding a
    copy of its weights.

    Inputs `images` `(batch, H, W, C)` (channels-last) and `token_ids`
    int `(batch, T)`, outputs `vision_logits` `(images, texts)` and
    `text_logits` `(texts, images)`, as the backbone's. The vision tower:
    the patches (a `Conv2D` without bias), the class token (an
    `Embedding` row) first, learned positions, a layer norm, pre-norm
    `TransformerEncoderBlock`s (`SelfAttention`, `FeedForward` with
    `quick_gelu`), a final layer norm, the class token's state
    (`TokenPooling("first")`). The text tower: a
    `TokenAndPositionEmbedding`, pre-norm blocks with a causal
    `SelfAttention`, a final layer norm, the state at the end token
    (`TokenPooling("eos")`: the position of the largest id, CLIP's end
    token). Then each tower's projection (a `Dense` without bias) and
    CLIP's head (`ContrastiveLogits`). Like the backbone, the text tower
    takes no padding mask: causal attention keeps the tokens after the
    end token out of its state.

    The position table of the vision tower is copied as the forward pass
    reads it, through the stored `position_ids` (`0, 1, ...` in the
    presets; a freshly built backbone holds zeros there, and every patch
    reads row 0).

    Args:
        backbone: a built `keras_hub.models.CLIPBackbone`: channels-last,
            towers without `intermediate_output_index`; otherwise
            `ValueError` naming the option.

    Returns:
        The converted `keras.Model`.

    Example:

    >>> import keras_hub
    >>> from keras_attention.interop.clip import convert_clip
    >>> m = keras_hub.models
    >>> backbone = m.CLIPBackbone(
    ...     m.CLIPVisionEncoder(4, 8, 1, 2, 16, image_shape=(8, 8, 3)),
    ...     m.CLIPTextEncoder(20, 8, 8, 1, 2, 16, max_sequence_length=6),
    ...     projection_dim=4)
    >>> sorted(convert_clip(backbone).output)
    ['text_logits', 'vision_logits']

    References:
        - Radford et al., 2021, "Learning Transferable Visual Models From
          Natural Language Supervision".
    """
    _check(backbone)
    vision = _image_text.tower_config(backbone.vision_encoder, _VISION)
    text = _image_text.tower_config(backbone.text_encoder, _TEXT)
    dtype = backbone.dtype_policy
    images = _vision.image_input(vision["image_shape"])
    token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    projection = _common.config_value(backbone, "projection_dim")
    embeddings = []
    for tower, name in (
        (_vision_tower(images, vision, dtype), "vision_projection"),
        (_text_tower(token_ids, text, dtype), "text_projection"),
    ):
        dense = keras.layers.Dense(
            projection, use_bias=False, dtype=dtype, name=name
        )
        embeddings.append(dense(tower))
    head = ContrastiveLogits(np.log(1 / 0.07), dtype=dtype, name="clip_head")
    vision_logits, text_logits = head(*embeddings)
    model = keras.Model(
        inputs={"images": images, "token_ids": token_ids},
        outputs={"vision_logits": vision_logits, "text_logits": text_logits},
        name=backbone.name,
    )
    _copy(backbone, model, vision, text)
    return model
