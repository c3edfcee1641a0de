"""The tensors a plain score function reads without being given them.

A plain score function (not a `ScoreLayer`) may read a trainable
`keras.Variable`, or a tensor that carries a gradient (a watched
TensorFlow tensor, a graph tensor or JAX tracer, a torch tensor
requiring grad), from its closure, the globals it names, its defaults,
a bound or callable object, a `functools.partial`: the dense path
differentiates it as it is, but a hand-written backward pass (the
blockwise path's custom gradient) only differentiates what it is given.
`split_captured` makes them explicit, as `ScoreLayer` weights are:

- Keras variables are read through a `keras.StatelessScope` that maps
  each one to the value passed, wherever the function finds it (the
  variables it reads are told from one call on a one-score tile, so a
  bound method of a whole layer passes only the weights it reads);
- tensors are replaced, in a copy of the function (its closure cells,
  defaults, globals, partial arguments, object attributes), by the value
  passed.

A tensor in a place no copy can replace (a module's attribute, a set) is
refused (`refusal`). A `tf.Variable` is left where it is: TensorFlow's
custom gradient gets the variables its forward pass reads
(`variables`), and the backward pass differentiates them too; so does a
Keras variable this search misses, on TensorFlow. On JAX a
differentiated tracer it misses is refused by `jax.custom_vjp` itself;
PyTorch differentiates the blockwise forward as it is.
"""

import copy
import functools
import types

import keras
import numpy as np
from keras import ops

from keras_attention.ops import _backend
from keras_attention.ops import scoring

_MAX_DEPTH = 6
_LEAVES = (str, bytes, int, float, bool, type(None), type, np.ndarray)
_LEAVES += (np.generic, types.ModuleType, types.BuiltinFunctionType)


def _trainable_tensor(x, traced):
    """A backend tensor that may carry a gradient: requiring grad
    (torch), without values and float (`traced`: a graph tensor, a JAX
    tracer) or, on TensorFlow, watched by a gradient tape (`traced`)."""
    if not keras.ops.is_tensor(x):
        return False
    if getattr(x, "requires_grad", False):
        return True
    if not traced:
        return False
    if not keras.backend.is_float_dtype(
        keras.backend.standardize_dtype(x.dtype)
    ):
        return False
    return _backend.is_symbolic(x) or _backend.is_recorded(x)


