import keras
from keras import ops

from keras_attention.utils import keras_utils
from keras_attention.utils import validation

CELLS = ("gru", "lstm")


@keras.saving.register_keras_serializable(package="keras_attention")
class EncoderBridge(keras.layers.Layer):
    """Initial decoder state from a bidirectional RNN encoder.

    Bahdanau et al. (2015, appendix A.2.2) start the decoder from the
    backward encoder's first state; with both directions:

        s_0 = tanh(W_s [h_fwd_T; h_bwd_1] + b_s)

    where `h_fwd_T` and `h_bwd_1` are the final states of the two
    directions, as `keras.layers.Bidirectional(..., return_state=True)`
    returns them. For an LSTM the cell state gets its own projection:
    `c_0 = tanh(W_c [c_fwd_T; c_bwd_1] + b_c)`.

    Args:
        units: int, the decoder's state size.
        cell: `"gru"` (one state) or `"lstm"` (`[h, c]`).
        kernel_initializer: initializer of `W`.
        bias_initializer: initializer of `b`.
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        forward_h: `(batch, d)`, final state of the forward direction.
        backward_h: `(batch, d)`, final state of the backward direction.
        forward_c, backward_c: `(batch, d)`, LSTM cell states (LSTM only).

    Returns:
        `s_0` `(batch, units)` for a GRU; `[h_0, c_0]` for an LSTM. Pass it
        as `AttentionRNNDecoder(...)(..., initial_state=...)`.

    Example:

    >>> import keras
    >>> import numpy as np
    >>> import keras_attention
    >>> encoder = keras.layers.Bidirectional(
    ...     keras.layers.GRU(4, return_sequences=True, return_state=True))
    >>> memory, forward_h, backward_h = encoder(np.ones((2, 5, 3), "float32"))
    >>> s0 = keras_attention.layers.EncoderBridge(8)(forward_h, backward_h)
    >>> tuple(s0.shape)
    (2, 8)

    References:
        - Bahdanau, Cho & Bengio, 2015, "Neural Machine Translation by
          Jointly Learning to Align and Translate".
    """

    def __init__(
        self,
        units,
        cell="gru",
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        units = validation.check_positive_int("units", units)
        if not isinstance(cell, str) or cell not in CELLS:
            raise ValueError(
                f"`cell` must be one of {CELLS}. Received: cell={cell!r}"
            )
        self.units = units
        self.cell = cell
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)

    def _dense(self, name, width):
        dense = keras.layers.Dense(
            self.units,
            activation="tanh",
            kernel_initializer=keras_utils.clone_initializer(
                self.kernel_initializer
            ),
            bias_initializer=keras_utils.clone_initializer(
                self.bias_initializer
            ),
            dtype=self.dtype_policy,
            name=name,
        )
        dense.build((None, width))
        return dense

    def build(
        self,
        forward_h_shape,
        backward_h_shape,
        forward_c_shape=None,
        backward_c_shape=None,
    ):
        shapes = {
            "forward_h_shape": forward_h_shape,
            "backward_h_shape": backward_h_shape,
        }
        if self.cell == "lstm":
            shapes.update(
                forward_c_shape=forward_c_shape,
                backward_c_shape=backward_c_shape,
            )
        for name, shape in shapes.items():
            if shape is None or len(shape) != 2 or shape[-1] is None:
                raise ValueError(
                    f"`{name[:-6]}` must have shape (batch, features) (cell="
                    f"{self.cell!r}). Received: {name}="
                    f"{None if shape is None else tuple(shape)}"
                )
        self._built_features = {
            name[:-6]: shape[-1] for name, shape in shapes.items()
        }
        width = forward_h_shape[-1] + backward_h_shape[-1]
        self.state_dense = self._dense("state", width)  # W_s, b_s
        if self.cell == "lstm":
            width_c = forward_c_shape[-1] + backward_c_shape[-1]
            self.carry_dense = self._dense("carry", width_c)  # W_c, b_c
        self.built = True

    def call(self, forward_h, backward_h, forward_c=None, backward_c=None):
        given = dict(
            forward_h=forward_h,
            backward_h=backward_h,
            forward_c=forward_c,
            backward_c=backward_c,
        )
        for name, features in self._built_features.items():
            if given[name] is None:
                raise ValueError(
                    f"`{name}` is required (cell={self.cell!r}). "
                    f"Received: {name}=None"
                )
            validation.check_call_input(
                name, given[name], features, (2,), "(batch, features)"
            )
        s0 = self.state_dense(ops.concatenate([forward_h, backward_h], -1))
        if self.cell == "gru":
            return s0
        c0 = self.carry_dense(ops.concatenate([forward_c, backward_c], -1))
        return [s0, c0]

    def compute_output_spec(
        self, forward_h, backward_h, forward_c=None, backward_c=None
    ):
        spec = keras.KerasTensor(
            (forward_h.shape[0], self.units), self.compute_dtype
        )
        if self.cell == "gru":
            return spec
        return [spec, keras.KerasTensor(spec.shape, self.compute_dtype)]

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "units": self.units,
                "cell": self.cell,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
                "bias_initializer": keras.initializers.serialize(
                    self.bias_initializer
                ),
            }
        )
        return config
