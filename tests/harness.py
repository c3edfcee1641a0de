"""The shared layer test harness.

Every layer test of the package calls `run_layer_test` (serialization and
`dir()`, state counts, build from shapes, symbolic shapes, `.keras`,
SavedModel in a fresh process, `fit` with and without XLA, mixed precision
down to every sublayer's policy) and, for layers that read Keras masks,
`run_mask_test`. The checks follow Keras's `TestCase.run_layer_test` and
keras-hub's `run_precision_test`; tests/test_harness.py shows each one
failing on a toy layer with the defect it is for.

`input_data` is a dict `{call_argument_name: numpy array}` of the tensor
arguments; `call_kwargs` holds the other call arguments. Inputs are fed to
functional models positionally, in the dict's order.
"""

import contextlib
import inspect
import json
import os
import tempfile

import keras
import numpy as np
import serving

BACKEND = keras.backend.backend()

ATOL = 1e-5


@contextlib.contextmanager
def float64_enabled():
    """JAX computes in float64 only with x64 enabled (the other backends
    always do): the float64 tests' context."""
    if BACKEND != "jax":
        yield
        return
    import jax

    with jax.enable_x64(True):
        yield


# The checks of `run_layer_test` a backend does not run, each with its
# reason (printed at the end of every pytest run on that backend by
# tests/conftest.py).
BACKEND_GAPS = {
    "jax": {
        "saved_model": "the export is the TensorFlow part's check (Keras "
        "exports JAX models through jax2tf, which this suite does not "
        "repeat)",
        "fit_eager": "`fit` without `jit_compile` runs the jitted train "
        "step's operations one by one, each compiled per shape (about 2.5 "
        "s per tiny model, 6x the jitted fit: 20.4 s against 3.6 s over "
        "eight harness tests, 2026-12-04); what traces under `jax.jit` "
        "runs eagerly, so `fit` runs jitted only (TensorFlow runs both: "
        "its graph and XLA kernels differ)",
    },
    "torch": {
        "saved_model": "Keras exports PyTorch models to a TensorFlow "
        "SavedModel only through torch_xla (StableHLO), which has no CPU "
        "wheel here; `.keras` files are tested instead",
        "fit_jit_compile": "`fit` with `jit_compile=True` is torch.compile "
        "(inductor builds C++ kernels): 50-70 s per tiny model, so `fit` "
        "runs eagerly only; the TensorFlow (XLA) and JAX (jax.jit) parts "
        "test compiled training",
    },
}
GAPS = BACKEND_GAPS.get(BACKEND, {})


def _as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _np(x):
    return keras.ops.convert_to_numpy(x)


def _input_spec_shape(array):
    """Dynamic axes: all but the last for floats; all for ints/bools."""
    if array.dtype.kind == "f" and array.ndim >= 2:
        return (None,) * (array.ndim - 2) + (array.shape[-1],)
    return (None,) * (array.ndim - 1)


def _make_model(layer, input_data, call_kwargs):
    inputs = [
        keras.Input(shape=_input_spec_shape(v), dtype=str(v.dtype), name=k)
        for k, v in input_data.items()
    ]
    outputs = layer(**dict(zip(input_data, inputs)), **call_kwargs)
    return keras.Model(inputs, list(_as_tuple(outputs)))


def _predict(model, input_data):
    return [_np(o) for o in _as_tuple(model(list(input_data.values())))]


def _assert_all_close(actual, expected, atol=ATOL, msg=""):
    for a, e in zip(_as_tuple(actual), _as_tuple(expected)):
        np.testing.assert_allclose(
            _np(a), _np(e), atol=atol, rtol=1e-5, err_msg=msg
        )


