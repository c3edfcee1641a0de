import keras
import numpy as np
from keras import ops

from keras_attention.layers.position_embedding import PositionEmbedding
from keras_attention.utils import keras_utils
from keras_attention.utils import validation


def _check_ids_shape(shape):
    if len(shape) not in (2, 3, 4):
        raise ValueError(
            "`inputs` must be token ids of shape (batch, steps) or "
            "(batch, ..., steps), rank 2 to 4. "
            f"Received: inputs_shape={tuple(shape)!r}"
        )


@keras.saving.register_keras_serializable(package="keras_attention")
class TokenAndPositionEmbedding(keras.layers.Layer):
    """Token embedding plus learned position embedding.

    `y[b, t] = E_token[ids[b, t]] + E_pos[start_index + t]`. With
    `mask_zero=True`, token id 0 is padding: the layer returns the Keras mask
    `ids != 0`, which every following block of the package reads and passes
    on.

    The arguments are keras-hub's, in keras-hub's order: the fourth is
    `tie_weights`, then `embeddings_initializer`, then `mask_zero` (pass
    those two by name). `token_embedding` is a
    `keras.layers.ReversibleEmbedding`: `layer.token_embedding(h,
    reverse=True)` maps hidden states to vocabulary logits, through the
    transposed token table when `tie_weights` (the default), else through
    a separate `(embedding_dim, vocabulary_size)` table.

    Args:
        vocabulary_size: int, number of token ids.
        sequence_length: int, maximum number of positions.
        embedding_dim: int, output features.
        tie_weights: bool, whether the reverse (logits) projection reuses
            the token table.
        embeddings_initializer: initializer of the tables.
        mask_zero: bool, whether id 0 is padding (produces a Keras mask).
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: int token ids `(batch, T)` (or `(batch, ..., T)`, rank up
            to 4, as keras-hub takes them).
        start_index: int or scalar int tensor, position of `inputs[..., 0]`
            (the cache index in incremental decoding).
        positions: optional integer positions `(T,)` or `(batch, T)`
            (batch 1 or the ids') instead of `start_index + arange(T)`
            (keras-hub's argument; packed documents:
            `keras_attention.masks.segment_positions`), rows of the
            position table in `[0, sequence_length)`. As in
            `PositionEmbedding`: eager calls raise `ValueError` naming
            `positions` for a value outside the table or another shape;
            compiled or traced (`tf.function`, `jax.jit`), the values are
            clamped into the table (a negative position reads row 0, one
            past the end the last row).

    Returns:
        `(batch, T, embedding_dim)`, with a Keras mask if `mask_zero`.

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> layer = keras_attention.layers.TokenAndPositionEmbedding(
    ...     100, 16, 8, mask_zero=True)
    >>> ids = np.array([[5, 7, 0]])
    >>> tuple(layer(ids).shape), np.asarray(layer.compute_mask(ids)).tolist()
    ((1, 3, 8), [[True, True, False]])

    References:
        - Vaswani et al., 2017, "Attention Is All You Need".
        - Radford et al., 2018, "Improving Language Understanding by
          Generative Pre-Training" (learned positions).
    """

    def __init__(
        self,
        vocabulary_size,
        sequence_length,
        embedding_dim,
        tie_weights=True,
        embeddings_initializer="uniform",
        mask_zero=False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.vocabulary_size = validation.check_positive_int(
            "vocabulary_size", vocabulary_size
        )
        self.sequence_length = validation.check_positive_int(
            "sequence_length", sequence_length
        )
        self.embedding_dim = validation.check_positive_int(
            "embedding_dim", embedding_dim
        )
        self.tie_weights = validation.check_bool("tie_weights", tie_weights)
        self.mask_zero = validation.check_bool("mask_zero", mask_zero)
        self.embeddings_initializer = keras.initializers.get(
            embeddings_initializer
        )
        self.supports_masking = self.mask_zero

    def build(self, inputs_shape):
        _check_ids_shape(inputs_shape)
        self.token_embedding = keras.layers.ReversibleEmbedding(
            self.vocabulary_size,
            self.embedding_dim,
            tie_weights=self.tie_weights,
            embeddings_initializer=keras_utils.clone_initializer(
                self.embeddings_initializer
            ),
            dtype=self.dtype_policy,
            name="token_embedding",
        )
        self.token_embedding.build(inputs_shape)
        self.position_embedding = PositionEmbedding(
            self.sequence_length,
            initializer=keras_utils.clone_initializer(
                self.embeddings_initializer
            ),
            dtype=self.dtype_policy,
            name="position_embedding",
        )
        self.position_embedding.build(
            tuple(inputs_shape) + (self.embedding_dim,)
        )
        self.built = True

    def call(self, inputs, start_index=0, positions=None):
        validation.check_numeric_input("inputs", inputs)
        _check_ids_shape(inputs.shape)
        if positions is not None:  # In the ids' terms (steps: last axis).
            shape = getattr(positions, "shape", None)
            validation.check_positions(
                "positions",
                np.shape(positions) if shape is None else shape,
                inputs.shape,
                -1,
            )
        tokens = self.token_embedding(inputs)
        return tokens + self.position_embedding(
            tokens, start_index=start_index, positions=positions
        )

    def compute_mask(self, inputs, mask=None):
        if not self.mask_zero:
            return None
        return ops.not_equal(inputs, 0)

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape) + (self.embedding_dim,)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "sequence_length": self.sequence_length,
                "embedding_dim": self.embedding_dim,
                "tie_weights": self.tie_weights,
                "mask_zero": self.mask_zero,
                "embeddings_initializer": keras.initializers.serialize(
                    self.embeddings_initializer
                ),
            }
        )
        return config
