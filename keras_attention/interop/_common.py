"""What the keras-hub converters share (private to `interop`): the inputs
of a converted model, and the copy of the backbone's weights by a table of
path prefixes (their weight path -> ours)."""

import keras
import numpy as np


def token_inputs(*names):
    """`keras.Input`s `(batch, T)` int32 named as keras-hub names them."""
    return {
        name: keras.Input(shape=(None,), dtype="int32", name=name)
        for name in names
    }


def layer_prefixes(table, num_layers):
    """`table` (pairs of path prefixes; `{i}` stands for a layer index)
    made concrete for layers `0 .. num_layers - 1`: `{their prefix: our
    prefix}`."""
    out = {}
    for theirs, ours in table:
        if "{i}" in theirs:
            for i in range(num_layers):
                out[theirs.format(i=i)] = ours.format(i=i)
        else:
            out[theirs] = ours
    return out


def our_path(path, prefixes):
    """Our weight path for the backbone's `path`: its longest prefix (whole
    path segments) found in `prefixes` replaced by ours; None if none."""
    parts = path.split("/")
    for n in range(len(parts), 0, -1):
        head = "/".join(parts[:n])
        if head in prefixes:
            return "/".join([prefixes[head]] + parts[n:])
    return None


def copy_weights(backbone, model, prefixes, transform=None):
    """Copies (never shares) every weight of `backbone` into `model`.

    Each backbone weight goes to the weight of `model` at `our_path`; every
    weight of both must be matched exactly once and shapes must agree, else
    `ValueError` (a keras-hub version whose layout the table does not
    describe). `transform(their_path, value)`, when given, maps each NumPy
    value first (a transposed kernel, an offset scale). Returns the list of
    `(their path, our path)` pairs.
    """
    ours = {w.path: w for w in model.weights}
    pairs, unmatched = [], []
    for weight in backbone.weights:
        target = our_path(weight.path, prefixes)
        if target not in ours:
            unmatched.append(f"{weight.path} -> {target}")
            continue
        variable = ours.pop(target)
        value = np.array(keras.ops.convert_to_numpy(weight.value))
        if transform is not None:
            value = np.asarray(transform(weight.path, value))
        if tuple(variable.shape) != value.shape:
            raise ValueError(
                f"Weight {weight.path!r} of {type(backbone).__name__} has "
                f"shape {value.shape!r} but the converted {target!r} has "
                f"{tuple(variable.shape)!r}."
            )
        variable.assign(value)
        pairs.append((weight.path, target))
    if unmatched or ours:
        raise ValueError(
            f"The conversion of {type(backbone).__name__} does not match "
            "its weights (an unsupported variant or keras-hub version). "
            f"Backbone weights without a place: {unmatched!r}; converted "
            f"weights left without a value: {sorted(ours)!r}."
        )
    return pairs


def config_value(backbone, name):
    """`backbone.name` of its config, `ValueError` naming it if missing."""
    value = getattr(backbone, name, None)
    if value is None:
        value = backbone.get_config().get(name)
    if value is None:
        raise ValueError(
            f"{type(backbone).__name__} has no `{name}` in its config; this "
            "keras-hub version is not supported. Received: "
            f"backbone={backbone.name!r}"
        )
    return value
