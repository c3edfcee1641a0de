"""keras-hub's `MetaCLIP2Backbone` rebuilt from `keras_attention` blocks:
CLIP's model (`interop.clip`) with MetaCLIP 2's differences."""

import numpy as np

from keras_attention.interop import _image_text
from keras_attention.interop import clip
from keras_attention.layers.contrastive_logits import ContrastiveLogits

# keras-hub 0.32's `MetaCLIP2TextPooler` (built by the backbone with its
# default): the end token of MetaCLIP 2's tokenizer.
EOS_TOKEN_ID = 2

# As CLIP's tables, with no final layer norm in the vision tower (the
# backbone's `vision_post_layer_norm` on the pooled class token instead)
# and MetaCLIP 2's head.
VISION_TABLE = tuple(row for row in clip.VISION_TABLE if row[0] != "layer_norm")
TEXT_TABLE = clip.TEXT_TABLE
HEAD_TABLE = (
    ("vision_post_layer_norm", "vision_post_layer_norm"),
    ("vision_projection", "vision_projection"),
    ("text_projection", "text_projection"),
    ("metaclip_2_head/logit_scale", "metaclip_2_head/logit_scale"),
)


def convert_metaclip_2(backbone):
    """A `keras.Model` of `keras_attention` blocks equal to a keras-hub
    `MetaCLIP2Backbone` (both towers, the projections and the head),
    holding a copy of its weights.

    CLIP's converted model (`interop.clip.convert_clip`: the same inputs
    `images` and `token_ids`, outputs `vision_logits` and `text_logits`,
    layers and names) with MetaCLIP 2's differences: the vision tower's
    final layer norm is applied to the pooled class token
    (`vision_post_layer_norm`, the backbone's), the text tower's final
    norm has epsilon 1e-5, and the text is pooled at its first end token
    (`TokenPooling("eos", eos_token_id=2)`, position 0 in a text without
    one, as keras-hub); the head is named `metaclip_2_head`. The position
    ids are `0, 1, ...` (computed by keras-hub, not stored).

    Args:
        backbone: a built `keras_hub.models.MetaCLIP2Backbone`:
            channels-last, towers without `intermediate_output_index`;
            otherwise `ValueError` naming the option.

    Returns:
        The converted `keras.Model`.

    Example:

    >>> import keras_hub
    >>> from keras_attention.interop.metaclip_2 import convert_metaclip_2
    >>> m = keras_hub.models
    >>> backbone = m.MetaCLIP2Backbone(
    ...     m.MetaCLIP2VisionEncoder(4, 8, 1, 2, 16, image_shape=(8, 8, 3)),
    ...     m.MetaCLIP2TextEncoder(20, 8, 8, 1, 2, 16, max_sequence_length=6),
    ...     projection_dim=4)
    >>> sorted(convert_metaclip_2(backbone).output)
    ['text_logits', 'vision_logits']

    References:
        - Chuang et al., 2025, "Meta CLIP 2: A Worldwide Scaling Recipe".
    """
    clip.check(backbone)
    vision = _image_text.tower_config(
        backbone.vision_encoder, clip.VISION_CONFIG
    )
    text = _image_text.tower_config(backbone.text_encoder, clip.TEXT_CONFIG)
    head = ContrastiveLogits(
        np.log(1 / 0.07), dtype=backbone.dtype_policy, name="metaclip_2_head"
    )
    model = clip.build(
        backbone,
        vision,
        text,
        head,
        pooled_norm=True,
        epsilon=1e-5,
        eos_token_id=EOS_TOKEN_ID,
    )
    tables = (VISION_TABLE, TEXT_TABLE, HEAD_TABLE)
    clip.copy_weights(backbone, model, tables, vision, text, position_ids=False)
    return model
