"""The harness catches the defects it is meant to catch.

Each broken toy layer differs from the correct `Scale` in one defect;
`run_layer_test` must fail on it (with the check's message), and pass on
`Scale` itself. The slow checks (SavedModel, `fit`) are off: they are not
what these tests are about.
"""

import json

import harness
import keras
import numpy as np
import pytest
import serving
from harness import run_layer_test
from keras import ops

X = np.random.default_rng(0).normal(size=(2, 3, 4)).astype("float32")
FAST = dict(run_saved_model=False, run_fit=False)


def _register(cls):
    return keras.saving.register_keras_serializable("test_harness")(cls)


@_register
class Scale(keras.layers.Layer):
    """Dense projection, dropout, times `factor`: a correct layer."""

    def __init__(self, units, factor=2.0, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.factor = factor
        self.seed = seed
        self.dense = self._make_dense()
        self.dropout = keras.layers.Dropout(
            0.5, seed=seed, dtype=self.dtype_policy
        )

    def _make_dense(self):
        return keras.layers.Dense(self.units, dtype=self.dtype_policy)

    def build(self, inputs_shape):
        self.dense.build(inputs_shape)

    def call(self, inputs, training=None):
        y = self.dropout(self.dense(inputs), training=training)
        return y * ops.cast(self.factor, y.dtype)

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape[:-1]) + (self.units,)

    def get_config(self):
        config = super().get_config()
        config.update(units=self.units, factor=self.factor, seed=self.seed)
        return config


@_register
class GlobalPolicySublayer(Scale):
    """Defect: the Dense sublayer takes the global dtype policy."""

    def _make_dense(self):
        return keras.layers.Dense(self.units)


@_register
class ConfigWithoutFactor(Scale):
    """Defect: `get_config` forgets `factor` (it has a default, so
    `from_config` still works, but the revived layer computes otherwise)."""

    def get_config(self):
        config = super().get_config()
        del config["factor"]
        return config


@_register
class WrongOutputShape(Scale):
    """Defect: `compute_output_shape` keeps the input's feature size."""

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape)


@_register
class AttributeNotInConfig(Scale):
    """Defect: an `__init__` argument missing from `get_config` adds an
    attribute, so a layer rebuilt from its config has another `dir()`."""

    def __init__(self, units, trace=False, **kwargs):
        super().__init__(units, **kwargs)
        if trace:
            self.trace_log = []


@_register
class BuildsNothing(Scale):
    """Defect: `build` creates no weights; the first call does."""

    def build(self, inputs_shape):
        pass


@_register
class Float32Scores(Scale):
    """Defect: a second output in float32 under mixed precision, where
    `compute_output_spec` announces the compute dtype."""

    def call(self, inputs, training=None):
        y = super().call(inputs, training=training)
        return y, ops.cast(ops.sum(y, axis=-1), "float32")

    def compute_output_shape(self, inputs_shape):
        return (super().compute_output_shape(inputs_shape), inputs_shape[:-1])


@_register
class FirstStepBias(Scale):
    """Defect: reads the first step of every sequence (adds it as a bias),
    which an empty sequence does not have: an indexing crash, not a
    `ValueError` naming the argument."""

    def call(self, inputs, training=None):
        y = super().call(inputs, training=training)
        return y + y[:, :1] * 0 + ops.expand_dims(y[:, 0], 1) * 0


@_register
class SqueezesOneStep(Scale):
    """Defect: a one-step sequence loses its time axis (`ops.squeeze`),
    where `compute_output_shape` keeps it."""

    def call(self, inputs, training=None):
        y = super().call(inputs, training=training)
        return ops.squeeze(y, 1) if y.shape[1] == 1 else y


@_register
class RefusesEmpty(Scale):
    """Correct: an empty sequence is refused with a clear `ValueError`."""

    def call(self, inputs, training=None):
        if inputs.shape[1] == 0:
            raise ValueError(
                "`inputs` must have at least one step. Received: "
                f"inputs.shape={tuple(inputs.shape)!r}"
            )
        return super().call(inputs, training=training)


