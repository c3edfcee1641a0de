"""The hook through which `collect_attention` records attention weights.

Every attention layer of the package goes through it, and a new layer
joins by implementing it (no edit in `keras_attention.visualization`):

- `call_with_attention(call, args, kwargs, options)`: calls `call` (the
  layer's own `call`, with the caller's `args` and `kwargs`) so that it
  computes its attention weights, and returns `(outputs, weights,
  metadata)`: the outputs as the caller asked for them, the weights as
  NumPy float32 `(batch, heads, Tq, Tk)` and a `dict` describing them.
  `AttentionRecording` implements it for layers whose `call` takes
  `return_attention_scores=` (the scores being the second output): they
  only implement `describe_attention`.
- `describe_attention(arguments, scores, options)`: `arguments` is the
  call's bound arguments (a `dict` by parameter name), `scores` the
  second output of the call; returns `(weights, metadata)`.

`metadata` holds `"kind"` (`"self"`, `"cross"`, `"decoder"`,
`"pooling"`), `"query_mask"` / `"key_mask"` (NumPy bool `(batch, T)` or
None), `"causal"`, `"window"` (`(left, right)` or None) and optionally
`"global_mask"`, `"heads_averaged"` and `"on_target_side"` (the layer
knows it is on a decoder's side). `options` carries `collect_attention`'s
settings: `"max_dense_length"` (the longest sequence whose banded weights
may be expanded to dense ones, or None).

A layer class whose role is fixed sets `attention_kind` (`"self"`,
`"cross"`): a parent layer holding a `"cross"` layer is a decoder block,
and its self-attention is on the target side.

How a call reaches the hook: every class deriving from
`AttentionRecording` has its own `call` wrapped once, when the class is
defined, by `recorded_call`, which consults the recording scope
(`recording(recorder)`, a context variable; `collect_attention` opens
it). Outside a scope, or for a layer the recorder did not select, the
wrapper calls `call` straight through; inside, it hands the call to the
recorder, which calls the hook. No instance method is replaced, the model
is not rewired, and a subclass's `call` that calls `super().call` is
recorded once (the recorder passes a layer's nested calls through).

The same wrapper refuses, inside an exclusive attention scope
(`keras_attention.distribution.ContextParallel`'s ring, where the
sequence is sharded), every layer whose class does not set
`runs_context_parallel = True` (`check_context_parallel`): only the
layers whose attention is `dot_product_attention` (which runs as the
ring there) or a reduction XLA splits over the shards set it, so a layer
with its own kernel (and a user's, by default) never attends over the
gathered sequence silently.
"""

import contextlib
import contextvars
import functools
import inspect
import types

import numpy as np
from keras import ops

from keras_attention.ops import paths
from keras_attention.utils import keras_utils


def numpy_weights(x, dtype="float32"):
    """`x` (a tensor) as a NumPy array of `dtype`."""
    return np.asarray(ops.convert_to_numpy(x)).astype(dtype)


def padding_mask(mask, tensor=None):
    """A boolean NumPy padding mask, from `mask` or the Keras mask of
    `tensor`; None when neither has one."""
    if mask is None and tensor is not None:
        mask = keras_utils.keras_mask(tensor)
    return None if mask is None else numpy_weights(mask, "bool")


def all_masks(*masks):
    """The logical and of the masks that are not None (None if none)."""
    masks = [m for m in masks if m is not None]
    if not masks:
        return None
    return np.logical_and.reduce(masks)


def without_scores(outputs):
    """A layer's outputs as the caller asked for them: the attention
    weights (second output) that the recorder requested dropped again."""
    rest = (outputs[0],) + tuple(outputs[2:])
    return rest[0] if len(rest) == 1 else rest


_SCOPE = contextvars.ContextVar("keras_attention_recording", default=None)


@contextlib.contextmanager
def recording(recorder):
    """The recording scope: inside it, the `call` of every
    `AttentionRecording` layer asks `recorder` first.

    `recorder` implements `wants(layer)` (whether to record this call of
    `layer`) and `record(layer, call, args, kwargs)` (calls the hook with
    `call`, the layer's `call` bound to it, and returns the outputs).
    Scopes nest: the innermost one applies.
    """
    token = _SCOPE.set(recorder)
    try:
        yield recorder
    finally:
        _SCOPE.reset(token)


def recorded_call(call):
    """`call` (a layer class's own `call` function) wrapped so that it
    consults the recording scope; applied by
    `AttentionRecording.__init_subclass__`."""

    @functools.wraps(call)
    def wrapper(self, *args, **kwargs):
        check_context_parallel(self)
        recorder = _SCOPE.get()
        if recorder is None or not recorder.wants(self):
            return call(self, *args, **kwargs)
        return recorder.record(self, types.MethodType(call, self), args, kwargs)

    wrapper._consults_recording = True
    return wrapper


def check_context_parallel(layer):
    """`ValueError` naming `layer`, its class and the distribution when an
    exclusive scope (`ContextParallel`'s ring) is in effect and `layer`'s
    class does not run there (`runs_context_parallel` unset: its attention
    is not `dot_product_attention`, so it would not run as a ring)."""
    if getattr(type(layer), "runs_context_parallel", False):
        return
    paths.refuse_in_exclusive_scope(
        f"{type(layer).__name__} layer {layer.name!r}",
        f"`{type(layer).__name__}` computes its attention on its own kernel, "
        "not with `dot_product_attention`",
    )


def consults_recording(layer):
    """Whether `layer`'s `call` consults the recording scope (its class
    derives from `AttentionRecording`)."""
    return bool(getattr(type(layer).call, "_consults_recording", False))


class AttentionRecording:
    """Mixin: the recording hook for attention layers.

    A subclass's `call` consults the recording scope (see the module
    docstring); the default `call_with_attention` serves layers whose
    `call` takes `return_attention_scores=`: they implement
    `describe_attention`. Others override `call_with_attention`.
    """

    attention_kind = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        call = cls.__dict__.get("call")
        if call is not None and not getattr(call, "_consults_recording", False):
            cls.call = recorded_call(call)

    def call_with_attention(self, call, args, kwargs, options):
        bound = inspect.signature(call).bind(*args, **kwargs)
        asked = bool(bound.arguments.get("return_attention_scores"))
        bound.arguments["return_attention_scores"] = True
        outputs = call(*bound.args, **bound.kwargs)
        weights, meta = self.describe_attention(
            bound.arguments, outputs[1], options
        )
        return (outputs if asked else without_scores(outputs)), weights, meta

    def describe_attention(self, arguments, scores, options):
        raise NotImplementedError(
            f"{type(self).__name__} must implement `describe_attention`"
        )
