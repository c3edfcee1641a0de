import inspect

import keras
import numpy as np
from keras import ops

from keras_attention.utils import validation


def _check_inputs(shape):
    validation.check_sequence_shape(
        "inputs",
        shape,
        ranks=(3, 4, 5),
        layout="(batch, steps, ..., features)",
    )
    if shape[-1] % 2:
        raise ValueError(
            "`inputs` must have an even (rotated) feature size. "
            f"Received: inputs_shape={tuple(shape)!r}"
        )


ROPE_TYPES = ("linear", "dynamic", "yarn", "llama3", "longrope")


def _check_denominator_dim(denominator_dim, rope_type):
    """`denominator_dim` (None or a positive int) as a Python int; refused
    with YaRN, whose frequencies keras-hub computes from the rotated size
    whatever `denominator_dim` says (an argument without effect)."""
    denominator_dim = validation.check_positive_int(
        "denominator_dim", denominator_dim, allow_none=True
    )
    if denominator_dim is not None and rope_type == "yarn":
        raise ValueError(
            "`denominator_dim` does not apply to `rope_type='yarn'` (whose "
            "frequencies use the rotated size; keras-hub ignores it there). "
            f"Received: denominator_dim={denominator_dim!r}, "
            f"rope_type={rope_type!r}"
        )
    return denominator_dim