class _Walk:
    """One walk through what a function reads, `visit(fn)`: records the
    trainable Keras variables (`variables`, a layer's too), the tensors
    that may carry a gradient (`tensors`) and where one cannot be
    replaced (`stuck`), and the objects through which a tensor that can
    be replaced is read (`paths`, ids). With `replace` (`{id(tensor):
    value}`) and the `paths` of a first walk, it returns a copy of the
    function reading the values instead (copying only those objects)."""

    def __init__(self, traced, replace=None, paths=None):
        self.traced, self.replace = traced, replace
        self.variables, self.tensors, self.stuck = {}, {}, []
        self.backend_variables = {}
        self.paths = set() if paths is None else paths
        self._copying = paths is not None
        self._seen, self._found = {}, 0

    def visit(self, obj, depth=0, fixed=None):
        """`obj`, or a copy of it reading the replacements; `fixed`: the
        name of a place no copy can replace (None: it can be)."""
        if self.replace is not None and id(obj) in self.replace:
            # By identity (a tape may no longer record it by now).
            return self.replace[id(obj)] if fixed is None else obj
        if isinstance(obj, _LEAVES):
            return obj
        if isinstance(obj, keras.Variable):
            if obj.trainable:
                self.variables.setdefault(id(obj), obj)
            return obj
        if isinstance(obj, keras.layers.Layer):
            for v in obj.trainable_variables:
                self.variables.setdefault(id(v), v)
            return obj
        if _backend.is_variable(obj):  # The custom gradient gets it.
            if obj.trainable:
                self.backend_variables.setdefault(id(obj), obj)
            return obj
        if _trainable_tensor(obj, self.traced):
            self.tensors.setdefault(id(obj), obj)
            if fixed is not None:
                self.stuck.append(fixed)
            self._found += fixed is None
            return obj
        if depth > _MAX_DEPTH or keras.ops.is_tensor(obj):
            return obj
        if id(obj) in self._seen:
            self._found += id(obj) in self.paths
            return self._seen[id(obj)]
        if self._copying and id(obj) not in self.paths:
            return obj
        self._seen[id(obj)] = obj  # A cycle reads the original.
        found = self._found
        new = self._copy(obj, depth + 1, fixed)
        if self._found > found:
            self.paths.add(id(obj))
        self._seen[id(obj)] = new
        return new

    def _all(self, items, depth, fixed):
        items = list(items)
        new = [self.visit(x, depth, fixed) for x in items]
        return new, any(a is not b for a, b in zip(new, items))

    def _copy(self, obj, depth, fixed):
        if isinstance(obj, (set, frozenset)):
            self._all(obj, depth, fixed or f"a set in {obj!r}")
            return obj
        if isinstance(obj, (list, tuple)):
            new, changed = self._all(obj, depth, fixed)
            if not changed:
                return obj
            return (
                type(obj)(*new) if hasattr(obj, "_fields") else type(obj)(new)
            )
        if isinstance(obj, dict):
            new, changed = self._all(obj.values(), depth, fixed)
            return dict(zip(obj, new)) if changed else obj
        if isinstance(obj, functools.partial):
            parts = [obj.func, obj.args, obj.keywords]
            (func, args, keywords), changed = self._all(parts, depth, fixed)
            return (
                functools.partial(func, *args, **keywords) if changed else obj
            )
        if isinstance(obj, types.MethodType):
            parts, changed = self._all(
                [obj.__func__, obj.__self__], depth, fixed
            )
            return types.MethodType(*parts) if changed else obj
        if isinstance(obj, types.FunctionType):
            return self._function(obj, depth, fixed)
        if callable(obj) or hasattr(obj, "__dict__"):
            return self._object(obj, depth, fixed)
        return obj

    def _function(self, fn, depth, fixed):
        cells = _cells(fn)
        contents, new_cells = self._all(
            [c.cell_contents for c in cells], depth, fixed
        )
        defaults, new_defaults = self._all(fn.__defaults__ or (), depth, fixed)
        kwdefaults = dict(fn.__kwdefaults__ or {})
        values, new_kwdefaults = self._all(kwdefaults.values(), depth, fixed)
        names, reads = _globals_read(fn)
        scope, new_globals = self._all(
            [fn.__globals__[n] for n in names], depth, fixed
        )
        for name, module, attr in reads:
            where = fixed or f"the module attribute `{name}.{attr}`"
            self.visit(getattr(module, attr), depth, where)
        if not (new_cells or new_defaults or new_kwdefaults or new_globals):
            return fn
        closure = iter(contents)
        closure = tuple(
            types.CellType(next(closure)) if _full(c) else c
            for c in fn.__closure__ or ()
        )
        space = fn.__globals__
        if new_globals:
            space = dict(space)
            space.update(zip(names, scope))
        new = types.FunctionType(
            fn.__code__,
            space,
            fn.__name__,
            tuple(defaults) if fn.__defaults__ else None,
            closure or None,
        )
        new.__kwdefaults__ = dict(zip(kwdefaults, values)) or None
        new.__dict__.update(fn.__dict__)
        return new

    def _object(self, obj, depth, fixed):
        attrs = dict(getattr(obj, "__dict__", {}))
        values, changed = self._all(attrs.values(), depth, fixed)
        call = getattr(type(obj), "__call__", None)
        new_call = call
        if isinstance(call, types.FunctionType):
            new_call = self.visit(call, depth, fixed)
        if changed:
            obj = copy.copy(obj)
            for name, value in zip(attrs, values):
                if value is not attrs[name]:
                    object.__setattr__(obj, name, value)
        if new_call is not call:
            return functools.partial(new_call, obj)
        return obj


def _full(cell):
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises.
    except ValueError:
        return False
    return True


def _cells(fn):
    return [c for c in fn.__closure__ or () if _full(c)]


def _code_names(code):
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def _globals_read(fn):
    """The names of the globals `fn`'s code names (sorted), and the
    attributes it names of the modules among them, `(name, module,
    attribute)`."""
    code_names = _code_names(fn.__code__)
    scope = fn.__globals__
    names = sorted(n for n in code_names if n in scope)
    reads = [
        (name, scope[name], attr)
        for name in names
        if isinstance(scope[name], types.ModuleType)
        for attr in sorted(code_names)
        if attr in getattr(scope[name], "__dict__", {})
    ]
    return names, reads


def _walk(fn, traced):
    walk = _Walk(traced)
    if isinstance(fn, scoring.AtPositions):
        fn = fn.fn
    if fn is not None and not isinstance(fn, keras.layers.Layer):
        walk.visit(fn)
    return walk


