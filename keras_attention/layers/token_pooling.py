import keras
from keras import ops

from keras_attention.utils import validation

POSITIONS = ("first", "last", "eos")


@keras.saving.register_keras_serializable(package="keras_attention")
class TokenPooling(keras.layers.Layer):
    """The hidden state of one token per sequence: `(batch, T, d)` ->
    `(batch, d)`.

    Which token (`position`):

    - `"first"`: position 0 (a class token: ViT, CLIP's vision tower);
    - `"last"`: the last real token, by `padding_mask` (right or left
      padding), else position `T - 1` (SigLIP's text tower); a sequence
      with no real token pools zeros;
    - `"eos"`: the first `eos_token_id` in `token_ids` (a causal text
      tower's end token, where it has seen the whole text: MetaCLIP 2),
      position 0 in a sequence without one (as keras-hub and
      transformers); with `eos_token_id=None`, the position of the
      largest id (its first occurrence), OpenAI CLIP's convention, whose
      end token is the last id of its vocabulary.

    Args:
        position: one of `"first"`, `"last"`, `"eos"`.
        eos_token_id: optional int >= 0, the end token of `"eos"`;
            refused with another `position`.
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: `(batch, T, d)` hidden states.
        token_ids: int `(batch, T)`, needed by `"eos"` (refused
            otherwise).
        padding_mask: optional boolean `(batch, T)`, True on real tokens;
            read by `"last"` (refused otherwise). When omitted, the Keras
            mask of `inputs` is read.

    Returns:
        `(batch, d)`.

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> x = np.arange(12, dtype="float32").reshape(1, 4, 3)
    >>> ids = np.array([[5, 9, 2, 0]])
    >>> eos = keras_attention.layers.TokenPooling("eos", eos_token_id=2)
    >>> np.asarray(eos(x, token_ids=ids)).tolist()
    [[6.0, 7.0, 8.0]]
    >>> last = keras_attention.layers.TokenPooling("last")
    >>> np.asarray(last(x, padding_mask=ids != 0)).tolist()
    [[6.0, 7.0, 8.0]]

    References:
        - Radford et al., 2021, "Learning Transferable Visual Models From
          Natural Language Supervision" (CLIP's end-token pooling).
    """

    def __init__(self, position="first", eos_token_id=None, **kwargs):
        super().__init__(**kwargs)
        if position not in POSITIONS:
            raise ValueError(
                f"`position` must be one of {POSITIONS!r}. Received: "
                f"position={position!r}"
            )
        self.position = position
        self.eos_token_id = validation.check_non_negative_int(
            "eos_token_id", eos_token_id, allow_none=True
        )
        if self.eos_token_id is not None and position != "eos":
            raise ValueError(
                "`eos_token_id` applies only to position='eos'. Received: "
                f"position={position!r}, eos_token_id={eos_token_id!r}"
            )
        self.supports_masking = True

    def build(self, inputs_shape):
        self._features = validation.check_sequence_shape("inputs", inputs_shape)
        self.built = True

    def _check_arguments(self, token_ids, padding_mask):
        if self.position == "eos" and token_ids is None:
            raise ValueError(
                "position='eos' needs the `token_ids` of the sequence. "
                "Received: token_ids=None"
            )
        if self.position != "eos" and token_ids is not None:
            raise ValueError(
                "`token_ids` are read only by position='eos'. Received: "
                f"position={self.position!r}"
            )
        if self.position != "last" and padding_mask is not None:
            raise ValueError(
                "`padding_mask` is read only by position='last'. Received: "
                f"position={self.position!r}"
            )

    def _index(self, inputs, token_ids, padding_mask):
        """`(batch,)` int32 positions to pool, and a `(batch,)` bool of the
        rows that have one (None: all)."""
        batch, steps = ops.shape(inputs)[0], ops.shape(inputs)[1]
        if self.position == "first":
            return ops.zeros((batch,), "int32"), None
        if self.position == "eos":
            ids = ops.convert_to_tensor(token_ids)
            if self.eos_token_id is None:
                return ops.cast(ops.argmax(ids, axis=-1), "int32"), None
            found = ops.cast(ops.equal(ids, self.eos_token_id), "int32")
            return ops.cast(ops.argmax(found, axis=-1), "int32"), None
        if padding_mask is None:
            return ops.full((batch,), steps - 1, "int32"), None
        real = ops.cast(padding_mask, "int32")
        from_end = ops.argmax(ops.flip(real, axis=-1), axis=-1)
        index = steps - 1 - ops.cast(from_end, "int32")
        return index, ops.any(ops.cast(real, "bool"), axis=-1)

    def call(self, inputs, token_ids=None, padding_mask=None, mask=None):
        validation.check_call_input("inputs", inputs, self._features)
        if inputs.shape[1] == 0:
            raise ValueError(
                "`inputs` must have at least one step to pool. Received: "
                f"inputs.shape={tuple(inputs.shape)!r}"
            )
        self._check_arguments(token_ids, padding_mask)
        if token_ids is not None:
            token_ids = ops.convert_to_tensor(token_ids)
            validation.check_padding_mask("token_ids", token_ids, inputs)
            dtype = keras.backend.standardize_dtype(token_ids.dtype)
            if "int" not in dtype:
                raise TypeError(
                    "`token_ids` must be integer ids. Received: "
                    f"token_ids.dtype={dtype!r}"
                )
        if self.position == "last" and padding_mask is None:
            padding_mask = mask  # the Keras mask of `inputs`
        if padding_mask is not None:
            padding_mask = ops.convert_to_tensor(padding_mask)
            validation.check_padding_mask("padding_mask", padding_mask, inputs)
        index, valid = self._index(inputs, token_ids, padding_mask)
        pooled = ops.take_along_axis(inputs, index[:, None, None], axis=1)
        pooled = pooled[:, 0]
        if valid is not None:
            pooled = pooled * ops.cast(valid, pooled.dtype)[:, None]
        return pooled

    def compute_mask(self, inputs, mask=None):
        return None

    def compute_output_shape(self, inputs_shape):
        return (inputs_shape[0], inputs_shape[-1])

    def get_config(self):
        config = super().get_config()
        config.update(
            {"position": self.position, "eos_token_id": self.eos_token_id}
        )
        return config
