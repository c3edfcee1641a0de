import keras
from keras import ops

from keras_attention.layers import recording
from keras_attention.ops.masking import masked_softmax
from keras_attention.utils import keras_utils
from keras_attention.utils import validation


@keras.saving.register_keras_serializable(package="keras_attention")
class AttentionPooling(recording.AttentionRecording, keras.layers.Layer):
    """Attention-weighted pooling of a sequence into one vector.

    Scores each step, normalizes the scores over the (unpadded) steps with a
    softmax in at least float32 (float64 layers: float64) and returns the
    weighted sum of the steps:

    - `units=None`: `e_t = w^T h_t` (a learned query vector);
    - `units=n`: `e_t = v^T tanh(W h_t + b)` (Yang et al., 2016).

    Padded steps get weight exactly 0; a fully padded sequence gets all-zero
    weights and a zero vector. Inputs of any dtype (e.g. integer features)
    are computed in the layer's compute dtype.

    Args:
        units: optional int, size of the hidden scoring layer.
        use_bias: bool, bias in the hidden scoring layer.
        kernel_initializer: initializer of the scoring kernels.
        bias_initializer: initializer of the hidden layer's bias.
        **kwargs: base layer arguments.

    Call arguments:
        inputs: `(batch, T, features)`.
        mask: optional boolean `(batch, T)` (read from the Keras mask).
        return_attention_scores: bool, also return the weights `(batch, T)`.

    Returns:
        `(batch, features)`, and the weights `(batch, T)` if requested.

    Example:

    >>> import keras
    >>> import numpy as np
    >>> import keras_attention
    >>> pool = keras_attention.layers.AttentionPooling(units=8)
    >>> x = np.ones((2, 5, 4), "float32")
    >>> mask = np.array([[True] * 3 + [False] * 2, [True] * 5])
    >>> y, w = pool(x, mask=mask, return_attention_scores=True)
    >>> tuple(y.shape), tuple(w.shape)
    ((2, 4), (2, 5))
    >>> # equal steps: uniform over the valid ones
    >>> np.round(keras.ops.convert_to_numpy(w), 2)
    array([[0.33, 0.33, 0.33, 0.  , 0.  ],
           [0.2 , 0.2 , 0.2 , 0.2 , 0.2 ]], dtype=float32)

    References:
        - Yang et al., 2016, "Hierarchical Attention Networks for Document
          Classification".
        - Bahdanau et al., 2015, "Neural Machine Translation by Jointly
          Learning to Align and Translate".
    """

    # Per-step scores, then sums over the steps: inside `ContextParallel`'s
    # scope XLA reduces over the sequence's shards (all-reduces of `(b,)`
    # and `(b, d)` partials), no step pairs with another
    # (`recording.check_context_parallel`).
    runs_context_parallel = True

    def __init__(
        self,
        units=None,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.units = validation.check_positive_int(
            "units", units, allow_none=True
        )
        self.use_bias = validation.check_bool("use_bias", use_bias)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.supports_masking = True

    def build(self, inputs_shape):
        self._features = validation.check_sequence_shape("inputs", inputs_shape)
        if self.units is not None:
            self._hidden = keras.layers.Dense(
                self.units,
                activation="tanh",
                use_bias=self.use_bias,
                kernel_initializer=keras_utils.clone_initializer(
                    self.kernel_initializer
                ),
                bias_initializer=keras_utils.clone_initializer(
                    self.bias_initializer
                ),
                dtype=self.dtype_policy,
                name="hidden",
            )
            self._hidden.build(inputs_shape)
            score_input = self.units
        else:
            score_input = inputs_shape[-1]
        self._score = keras.layers.Dense(
            1,
            use_bias=False,
            kernel_initializer=keras_utils.clone_initializer(
                self.kernel_initializer
            ),
            dtype=self.dtype_policy,
            name="score",
        )
        self._score.build((None, None, score_input))
        self.built = True

    def call(self, inputs, mask=None, return_attention_scores=False):
        # b - batch, t - steps, d - features
        validation.check_call_input("inputs", inputs, self._features)
        validation.check_padding_mask("mask", mask, inputs)
        # Integer inputs are pooled in the compute dtype (cast to an int
        # dtype, the weights would round to zero).
        inputs = ops.cast(inputs, self.compute_dtype)
        h = self._hidden(inputs) if self.units is not None else inputs
        scores = self._score(h)[..., 0]  # (b, t)
        weights = masked_softmax(scores, mask)
        weights = ops.cast(weights, inputs.dtype)
        pooled = ops.einsum("bt,btd->bd", weights, inputs)
        if return_attention_scores:
            return pooled, weights
        return pooled

    def describe_attention(self, arguments, scores, options):
        """`collect_attention`'s hook (`layers/recording.py`): the
        weights `(batch, 1, 1, T)` of the learned query."""
        weights = recording.numpy_weights(scores)[:, None, None, :]
        meta = dict(
            kind="pooling",
            query_mask=None,
            key_mask=recording.padding_mask(
                arguments.get("mask"), arguments.get("inputs")
            ),
            causal=False,
            window=None,
        )
        return weights, meta

    def compute_mask(self, inputs, mask=None):
        return None

    def compute_output_spec(
        self, inputs, return_attention_scores=False, **kwargs
    ):
        pooled = keras.KerasTensor(
            (inputs.shape[0], inputs.shape[-1]), dtype=self.compute_dtype
        )
        if return_attention_scores:
            w = keras.KerasTensor(inputs.shape[:2], dtype=self.compute_dtype)
            return pooled, w
        return pooled

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "units": self.units,
                "use_bias": self.use_bias,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
                "bias_initializer": keras.initializers.serialize(
                    self.bias_initializer
                ),
            }
        )
        return config
