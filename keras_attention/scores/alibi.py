import math

import keras
import numpy as np
from keras import ops

from keras_attention.mods.base import PACKAGE
from keras_attention.mods.base import ScoreLayer
from keras_attention.utils import validation


def alibi_slopes(num_heads, alibi_bias_max=8):
    """ALiBi's per-head slopes (Press et al. 2022), a list of floats.

    For `n` heads, a power of two, the geometric sequence starting at
    `2 ** (-alibi_bias_max / n)` with that ratio (`1/2, 1/4, ..., 1/256`
    for 8 heads and the paper's `alibi_bias_max=8`); otherwise the slopes
    of the closest smaller power of two `p`, then every other slope of
    `2p` heads (the paper's code, as keras-hub's `AlibiBias`).

    Example:

    >>> from keras_attention.scores import alibi_slopes
    >>> alibi_slopes(4)
    [0.25, 0.0625, 0.015625, 0.00390625]
    """
    num_heads = validation.check_positive_int("num_heads", num_heads)
    alibi_bias_max = validation.check_positive_int(
        "alibi_bias_max", alibi_bias_max
    )

    def power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - math.log2(alibi_bias_max))))
        return [start * start**i for i in range(n)]

    if math.log2(num_heads).is_integer():
        return power_of_2(num_heads)
    closest = 2 ** math.floor(math.log2(num_heads))
    return (
        power_of_2(closest)
        + alibi_slopes(2 * closest, alibi_bias_max)[0::2][: num_heads - closest]
    )


@keras.saving.register_keras_serializable(package=PACKAGE)
class ALiBi(ScoreLayer):
    """Attention with linear biases: `score - m_h * (q_idx - kv_idx)`.

    Each head `h` penalises distant keys linearly with its slope `m_h`
    (`alibi_slopes`); no position embeddings are needed and models
    extrapolate to sequences longer than those seen in training. The
    causal form (`bidirectional=False`) is the paper's: with a causal
    mask `q_idx - kv_idx >= 0`; the weights equal keras-hub's
    `AlibiBias` (which adds `m_h * (kv_idx - (T_k - 1))`: the same up to a
    constant per query, which the softmax cancels). `bidirectional=True`
    uses the distance `|q_idx - kv_idx|` (encoders). `slope_scale`
    multiplies every slope: Falcon adds its biases before scaling the
    scores by `1 / sqrt(head_dim)`, so its slopes are the paper's times
    `head_dim ** -0.5`.

    Positions are absolute (a cache offset is applied by the paths), and
    the bias is formed per tile on the blockwise and banded paths: O(T)
    memory, never a `(T, T)` bias.

    Args:
        num_heads: int or None: the number of query heads; None when the
            object is given to an attention layer (it passes its own).
        alibi_bias_max: int, the paper's 8: the slopes' range.
        bidirectional: bool, the symmetric distance instead of the causal
            form.
        slope_scale: finite float > 0, the factor of every slope (1: the
            paper's slopes; Falcon: `head_dim ** -0.5`).

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> from keras_attention.scores import ALiBi
    >>> layer = keras_attention.layers.SelfAttention(
    ...     num_heads=4, key_dim=8, causal=True, score_mod=ALiBi())
    >>> tuple(layer(np.ones((2, 16, 32), "float32")).shape)
    (2, 16, 32)
    >>> bias = ALiBi(num_heads=2)
    >>> s = bias(np.zeros((1, 2, 1, 3), "float32"), 0,
    ...          np.arange(2).reshape(1, 2, 1, 1), np.array(2), np.arange(3))
    >>> np.asarray(s)[0, :, 0].tolist()
    [[-0.125, -0.0625, 0.0], [-0.0078125, -0.00390625, 0.0]]

    References:
        - Press et al., 2022, "Train Short, Test Long: Attention with
          Linear Biases Enables Input Length Extrapolation".
    """

    def __init__(
        self,
        num_heads=None,
        alibi_bias_max=8,
        bidirectional=False,
        slope_scale=1.0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.slope_scale = validation.check_positive_number(
            "slope_scale", slope_scale
        )
        self.alibi_bias_max = validation.check_positive_int(
            "alibi_bias_max", alibi_bias_max
        )
        self.bidirectional = validation.check_bool(
            "bidirectional", bidirectional
        )
        self.num_heads = validation.check_positive_int(
            "num_heads", num_heads, allow_none=True
        )
        if self.num_heads is not None:
            self.build(self.num_heads)

    def build(self, num_heads=None):
        if num_heads is None:
            raise ValueError(
                "ALiBi needs the number of heads: pass `num_heads=` or "
                "give it to an attention layer. Received: num_heads=None"
            )
        if self.num_heads is not None and num_heads != self.num_heads:
            raise ValueError(
                f"ALiBi was made for {self.num_heads} heads but is used "
                f"with {num_heads!r}. Received: num_heads={num_heads!r}"
            )
        self.num_heads = validation.check_positive_int("num_heads", num_heads)
        slopes = np.asarray(alibi_slopes(self.num_heads, self.alibi_bias_max))
        self.slopes = (slopes * self.slope_scale).astype("float32")
        self.built = True

    def score_fn(self, score, batch, head, q_idx, kv_idx):
        if not self.built:
            self.build(None)
        distance = ops.subtract(q_idx, kv_idx)
        if self.bidirectional:
            distance = ops.abs(distance)
        slope = ops.take(self.slopes, head)
        return ops.subtract(score, slope * ops.cast(distance, "float32"))

    def relative_bias(self, distance):
        """The bias of each head at each distance `q_idx - kv_idx`
        (`distance`: 1-D int32): float32 `(num_heads, n)`. The blockwise
        path forms a tile's biases from it (`keras_attention.ops.scoring`)."""
        if not self.built:
            self.build(None)
        if self.bidirectional:
            distance = ops.abs(distance)
        slopes = ops.convert_to_tensor(self.slopes[:, None])
        return -slopes * ops.cast(distance, "float32")[None, :]

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            alibi_bias_max=self.alibi_bias_max,
            bidirectional=self.bidirectional,
            slope_scale=self.slope_scale,
        )
        return config
