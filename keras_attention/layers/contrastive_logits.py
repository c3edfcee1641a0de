import math

import keras
import numpy as np
from keras import ops

from keras_attention.utils import keras_utils
from keras_attention.utils import validation


def _normalized(x):
    """`x / |x|` over the last axis; a zero vector stays zero (the squared
    norm is taken plus 1e-30). Python operators, not `ops.maximum`:
    Keras's type promotion turns float64 into float32 on JAX and
    PyTorch."""
    squares = ops.sum(ops.square(x), axis=-1, keepdims=True)
    return x / ops.sqrt(squares + keras_utils.constant(1e-30, x.dtype))


@keras.saving.register_keras_serializable(package="keras_attention")
class ContrastiveLogits(keras.layers.Layer):
    """The image-text similarity logits of CLIP and SigLIP.

    Both batches of embeddings are L2-normalized; then
    `text_logits = exp(logit_scale) * t v^T (+ logit_bias)` `(texts,
    images)` and `image_logits` its transpose `(images, texts)`, with
    `logit_scale` (a log temperature) and, with `use_bias=True`
    (SigLIP's sigmoid loss), `logit_bias` learned scalars. Computed in at
    least float32 (float64 stays float64), returned in the compute dtype.

    Args:
        logit_scale: float, the initial log scale (CLIP's `log(1 /
            0.07)`, the default; SigLIP's `log(10)`).
        use_bias: bool, a learned `logit_bias` added to the logits
            (SigLIP).
        logit_bias: float, its initial value (SigLIP's -10); refused
            without `use_bias`.
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        image_embeddings: `(images, d)`.
        text_embeddings: `(texts, d)`.

    Returns:
        `(image_logits, text_logits)`: `(images, texts)` and `(texts,
        images)`.

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> head = keras_attention.layers.ContrastiveLogits(logit_scale=0.0)
    >>> images = np.array([[3.0, 4.0], [1.0, 0.0]], "float32")
    >>> texts = np.array([[0.0, 2.0]], "float32")
    >>> image_logits, text_logits = head(images, texts)
    >>> from keras import ops
    >>> logits = ops.convert_to_numpy(text_logits).astype("float64")
    >>> np.round(logits, 2).tolist()
    [[0.8, 0.0]]

    References:
        - Radford et al., 2021, "Learning Transferable Visual Models From
          Natural Language Supervision" (CLIP).
        - Zhai et al., 2023, "Sigmoid Loss for Language Image
          Pre-Training" (SigLIP: `logit_bias`).
    """

    def __init__(
        self,
        logit_scale=math.log(1 / 0.07),
        use_bias=False,
        logit_bias=0.0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.logit_scale = validation.check_finite_number(
            "logit_scale", logit_scale
        )
        self.use_bias = validation.check_bool("use_bias", use_bias)
        self.logit_bias = validation.check_finite_number(
            "logit_bias", logit_bias
        )
        if not self.use_bias and self.logit_bias != 0.0:
            raise ValueError(
                "`logit_bias` needs use_bias=True. Received: "
                f"logit_bias={logit_bias!r}, use_bias={use_bias!r}"
            )

    def build(self, image_embeddings_shape, text_embeddings_shape=None):
        for name, shape in (
            ("image_embeddings", image_embeddings_shape),
            ("text_embeddings", text_embeddings_shape),
        ):
            if shape is not None and len(shape) != 2:
                raise ValueError(
                    f"`{name}` must have shape (batch, features). Received: "
                    f"{name}_shape={tuple(shape)!r}"
                )
        self.logit_scale_weight = self.add_weight(
            name="logit_scale",
            shape=(),
            initializer=keras.initializers.Constant(
                np.float64(self.logit_scale)
            ),
        )
        self.logit_bias_weight = None
        if self.use_bias:
            self.logit_bias_weight = self.add_weight(
                name="logit_bias",
                shape=(),
                initializer=keras.initializers.Constant(
                    np.float64(self.logit_bias)
                ),
            )
        self.built = True

    def call(self, image_embeddings, text_embeddings):
        dtype = self.compute_dtype
        work = "float64" if dtype == "float64" else "float32"
        images = ops.cast(ops.convert_to_tensor(image_embeddings), work)
        texts = ops.cast(ops.convert_to_tensor(text_embeddings), work)
        if images.shape[-1] != texts.shape[-1]:
            raise ValueError(
                "`image_embeddings` and `text_embeddings` must have the same "
                f"features. Received: image_embeddings.shape="
                f"{tuple(images.shape)!r}, text_embeddings.shape="
                f"{tuple(texts.shape)!r}"
            )
        scale = ops.exp(ops.cast(self.logit_scale_weight, work))
        # einsum, not matmul: Keras's PyTorch matmul returns float32 for
        # float64 inputs.
        similarity = ops.einsum(
            "td,vd->tv", _normalized(texts), _normalized(images)
        )
        text_logits = similarity * scale
        if self.logit_bias_weight is not None:
            text_logits = text_logits + ops.cast(self.logit_bias_weight, work)
        text_logits = ops.cast(text_logits, dtype)
        return ops.transpose(text_logits), text_logits

    def compute_output_shape(
        self, image_embeddings_shape, text_embeddings_shape
    ):
        images, texts = image_embeddings_shape[0], text_embeddings_shape[0]
        return (images, texts), (texts, images)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "logit_scale": self.logit_scale,
                "use_bias": self.use_bias,
                "logit_bias": self.logit_bias,
            }
        )
        return config