def inverse_frequencies(
    dim,
    max_wavelength=10000,
    scaling_factor=1.0,
    rope_type="linear",
    beta_fast=32.0,
    beta_slow=1.0,
    original_max_position_embeddings=4096,
    truncate=True,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    denominator_dim=None,
    short_factor=None,
    long_factor=None,
    long=False,
):
    """RoPE's `theta_k`, `k = 0 .. dim/2 - 1`, with keras-hub's scaling
    rules, as a float32 NumPy array (computed in float64 on the host).

    The base frequencies are `max_wavelength ** (-2k / denominator_dim)`
    (`denominator_dim` None: `dim`, keras-hub's `denominator_dim`), then:

    - `"linear"`: position interpolation (Chen et al. 2023),
      `theta_k / scaling_factor`;
    - `"dynamic"`: `theta_k / scaling_factor ** (dim / (dim - 2))`;
    - `"yarn"` (Peng et al. 2023): per frequency, a ramp between
      interpolation (`theta_k / scaling_factor`, the low frequencies) and
      extrapolation (`theta_k`, the high ones) over the dimensions whose
      wavelengths make between `beta_slow` and `beta_fast` rotations in
      `original_max_position_embeddings` positions (rounded outwards to
      whole dimensions when `truncate`).
    - `"llama3"` (Llama 3.1): wavelengths longer than
      `original_max_position_embeddings / low_freq_factor` get
      `theta_k / scaling_factor`, those shorter than
      `original_max_position_embeddings / high_freq_factor` keep `theta_k`,
      and those between are interpolated linearly in
      `original_max_position_embeddings / wavelength` (keras-hub's
      `LlamaRotaryEmbedding` with `frequency_adjustment_factor =
      scaling_factor` and `pretraining_sequence_length =
      original_max_position_embeddings`).
    - `"longrope"` (LongRoPE, Ding et al. 2024; Phi-3's "su"):
      `theta_k / short_factor[k]`, or `theta_k / long_factor[k]` with
      `long` (`RotaryEmbedding` takes the long factors when the positions
      reach past `original_max_position_embeddings`, as keras-hub's
      `Phi3SuScaledRotaryEmbedding`).
    """
    k = np.arange(0, dim, 2, dtype="float64")
    _check_denominator_dim(denominator_dim, rope_type)
    denominator = dim if denominator_dim is None else denominator_dim
    theta = np.power(float(max_wavelength), -k / denominator)
    if rope_type == "linear":
        return (theta / scaling_factor).astype("float32")
    if rope_type == "longrope":
        factors = np.asarray(long_factor if long else short_factor, "float64")
        if factors.shape != theta.shape:
            raise ValueError(
                "LongRoPE's `short_factor` and `long_factor` need one factor "
                f"per rotated pair ({theta.shape[0]} for {dim} features). "
                f"Received: {len(factors)} factors"
            )
        return (theta / factors).astype("float32")
    if rope_type == "dynamic":
        return (theta / scaling_factor ** (dim / max(1, dim - 2))).astype(
            "float32"
        )
    if rope_type == "llama3":
        length = float(original_max_position_embeddings)
        wavelength = 2 * np.pi / theta
        smooth = (length / wavelength - low_freq_factor) / (
            high_freq_factor - low_freq_factor
        )
        smoothed = (1 - smooth) * theta / scaling_factor + smooth * theta
        scaled = np.where(
            wavelength > length / low_freq_factor, theta / scaling_factor, theta
        )
        medium = (wavelength >= length / high_freq_factor) & (
            wavelength <= length / low_freq_factor
        )
        return np.where(medium, smoothed, scaled).astype("float32")
    base = float(max_wavelength)

    def correction_dim(rotations):
        return (
            dim
            * np.log(original_max_position_embeddings / (rotations * 2 * np.pi))
        ) / (2 * np.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = np.floor(low), np.ceil(high)
    low, high = max(low, 0.0), min(high, dim - 1.0)
    ramp = np.clip(
        (np.arange(dim // 2, dtype="float64") - low) / max(high - low, 0.001),
        0,
        1,
    )
    extrapolation = 1 - ramp
    scaled = (theta / scaling_factor) * ramp + theta * extrapolation
    return scaled.astype("float32")


# The arguments of `RotaryEmbedding` a `rotary_scaling` dict may set.
ROTARY_SCALING_ARGUMENTS = (
    "scaling_factor",
    "rope_type",
    "beta_fast",
    "beta_slow",
    "original_max_position_embeddings",
    "truncate",
    "low_freq_factor",
    "high_freq_factor",
    "short_factor",
    "long_factor",
)


# Its arguments after `dim`: RotaryEmbedding's attributes and config keys.
_FREQUENCY_ARGUMENTS = tuple(inspect.signature(inverse_frequencies).parameters)
_FREQUENCY_ARGUMENTS = _FREQUENCY_ARGUMENTS[1:-1]  # all but `dim`, `long`


def _check_factors(rope_type, short_factor, long_factor):
    """LongRoPE's factors as tuples of floats: both given (lists of
    positive numbers of one length) for `rope_type="longrope"`, neither
    for the other types."""
    given = (short_factor is not None, long_factor is not None)
    if rope_type != "longrope":
        if any(given):
            raise ValueError(
                "`short_factor` and `long_factor` apply to "
                f"`rope_type='longrope'` only. Received: rope_type="
                f"{rope_type!r}, short_factor={short_factor!r}, "
                f"long_factor={long_factor!r}"
            )
        return None, None
    out = []
    for name, factors in (
        ("short_factor", short_factor),
        ("long_factor", long_factor),
    ):
        if factors is None or isinstance(factors, (str, bytes)):
            raise ValueError(
                f"`rope_type='longrope'` needs `{name}`, a list of positive "
                f"numbers. Received: {name}={factors!r}"
            )
        factors = tuple(float(f) for f in factors)
        if not factors or min(factors) <= 0:
            raise ValueError(
                f"`{name}` must be a non-empty list of positive numbers. "
                f"Received: {name}={factors!r}"
            )
        out.append(factors)
    if len(out[0]) != len(out[1]):
        raise ValueError(
            "`short_factor` and `long_factor` must have one length. "
            f"Received: short_factor={out[0]!r}, long_factor={out[1]!r}"
        )
    return tuple(out)


def check_rotary_scaling(rotary_scaling, rotary_max_wavelength):
    """Validates the `rotary_scaling` option of the attention layers and
    blocks: None, or a dict of `RotaryEmbedding`'s scaling arguments
    (`ROTARY_SCALING_ARGUMENTS`), which needs rotary positions
    (`rotary_max_wavelength`). Returns a plain dict copy (or None).

    Args:
        rotary_scaling: None or the dict to check.
        rotary_max_wavelength: the layer's `rotary_max_wavelength`.

    Returns:
        A copy of `rotary_scaling` as a plain dict, or None.

    Raises:
        TypeError: `rotary_scaling` is neither None nor a dict.
        ValueError: an unknown key, an invalid value (as
            `RotaryEmbedding` says) or no `rotary_max_wavelength`.

    Example:

    >>> from keras_attention.layers.rotary_embedding import (
    ...     check_rotary_scaling)
    >>> check_rotary_scaling({"scaling_factor": 4.0}, 10000)
    {'scaling_factor': 4.0}
    """
    if rotary_scaling is None:
        return None
    if not isinstance(rotary_scaling, dict):
        raise TypeError(
            "`rotary_scaling` must be None or a dict of RotaryEmbedding "
            f"arguments among {ROTARY_SCALING_ARGUMENTS}. Received: "
            f"rotary_scaling={rotary_scaling!r}"
        )
    unknown = sorted(set(rotary_scaling) - set(ROTARY_SCALING_ARGUMENTS))
    if unknown:
        raise ValueError(
            f"`rotary_scaling` takes the keys {ROTARY_SCALING_ARGUMENTS}; "
            f"unknown: {unknown}. Received: rotary_scaling={rotary_scaling!r}"
        )
    if rotary_max_wavelength is None:
        raise ValueError(
            "`rotary_scaling` needs rotary positions: set "
            "`rotary_max_wavelength`. Received: "
            f"rotary_scaling={rotary_scaling!r}, rotary_max_wavelength=None"
        )
    RotaryEmbedding(**rotary_scaling)  # its own checks of the values
    return dict(rotary_scaling)


def check_rotary_arguments(rotary_max_wavelength, rotary_scaling, head_size):
    """The rotary options of an attention layer, checked: a wavelength
    of at least 1 (or None), heads of an even size when rotated
    (`head_size`, the layer's `key_dim`) and `rotary_scaling` as
    `check_rotary_scaling` says. Returns both, normalized."""
    rotary_max_wavelength = validation.check_positive_number(
        "rotary_max_wavelength",
        rotary_max_wavelength,
        allow_none=True,
        minimum=1,
    )
    validation.check_rotary_head_size(
        rotary_max_wavelength, head_size, f"key_dim={head_size!r}"
    )
    rotary_scaling = check_rotary_scaling(rotary_scaling, rotary_max_wavelength)
    return rotary_max_wavelength, rotary_scaling


def check_rotary_fraction(rotary_fraction, rotary_max_wavelength, head_size):
    """`(rotary_fraction, rotated features)` of an attention layer's
    partial rotary: a number in (0, 1] (below 1 only with rotary
    positions), rotating the first `2 * floor(head_size * fraction / 2)`
    features of each head (at least 2)."""
    fraction = validation.check_positive_number(
        "rotary_fraction", rotary_fraction
    )
    if fraction > 1:
        raise ValueError(
            "`rotary_fraction` must be in (0, 1]. Received: "
            f"rotary_fraction={rotary_fraction!r}"
        )
    if fraction == 1:
        return 1.0, head_size
    if rotary_max_wavelength is None:
        raise ValueError(
            "`rotary_fraction` below 1 needs rotary positions "
            "(`rotary_max_wavelength`). Received: "
            f"rotary_fraction={rotary_fraction!r}, rotary_max_wavelength=None"
        )
    dims = 2 * int(head_size * fraction / 2)
    if dims < 2:
        raise ValueError(
            "`rotary_fraction` must rotate at least 2 features of each "
            f"head. Received: rotary_fraction={rotary_fraction!r}, "
            f"key_dim={head_size!r}"
        )
    return float(fraction), dims


@keras.saving.register_keras_serializable(package="keras_attention")
class RotaryEmbedding(keras.layers.Layer):
    """Rotary position embedding (RoPE), applied to queries and keys.

    Splits the feature axis of `x` (size `d`, even) into halves `x1, x2`
    and rotates each pair `(x1[k], x2[k])` by the angle `m * theta_k` of
    its position `m`:

        theta_k = max_wavelength ** (-2k / d),   k = 0 .. d/2 - 1
        y1 = x1 cos(m theta) - x2 sin(m theta)
        y2 = x2 cos(m theta) + x1 sin(m theta)

    A rotation keeps norms, and `rope(q, m) . rope(k, n)` depends on the
    positions only through `m - n`, which makes attention scores relative.
    Context extension (keras-hub's arguments and numbers):
    `scaling_factor` with `rope_type="linear"` (position interpolation),
    `"dynamic"`, `"yarn"` (YaRN: `inverse_frequencies`; cos and sin are
    also scaled by `0.1 ln(scaling_factor) + 1`) or `"llama3"` (Llama
    3.1's frequency adjustment, between `low_freq_factor` and
    `high_freq_factor`). The maths runs in
    float32 and the result is cast back to the input's dtype. The layer
    has no weights.

    The first ten arguments are keras-hub's `RotaryEmbedding`'s, in
    keras-hub's order (the same positional call means the same layer);
    `low_freq_factor` and `high_freq_factor` follow (pass them by name).

    Args:
        max_wavelength: finite number >= 1, the longest wavelength `10000`
            of the paper (below 1 the frequencies grow with the feature
            index, and tiny values overflow float32 into NaN angles).
        scaling_factor: number >= 1 (1: no scaling).
        rope_type: `"linear"`, `"dynamic"`, `"yarn"` or `"llama3"`.
        beta_fast: YaRN's high-frequency boundary (keras-hub's default
            32).
        beta_slow: YaRN's low-frequency boundary (default 1).
        original_max_position_embeddings: YaRN's and Llama 3.1's training
            length (default 4096).
        truncate: bool, YaRN's rounding of the boundaries (default True).
        sequence_axis: int, the axis of the positions (default 1).
        feature_axis: int, the axis of the rotated features (default -1).
        denominator_dim: None or a positive int (keras-hub's argument):
            the frequencies are `max_wavelength ** (-2k /
            denominator_dim)` instead of `-2k / d` (Gemma 4 rotates part of
            each head with the frequencies of the full head size). Not
            with `rope_type="yarn"` (refused; keras-hub ignores it there).
        low_freq_factor: `"llama3"`: wavelengths above
            `original_max_position_embeddings / low_freq_factor` are
            scaled by `1 / scaling_factor` (default 1).
        high_freq_factor: `"llama3"`: wavelengths below
            `original_max_position_embeddings / high_freq_factor` are kept
            (default 4; greater than `low_freq_factor`).
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: `(batch, T, ..., d)` by default (e.g. projected heads
            `(b, T, h, d)`), rank 3 to 5.
        start_index: int or scalar int tensor, absolute position of the
            first step (the cache index in incremental decoding).
        positions: optional positions `(T,)` or `(batch, T)` (ints or
            floats, any sign; batch 1 or the inputs') instead of
            `start_index + arange(T)` (which is then ignored): positions
            that restart in each packed document
            (`keras_attention.masks.segment_positions`), or any others.
            `T` is the size of the inputs' `sequence_axis`; another shape
            raises `ValueError` naming `positions` and both shapes
            (eagerly, and when traced for the sizes known then; a size
            unknown when traced fails in the backend's broadcast).

    Returns:
        A tensor shaped like `inputs`.

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> rope = keras_attention.layers.RotaryEmbedding()
    >>> q = np.ones((1, 4, 2, 8), "float32")
    >>> tuple(rope(q, start_index=3).shape)
    (1, 4, 2, 8)
    >>> y = rope(q, positions=np.array([[0, 1, 0, 1]]))
    >>> bool(np.allclose(y[0, 0], y[0, 2]))
    True

    References:
        - Su et al., 2021, "RoFormer: Enhanced Transformer with Rotary
          Position Embedding".
        - Chen et al., 2023, "Extending Context Window of Large Language
          Models via Positional Interpolation".
        - Peng et al., 2023, "YaRN: Efficient Context Window Extension of
          Large Language Models".
    """

    def __init__(
        self,
        max_wavelength=10000,
        scaling_factor=1.0,
        rope_type="linear",
        beta_fast=32.0,
        beta_slow=1.0,
        original_max_position_embeddings=4096,
        truncate=True,
        sequence_axis=1,
        feature_axis=-1,
        denominator_dim=None,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        short_factor=None,
        long_factor=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.max_wavelength = validation.check_positive_number(
            "max_wavelength", max_wavelength, minimum=1
        )
        self.scaling_factor = validation.check_positive_number(
            "scaling_factor", scaling_factor, minimum=1
        )
        if rope_type not in ROPE_TYPES:
            raise ValueError(
                f"`rope_type` must be one of {ROPE_TYPES}. Received: "
                f"rope_type={rope_type!r}"
            )
        self.rope_type = rope_type
        self.short_factor, self.long_factor = _check_factors(
            rope_type, short_factor, long_factor
        )
        self.beta_fast = validation.check_positive_number(
            "beta_fast", beta_fast
        )
        self.beta_slow = validation.check_positive_number(
            "beta_slow", beta_slow
        )
        self.original_max_position_embeddings = validation.check_positive_int(
            "original_max_position_embeddings",
            original_max_position_embeddings,
        )
        self.truncate = validation.check_bool("truncate", truncate)
        self.denominator_dim = _check_denominator_dim(
            denominator_dim, rope_type
        )
        self.low_freq_factor = validation.check_positive_number(
            "low_freq_factor", low_freq_factor
        )
        self.high_freq_factor = validation.check_positive_number(
            "high_freq_factor", high_freq_factor
        )
        if self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(
                "`high_freq_factor` must be greater than `low_freq_factor`. "
                f"Received: high_freq_factor={high_freq_factor!r}, "
                f"low_freq_factor={low_freq_factor!r}"
            )
        for name, axis in (
            ("sequence_axis", sequence_axis),
            ("feature_axis", feature_axis),
        ):
            if not validation.is_int(axis):
                raise TypeError(
                    f"`{name}` must be an int. Received: {name}={axis!r}"
                )
        self.sequence_axis, self.feature_axis = (
            int(sequence_axis),
            int(feature_axis),
        )
        self.supports_masking = True

    def _axes(self, shape):
        """The normalized `(sequence_axis, feature_axis)` of `shape`."""
        rank = len(shape)
        axes = []
        for name, axis in (
            ("sequence_axis", self.sequence_axis),
            ("feature_axis", self.feature_axis),
        ):
            if not -rank <= axis < rank:
                raise ValueError(
                    f"`{name}` is out of range for inputs of rank {rank}. "
                    f"Received: {name}={axis!r}"
                )
            axes.append(axis % rank)
        if axes[0] == axes[1] or 0 in axes:
            raise ValueError(
                "`sequence_axis` and `feature_axis` must be different axes "
                "other than the batch axis. Received: "
                f"sequence_axis={self.sequence_axis!r}, "
                f"feature_axis={self.feature_axis!r}"
            )
        return tuple(axes)

    def _standard_shape(self, shape):
        """`shape` with the sequence axis at 1 and the features last."""
        if len(shape) < 3:
            _check_inputs(shape)  # The rank error, naming the shape.
        seq, feat = self._axes(shape)
        rest = [a for a in range(len(shape)) if a not in (0, seq, feat)]
        order = [0, seq] + rest + [feat]
        return tuple(shape[a] for a in order), order

    def build(self, inputs_shape):
        _check_inputs(self._standard_shape(tuple(inputs_shape))[0])
        self.built = True

    def _cos_sin(self, length, dim, rank, start_index, positions=None):
        # m - positions (b|1, T), k - frequency index
        if positions is None:
            m = ops.cast(ops.arange(length), "float32") + ops.cast(
                start_index, "float32"
            )
            m = m[None]
        else:
            m = ops.cast(positions, "float32")
            if len(m.shape) == 1:
                m = m[None]
        # Frequencies in float64 on the host, then float32: a huge
        # `max_wavelength` (1e300) has no float32 value, its powers do.
        theta = ops.convert_to_tensor(
            inverse_frequencies(dim, **self._frequency_arguments())
        )
        if self.rope_type == "longrope":
            theta = self._longrope_frequencies(
                dim, theta, m, length, start_index
            )
        angles = ops.einsum("bm,k->bmk", m, theta)
        # No -1: a length-0 sequence makes it ambiguous (JAX divides by 0).
        shape = (ops.shape(angles)[0], length) + (1,) * (rank - 3)
        shape = shape + (dim // 2,)
        cos, sin = ops.cos(angles), ops.sin(angles)
        if self.rope_type == "yarn":
            factor = 0.1 * float(np.log(self.scaling_factor)) + 1.0
            cos, sin = cos * factor, sin * factor
        if self.rope_type == "longrope" and self.scaling_factor > 1:
            # LongRoPE's attention factor (keras-hub's Phi-3, HF's).
            factor = float(
                np.sqrt(
                    1
                    + np.log(self.scaling_factor)
                    / np.log(self.original_max_position_embeddings)
                )
            )
            cos, sin = cos * factor, sin * factor
        return ops.reshape(cos, shape), ops.reshape(sin, shape)

    def _longrope_frequencies(self, dim, short, m, length, start_index):
        """LongRoPE's frequencies: the long factors' when the positions
        reach past `original_max_position_embeddings` (the largest
        position plus 1: `start_index + length` as keras-hub's
        `Phi3SuScaledRotaryEmbedding` has it, or the largest of
        `positions` plus 1), else the short factors'."""
        arguments = dict(self._frequency_arguments(), long=True)
        long = ops.convert_to_tensor(inverse_frequencies(dim, **arguments))
        if isinstance(length, int) and length == 0:
            return short
        reach = ops.max(m) + 1.0
        beyond = reach > float(self.original_max_position_embeddings)
        return ops.where(beyond, long, short)

    def _frequency_arguments(self):
        """The arguments of `inverse_frequencies` this layer was built
        with (also its config's keys)."""
        return {name: getattr(self, name) for name in _FREQUENCY_ARGUMENTS}

    def call(self, inputs, start_index=0, positions=None):
        shape, order = self._standard_shape(tuple(inputs.shape))
        _check_inputs(shape)
        validation.check_numeric_input("inputs", inputs)
        start_index = validation.check_index(
            "start_index", start_index, allow_negative=True
        )
        x = ops.transpose(inputs, order) if order != sorted(order) else inputs
        if positions is not None:
            validation.check_numeric_input("positions", positions)
            positions = ops.convert_to_tensor(positions)
            validation.check_positions(
                "positions", positions.shape, inputs.shape, order[1]
            )
        dim = shape[-1]
        cos, sin = self._cos_sin(
            ops.shape(x)[1], dim, len(shape), start_index, positions
        )
        x = ops.cast(x, "float32")
        x1, x2 = x[..., : dim // 2], x[..., dim // 2 :]
        y = ops.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
        if order != sorted(order):
            y = ops.transpose(y, list(np.argsort(order)))
        return ops.cast(y, inputs.dtype)

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            self._frequency_arguments(),
            sequence_axis=self.sequence_axis,
            feature_axis=self.feature_axis,
        )
        return config