@_register
class Wrapper(keras.layers.Layer):
    """Calls the layer it is given (as a decoder calls its `attention`)."""

    def __init__(self, inner, **kwargs):
        super().__init__(**kwargs)
        if isinstance(inner, dict):
            inner = keras.saving.deserialize_keras_object(inner)
        self.inner = inner

    def call(self, inputs):
        return self.inner(inputs)

    def get_config(self):
        config = super().get_config()
        config.update(inner=keras.saving.serialize_keras_object(self.inner))
        return config


def _run(cls, init_kwargs=None, **kwargs):
    return run_layer_test(
        cls,
        dict(units=5, seed=1, **(init_kwargs or {})),
        dict(inputs=X),
        **{**FAST, **kwargs},
    )


def test_correct_layer_passes_with_all_counts():
    (out,) = _run(
        Scale,
        expected_output_shape=(2, 3, 5),
        expected_num_trainable_weights=2,
        expected_num_non_trainable_weights=0,
        expected_num_non_trainable_variables=1,  # the seed generator state
        expected_num_seed_generators=1,
    )
    assert out.shape == (2, 3, 5)


def test_sublayer_in_the_global_policy_fails():
    with pytest.raises(AssertionError, match="\\(Dense\\): 'float32'"):
        _run(GlobalPolicySublayer)


def test_sublayer_policy_check_can_be_skipped_with_a_reason():
    _run(
        GlobalPolicySublayer,
        skip_checks={"sublayer_policies": "toy: the check is under test"},
    )
    with pytest.raises(AssertionError, match="needs a reason"):
        _run(GlobalPolicySublayer, skip_checks={"sublayer_policies": ""})
    with pytest.raises(AssertionError, match="no_such_check"):
        _run(Scale, skip_checks={"no_such_check": "typo"})


def test_config_missing_an_argument_fails():
    with pytest.raises(AssertionError, match=".keras"):
        _run(ConfigWithoutFactor, dict(factor=3.0), run_mixed_precision=False)


def test_wrong_compute_output_shape_fails():
    with pytest.raises(
        AssertionError, match="output 0 has shape \\(2, 3, 4\\)"
    ):
        _run(WrongOutputShape, run_mixed_precision=False)


def test_dir_differs_after_from_config_fails():
    with pytest.raises(AssertionError, match="dir\\(\\) differs.*trace_log"):
        _run(AttributeNotInConfig, dict(trace=True), run_mixed_precision=False)


def test_build_from_shapes_missing_weights_fails():
    with pytest.raises(
        AssertionError, match="symbolic call|build\\(\\) from shapes"
    ):
        _run(BuildsNothing, run_mixed_precision=False)


def test_wrong_state_counts_fail():
    with pytest.raises(AssertionError, match="1 seed_generators, expected 2"):
        _run(Scale, expected_num_seed_generators=2, run_mixed_precision=False)
    with pytest.raises(AssertionError, match="non_trainable_weights"):
        _run(
            Scale,
            expected_num_non_trainable_weights=1,
            run_mixed_precision=False,
        )


def test_crash_on_an_empty_sequence_fails():
    with pytest.raises(AssertionError, match="length 0 .* crashed"):
        _run(FirstStepBias, run_mixed_precision=False)


def test_wrong_shape_on_a_one_step_sequence_fails():
    with pytest.raises(
        AssertionError,
        match=r"length 1 .*output 0 has shape \(2, 5\), "
        r"compute_output_spec says \(2, 1, 5\)",
    ):
        _run(SqueezesOneStep, run_mixed_precision=False)


def test_clear_value_error_on_an_empty_sequence_passes():
    _run(RefusesEmpty, run_mixed_precision=False)
    with pytest.raises(AssertionError, match="length 0"):
        harness.check_extreme_lengths(
            FirstStepBias, dict(units=5), dict(inputs=X), {}
        )
    # Inputs without a sequence axis: nothing to check.
    harness.check_extreme_lengths(
        FirstStepBias, dict(units=5), dict(inputs=X[:, 0]), {}
    )