def closes_over_tensors(fn, traced=False):
    """Whether a plain function `fn` reads a trainable variable (or a
    layer holding one) that it is not given. Looked for wherever the
    function reads it: its closure, the globals its code names (module
    attributes too), its defaults, a bound method's object, a callable
    object's attributes, a `functools.partial`'s arguments, and the
    functions these hold, recursively. Constant tensors are fine
    (nothing to differentiate). Layers (`ScoreLayer`) pass their weights
    explicitly and are not such functions.

    `traced=True` counts float tensors that may be differentiated too
    (a graph tensor or JAX tracer, computed inside a traced function,
    which cannot be told from a constant; a TensorFlow tensor a gradient
    tape watches)."""
    walk = _walk(fn, traced)
    return bool(walk.variables or walk.tensors or walk.backend_variables)


def refusal(score_mod):
    """Why the blockwise path cannot pass what `score_mod` reads to its
    backward pass (a tensor that may carry a gradient in a place no copy
    of the function can replace), or None."""
    return _refusal(_walk(score_mod, traced=True).stuck, score_mod)


def _refusal(stuck, score_mod):
    if not stuck:
        return None
    return (
        "implementation='blockwise' cannot pass the tensors a score "
        "function reads to its hand-written backward pass when they are "
        f"in {stuck[0]} (they may carry a gradient, which would be lost): "
        "read it from a closure, a default or an object, make the function "
        "a `keras_attention.mods.ScoreLayer`, or use 'dense'. Received: "
        f"score_mod={score_mod!r}"
    )


class _Reads(keras.StatelessScope):
    """A stateless scope that maps `mapping`'s variables and answers for
    the others as the scope around it does (a trainer's), recording which
    variables are read (`read`)."""

    def __init__(self, mapping=()):
        super().__init__(state_mapping=list(mapping))
        self.read = {}

    def get_current_value(self, variable):
        self.read.setdefault(id(variable), variable)
        value = self.state_mapping.get(id(variable))
        outer = getattr(self, "original_scope", None)
        if value is None and outer is not None:
            value = outer.get_current_value(variable)
        return value


def _variables_read(fn, variables, heads, dtype):
    """Those of `variables` (a dict by id) that `fn` reads, told from one
    call on a one-score tile; all of them if that call fails."""
    grid = [ops.zeros((1, 1, 1, 1), "int32")] * 4
    grid[1] = ops.reshape(ops.arange(heads, dtype="int32"), (1, -1, 1, 1))
    score = ops.zeros((1, heads, 1, 1), dtype)
    try:
        with _Reads() as scope:
            fn(score, *grid)
    except Exception:  # noqa: BLE001 - a function for other tiles only.
        return list(variables.values())
    return [v for k, v in variables.items() if k in scope.read]


def split_captured(score_mod, heads=1, dtype="float32"):
    """`score_mod` as `(fn, params)` (as `scoring.split_score_mod`):
    `fn(params, score, batch, head, q_idx, kv_idx)` reads the trainable
    Keras variables and the tensors that may carry a gradient, that a
    plain function reads, from `params` (a tuple: the variables' values,
    then the tensors), so that a hand-written backward pass gives them
    their gradients; `params=()` when it reads none (a `ScoreLayer`:
    `scoring.split_score_mod`). `heads` and `dtype`: of the scores, for
    the call that tells which variables it reads.

    Raises `ValueError` naming `score_mod` when such a tensor is where
    no copy of the function can replace it (`refusal`).
    """
    if isinstance(score_mod, scoring.AtPositions):
        inner, params = split_captured(score_mod.fn, heads, dtype)

        def at_positions(params, score, batch, head, q_idx, kv_idx):
            q_idx, kv_idx = score_mod.positions(q_idx, kv_idx)
            return inner(params, score, batch, head, q_idx, kv_idx)

        return at_positions, params
    if score_mod is None or isinstance(score_mod, keras.layers.Layer):
        return scoring.split_score_mod(score_mod)
    walk = _walk(score_mod, traced=True)
    reason = _refusal(walk.stuck, score_mod)
    if reason is not None:
        raise ValueError(reason)
    variables = walk.variables
    if variables:
        variables = _variables_read(score_mod, variables, heads, dtype)
    tensors, paths = list(walk.tensors.values()), walk.paths
    if not variables and not tensors:
        return scoring.split_score_mod(score_mod)
    with scoring.full_precision_variables():
        # A read of each (TensorFlow's custom gradient must not see the
        # variables themselves), at its own dtype (as `ScoreLayer`).
        params = tuple(ops.copy(v) for v in list(variables) + tensors)
    count = len(variables)

    def fn(params, *args):
        target = score_mod
        if tensors:
            replace = {id(t): p for t, p in zip(tensors, params[count:])}
            target = _Walk(True, replace, paths).visit(score_mod)
        with _Reads(zip(variables, params[:count])):
            return target(*args)

    return fn, params
