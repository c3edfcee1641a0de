import math

import keras
from keras import ops

from keras_attention.mods.base import PACKAGE
from keras_attention.mods.base import ScoreMod
from keras_attention.utils import validation


@keras.saving.register_keras_serializable(package=PACKAGE)
class SoftCap(ScoreMod):
    """Logit soft-capping: `cap * tanh(score / cap)` (Gemma 2).

    Scores stay in `(-cap, cap)`, smoothly: small scores are unchanged,
    large ones saturate (training stability). On every path and backend
    (Keras applies it on JAX/TPU only), with its gradient
    `1 - tanh(score / cap) ** 2`.

    Args:
        cap: positive finite number (Gemma 2: 50.0 for attention).

    Example:

    >>> import numpy as np
    >>> from keras_attention.scores import SoftCap
    >>> s = SoftCap(5.0)(np.array([0.5, 50.0], "float32"), 0, 0, 0, 0)
    >>> tuple(round(float(x), 3) for x in s)
    (0.498, 5.0)

    References:
        - Gemma Team, 2024, "Gemma 2: Improving Open Language Models at a
          Practical Size".
    """

    def __init__(self, cap):
        cap = validation.check_positive_number("cap", cap)
        self.cap = float(cap)
        if not math.isfinite(self.cap):  # pragma: no cover - checked above
            raise ValueError(f"`cap` must be finite. Received: cap={cap!r}")

    def __call__(self, score, batch, head, q_idx, kv_idx):
        return self.cap * ops.tanh(score / self.cap)

    def tanh_soft_cap(self):
        """The cap: this score function is `cap * tanh(score / cap)` (the
        blockwise path differentiates it in one op:
        `keras_attention.ops.scoring.split_soft_cap`)."""
        return self.cap

    def get_config(self):
        return {"cap": self.cap}
