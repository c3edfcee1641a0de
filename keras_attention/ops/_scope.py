"""The state of `implementation_scope` (`paths.py`): the path forced in
the current context, a context variable (not module state).

Here rather than in `paths.py` so that the kernels `paths.py` imports
(`global_local`, `sliding_window`) can refuse to run inside an exclusive
scope: the ring of `keras_attention.distribution.ContextParallel`, where
the sequence is sharded and every attention must run on the ring.
"""

import contextlib
import contextvars
import dataclasses

import keras


@dataclasses.dataclass(frozen=True)
class ImplementationScope:
    """What `implementation_scope` forces: a path name (None: the
    automatic choice), tuning options, and whether the path is
    `exclusive` (`paths.AttentionPath`)."""

    name: str = None
    options: dict = dataclasses.field(default_factory=dict)
    exclusive: bool = False


_SCOPE = contextvars.ContextVar(
    "keras_attention_implementation_scope", default=ImplementationScope()
)


def current_scope():
    """The innermost `implementation_scope` in effect (an
    `ImplementationScope`; name None outside any)."""
    return _SCOPE.get()


def exclusive_scope():
    """The name of the path the innermost `implementation_scope` forces
    when that path is `exclusive` (every attention inside must run on it:
    the ring of `keras_attention.distribution.ContextParallel`), else
    None. The layers and kernels read it to refuse what they would run
    on another kernel (returned weights, dropout on them,
    `flash_attention`, global tokens, their own kernels)."""
    scope = current_scope()
    return scope.name if scope.exclusive else None


@contextlib.contextmanager
def forced(name, options, exclusive=False):
    """Forces path `name` with tuning `options` (checked by
    `paths.implementation_scope`) for the calls made inside."""
    token = _SCOPE.set(ImplementationScope(name, dict(options), exclusive))
    try:
        yield
    finally:
        _SCOPE.reset(token)


def release_exclusive_scope(**options):
    """The automatic choice, with tuning `options`, inside an exclusive
    path's own computation (the ring's blocks, on one device's shards):
    the one way out of an exclusive scope (`implementation_scope` refuses
    to leave it)."""
    return forced(None, options)


def refuse_in_exclusive_scope(what, why):
    """`ValueError` when an exclusive scope is in effect (`ContextParallel`'s
    ring): `what` (a layer or an op, described) computes attention on its
    own kernel (`why`), which would attend over the whole sequence on every
    device, gathered, rather than as the scope's path."""
    exclusive = exclusive_scope()
    if exclusive is None:
        return
    where = f"`implementation_scope({exclusive!r})`"
    distribution = keras.distribution.distribution()
    if distribution is not None:
        where += f", the scope of the distribution {distribution!r},"
    raise ValueError(
        f"{what} cannot run inside {where} where every attention runs on "
        f"the {exclusive!r} path (context parallelism: the sequence is "
        f"sharded across devices): {why}, so it would attend over the "
        "whole sequence gathered on every device. Call it outside the "
        "scope (on one device), or use the attention layers that run as "
        "ring attention (the guide 'Long sequences across devices' lists "
        "them)."
    )