def test_output_dtype_unlike_compute_output_spec_fails():
    with pytest.raises(AssertionError, match="output 1 .*compute_output_spec"):
        _run(Float32Scores)


def test_build_shapes_align_like_keras_call():
    class TwoInputs(keras.layers.Layer):
        def build(self, query_shape, value_shape=None):
            pass

        def call(self, query, value=None, query_mask=None):
            return query

    one = harness.build_shapes(Scale(2), dict(inputs=X, mask=X[..., 0]))
    assert one == dict(inputs_shape=(2, 3, 4))
    two = harness.build_shapes(
        TwoInputs(), dict(query=X, value=X[:, :2], query_mask=X[..., 0])
    )
    assert two == dict(query_shape=(2, 3, 4), value_shape=(2, 2, 4))


_IMPORTS_CODE = """
import importlib

found = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
        found[name] = True
    except ImportError:
        found[name] = False
answer(found)
"""


def test_fresh_process_cannot_import_blocked_modules():
    assert serving.answer_in_fresh_process(
        _IMPORTS_CODE,
        args=["keras_attention", "examples", "json"],
        blocked_modules=serving.BLOCKED_MODULES,
    ) == {"keras_attention": False, "examples": False, "json": True}


def test_fresh_process_failure_shows_stderr():
    with pytest.raises(AssertionError, match="(?s)exited with 1.*boom"):
        serving.run_in_fresh_process("raise SystemExit('boom')")


def _shared_answer(code, args=(), blocked=("keras_attention", "examples")):
    output = serving.run_in_shared_process(
        code, args=args, blocked_modules=blocked
    )
    lines = [
        line[len(serving.ANSWER_PREFIX) :]
        for line in output.splitlines()
        if line.startswith(serving.ANSWER_PREFIX)
    ]
    return json.loads(lines[-1])


def test_shared_process_is_isolated_like_a_fresh_one(tmp_path):
    found = _shared_answer(
        _IMPORTS_CODE, args=["keras_attention", "examples", "json"]
    )
    assert found == {"keras_attention": False, "examples": False, "json": True}
    where = _shared_answer(
        "import os\nanswer([os.getcwd(), os.environ['PYTHONPATH']])",
        args=(),
    )
    assert where == ["/", ""]
    output = serving.run_in_shared_process(
        "import os\nprint(os.getcwd())",
        cwd=tmp_path,
        blocked_modules=("keras_attention", "examples"),
    )
    assert output.strip() == str(tmp_path)


def test_shared_process_is_kept_and_each_call_has_a_fresh_namespace():
    first = _shared_answer("import os\nleft = 1\nanswer(os.getpid())")
    second = _shared_answer(
        "import os\nanswer([os.getpid(), 'left' in globals()])"
    )
    assert second == [first, False]
    # Other blocked modules: another process.
    other = _shared_answer("import os\nanswer(os.getpid())", blocked=("x",))
    assert other != first


def test_shared_process_failure_shows_the_traceback():
    with pytest.raises(AssertionError, match="(?s)served code failed.*boom"):
        serving.run_in_shared_process("raise ValueError('boom')")
    # The process survives a failing call.
    assert _shared_answer("answer(2)") == 2


def test_layer_arguments_are_rebuilt_under_the_mixed_policy():
    # The test builds `inner` in float32; under mixed precision the harness
    # gives it the policy too, and still checks the whole sublayer tree.
    run_layer_test(
        Wrapper, dict(inner=Scale(5, seed=1)), dict(inputs=X), **FAST
    )
    with pytest.raises(AssertionError, match="\\(Dense\\): 'float32'"):
        run_layer_test(
            Wrapper,
            dict(inner=GlobalPolicySublayer(5, seed=1)),
            dict(inputs=X),
            **FAST,
        )
