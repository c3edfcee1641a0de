import keras
import numpy as np
from keras import ops

from keras_attention.utils import keras_utils
from keras_attention.utils import validation

# Ranks of `inputs`: `(batch, T, d)` and keras-hub's `(batch, ..., T, d)`,
# up to 5 (oneDNN's kernels take rank <= 5).
_RANKS = (3, 4, 5)


def _check_positions(length, start_index, sequence_length):
    """`start_index` checked (`validation.check_index`: a non-negative
    integer or an integer tensor) and, when it and the number of steps
    `length` are static, `start_index + length <= sequence_length`: the
    table has no row beyond (TensorFlow's slice fails, JAX's clamps into
    the wrong rows). Returns `start_index` (a Python int when static)."""
    start_index = validation.check_index("start_index", start_index)
    start = keras_utils.concrete_int(start_index)
    if start is not None and start < 0:
        validation.check_index("start_index", start)  # names the value
    if (
        start is not None
        and length is not None
        and start + length > sequence_length
    ):
        raise ValueError(
            "Positions `start_index` .. `start_index + steps - 1` must be "
            f"below `sequence_length`. Received: start_index={start!r}"
            f", steps={length!r}, sequence_length={sequence_length!r}"
        )
    return start_index


def _known_values(x):
    """`x` as a NumPy array when its values are known now (a NumPy array,
    a list, an eager tensor), None where they are not (a tensor traced by
    `tf.function` or `jax.jit`, a symbolic Keras input)."""
    if isinstance(x, (np.ndarray, np.generic, list, tuple, int, float)):
        return np.asarray(x)
    try:
        return np.asarray(ops.convert_to_numpy(x))
    except Exception:  # noqa: BLE001 - symbolic: no value before it runs.
        return None


def _gather_rows(table, positions, inputs_shape, name="positions"):
    """Rows `table[positions]` `(b|1, T, d)` for positions `(T,)` or
    `(batch, T)` of inputs `(batch, ..., T, d)`.

    Eagerly (values known): `ValueError` naming `name` unless they are
    whole numbers in `[0, rows)` and of the inputs' shape
    (`validation.check_positions`). Where they are not known (compiled,
    traced), shapes known at trace time are checked and the values are
    cast to int32 and clamped into the table: every backend reads row 0
    for a negative position and the last row past the end (not the
    backend's gather: TensorFlow fails on CPU, XLA clamps, JAX fills NaN,
    and all of them read a negative index from the end)."""
    validation.check_numeric_input(name, positions)
    values = _known_values(positions)
    positions = ops.convert_to_tensor(positions)
    rows = table.shape[0]
    validation.check_positions(
        name, positions.shape, inputs_shape, -2, values=values, size=rows
    )
    index = ops.clip(ops.cast(positions, "int32"), 0, rows - 1)
    out = ops.take(table, index, axis=0)
    return out[None] if len(positions.shape) == 1 else out


@keras.saving.register_keras_serializable(package="keras_attention")
class PositionEmbedding(keras.layers.Layer):
    """Learned position embedding: one trainable vector per position.

    Returns the embeddings of positions `start_index .. start_index + T - 1`
    broadcast to the shape of `inputs` (add them yourself: `x + layer(x)`).

    Args:
        sequence_length: int, the maximum number of positions.
        initializer: initializer of the `(sequence_length, d)` table.
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: `(batch, T, d)`, or `(batch, ..., T, d)` up to rank 5
            (keras-hub's layout: positions on the second-to-last axis);
            only its shape is used. `T` (plus `start_index`) must not
            exceed `sequence_length`.
        start_index: int or scalar int tensor, position of `inputs[:, 0]`
            (the cache index in incremental decoding).
        positions: optional integer positions `(T,)` or `(batch, T)`
            (batch 1 or the inputs') instead of `start_index + arange(T)`
            (keras-hub's argument): positions that restart in each packed
            document (`keras_attention.masks.segment_positions`). Each is
            a row of the table, a whole number in `[0, sequence_length)`:
            eager calls raise `ValueError` naming `positions` (and the
            value) otherwise, or for another shape. Compiled or traced
            (`tf.function`, `jax.jit`: TensorFlow's and JAX's `fit` and
            `predict`; PyTorch's run eagerly and check), where the values
            are not known, they are cast to int32 and clamped into the
            table on every backend (a negative position reads row 0, one
            past the end the last row); shapes known at trace time are
            still checked.

    Returns:
        position embeddings of the shape of `inputs`.

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> layer = keras_attention.layers.PositionEmbedding(sequence_length=10)
    >>> tuple(layer(np.zeros((2, 4, 8), "float32")).shape)
    (2, 4, 8)

    References:
        - Gehring et al., 2017, "Convolutional Sequence to Sequence
          Learning" (learned position embeddings).
        - Devlin et al., 2019, "BERT".
    """

    def __init__(self, sequence_length, initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        self.sequence_length = validation.check_positive_int(
            "sequence_length", sequence_length
        )
        self.initializer = keras.initializers.get(initializer)
        self.supports_masking = True

    def build(self, inputs_shape):
        validation.check_sequence_shape("inputs", inputs_shape, _RANKS)
        if (
            inputs_shape[-2] is not None
            and inputs_shape[-2] > self.sequence_length
        ):
            raise ValueError(
                "`inputs` has more steps than `sequence_length`. Received: "
                f"inputs_shape={tuple(inputs_shape)!r}, "
                f"sequence_length={self.sequence_length!r}"
            )
        self.position_embeddings = self.add_weight(
            name="embeddings",
            shape=(self.sequence_length, inputs_shape[-1]),
            initializer=keras_utils.clone_initializer(self.initializer),
            trainable=True,
        )
        self.built = True

    def call(self, inputs, start_index=0, positions=None):
        validation.check_sequence_shape("inputs", inputs.shape, _RANKS)
        validation.check_built_features(
            "inputs", inputs.shape, self.position_embeddings.shape[-1]
        )
        table = ops.convert_to_tensor(self.position_embeddings)
        # p - positions, d - features; rows (b|1, T, d), then one axis per
        # extra input axis before T (keras-hub's `(batch, ..., T, d)`).
        if positions is not None:  # (T,) or (batch, T) row indices
            rows = _gather_rows(table, positions, tuple(inputs.shape))
        else:
            start_index = _check_positions(
                inputs.shape[-2], start_index, self.sequence_length
            )
            length = ops.shape(inputs)[-2]
            rows = ops.slice(
                table, (start_index, 0), (length, ops.shape(table)[1])
            )[None]
        for _ in range(len(inputs.shape) - 3):
            rows = ops.expand_dims(rows, 1)
        out = ops.broadcast_to(rows, ops.shape(inputs))
        return ops.cast(out, self.compute_dtype)

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "sequence_length": self.sequence_length,
                "initializer": keras.initializers.serialize(self.initializer),
            }
        )
        return config
