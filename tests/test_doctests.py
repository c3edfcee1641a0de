"""Every `>>>` example in the package runs, as a user would paste it.

One test per module of `keras_attention` (found with `pkgutil`), each
running that module's docstring examples with `doctest` in EMPTY globals:
nothing (`np`, `keras`, `keras_attention`, the module's own names) is
injected, so an example must import what it uses and name things in full
(`keras_attention.layers.SelfAttention`). A failure shows doctest's report.
"""

import doctest
import importlib
import inspect
import io
import os
import pkgutil

import pytest

import keras_attention

OPTIONFLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE

# Modules whose examples need TensorFlow itself (not only Keras): none yet.
TF_ONLY_MODULES = frozenset()


def _module_names():
    names = [keras_attention.__name__]
    for info in pkgutil.walk_packages(
        keras_attention.__path__, prefix=keras_attention.__name__ + "."
    ):
        names.append(info.name)
    return sorted(names)


MODULE_NAMES = _module_names()


def _doctests(module_name):
    """The module's doctests, with empty globals (nothing injected)."""
    module = importlib.import_module(module_name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    # globs={} (not None): doctest would otherwise run every example in the
    # module's namespace, where unimported names happen to resolve.
    tests = finder.find(module, module_name, globs={})
    return sorted((t for t in tests if t.examples), key=lambda t: t.name)


# On JAX, the interop modules' examples (each converts a keras-hub model,
# ~5-20 s of JAX compiling on the 2-core machine) run with SLOW=1 only:
# the JAX part's tests/interop converts every family, and TensorFlow and
# PyTorch run these examples in the fast tier.
JAX_SLOW_PREFIXES = ("keras_attention.interop.",)


def _params():
    params = []
    jax = os.environ.get("KERAS_BACKEND") == "jax"
    slow = pytest.mark.slow(
        "on JAX: tests/interop converts every family; the interop "
        "examples run on TensorFlow and PyTorch"
    )
    for name in MODULE_NAMES:
        marks = [pytest.mark.tf_only] if name in TF_ONLY_MODULES else []
        if jax and name.startswith(JAX_SLOW_PREFIXES):
            marks.append(slow)
        params.append(pytest.param(name, marks=marks, id=name))
    return params


@pytest.mark.parametrize("module_name", _params())
def test_docstring_examples_run(module_name):
    tests = _doctests(module_name)
    if not tests:
        # Counted, not skipped: `test_public_api_has_examples` requires
        # examples where the package promises them.
        return
    report = io.StringIO()
    runner = doctest.DocTestRunner(optionflags=OPTIONFLAGS, verbose=False)
    failed = attempted = 0
    for test in tests:
        result = runner.run(test, out=report.write, clear_globs=True)
        failed += result.failed
        attempted += result.attempted
    if failed:
        pytest.fail(
            f"{failed} of {attempted} docstring examples of "
            f"{module_name} failed:\n{report.getvalue()}",
            pytrace=False,
        )
    assert attempted > 0


def _public_objects():
    """The public layers, generators and plot function, by full name."""
    from keras_attention import generation
    from keras_attention import layers
    from keras_attention.visualization import plot_attention

    objects = {}
    for package, prefix in (
        (layers, "keras_attention.layers"),
        (generation, "keras_attention.generation"),
    ):
        for name, obj in vars(package).items():
            if inspect.isclass(obj) and not name.startswith("_"):
                objects[f"{prefix}.{name}"] = obj
    objects["keras_attention.visualization.plot_attention"] = plot_attention
    return objects


def test_public_api_has_examples():
    """Every public layer/generator documents a runnable example, and the
    runner above sees it (so examples cannot drop out of the suite)."""
    without = []
    for full_name, obj in sorted(_public_objects().items()):
        tests = doctest.DocTestFinder().find(obj, full_name, globs={})
        if not any(t.examples for t in tests if t.name == full_name):
            without.append(full_name)
    assert not without, f"public objects without a `>>>` example: {without}"
    found = {t.name for m in MODULE_NAMES for t in _doctests(m)}
    for full_name, obj in _public_objects().items():
        own = f"{obj.__module__}.{obj.__qualname__}"
        assert own in found, f"the doctest runner misses {full_name} ({own})"


def test_runner_injects_nothing():
    """An example that uses `np` without importing it fails in the runner."""
    test = doctest.DocTestParser().get_doctest(
        ">>> np.zeros(2).shape\n(2,)\n", {}, "probe", None, 0
    )
    runner = doctest.DocTestRunner(optionflags=OPTIONFLAGS)
    assert runner.run(test, out=lambda _: None).failed == 1