def _variant(input_data, batch_factor=1, trim=0):
    """Same inputs with the batch tiled and the time axes shortened."""
    out = {}
    for k, v in input_data.items():
        v = np.concatenate([v] * batch_factor, axis=0)
        if trim:
            dyn = _input_spec_shape(v)
            index = [slice(None)] + [
                slice(0, v.shape[a + 1] - trim) if d is None else slice(None)
                for a, d in enumerate(dyn)
            ]
            v = v[tuple(index)]
        out[k] = v
    return out


def _public_dir(obj):
    names = set(dir(obj))
    names.discard("__annotations__")
    return names


def check_config(layer, check_dir=True):
    """`get_config` -> `from_config` and `serialize_keras_object` ->
    `deserialize_keras_object` give the identical JSON config; with
    `check_dir`, the revived layers also have the same attributes (`dir()`)
    as `layer` (an unbuilt layer: `build` adds attributes)."""
    cls = layer.__class__
    config = layer.get_config()
    revived = cls.from_config(config)
    assert json.dumps(revived.get_config(), sort_keys=True) == json.dumps(
        config, sort_keys=True
    )
    serialized = keras.saving.serialize_keras_object(layer)
    json.dumps(serialized)
    again = keras.saving.deserialize_keras_object(serialized)
    assert isinstance(again, cls)
    assert json.dumps(again.get_config(), sort_keys=True) == json.dumps(
        config, sort_keys=True
    )
    if check_dir:
        for other in (revived, again):
            missing = _public_dir(layer) - _public_dir(other)
            extra = _public_dir(other) - _public_dir(layer)
            assert not missing and not extra, (
                f"dir() differs after rebuilding {cls.__name__} from its "
                f"config: missing {sorted(missing)}, extra {sorted(extra)}"
            )


def seed_generators(layer):
    """The distinct `SeedGenerator`s of `layer` and all its sublayers."""
    found = {}
    for sublayer in layer._flatten_layers(include_self=True, recursive=True):
        for generator in sublayer._seed_generators:
            found.setdefault(id(generator), generator)
    return list(found.values())


def state_counts(layer):
    """Counts of a built layer's state, by kind."""
    return dict(
        trainable_weights=len(layer.trainable_weights),
        non_trainable_weights=len(layer.non_trainable_weights),
        non_trainable_variables=len(layer.non_trainable_variables),
        seed_generators=len(seed_generators(layer)),
    )


def check_state_counts(layer, expected, how):
    """`layer`'s state counts equal `expected` (a dict of `state_counts`
    keys; a `None` value is not checked)."""
    assert layer.built, f"{type(layer).__name__} not built {how}"
    actual = state_counts(layer)
    for kind, count in expected.items():
        if count is not None:
            assert actual[kind] == count, (
                f"{type(layer).__name__} {how}: {actual[kind]} {kind}, "
                f"expected {count}"
            )


