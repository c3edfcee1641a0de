"""keras-hub's `GPTNeoXBackbone` rebuilt from `keras_attention` blocks."""

import keras
import numpy as np

from keras_attention.interop import _common
from keras_attention.layers.activations import gelu_approximate

# Their weight path prefix -> ours (`{i}`: the layer index). keras-hub's
# fused `query_key_value` projection (`(hidden, heads, 3 * head_dim)`,
# each head's query, key and value side by side) is split into our
# `query`, `key` and `value` (`QKV`); its attention output, a `(hidden,
# hidden)` kernel, is reshaped to our `(heads, head_dim, hidden)`.
WEIGHT_TABLE = (
    ("token_embedding", "token_embedding"),
    (
        "transformer_layer_{i}/self_attention/query_key_value",
        "transformer_layer_{i}/self_attention",
    ),
    (
        "transformer_layer_{i}/self_attention/attention_output",
        "transformer_layer_{i}/self_attention/attention_output",
    ),
    (
        "transformer_layer_{i}/self_attention_layer_norm",
        "transformer_layer_{i}/self_attention_norm",
    ),
    (
        "transformer_layer_{i}/feedforward_intermediate_dense",
        "transformer_layer_{i}/feed_forward/intermediate_dense",
    ),
    (
        "transformer_layer_{i}/feedforward_output_dense",
        "transformer_layer_{i}/feed_forward/output_dense",
    ),
    (
        "transformer_layer_{i}/feedforward_layer_norm",
        "transformer_layer_{i}/feed_forward_norm",
    ),
    ("layer_norm", "layer_norm"),
)

QKV = ("query", "key", "value")


def rotary_fraction(backbone, head_dim):
    """The self-attention's `rotary_fraction` rotating keras-hub's
    `int(head_dim * rotary_percentage)` first features of each head (ours
    rotates `2 * floor(head_dim * fraction / 2)`): that count must be
    even and at least 2, else `ValueError`."""
    percentage = float(_common.config_value(backbone, "rotary_percentage"))
    rotated = int(head_dim * percentage)
    if rotated % 2 or rotated < 2:
        raise ValueError(
            "keras-hub rotates `int(head_dim * rotary_percentage)` "
            "features of each head, which must be even and at least 2. "
            f"Received: head_dim={head_dim!r}, rotary_percentage="
            f"{percentage!r}"
        )
    return rotated / head_dim


def _copy_weights(backbone, model, num_layers, heads, head_dim):
    """Copies the backbone's weights into `model` by `WEIGHT_TABLE`: the
    fused query/key/value kernel and bias split into ours, the output
    kernel reshaped."""
    prefixes = _common.layer_prefixes(WEIGHT_TABLE, num_layers)
    ours = {w.path: w for w in model.weights}
    pairs = []
    for weight in backbone.weights:
        path = _common.our_path(weight.path, prefixes)
        value = _common.numpy_value(weight)
        if "/query_key_value/" in weight.path:
            # `.../self_attention/kernel` -> `.../self_attention/query/kernel`
            head, name = path.rsplit("/", 1)
            for k, part in enumerate(QKV):
                target = ours.get(f"{head}/{part}/{name}")
                if target is not None:
                    piece = value[..., k * head_dim : (k + 1) * head_dim]
                    pairs.append((weight, target, piece))
            continue
        if path not in ours:
            continue  # reported by `copy_pairs` as without a place
        if weight.path.endswith("attention_output/kernel"):
            value = np.reshape(value, (heads, head_dim, -1))
        pairs.append((weight, ours[path], value))
    _common.copy_pairs(backbone, model, pairs)


def convert_gpt_neox(backbone):
    """A `keras.Model` of `keras_attention` blocks equal to a keras-hub
    `GPTNeoXBackbone`, holding a copy of its weights.

    Inputs `token_ids`, `padding_mask` (int `(batch, T)`); output the
    sequence output `(batch, T, hidden)`. The tied token embedding and
    its dropout, then `TransformerDecoderBlock`s with
    `parallel_residual=True` (GPT-NeoX's parallel residual: `x +
    attention(LN1(x)) + feed_forward(LN2(x))`, pre-norm, each sublayer
    with its own layer norm), multi-head attention with biases and
    partial rotary positions (`rotary_fraction`: keras-hub rotates the
    first `int(head_dim * rotary_percentage)` features of each head,
    frequencies over them, `rotary_max_wavelength`), a feed-forward with
    biases and `gelu_approximate`; then the final layer norm. keras-hub's
    fused query/key/value projection is split into ours.

    keras-hub's `GPTNeoXCausalLM.generate` rotates each cached step's
    query at position 0 (its attention calls its rotary embedding without
    the step's index): its tokens are not those of greedy decoding
    driven by its own forward pass. Ours rotate each query at its
    position and equal the latter.

    Args:
        backbone: a built `keras_hub.models.GPTNeoXBackbone`.

    Returns:
        The converted `keras.Model`.

    Raises:
        ValueError: a `rotary_percentage` that makes keras-hub rotate an
            odd number of features (or none).

    Example:

    >>> import keras_hub
    >>> from keras_attention.interop.gpt_neox import convert_gpt_neox
    >>> backbone = keras_hub.models.GPTNeoXBackbone(
    ...     vocabulary_size=20, num_layers=1, num_heads=2, hidden_dim=16,
    ...     intermediate_dim=32, rotary_percentage=0.25)
    >>> block = convert_gpt_neox(backbone).get_layer("transformer_layer_0")
    >>> block.parallel_residual, block.self_attention.rotary_fraction
    (True, 0.25)

    References:
        - Black et al., 2022, "GPT-NeoX-20B: An Open-Source Autoregressive
          Language Model".
        - Su et al., 2021, "RoFormer: Enhanced Transformer with Rotary
          Position Embedding".
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
            "rotary_max_wavelength",
            "layer_norm_epsilon",
        )
    }
    heads, hidden = config["num_heads"], config["hidden_dim"]
    head_dim = hidden // heads
    fraction = rotary_fraction(backbone, head_dim)
    dtype = backbone.dtype_policy
    inputs = _common.token_inputs("token_ids", "padding_mask")
    x = keras.layers.ReversibleEmbedding(
        config["vocabulary_size"], hidden, dtype=dtype, name="token_embedding"
    )(inputs["token_ids"])
    x = keras.layers.Dropout(
        config["dropout"], dtype=dtype, name="embeddings_dropout"
    )(x)
    for i in range(config["num_layers"]):
        x = _common.decoder_block(
            f"transformer_layer_{i}",
            self_attention=_common.self_attention(
                heads,
                head_dim,
                causal=True,
                dropout=config["dropout"],
                rotary_max_wavelength=config["rotary_max_wavelength"],
                rotary_fraction=fraction,
                dtype=dtype,
            ),
            feed_forward=_common.feed_forward(
                config["intermediate_dim"],
                activation=gelu_approximate,
                dtype=dtype,
            ),
            dropout=config["dropout"],
            norm_first=True,
            parallel_residual=True,
            layer_norm_epsilon=config["layer_norm_epsilon"],
            dtype=dtype,
        )(x, padding_mask=inputs["padding_mask"])
    x = keras.layers.LayerNormalization(
        epsilon=config["layer_norm_epsilon"], dtype=dtype, name="layer_norm"
    )(x)
    model = keras.Model(inputs=inputs, outputs=x, name=backbone.name)
    _copy_weights(backbone, model, config["num_layers"], heads, head_dim)
    return model
