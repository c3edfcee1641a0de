"""What the converters of keras-hub's image-text backbones (CLIP,
SigLIP) share (private to `interop`): a tower's stack of pre-norm
encoder blocks, the copy of a tower's weights (keras-hub's two towers
name their layers alike, so each tower is matched on its own), and the
position tables read through their stored `position_ids`."""

import numpy as np

from keras_attention.interop import _common
from keras_attention.layers.activations import gelu_approximate
from keras_attention.layers.activations import quick_gelu

# keras-hub's activation names that are functions of ours (registered:
# they reload under `safe_mode=True`); other names are Keras's.
_ACTIVATIONS = {"quick_gelu": quick_gelu, "gelu_approximate": gelu_approximate}


def activation(name):
    """A keras-hub `intermediate_activation` as ours."""
    return _ACTIVATIONS.get(name, name)


def stack(x, name, config, causal, activation, epsilon, dtype):
    """`config["num_layers"]` pre-norm blocks named
    `{name}_transformer_layer_{i}`, each a `SelfAttention` (with biases)
    and a `FeedForward` of `activation`: `TransformerEncoderBlock`s, or
    with `causal` `TransformerDecoderBlock`s without cross-attention."""
    hidden, heads = config["hidden_dim"], config["num_heads"]
    block = _common.decoder_block if causal else _common.encoder_block
    for i in range(config["num_layers"]):
        x = block(
            f"{name}_transformer_layer_{i}",
            self_attention=_common.self_attention(
                heads, hidden // heads, causal=causal, dtype=dtype
            ),
            feed_forward=_common.feed_forward(
                config["intermediate_dim"], activation=activation, dtype=dtype
            ),
            norm_first=True,
            layer_norm_epsilon=epsilon,
            dtype=dtype,
        )(x)
    return x


def tower_config(encoder, names):
    """`{name: value}` of a keras-hub tower (`CLIPVisionEncoder`, ...)."""
    return {name: _common.config_value(encoder, name) for name in names}


def _name_prefix(encoder):
    """The prefix keras-hub puts before a tower's layer names
    (`"<name>_"` for a tower built with a `name`), or ""."""
    prefix = f"{encoder.name}_"
    if any(w.path.startswith(prefix) for w in encoder.weights):
        return prefix
    return ""


def tower_pairs(encoder, model, table, num_layers, transform=None):
    """`(their weight, our weight, value)` for `_common.copy_pairs`, of the
    weights of one tower `encoder`: `table` (pairs of path prefixes, theirs
    within the tower -> ours; `{i}` the layer index) made concrete, their
    weights not in it left out (the caller's `copy_pairs` names them).
    `transform(their local path, value)` maps a value first."""
    prefix = _name_prefix(encoder)
    prefixes = {
        prefix + theirs: ours
        for theirs, ours in _common.layer_prefixes(table, num_layers).items()
    }
    ours = {w.path: w for w in model.weights}
    pairs = []
    for weight in encoder.weights:
        target = ours.get(_common.our_path(weight.path, prefixes))
        if target is None:
            continue
        value = _common.numpy_value(weight)
        if transform is not None:
            value = transform(weight.path[len(prefix) :], value)
        pairs.append((weight, target, value))
    return pairs


def position_ids(encoder):
    """A tower's stored `position_ids` `(positions,)` (keras-hub's
    `embedding/position_ids`, `(1, positions)`) and the variable."""
    prefix = _name_prefix(encoder)
    for weight in encoder.weights:
        if weight.path == f"{prefix}embedding/position_ids":
            return np.asarray(_common.numpy_value(weight))[0], weight
    raise ValueError(
        f"{type(encoder).__name__} has no `embedding/position_ids`; this "
        f"keras-hub version is not supported. Received: "
        f"encoder={encoder.name!r}"
    )


def positions_transform(encoder):
    """A `tower_pairs` transform giving the position table as the forward
    pass reads it: its rows at the stored `position_ids` (`0, 1, ...` in
    the presets)."""
    ids, _ = position_ids(encoder)

    def transform(path, value):
        if path == "embedding/position_embedding/embeddings":
            return value[ids]
        return value

    return transform