def build_shapes(layer, input_data):
    """Keyword arguments for `layer.build`, as Keras's `__call__` aligns
    them: a one-argument `build` gets the first input's shape, a
    multi-argument `build(foo_shape, ...)` the shape of call argument
    `foo`."""
    shapes = {f"{k}_shape": tuple(v.shape) for k, v in input_data.items()}
    names = [
        name
        for name, p in inspect.signature(layer.build).parameters.items()
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if len(names) == 1:
        return {names[0]: next(iter(shapes.values()))}
    return {name: shapes[name] for name in names if name in shapes}


def check_build_from_shapes(
    layer_cls, init_kwargs, input_data, call_kwargs, reference, eager, atol
):
    """`layer.build(**shapes)` alone creates all the state `reference` (a
    layer built by a call) has; with `reference`'s weights, a call creates
    nothing more and reproduces `eager`."""
    layer = layer_cls(**init_kwargs)
    layer.build(**build_shapes(layer, input_data))
    expected = state_counts(reference)
    check_state_counts(layer, expected, "after build() from shapes")
    layer.set_weights(reference.get_weights())
    outputs = _as_tuple(layer(**input_data, **call_kwargs))
    check_state_counts(layer, expected, "after build() from shapes and call")
    _assert_all_close(outputs, eager, atol, "build() from shapes, then call")


def _symbolic(input_data, float_dtype=None):
    """KerasTensors shaped like `input_data`; floats in `float_dtype`."""
    return {
        k: keras.KerasTensor(
            v.shape,
            dtype=float_dtype
            if float_dtype and v.dtype.kind == "f"
            else str(v.dtype),
        )
        for k, v in input_data.items()
    }


def check_symbolic_shapes(
    layer_cls, init_kwargs, input_data, call_kwargs, eager, counts=None
):
    """A symbolic call gives the eager outputs' shapes and dtypes, and
    builds the state counts `counts` (if given)."""
    layer = layer_cls(**init_kwargs)
    outputs = _as_tuple(layer(**_symbolic(input_data), **call_kwargs))
    if counts is not None:
        check_state_counts(layer, counts, "by a symbolic call")
    assert len(outputs) == len(eager), (
        f"{len(outputs)} symbolic outputs, {len(eager)} eager ones"
    )
    for i, (s, e) in enumerate(zip(outputs, eager)):
        assert tuple(s.shape) == tuple(e.shape), (
            f"symbolic output {i} has shape {tuple(s.shape)}, the eager one "
            f"{tuple(e.shape)} (compute_output_shape?)"
        )
        dtype = keras.backend.standardize_dtype(s.dtype)
        assert dtype == str(e.dtype), (
            f"symbolic output {i} has dtype {dtype}, the eager one {e.dtype}"
        )


_SERVE_CODE = """
import numpy as np
import tensorflow as tf

path, inputs_path, out_path = sys.argv[1:4]
served = tf.saved_model.load(path)
data = np.load(inputs_path)
results = {}
for variant in sorted({k.split("/")[0] for k in data.files}):
    names = sorted(k for k in data.files if k.startswith(variant + "/"))
    outs = served.serve([tf.constant(data[n]) for n in names])
    outs = outs if isinstance(outs, (list, tuple)) else [outs]
    for i, o in enumerate(outs):
        results[f"{variant}/{i}"] = o.numpy()
np.savez(out_path, **results)
"""


def check_saved_model(model, variants, atol=ATOL):
    """Exports `model`, serves each input variant with TensorFlow alone in a
    separate process that cannot import keras_attention, examples or Keras
    (one kept for all the checks of this test process), and compares with
    the Keras model."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "exported")
        model.export(path, verbose=False)
        arrays = {}
        for vi, data in enumerate(variants):
            for ai, v in enumerate(data.values()):
                arrays[f"v{vi}/{ai:02d}"] = v
        inputs_path = os.path.join(tmp, "in.npz")
        out_path = os.path.join(tmp, "out.npz")
        np.savez(inputs_path, **arrays)
        # One serving process for every check of this test process (see
        # `serving.run_in_shared_process`): a Python + TensorFlow start per
        # layer configuration was a large part of the TensorFlow part's time.
        serving.run_in_shared_process(
            _SERVE_CODE,
            args=[path, inputs_path, out_path],
            blocked_modules=serving.BLOCKED_MODULES + serving.KERAS_MODULES,
            cwd=tmp,
        )
        served = np.load(out_path)
        for vi, data in enumerate(variants):
            expected = _predict(model, data)
            for oi, e in enumerate(expected):
                np.testing.assert_allclose(
                    served[f"v{vi}/{oi}"],
                    e,
                    atol=atol,
                    rtol=1e-5,
                    err_msg=f"SavedModel output {oi} of variant {vi}",
                )


def check_fit(layer_cls, init_kwargs, input_data, call_kwargs, jit_compile):
    import tensorflow as tf

    layer = layer_cls(**init_kwargs)
    model = _make_model(layer, input_data, call_kwargs)
    model = keras.Model(model.inputs, model.outputs[0])
    target = np.zeros(_predict(model, input_data)[0].shape, "float32")
    model.compile(optimizer="sgd", loss="mse", jit_compile=jit_compile)
    ds = tf.data.Dataset.from_tensor_slices(
        (tuple(input_data.values()), target)
    ).batch(len(target))
    before = [_np(w).copy() for w in model.trainable_weights]
    history = model.fit(ds, epochs=1, verbose=0, shuffle=False)
    assert np.isfinite(history.history["loss"][-1])
    changed = [
        not np.array_equal(b, _np(w))
        for b, w in zip(before, model.trainable_weights)
    ]
    assert any(changed) or not before, "fit changed no weight"


def check_sublayer_policies(layer):
    """Every sublayer computes and stores in `layer`'s dtypes (keras-hub's
    precision test): a sublayer created without `dtype=self.dtype_policy`
    takes the global policy instead."""
    policy = layer.dtype_policy
    expected = (policy.compute_dtype, policy.variable_dtype)
    wrong = [
        f"{sublayer.path or sublayer.name!r} ({type(sublayer).__name__}): "
        f"{sublayer.dtype_policy.name!r}"
        for sublayer in layer._flatten_layers(
            include_self=False, recursive=True
        )
        if not isinstance(sublayer, keras.layers.InputLayer)
        and (sublayer.compute_dtype, sublayer.variable_dtype) != expected
    ]
    assert not wrong, (
        f"sublayers of {type(layer).__name__} (dtype policy "
        f"{policy.name!r}) in another dtype policy: " + "; ".join(wrong)
    )


def check_output_spec_dtypes(layer, input_data, call_kwargs, outputs):
    """Every output's dtype is the one `compute_output_spec` announces
    (Keras's mixed precision check; float inputs in the compute dtype when
    the layer autocasts)."""
    float_dtype = layer.compute_dtype if layer.autocast else None
    specs = _as_tuple(
        layer.compute_output_spec(
            **_symbolic(input_data, float_dtype), **call_kwargs
        )
    )
    assert len(specs) == len(outputs), (len(specs), len(outputs))
    for i, (o, spec) in enumerate(zip(outputs, specs)):
        dtype = keras.backend.standardize_dtype(o.dtype)
        assert dtype == spec.dtype, (
            f"{type(layer).__name__} output {i} under "
            f"{layer.dtype_policy.name}: dtype {dtype}, compute_output_spec "
            f"says {spec.dtype}"
        )


def _layers_under_policy(init_kwargs, policy):
    """`init_kwargs` with `dtype=policy`, and every layer object among them
    (e.g. a decoder's `attention`) rebuilt from its config in `policy`: the
    test built those under the global float32 policy, and a layer keeps
    the policy of a layer it is given (as Keras's `RNN` keeps its cell's),
    where a user of mixed precision would have built them in `policy`."""
    kwargs = dict(init_kwargs, dtype=policy)
    for name, value in init_kwargs.items():
        if isinstance(value, keras.layers.Layer):
            config = dict(value.get_config(), dtype=policy)
            kwargs[name] = type(value).from_config(config)
    return kwargs


def check_mixed_precision(
    layer_cls,
    init_kwargs,
    input_data,
    call_kwargs,
    policy,
    check_output_spec=True,
    check_sublayers=True,
):
    layer = layer_cls(**_layers_under_policy(init_kwargs, policy))
    outputs = _as_tuple(layer(**input_data, **call_kwargs))
    compute = keras.DTypePolicy(policy).compute_dtype
    for o in outputs:
        a = _np(keras.ops.cast(o, "float32"))
        assert np.all(np.isfinite(a)), f"non-finite output under {policy}"
    first = outputs[0]
    if keras.backend.is_float_dtype(first.dtype):
        assert keras.backend.standardize_dtype(first.dtype) == compute
    for w in layer.weights:
        if keras.backend.is_float_dtype(w.dtype):
            assert keras.backend.standardize_dtype(w.dtype) == "float32", w.path
    if check_output_spec:
        check_output_spec_dtypes(layer, input_data, call_kwargs, outputs)
    if check_sublayers:
        check_sublayer_policies(layer)


def _cut(input_data, length):
    """`input_data` with every sequence axis (the dynamic axes of
    `_input_spec_shape`) cut to its first `length` steps."""
    out = {}
    for k, v in input_data.items():
        index = [slice(None)] + [
            slice(0, length) if d is None else slice(None)
            for d in _input_spec_shape(v)
        ]
        out[k] = v[tuple(index)]
    return out


def check_extreme_lengths(layer_cls, init_kwargs, input_data, call_kwargs):
    """The documented return shapes hold for sequences of length 1 and 0.

    Every sequence axis of the inputs is cut to 1, then to 0 steps; a
    fresh layer is called eagerly and each output must have the shape
    `compute_output_spec` announces for those inputs and be finite. At
    length 0 a layer that cannot take empty sequences must raise a clear
    `ValueError` (the package's `... Received: ...` message), never crash
    with another exception. Inputs without a sequence axis: nothing to
    check.
    """
    for length in (1, 0):
        data = _cut(input_data, length)
        if all(data[k].shape == v.shape for k, v in input_data.items()):
            return
        shapes = {k: v.shape for k, v in data.items()}
        layer = layer_cls(**init_kwargs)
        try:
            outputs = keras.tree.flatten(layer(**data, **call_kwargs))
        except ValueError as error:
            assert length == 0 and "Received" in str(error), (
                f"{layer_cls.__name__} on inputs of length {length} "
                f"{shapes}: {type(error).__name__}: {error}"
            )
            continue
        except Exception as error:
            raise AssertionError(
                f"{layer_cls.__name__} on inputs of length {length} "
                f"{shapes} crashed (a ValueError naming the argument was "
                f"due, if anything): {type(error).__name__}: {error}"
            ) from error
        specs = keras.tree.flatten(
            layer.compute_output_spec(**_symbolic(data), **call_kwargs)
        )
        assert len(specs) == len(outputs), (len(specs), len(outputs))
        for i, (o, spec) in enumerate(zip(outputs, specs)):
            assert tuple(o.shape) == tuple(spec.shape), (
                f"{layer_cls.__name__} on inputs of length {length} "
                f"{shapes}: output {i} has shape {tuple(o.shape)}, "
                f"compute_output_spec says {tuple(spec.shape)}"
            )
            values = _np(keras.ops.cast(o, "float32"))
            assert np.all(np.isfinite(values)), (
                f"{layer_cls.__name__} on inputs of length {length} "
                f"{shapes}: output {i} is not finite"
            )


# The checks `run_layer_test(skip_checks={name: reason})` may skip, each
# only with the reason it cannot apply to the layer.
SKIPPABLE_CHECKS = (
    "dir",  # dir() equal after rebuilding from config
    "build_from_shapes",  # build(**shapes) alone creates all the state
    "output_spec_dtypes",  # mixed precision: outputs as compute_output_spec
    "sublayer_policies",  # mixed precision: sublayers in the layer's policy
    "extreme_lengths",  # return shapes at lengths 1 and 0
)


def _skipped(skip_checks):
    skip_checks = dict(skip_checks or {})
    for name, reason in skip_checks.items():
        assert name in SKIPPABLE_CHECKS, (name, SKIPPABLE_CHECKS)
        assert isinstance(reason, str) and reason.strip(), (
            f"skipping {name!r} needs a reason"
        )
    return skip_checks


def run_layer_test(
    layer_cls,
    init_kwargs,
    input_data,
    call_kwargs=None,
    expected_output_shape=None,
    expected_num_trainable_weights=None,
    expected_num_non_trainable_weights=None,
    run_saved_model=True,
    vary_sequence_length=True,
    run_fit=True,
    run_mixed_precision=True,
    atol=ATOL,
    expected_num_non_trainable_variables=None,
    expected_num_seed_generators=None,
    skip_checks=None,
):
    """Runs the checks every layer of the package must pass.

    1. `get_config` -> `from_config` gives the identical JSON config, and
       `serialize_keras_object` round-trips; the revived layers have the
       same `dir()` as the original.
    2. State counts after the first call (trainable and non-trainable
       weights, non-trainable variables, seed generators) equal the
       `expected_num_*` given; a symbolic call and `build(**shapes)` alone
       create the same state; after `build` from shapes and the first
       call's weights, a call reproduces its outputs. Symbolic output
       shapes/dtypes equal eager. The outputs have the shapes
       `compute_output_spec` announces also on sequences of length 1 and
       0 (or, at 0, a clear `ValueError`): `check_extreme_lengths`.
    3. `.keras` save -> `load_model` -> identical outputs.
    4. TensorFlow SavedModel in a fresh process (no keras_attention, no
       Keras import), also with another batch size and a shorter sequence
       (TF backend).
    5. `fit` on a `tf.data.Dataset`, with and without `jit_compile`
       (without only on PyTorch, with only on JAX: see `BACKEND_GAPS`).
    6. `mixed_float16` and `mixed_bfloat16`: finite outputs, compute-dtype
       first output, every output in the dtype `compute_output_spec`
       announces, float32 variables, every sublayer in the layer's dtype
       policy.

    `skip_checks` maps a name of `SKIPPABLE_CHECKS` to the reason it cannot
    apply to this layer.

    Returns the eager outputs (a tuple) for further checks.
    """
    call_kwargs = dict(call_kwargs or {})
    input_data = {k: np.asarray(v) for k, v in input_data.items()}
    skipped = _skipped(skip_checks)

    layer = layer_cls(**init_kwargs)
    check_config(layer, check_dir="dir" not in skipped)
    eager = tuple(_np(o) for o in _as_tuple(layer(**input_data, **call_kwargs)))
    for o in eager:
        assert np.all(np.isfinite(o.astype("float32"))), "non-finite output"
    if expected_output_shape is not None:
        shapes = expected_output_shape
        if not isinstance(shapes[0], (tuple, list)):
            shapes = (shapes,)
        assert tuple(tuple(o.shape) for o in eager) == tuple(map(tuple, shapes))
    expected_counts = dict(
        trainable_weights=expected_num_trainable_weights,
        non_trainable_weights=expected_num_non_trainable_weights,
        non_trainable_variables=expected_num_non_trainable_variables,
        seed_generators=expected_num_seed_generators,
    )
    check_state_counts(layer, expected_counts, "by an eager call")
    check_config(layer, check_dir=False)  # config is stable after build
    check_symbolic_shapes(
        layer_cls,
        init_kwargs,
        input_data,
        call_kwargs,
        eager,
        counts=state_counts(layer),
    )
    if "build_from_shapes" not in skipped:
        check_build_from_shapes(
            layer_cls, init_kwargs, input_data, call_kwargs, layer, eager, atol
        )
    if "extreme_lengths" not in skipped:
        check_extreme_lengths(layer_cls, init_kwargs, input_data, call_kwargs)

    model = _make_model(layer_cls(**init_kwargs), input_data, call_kwargs)
    expected = _predict(model, input_data)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.keras")
        model.save(path)
        reloaded = keras.saving.load_model(path)
        _assert_all_close(
            _predict(reloaded, input_data), expected, atol, ".keras"
        )

    if run_saved_model and "saved_model" not in GAPS:
        variants = [input_data, _variant(input_data, batch_factor=2)]
        if vary_sequence_length:
            variants.append(_variant(input_data, trim=1))
        check_saved_model(model, variants, atol)

    if run_fit:
        jits = [
            jit
            for jit, gap in ((False, "fit_eager"), (True, "fit_jit_compile"))
            if gap not in GAPS
        ]
        for jit in jits:
            check_fit(layer_cls, init_kwargs, input_data, call_kwargs, jit)

    if run_mixed_precision:
        for policy in ("mixed_float16", "mixed_bfloat16"):
            check_mixed_precision(
                layer_cls,
                init_kwargs,
                input_data,
                call_kwargs,
                policy,
                check_output_spec="output_spec_dtypes" not in skipped,
                check_sublayers="sublayer_policies" not in skipped,
            )
    return eager


def run_mask_test(
    layer_cls,
    init_kwargs,
    tensor_args,
    mask_args,
    call_kwargs=None,
    causal=False,
    batch=2,
    steps=6,
    features=8,
    atol=ATOL,
):
    """Checks a layer's handling of padding (and causal) masks.

    - Feeding `Embedding(mask_zero=True)` output (a Keras mask) equals
      feeding the embedded tensor with explicit `mask_args`.
    - Changing values at padded positions changes no output at unpadded
      positions.
    - The Keras mask of the first tensor argument is propagated to the
      output (when the output keeps the time axis), and the input keeps its
      mask (it is not deleted by the layer).
    - For causal layers, changing future steps changes no earlier output.

    `tensor_args` names the call arguments that receive the sequence
    (e.g. `("query", "value")`), `mask_args` the matching explicit mask
    arguments (e.g. `("query_mask", "value_mask")`).
    """
    call_kwargs = dict(call_kwargs or {})
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 20, size=(batch, steps)).astype("int32")
    ids[0, steps - 2 :] = 0  # example 0 is padded at the end
    valid = ids != 0

    layer = layer_cls(**init_kwargs)
    embedding = keras.layers.Embedding(20, features, mask_zero=True)
    token_input = keras.Input((None,), dtype="int32")
    embedded = embedding(token_input)
    out = _as_tuple(layer(**{a: embedded for a in tensor_args}, **call_kwargs))[
        0
    ]
    if len(out.shape) == 3:
        assert getattr(out, "_keras_mask", None) is not None, (
            "mask not propagated"
        )
    assert getattr(embedded, "_keras_mask", None) is not None, (
        "input mask deleted"
    )
    model = keras.Model(token_input, out)
    with_keras_mask = _np(model(ids))

    x = _np(embedding(ids))
    explicit = dict(
        {a: x for a in tensor_args}, **{m: valid for m in mask_args}
    )
    with_explicit = _np(_as_tuple(layer(**explicit, **call_kwargs))[0])

    def valid_part(y):
        return y[valid] if y.ndim >= 3 and y.shape[1] == steps else y

    np.testing.assert_allclose(
        valid_part(with_keras_mask), valid_part(with_explicit), atol=atol
    )
    assert np.all(np.isfinite(with_explicit)), "non-finite output at padding"

    noisy = x.copy()
    noisy[~valid] = rng.normal(size=noisy[~valid].shape) * 10
    perturbed = dict(
        {a: noisy for a in tensor_args}, **{m: valid for m in mask_args}
    )
    with_noise = _np(_as_tuple(layer(**perturbed, **call_kwargs))[0])
    np.testing.assert_allclose(
        valid_part(with_noise), valid_part(with_explicit), atol=atol
    )

    if causal:
        cut = steps // 2
        future = x.copy()
        future[:, cut:] = rng.normal(size=future[:, cut:].shape)
        a = _np(
            _as_tuple(layer(**{t: x for t in tensor_args}, **call_kwargs))[0]
        )
        b = _np(
            _as_tuple(layer(**{t: future for t in tensor_args}, **call_kwargs))[
                0
            ]
        )
        np.testing.assert_allclose(a[:, :cut], b[:, :cut], atol=atol)
        assert not np.allclose(a[:, cut:], b[:, cut:]), (
            "future change had no effect"
        )
