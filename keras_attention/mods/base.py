"""Base classes of the score and mask objects, and their composition.

A *mask object* is a Keras-serializable callable
`mask(batch, head, q_idx, kv_idx) -> bool` (the `mask_mod` of
`keras_attention.ops.dot_product_attention`); a *score object* a callable
`score(score, batch, head, q_idx, kv_idx) -> score` (the `score_mod`). The
index arguments are int32 tensors (or NumPy arrays, when a path evaluates
a mask on a tile while tracing) broadcastable to the block of scores
`(batch, heads, queries, keys)`; positions are absolute.

Objects that need data known only at call time (segment ids, a prefix
length per example) name it in `inputs`; layers pass it through their
`mod_inputs=` call argument and `bind(**inputs)` returns the plain
function for one call. A score object with weights (a learned bias) is a
`keras.layers.Layer` too (`ScoreLayer`): the layer holding it tracks and
saves its weights.
"""

import keras

from keras_attention.ops import fused
from keras_attention.ops.scoring import check_mod  # noqa: F401
from keras_attention.ops.scoring import full_precision_variables
from keras_attention.utils import keras_utils

#: The package name mask and score objects are registered under.
PACKAGE = "keras_attention"


class _Bindable:
    """What mask and score objects share: `inputs` and `bind`."""

    #: Names of the call-time inputs `bind` needs (`("segment_ids",)`).
    inputs = ()

    def bind(self, **inputs):
        """The function for one call, with its call-time `inputs`.

        Raises `ValueError` when an input this object needs is missing or
        one it does not use is given (it would be silently ignored).
        """
        _check_inputs(self, inputs)
        return self._bind(**inputs) if self.inputs else self

    def _bind(self, **inputs):  # pragma: no cover - overridden
        raise NotImplementedError

    def get_config(self):
        return {}

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other):
        return type(self) is type(other) and (
            self.get_config() == other.get_config()
        )

    def __hash__(self):
        return hash(type(self).__name__)


def _check_inputs(obj, inputs):
    needed = tuple(obj.inputs)
    missing = [n for n in needed if inputs.get(n) is None]
    extra = sorted(set(inputs) - set(needed))
    if missing or extra:
        raise ValueError(
            f"{type(obj).__name__} needs the call-time inputs {needed!r} "
            "(through the layer's `mod_inputs=` argument). "
            f"Missing: {missing!r}; not used by it: {extra!r}. "
            f"Received: mod_inputs keys={sorted(inputs)!r}"
        )


@keras.saving.register_keras_serializable(package=PACKAGE)
class MaskMod(_Bindable):
    """Base class of mask objects: `mask(batch, head, q_idx, kv_idx)`.

    Subclasses implement `__call__` with elementwise operators on the
    index arguments (`q_idx >= kv_idx`, `&`, `|`): written so, a mask
    also runs on NumPy indices, and the blockwise path skips the tiles it
    masks entirely. Give `get_config` for saving.
    """

    # Optional fast path (`keras_attention.ops.fused.mask_band` reads it):
    # `band_bounds()` -> `(left, right)` when the mask is exactly
    # `q_idx - left <= kv_idx <= q_idx + right` (None: unbounded; causal
    # is `(None, 0)`), else None. A GPU kernel then takes it as a window
    # (cuDNN's `local_window_size`). Used only when the class defining it
    # also defines `__call__`.
    band_bounds = None
    # Optional cache bound (`mask_lookback` reads it): `lookback()` -> the
    # most earlier positions any query may see (an int: the mask allows
    # no key `kv_idx < q_idx - lookback()`), else None. An attention
    # layer holding such a mask decodes over a ring of `lookback() + 1`
    # slots (`MultiHeadAttention.cache_window`): `ChunkedCausalMask`'s
    # cache holds one chunk. Used only when the class defining it also
    # defines `__call__`.
    lookback = None

    def __call__(self, batch, head, q_idx, kv_idx):  # pragma: no cover
        raise NotImplementedError

    def __and__(self, other):
        return and_masks(self, other)

    def __or__(self, other):
        return or_masks(self, other)


