import keras
import numpy as np
from keras import ops

from keras_attention.layers import _einsum_dense
from keras_attention.utils import keras_utils
from keras_attention.utils import validation

_RANKS = (2, 3, 4, 5)
_LAYOUT = "(batch, ..., features)"


@keras.saving.register_keras_serializable(package="keras_attention")
class FeedForward(keras.layers.Layer):
    """Position-wise feed-forward network of the Transformer.

    `FFN(x) = W2 dropout(activation(x W1 + b1)) + b2`, applied to every
    position alike; the output has the input's feature size. Keras masks
    pass through unchanged.

    Gated (`gated=True`, the GLU variants of Shazeer 2020: SwiGLU with
    `activation="silu"`, GEGLU with `"gelu"`, as in Llama, Mistral and
    Gemma): `FFN(x) = W2 dropout(activation(x Wg + bg) * (x W1 + b1)) +
    b2`, a third `(d, intermediate_dim)` projection `gate_dense`.

    Layer scale (`layer_scale=v`, as in CaiT and DINOv2): the output
    times a learned per-feature vector `layer_scale` `(d,)` initialised
    to `v`, `FFN(x) * lambda`.

    Args:
        intermediate_dim: int, width of the hidden layer (`d_ff`).
        activation: activation of the hidden layer.
        dropout: float in [0, 1), dropout on the hidden activations.
        use_bias: bool.
        kernel_initializer: initializer of the layers' kernels.
        bias_initializer: initializer of the layers' biases.
        gated: bool, the gated (GLU) form above; default False (the
            Transformer's).
        layer_scale: optional positive float, the initial value of a
            learned per-feature scale of the output (a weight named
            `layer_scale`); None (default): no scale.
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: `(batch, T, d)`.
        training: bool, dropout on or off.

    Returns:
        `(batch, T, d)`.

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> ffn = keras_attention.layers.FeedForward(intermediate_dim=32)
    >>> tuple(ffn(np.ones((2, 5, 8), "float32")).shape)
    (2, 5, 8)
    >>> swiglu = keras_attention.layers.FeedForward(
    ...     32, activation="silu", use_bias=False, gated=True)
    >>> tuple(swiglu(np.ones((2, 5, 8), "float32")).shape)
    (2, 5, 8)

    References:
        - Vaswani et al., 2017, "Attention Is All You Need", section 3.3.
        - Shazeer, 2020, "GLU Variants Improve Transformer" (`gated`).
        - Touvron et al., 2021, "Going deeper with Image Transformers"
          (CaiT; `layer_scale`).
    """

    def __init__(
        self,
        intermediate_dim,
        activation="relu",
        dropout=0.0,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        gated=False,
        layer_scale=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.intermediate_dim = validation.check_positive_int(
            "intermediate_dim", intermediate_dim
        )
        self.dropout = validation.check_rate("dropout", dropout)
        self.activation = keras.activations.get(activation)
        self.use_bias = validation.check_bool("use_bias", use_bias)
        self.gated = validation.check_bool("gated", gated)
        self.layer_scale = validation.check_positive_number(
            "layer_scale", layer_scale, allow_none=True
        )
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.supports_masking = True

    def _dense(self, units, name, activation=None):
        clone = keras_utils.clone_initializer
        return _einsum_dense.Dense(
            units,
            activation=activation,
            use_bias=self.use_bias,
            kernel_initializer=clone(self.kernel_initializer),
            bias_initializer=clone(self.bias_initializer),
            dtype=self.dtype_policy,
            name=name,
        )

    def build(self, inputs_shape):
        self._features = validation.check_sequence_shape(
            "inputs",
            inputs_shape,
            ranks=_RANKS,
            layout=_LAYOUT,
        )
        hidden_shape = tuple(inputs_shape[:-1]) + (self.intermediate_dim,)
        self.intermediate_dense = self._dense(
            self.intermediate_dim,
            "intermediate_dense",
            None if self.gated else self.activation,
        )
        self.intermediate_dense.build(inputs_shape)
        if self.gated:
            self.gate_dense = self._dense(
                self.intermediate_dim, "gate_dense", self.activation
            )
            self.gate_dense.build(inputs_shape)
        self.dropout_layer = keras.layers.Dropout(
            self.dropout, dtype=self.dtype_policy
        )
        self.output_dense = self._dense(inputs_shape[-1], "output_dense")
        self.output_dense.build(hidden_shape)
        self.layer_scale_weight = None
        if self.layer_scale is not None:
            self.layer_scale_weight = self.add_weight(
                name="layer_scale",
                shape=(inputs_shape[-1],),
                initializer=keras.initializers.Constant(
                    np.float64(self.layer_scale)
                ),
            )
        self.built = True

    def call(self, inputs, training=None):
        validation.check_call_input(
            "inputs", inputs, self._features, _RANKS, _LAYOUT
        )
        hidden = self.intermediate_dense(inputs)
        if self.gated:
            hidden = self.gate_dense(inputs) * hidden
        hidden = self.dropout_layer(hidden, training=training)
        outputs = self.output_dense(hidden)
        if self.layer_scale_weight is not None:
            outputs = outputs * ops.cast(self.layer_scale_weight, outputs.dtype)
        return outputs

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "intermediate_dim": self.intermediate_dim,
                "activation": keras.activations.serialize(self.activation),
                "dropout": self.dropout,
                "use_bias": self.use_bias,
                "gated": self.gated,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
                "bias_initializer": keras.initializers.serialize(
                    self.bias_initializer
                ),
            }
        )
        if self.layer_scale is not None:  # earlier releases' configs stay
            config["layer_scale"] = self.layer_scale
        return config
