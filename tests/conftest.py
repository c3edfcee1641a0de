import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import xla_flags  # noqa: E402

# Silence TensorFlow before anything imports it; XLA's flags (one place:
# tests/xla_flags.py) before JAX or TensorFlow starts.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault(
    "XLA_FLAGS", xla_flags.xla_flags(os.environ["KERAS_BACKEND"])
)

import harness  # noqa: E402
import keras  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck  # noqa: E402
from hypothesis import settings  # noqa: E402

# Property-based tests (Hypothesis). "ci" (the default) keeps each property
# small enough that the property suite stays within ~3 minutes per backend
# on the 2-core CI machine; "thorough" is for developers' long runs:
#     python -m pytest tests/properties --hypothesis-profile=thorough
# Both derandomized in CI (`derandomize=True`: the same examples every run,
# so a failure is reproducible from the log); "thorough" draws fresh ones.
_SLOW_CHECKS = [HealthCheck.too_slow, HealthCheck.data_too_large]
# On JAX each drawn example compiles anew (JAX compiles per shape), so the
# JAX part draws fewer per property (and the files' own divisors apply on
# top: `settings.default.max_examples // 2`): the properties' breadth is
# the TensorFlow and PyTorch parts'; the JAX part checks that each
# property holds on JAX's own ops too. Measured (2026-12-04, loaded
# machine): tests/properties took 566 of the JAX part's 2,200 test-seconds.
# 2026-12-04: 15 (TensorFlow, PyTorch) and 6 (JAX) for the whole CI to stay
# within its 25 minutes (a clean-clone run took 31 min with 25 and 8).
# 2026-12-06: 10 on TensorFlow and PyTorch (the TF part took 966 s with 15,
# the whole CI about 28 min); `HYPOTHESIS_PROFILE=thorough` runs 500.
_CI_EXAMPLES = 6 if os.environ["KERAS_BACKEND"] == "jax" else 10
settings.register_profile(
    "ci",
    max_examples=_CI_EXAMPLES,
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=_SLOW_CHECKS,
)
settings.register_profile(
    "thorough",
    max_examples=500,
    deadline=None,
    print_blob=True,
    suppress_health_check=_SLOW_CHECKS,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

BACKEND = keras.backend.backend()

# One PyTorch intra-op thread per pytest worker. The suite runs two workers
# on two cores and PyTorch starts as many OpenMP threads as cores in each,
# so a tiny op it parallelizes (softmax, scaled_dot_product_attention)
# waits for a thread the other worker holds: on the loaded 2-core machine a
# softmax of a (2, 2, 5, 6) tensor took ~44 ms with 2 threads and ~10 us
# with 1, and tests/generation/test_encoder_decoder.py's training fixture
# ~220 CPU s instead of ~13. The suite's tensors are far too small to gain
# from threads (the examples' subprocesses set OMP_NUM_THREADS=1 alike).
if BACKEND == "torch":
    import torch

    torch.set_num_threads(1)


# The slow tier: tests marked `slow(reason)` run only with `SLOW=1` (`SLOW=1
# bash tests/run.sh`, the developers' long run); CI skips them, naming the
# reason (`pytest -rs`). Each covers what the fast tier covers elsewhere at
# a higher cost (its reason says where).
SLOW = os.environ.get("SLOW", "0") == "1"


def _reason(item, name):
    """The reason given to marker `name` (positional or `reason=`)."""
    marker = item.get_closest_marker(name)
    reason = marker.kwargs.get("reason") or (marker.args or ("",))[0]
    return str(reason or "").strip()


# Sampled files: on the backend named, the first case of each parametrized
# test of these files (for each attention path, where a test has a `path`
# parameter) runs in the fast tier and its other cases in the slow
# tier; every case runs on the other backends of the fast tier (PyTorch
# runs them all) and everywhere with SLOW=1. The list is the CI budget's
# (the whole `.ci/run` within 25 minutes on 2 cores), chosen by measured
# cost (2026-12-04, `--durations=0` on each part): on JAX each case
# compiles anew (a layer's harness case, a score object on each path),
# and these files cost the most there while their cases vary
# backend-neutral options (score objects, layer arguments, dtypes); the
# attention paths (tests/ops/test_attention_paths.py) and the mask
# matrix keep every case on JAX. On TensorFlow the generation files'
# cases each trace a decoding loop (XLA and not); PyTorch runs them all
# (cheap: eager), and each sampled test keeps one case on TensorFlow.
SAMPLED = {
    "jax": (
        "tests/blocks/test_block_composition.py",
        "tests/layers/test_array_like_arguments.py",
        "tests/layers/test_cache_batch.py",
        "tests/layers/test_graph_attention.py",
        "tests/layers/test_layer_arguments.py",
        "tests/layers/test_mha_keras_contract.py",
        "tests/layers/test_multi_head_latent_attention.py",
        "tests/layers/test_self_attention.py",
        "tests/layers/test_token_mixer.py",
        "tests/ops/test_inf_scores_float64.py",
        "tests/ops/test_local.py",
        "tests/ops/test_log_sum_exp.py",
        "tests/ops/test_programmable.py",
        "tests/ops/test_score_objects.py",
    ),
    "tensorflow": (
        "tests/generation/test_decoder_only.py",
        "tests/generation/test_encoder_decoder.py",
        "tests/generation/test_mixed_cache.py",
        "tests/generation/test_prefill.py",
        "tests/generation/test_rolling_cache.py",
    ),
}


def _sample(items):
    """Marks `slow` every case but the first of each parametrized test of
    this backend's `SAMPLED` files (the first for each value of a `path`
    parameter: every attention path keeps a case)."""
    files = SAMPLED.get(BACKEND, ())
    others = "TensorFlow and PyTorch" if BACKEND == "jax" else "PyTorch"
    reason = (
        f"sampled on {BACKEND} (tests/conftest.py SAMPLED): this test's "
        f"first case runs here, every case on {others}"
    )
    seen = set()
    for item in items:
        if BACKEND == "jax" and item.get_closest_marker("slow_on_jax"):
            because = _reason(item, "slow_on_jax")
            if not because:
                raise pytest.UsageError(f"{item.nodeid}: slow_on_jax(reason)")
            item.add_marker(
                pytest.mark.slow(
                    f"on JAX (TensorFlow and PyTorch run it): {because}"
                )
            )
        path = item.nodeid.split("::")[0]
        if (
            path not in files
            or not hasattr(item, "callspec")
            or item.get_closest_marker("slow") is not None
        ):
            continue
        # One case per attention path: the paths are backend code.
        test = (path, item.originalname, str(item.callspec.params.get("path")))
        if test in seen:
            item.add_marker(pytest.mark.slow(reason))
        seen.add(test)


# The files that cost the most (seconds of one worker, TensorFlow part,
# `--durations` of a clean-clone CI, 2026-12-06: the examples' runs, the
# subprocesses, traced generation loops), costliest first (about). tests/run.sh
# hands whole files to its two pytest-xdist workers in collection order
# (`--no-loadscope-reorder`): these files first, then the others by their
# number of tests that run, most first. xdist's own order (every file by its
# number of tests, skipped ones included) put the one-test files last, among
# them the GPU benchmark's dry run (47 s) and the examples' single runs, so
# one worker ran them while the other idled. A file missing from the list
# only runs later; the order changes no test.
COSTLY_FILES = (
    "tests/examples/test_language_model.py",
    "tests/examples/test_pretrain.py",
    "tests/benchmarks_smoke/test_gpu_benchmark.py",
    "tests/examples/test_translate.py",
    "tests/distribution/test_layout_map.py",
    "tests/generation/test_recurrent_cache.py",
    "tests/examples/test_compare_attention.py",
    "tests/generation/test_decoder_only.py",
    "tests/examples/test_caption_example.py",
    "tests/distribution/test_ring_attention.py",
    "tests/examples/test_multiworker.py",
    "tests/examples/test_language_model_mixers.py",
    "tests/examples/test_classify.py",
    "tests/examples/test_graph_example.py",
    "tests/layers/test_attention_rnn_decoder.py",
    "tests/memory/test_additive_memory.py",
    "tests/generation/test_encoder_decoder.py",
    "tests/examples/test_inspect_pretrained.py",
)


def _costly_files_first(items):
    """Reorders `items` file by file (each file's tests keep their order):
    `COSTLY_FILES` first, then the others by their number of tests not
    skipped by a marker, most first."""
    runs = {}
    for item in items:
        path = item.nodeid.split("::")[0]
        skipped = item.get_closest_marker("skip") is not None
        runs[path] = runs.get(path, 0) + (not skipped)
    rank = {path: i for i, path in enumerate(COSTLY_FILES)}
    items.sort(
        key=lambda item: (
            rank.get(item.nodeid.split("::")[0], len(rank)),
            -runs[item.nodeid.split("::")[0]],
        )
    )


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """`tf_only` / `tf_only(reason)` tests run on TensorFlow only;
    `not_torch(reason)` tests are skipped on PyTorch. The reason shows in
    `pytest -rs`. `SAMPLED` files' other cases join the slow tier. Then
    `COSTLY_FILES` first (`_costly_files_first`)."""
    _sample(items)
    for item in items:
        # Markers, not `item.keywords`: keywords hold the names of the
        # test's parents too (a clone in a folder named `slow` would put
        # every test in the slow tier).
        if item.get_closest_marker("slow") is not None and not SLOW:
            reason = _reason(item, "slow")
            if not reason:
                raise pytest.UsageError(f"{item.nodeid}: slow(reason)")
            item.add_marker(
                pytest.mark.skip(reason=f"slow tier (SLOW=1 runs it): {reason}")
            )
            continue
        if BACKEND == "torch" and item.get_closest_marker("not_torch"):
            reason = _reason(item, "not_torch")
            if not reason:
                raise pytest.UsageError(f"{item.nodeid}: not_torch(reason)")
            item.add_marker(pytest.mark.skip(reason=f"PyTorch: {reason}"))
        elif BACKEND != "tensorflow" and item.get_closest_marker("tf_only"):
            reason = _reason(item, "tf_only")
            reason = f": {reason}" if reason else ""
            item.add_marker(
                pytest.mark.skip(reason=f"needs the TensorFlow backend{reason}")
            )
    _costly_files_first(items)


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "tf_only(reason=None): runs only on the TensorFlow backend",
    )
    config.addinivalue_line(
        "markers",
        "not_torch(reason): skipped on the PyTorch backend, with the reason",
    )
    config.addinivalue_line(
        "markers",
        "slow(reason): the slow tier, run only with SLOW=1 (see above)",
    )
    config.addinivalue_line(
        "markers",
        "slow_on_jax(reason): in the slow tier on JAX only (a test whose "
        "compilations dominate the JAX part; TensorFlow and PyTorch run it)",
    )


def pytest_terminal_summary(terminalreporter):
    """Names the `run_layer_test` checks this backend does not run."""
    if not harness.GAPS:
        return
    terminalreporter.section(f"harness checks not run on {BACKEND}")
    for check, reason in harness.GAPS.items():
        terminalreporter.write_line(f"{check}: {reason}")


@pytest.fixture(autouse=True)
def _reset_keras_state():
    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(0)
    yield
    keras.config.set_dtype_policy("float32")


@pytest.fixture(autouse=True)
def _pinned_relative_sdpa_crossover(monkeypatch):
    """The automatic choice between the relative_sdpa and flex paths
    (PyTorch, CPU) measures the kernels once per process unless the
    crossover is pinned (`relative_sdpa.min_density`): pinned here, so
    that no test's path depends on the machine or its load, and no test
    pays the measurement's compilation unasked; tests/ops/
    test_relative_sdpa.py tests the measurement."""
    from keras_attention.ops import relative_sdpa

    monkeypatch.setattr(relative_sdpa, "RELATIVE_SDPA_MIN_DENSITY", 0.25)