@keras.saving.register_keras_serializable(package=PACKAGE)
class ScoreMod(_Bindable):
    """Base class of score objects without weights:
    `score(score, batch, head, q_idx, kv_idx) -> score` (float32 scores
    in, same shape out).

    Two optional fast paths a kernel may use instead of calling the
    object on every tile: `relative_bias(distance)` and `tanh_soft_cap()`
    (see the class attributes below; `keras_attention.scores.ALiBi`,
    `T5RelativeBias` and `SoftCap` implement them).
    """

    # Optional fast paths (`keras_attention.ops.scoring.split_relative_bias`
    # and `split_soft_cap` read them): None here, a method in a subclass
    # that is such a score. Used only when the class defining the method
    # also defines the score function (a subclass overriding one of them
    # gets the general path).
    #
    # `relative_bias(distance)`: the score only adds a bias of the head
    # and the distance, `score(s, b, h, q, kv) == s + relative_bias(q -
    # kv)[h]`; `distance` is a 1-D int32 tensor, the result float
    # `(heads | 1, n)` (ALiBi, T5's buckets). The blockwise path then
    # forms each tile's bias from its distances and sums the gradient
    # along the tile's diagonals.
    relative_bias = None
    # `tanh_soft_cap()`: the score is `cap * tanh(score / cap)`; returns
    # the cap (Gemma 2's logit soft-capping). The blockwise path then
    # differentiates through the `tanh` in one op.
    tanh_soft_cap = None

    def __call__(self, score, batch, head, q_idx, kv_idx):  # pragma: no cover
        raise NotImplementedError


class ScoreLayer(keras.layers.Layer, _Bindable):
    """Base class of score objects with weights (a learned bias): a Keras
    layer, so the attention layer holding it tracks, trains and saves
    them. Subclasses create their weights in `build(num_heads)` (called
    by the attention layer with its number of query heads) and implement
    `score_fn(score, batch, head, q_idx, kv_idx)`. The optional fast
    paths `relative_bias(distance)` and `tanh_soft_cap()` are those of
    `ScoreMod` (declared below)."""

    inputs = ()

    # Optional fast paths (`keras_attention.ops.scoring.split_relative_bias`
    # and `split_soft_cap` read them): None here, a method in a subclass
    # that is such a score. Used only when the class defining the method
    # also defines the score function (a subclass overriding one of them
    # gets the general path).
    #
    # `relative_bias(distance)`: the score only adds a bias of the head
    # and the distance, `score(s, b, h, q, kv) == s + relative_bias(q -
    # kv)[h]`; `distance` is a 1-D int32 tensor, the result float
    # `(heads | 1, n)` (ALiBi, T5's buckets). The blockwise path then
    # forms each tile's bias from its distances and sums the gradient
    # along the tile's diagonals.
    relative_bias = None
    # `tanh_soft_cap()`: the score is `cap * tanh(score / cap)`; returns
    # the cap (Gemma 2's logit soft-capping). The blockwise path then
    # differentiates through the `tanh` in one op.
    tanh_soft_cap = None

    def build(self, num_heads=None):
        self.built = True

    def score_fn(self, score, batch, head, q_idx, kv_idx):  # pragma: no cover
        raise NotImplementedError

    def __call__(self, score, batch, head, q_idx, kv_idx):
        # Not Layer.__call__: scores and index grids are no layer inputs
        # (no masks, no autocasting of the int indices).
        with full_precision_variables():
            return self.score_fn(score, batch, head, q_idx, kv_idx)

    def get_config(self):
        return keras.layers.Layer.get_config(self)

    __eq__ = object.__eq__
    __hash__ = object.__hash__
    __repr__ = keras.layers.Layer.__repr__


def _mods_config(mods):
    return [keras.saving.serialize_keras_object(m) for m in mods]


def _mods_from_config(configs):
    return [keras.saving.deserialize_keras_object(c) for c in configs]


