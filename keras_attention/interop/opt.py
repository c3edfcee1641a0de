"""keras-hub's `OPTBackbone` rebuilt from `keras_attention` blocks."""

import keras

from keras_attention.interop import _common
from keras_attention.interop.gpt2 import WEIGHT_TABLE as GPT2_TABLE
from keras_attention.layers.token_and_position_embedding import (
    TokenAndPositionEmbedding,
)

# Their weight path prefix -> ours (`{i}`: the layer index): GPT-2's
# decoder layers and final norm (keras-hub's `TransformerDecoder` on both),
# with the token and position tables under `embeddings` on both sides.
WEIGHT_TABLE = (("embeddings", "embeddings"),) + tuple(
    pair for pair in GPT2_TABLE if "embedding" not in pair[0]
)


def convert_opt(backbone):
    """A `keras.Model` of `keras_attention` blocks equal to a keras-hub
    `OPTBackbone`, holding a copy of its weights.

    Inputs `token_ids`, `padding_mask` (int `(batch, T)`); output the
    sequence output `(batch, T, hidden)`. Token plus learned position
    embeddings (`TokenAndPositionEmbedding`: keras-hub's table of
    `max_sequence_length` rows, position `p` in row `p`; the token table
    tied to the logits), `TransformerDecoderBlock`s with biases, each
    pre-norm or post-norm as its keras-hub layer (`normalize_first`:
    keras-hub 0.32's backbone builds them pre-norm, OPT-350m's
    post-norm layers are theirs with `normalize_first=False`), with its
    activation (`relu`) and norm epsilon (1e-5), and the final layer norm.
    The position table is keras-hub's: `max_sequence_length` rows,
    position `p` in row `p` on both sides (Hugging Face's OPT stores 2
    more rows and reads position `p` from row `p + 2`; keras-hub's table
    has no such offset). The dropout (`dropout`, 0.1
    by default) sits where keras-hub's does: on the attention weights
    and on each sublayer's output, not on the feed-forward's hidden
    activations.

    Args:
        backbone: a built `keras_hub.models.OPTBackbone`.

    Returns:
        The converted `keras.Model`.

    Example:

    >>> import keras_hub
    >>> from keras_attention.interop.opt import convert_opt
    >>> backbone = keras_hub.models.OPTBackbone(
    ...     vocabulary_size=20, num_layers=1, num_heads=2, hidden_dim=8,
    ...     intermediate_dim=16, max_sequence_length=6)
    >>> convert_opt(backbone).output.shape
    (None, None, 8)

    References:
        - Zhang et al., 2022, "OPT: Open Pre-trained Transformer Language
          Models".
    """
    config = {
        name: _common.config_value(backbone, name)
        for name in (
            "vocabulary_size",
            "num_layers",
            "num_heads",
            "hidden_dim",
            "intermediate_dim",
            "dropout",
            "max_sequence_length",
        )
    }
    dtype = backbone.dtype_policy
    inputs = _common.token_inputs("token_ids", "padding_mask")
    x = TokenAndPositionEmbedding(
        config["vocabulary_size"],
        config["max_sequence_length"],
        config["hidden_dim"],
        dtype=dtype,
        name="embeddings",
    )(inputs["token_ids"])
    heads, hidden = config["num_heads"], config["hidden_dim"]
    for i, layer in enumerate(backbone.transformer_layers):
        x = _common.decoder_block(
            f"transformer_layer_{i}",
            self_attention=_common.self_attention(
                heads,
                hidden // heads,
                causal=True,
                dropout=config["dropout"],
                dtype=dtype,
            ),
            feed_forward=_common.feed_forward(
                config["intermediate_dim"],
                activation=layer.activation,
                dtype=dtype,
            ),
            dropout=config["dropout"],
            norm_first=bool(layer.normalize_first),
            layer_norm_epsilon=float(layer.layer_norm_epsilon),
            dtype=dtype,
        )(x, padding_mask=inputs["padding_mask"])
    x = keras.layers.LayerNormalization(
        epsilon=float(backbone.layer_norm.epsilon),
        dtype=dtype,
        name="layer_norm",
    )(x)
    model = keras.Model(inputs=inputs, outputs=x, name=backbone.name)
    prefixes = _common.layer_prefixes(WEIGHT_TABLE, config["num_layers"])
    _common.copy_weights(backbone, model, prefixes)
    return model
