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
BLOCK_TABLE = (
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
    *((t, f"vision_transformer_layer_{{i}}/{o}") for t, o in BLOCK_TABLE),
    ("layer_norm", "vision_layer_norm"),
)
TEXT_TABLE = (
    ("embedding/token_embedding", "text_embedding/token_embedding"),
    ("embedding/position_embedding", "text_embedding/position_embedding"),
    *((t, f"text_transformer_layer_{{i}}/{o}") for t, o in BLOCK_TABLE),
    ("layer_norm", "text_layer_norm"),
)
# The backbone's own weights (outside its towers): theirs -> ours.
HEAD_TABLE = (
    ("vision_projection", "vision_projection"),
    ("text_projection", "text_projection"),
    ("clip_head/logit_scale", "clip_head/logit_scale"),
)

VISION_CONFIG = (
    "patch_size",
    "hidden_dim",
    "num_layers",
    "num_heads",
    "intermediate_dim",
    "intermediate_activation",
    "image_shape",
)
TEXT_CONFIG = (
    "vocabulary_size",
    "embedding_dim",
    "hidden_dim",
    "num_layers",
    "num_heads",
    "intermediate_dim",
    "intermediate_activation",
    "max_sequence_length",
)


def check(backbone):
    for encoder in (backbone.vision_encoder, backbone.text_encoder):
        _vision.check_options(
            encoder,
            {"intermediate_output_index": None, "data_format": "channels_last"},
        )


def _vision_tower(images, config, dtype, pooled_norm=False):
    """CLIP's vision tower; `pooled_norm` (MetaCLIP 2): the final layer
    norm on the pooled class token (`vision_post_layer_norm`) instead of
    on the sequence (`vision_layer_norm`), the same values."""
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
    name = "vision_post_layer_norm" if pooled_norm else "vision_layer_norm"
    norm = keras.layers.LayerNormalization(epsilon=1e-5, dtype=dtype, name=name)
    pooling = TokenPooling("first", dtype=dtype, name="vision_pooling")
    return norm(pooling(x)) if pooled_norm else pooling(norm(x))


def _text_tower(token_ids, config, dtype, epsilon=1e-6, eos_token_id=None):
    """CLIP's text tower, its final norm of `epsilon`, pooled at the first
    `eos_token_id` (None: at the largest id)."""
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
        epsilon=epsilon, dtype=dtype, name="text_layer_norm"
    )(x)
    pooling = TokenPooling(
        "eos", eos_token_id=eos_token_id, dtype=dtype, name="text_pooling"
    )
    return pooling(x, token_ids=token_ids)


def copy_weights(backbone, model, tables, vision, text, position_ids=True):
    """Copies `backbone`'s weights into `model` by `tables` (vision, text,
    head); `position_ids`: the vision tower stores them (CLIP; MetaCLIP 2
    computes `0, 1, ...`)."""
    vision_table, text_table, head_table = tables
    ours = {w.path: w for w in model.weights}
    vision_transform = (
        _image_text.positions_transform(backbone.vision_encoder)
        if position_ids
        else (lambda path, value: value)
    )

    def transform(path, value):
        if path == "embedding/class_embedding":
            return value[None]  # one row (1, hidden)
        return vision_transform(path, value)

    pairs = _image_text.tower_pairs(
        backbone.vision_encoder,
        model,
        vision_table,
        vision["num_layers"],
        transform,
    )
    pairs += _image_text.tower_pairs(
        backbone.text_encoder, model, text_table, text["num_layers"]
    )
    towers = {
        id(w)
        for w in backbone.vision_encoder.weights + backbone.text_encoder.weights
    }
    head = dict(head_table)
    for weight in backbone.weights:
        if id(weight) in towers:
            continue
        target = ours.get(_common.our_path(weight.path, head))
        if target is not None:
            pairs.append((weight, target, None))
    recomputed = []
    if position_ids:
        recomputed = [_image_text.position_ids(backbone.vision_encoder)[1]]
    _common.copy_pairs(backbone, model, pairs, recomputed=recomputed)


def build(backbone, vision, text, head, **options):
    """The converted model of a CLIP-style backbone (CLIP, MetaCLIP 2):
    both towers (`options`: `pooled_norm` for the vision tower,
    `epsilon` and `eos_token_id` for the text tower), the projections
    and `head` (a `ContrastiveLogits`)."""
    dtype = backbone.dtype_policy
    images = _vision.image_input(vision["image_shape"])
    token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    projection = _common.config_value(backbone, "projection_dim")
    pooled_norm = options.pop("pooled_norm", False)
    embeddings = []
    for tower, name in (
        (
            _vision_tower(images, vision, dtype, pooled_norm),
            "vision_projection",
        ),
        (_text_tower(token_ids, text, dtype, **options), "text_projection"),
    ):
        dense = keras.layers.Dense(
            projection, use_bias=False, dtype=dtype, name=name
        )
        embeddings.append(dense(tower))
    vision_logits, text_logits = head(*embeddings)
    return keras.Model(
        inputs={"images": images, "token_ids": token_ids},
        outputs={"vision_logits": vision_logits, "text_logits": text_logits},
        name=backbone.name,
    )


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
    check(backbone)
    vision = _image_text.tower_config(backbone.vision_encoder, VISION_CONFIG)
    text = _image_text.tower_config(backbone.text_encoder, TEXT_CONFIG)
    head = ContrastiveLogits(
        np.log(1 / 0.07), dtype=backbone.dtype_policy, name="clip_head"
    )
    model = build(backbone, vision, text, head)
    tables = (VISION_TABLE, TEXT_TABLE, HEAD_TABLE)
    copy_weights(backbone, model, tables, vision, text)
    return model