class _Composed(MaskMod):
    def __init__(self, *mods):
        if not mods:
            raise ValueError(
                f"{type(self).__name__} needs at least one mask. "
                f"Received: mods={mods!r}"
            )
        for m in mods:
            if not callable(m):
                raise TypeError(
                    "Masks to compose must be mask objects or functions "
                    f"`mask(batch, head, q_idx, kv_idx)`. Received: {m!r}"
                )
        self.mods = tuple(mods)

    @property
    def inputs(self):
        names = []
        for m in self.mods:
            names += [n for n in getattr(m, "inputs", ()) if n not in names]
        return tuple(names)

    def _bind(self, **inputs):
        bound = [
            m.bind(**{n: inputs[n] for n in m.inputs})
            if isinstance(m, _Bindable)
            else m
            for m in self.mods
        ]
        return type(self)(*bound)

    def get_config(self):
        for m in self.mods:
            _check_serializable(m, "mods")
        return {"mods": _mods_config(self.mods)}

    @classmethod
    def from_config(cls, config):
        return cls(*_mods_from_config(config["mods"]))

    def __repr__(self):
        return f"{type(self).__name__}{self.mods!r}"


@keras.saving.register_keras_serializable(package=PACKAGE)
class AndMask(_Composed):
    """May attend where every one of `mods` allows (logical and)."""

    def __call__(self, batch, head, q_idx, kv_idx):
        out = self.mods[0](batch, head, q_idx, kv_idx)
        for m in self.mods[1:]:
            out = out & m(batch, head, q_idx, kv_idx)
        return out

    def band_bounds(self):
        """The intersection of the parts' bands, when each is one."""
        bands = [fused.mask_band(m) for m in self.mods]
        if None in bands:
            return None
        lefts = [b[0] for b in bands if b[0] is not None]
        rights = [b[1] for b in bands if b[1] is not None]
        return (min(lefts, default=None), min(rights, default=None))

    def and_parts(self):
        """The masks this one is the logical and of (a kernel may take
        them one by one: the flex path)."""
        return self.mods

    def lookback(self):
        """The smallest of the parts' lookbacks (None when none has
        one): a key must pass every part."""
        bounds = [mask_lookback(m) for m in self.mods]
        return min((b for b in bounds if b is not None), default=None)


@keras.saving.register_keras_serializable(package=PACKAGE)
class OrMask(_Composed):
    """May attend where any one of `mods` allows (logical or)."""

    def __call__(self, batch, head, q_idx, kv_idx):
        out = self.mods[0](batch, head, q_idx, kv_idx)
        for m in self.mods[1:]:
            out = out | m(batch, head, q_idx, kv_idx)
        return out


def and_masks(*mods):
    """A mask allowing what every mask of `mods` allows.

    Example:

    >>> import numpy as np
    >>> from keras_attention import mods
    >>> both = mods.and_masks(mods.CausalMask(), mods.SlidingWindowMask(1))
    >>> q, kv = np.arange(4)[:, None], np.arange(4)[None, :]
    >>> both(0, 0, q, kv).astype(int)
    array([[1, 0, 0, 0],
           [1, 1, 0, 0],
           [0, 1, 1, 0],
           [0, 0, 1, 1]])
    """
    return AndMask(*mods)


def mask_lookback(mask_mod):
    """The most earlier positions a query of `mask_mod` may see, when the
    mask says so (`MaskMod.lookback`: `ChunkedCausalMask`'s `chunk_size -
    1`, the smallest of an `AndMask`'s parts), else None (also for a plain
    function, or a subclass that overrides `__call__` but not
    `lookback`).

    Example:

    >>> from keras_attention import mods
    >>> from keras_attention.mods.base import mask_lookback
    >>> mask_lookback(mods.ChunkedCausalMask(4)), mask_lookback(None)
    (3, None)
    """
    method = getattr(mask_mod, "lookback", None)
    if method is None or not callable(method):
        return None
    defining = [
        next((c for c in type(mask_mod).__mro__ if name in vars(c)), None)
        for name in ("lookback", "__call__")
    ]
    return method() if defining[0] is defining[1] else None


def or_masks(*mods):
    """A mask allowing what any mask of `mods` allows."""
    return OrMask(*mods)


def is_serializable(obj):
    """Whether `obj` (a mask or score object) can be saved in a config."""
    if obj is None:
        return True
    if isinstance(obj, keras.layers.Layer):
        return True
    if not isinstance(obj, _Bindable):
        return False
    try:
        obj.get_config()
    except ValueError:
        return False
    return True


def _check_serializable(obj, argument, owner=None):
    if is_serializable(obj):
        return
    where = f" of layer {owner!r}" if owner else ""
    raise ValueError(
        f"`{argument}`{where} is a plain function ({obj!r}): a model holding "
        "it cannot be saved. Use a mask or score object of "
        "`keras_attention.mods` (or subclass `MaskMod` / `ScoreMod` / "
        "`ScoreLayer` with a `get_config` and register it with "
        "`keras.saving.register_keras_serializable`)."
    )


def serialize(obj, argument, owner=None):
    """The config entry of a mask or score object (None stays None);
    `ValueError` naming `argument` and `owner` for a plain function."""
    if obj is None:
        return None
    _check_serializable(obj, argument, owner)
    config = keras.saving.serialize_keras_object(obj)
    if (
        isinstance(obj, keras.layers.Layer)
        and keras_utils.saving_shared_objects()
    ):
        # Keras copies nested configs, so its own marking of a second
        # holder does not reach the first one's copy: mark every holder.
        config["shared_object_id"] = id(obj)
    return config


def deserialize(config):
    """Inverse of `serialize`."""
    if config is None:
        return None
    return keras.saving.deserialize_keras_object(config)


_MOD_ARGUMENTS = ("score_mod", "mask_mod")


def config_entries(owner):
    """`{"score_mod": ..., "mask_mod": ...}` of a layer holding them, for
    its `get_config` (only those that are set: a layer without them keeps
    Keras's config keys)."""
    return {
        name: serialize(getattr(owner, name), name, owner.name)
        for name in _MOD_ARGUMENTS
        if getattr(owner, name) is not None
    }


def from_config_entries(config):
    """A copy of a layer config with its mask and score objects
    deserialized (for `from_config`)."""
    config = dict(config)
    for name in _MOD_ARGUMENTS:
        config[name] = deserialize(config.get(name))
    return config


def bind(obj, inputs, argument):
    """`obj` ready for one call: a bound object, a plain function as it
    is (refusing call-time inputs it cannot take), or None."""
    if obj is None:
        return None
    if isinstance(obj, _Bindable):
        return obj.bind(**inputs)
    if inputs:
        raise ValueError(
            f"`{argument}` is a plain function: it cannot take call-time "
            f"inputs. Received: mod_inputs keys={sorted(inputs)!r}"
        )
    return obj


def bind_all(score_mod, mask_mod, mod_inputs):
    """`(score_mod, mask_mod)` bound for one call: `mod_inputs` (a dict or
    None) split by the names each declares in `inputs`; a name neither
    uses is refused (it would be silently ignored)."""
    mod_inputs = dict(mod_inputs or {})
    used = set()
    bound = []
    for obj, argument in ((score_mod, "score_mod"), (mask_mod, "mask_mod")):
        names = tuple(getattr(obj, "inputs", ()) or ())
        used.update(names)
        mine = {n: mod_inputs[n] for n in names if n in mod_inputs}
        bound.append(bind(obj, mine, argument))
    unused = sorted(set(mod_inputs) - used)
    if unused:
        raise ValueError(
            f"`mod_inputs` has entries no score or mask function of the layer "
            f"uses: {unused!r} (score_mod={score_mod!r}, "
            f"mask_mod={mask_mod!r}). Received: mod_inputs keys="
            f"{sorted(mod_inputs)!r}"
        )
    return tuple(bound)
