"""The shared example infrastructure: resumable fit, mirrored strategy,
the shipped datasets' common code, and the examples' place (programs in
the repository, not an installed package)."""

import argparse
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

pytestmark = pytest.mark.tf_only

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def _args(tmp_path, *extra):
    from examples.common import add_training_args

    parser = add_training_args(argparse.ArgumentParser(), epochs=3)
    return parser.parse_args(
        [
            "--output-dir",
            str(tmp_path),
            "--backup-every",
            "2",
            "--patience",
            "10",
            *extra,
        ]
    )


def _data():
    """A fresh (seeded) pipeline, as a restarted process would build it."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(48, 4)).astype("float32")
    y = x @ rng.normal(size=(4, 1)).astype("float32")
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    train = ds.take(40).shuffle(40, seed=1).batch(8)  # 5 steps per epoch
    val = ds.skip(40).batch(8)
    return train, val


def _model():
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.Adam(0.05), "mse")
    return model


class _Recorder:
    """Records (global step, first input value) of every trained batch."""

    def __init__(self):
        import keras

        seen = self.seen = []

        class Cb(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                seen.append(int(self.model.optimizer.iterations.numpy()))

        self.callback = Cb()


class _Interrupt(Exception):
    pass


def _interrupt_at(step):
    import keras

    class Cb(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if int(self.model.optimizer.iterations.numpy()) == step:
                raise _Interrupt()

    return Cb()


def test_killed_run_resumes_mid_epoch_with_identical_result(tmp_path):
    from examples.common import fit
    from examples.common.training import read_backup

    reference = _model()
    fit(reference, *_data(), _args(tmp_path / "ref"), verbose=0)

    args = _args(tmp_path / "run")
    model = _model()
    train, val = _data()
    with pytest.raises(_Interrupt):
        # Killed at global step 8 (epoch 2, batch 3); last backup at step 8
        # (every 2 steps) is written before the interruption callback runs.
        fit(model, train, val, args, callbacks=[_interrupt_at(9)], verbose=0)
    backup = read_backup(str(tmp_path / "run"))
    assert backup["step"] == 8 and backup["epoch"] == 1

    resumed = _model()  # a fresh process would start from new weights
    train, val = _data()
    recorder = _Recorder()
    history = fit(
        resumed, train, val, args, callbacks=[recorder.callback], verbose=0
    )
    # Continues after the backed-up step, stops at epochs * steps.
    assert recorder.seen[0] == 9 and recorder.seen[-1] == 15
    assert history.epoch == [1, 2]
    assert read_backup(str(tmp_path / "run")) is None  # cleaned up
    # Same updates on the same batches as the uninterrupted run. The best
    # checkpoint is restored at the end: compare the final states instead.
    for a, b in zip(reference.optimizer.variables, resumed.optimizer.variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)
    for name in ("checkpoints/best.weights.h5", "logs"):
        assert os.path.exists(tmp_path / "run" / name)


def test_backup_dir_flag_moves_the_backup(tmp_path):
    from examples.common import fit
    from examples.common.training import read_backup

    args = _args(tmp_path / "run", "--backup-dir", str(tmp_path / "bk"))
    model = _model()
    train, val = _data()
    with pytest.raises(_Interrupt):
        fit(model, train, val, args, callbacks=[_interrupt_at(5)], verbose=0)
    assert read_backup(str(tmp_path / "run")) is None
    backup = read_backup(str(tmp_path / "run"), str(tmp_path / "bk"))
    assert backup["step"] == 4


def test_one_process_is_its_own_chief():
    import tensorflow as tf

    from examples.common import distributed

    strategy = tf.distribute.get_strategy()
    assert distributed.is_chief(strategy) and distributed.is_chief(None)
    assert distributed.worker_output_dir("out", strategy) == "out"
    assert not distributed.uses_custom_loop(strategy)


def test_distributed_evaluate_is_model_evaluate_without_workers():
    from examples.common import distributed

    model = _model()
    _, val = _data()
    expected = model.evaluate(val, verbose=0, return_dict=True)
    assert distributed.evaluate(model, val) == expected


def test_fit_restores_best_weights_and_loss_falls(tmp_path):
    from examples.common import fit

    train, val = _data()
    model = _model()
    before = model.evaluate(val, verbose=0)
    history = fit(model, train, val, _args(tmp_path), verbose=0)
    best = min(history.history["val_loss"])
    assert best < before
    np.testing.assert_allclose(model.evaluate(val, verbose=0), best, rtol=1e-4)


def test_mirrored_strategy_on_two_logical_cpus(tmp_path):
    # Logical devices must be configured before TensorFlow initializes its
    # runtime: run in a fresh process.
    script = textwrap.dedent(
        f"""
        import argparse, sys
        sys.path.insert(0, {ROOT!r})
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from examples.common import add_training_args, setup_runtime, fit
        import test_common as t
        p = add_training_args(argparse.ArgumentParser(), epochs=2)
        args = p.parse_args(["--strategy", "mirrored", "--logical-cpus", "2",
                             "--output-dir", {str(tmp_path)!r}])
        strategy = setup_runtime(args)
        train, val = t._data()
        with strategy.scope():
            model = t._model()
        h = fit(model, train, val, args, verbose=0)
        print("REPLICAS", strategy.num_replicas_in_sync,
              type(strategy).__name__, h.history["loss"][0] >
              h.history["loss"][-1])
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert "REPLICAS 2 MirroredStrategy True" in out.stdout, out.stderr[-3000:]


def test_add_training_args_defaults_and_choices():
    from examples.common import add_training_args

    parser = add_training_args(
        argparse.ArgumentParser(), epochs=7, batch_size=16
    )
    args = parser.parse_args([])
    assert (args.epochs, args.batch_size, args.strategy) == (7, 16, "default")
    assert args.mixed_precision == "auto" and args.jit_compile is None
    assert parser.parse_args(["--no-jit-compile"]).jit_compile is False
    with pytest.raises(SystemExit):
        parser.parse_args(["--strategy", "tpu"])


@pytest.mark.parametrize(
    "value, unknown",
    [("a,c", "unknown: c"), (" , ", "unknown: none given")],
)
def test_parse_choices_names_the_flag_and_the_unknown_names(
    capsys, value, unknown
):
    from examples.common import parse_choices

    parser = argparse.ArgumentParser()
    assert parse_choices(parser, "--kinds", " a, b,", ("a", "b")) == ["a", "b"]
    with pytest.raises(SystemExit) as exit_info:
        parse_choices(parser, "--kinds", value, ("a", "b"))
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "--kinds takes comma-separated names among a, b" in error
    assert unknown in error and repr(value) in error


def test_mixed_precision_policy_on_cpu():
    from examples.common.training import mixed_precision_policy

    ns = argparse.Namespace
    assert mixed_precision_policy(ns(mixed_precision="off")) == "float32"
    assert mixed_precision_policy(ns(mixed_precision="auto")) == "float32"
    assert mixed_precision_policy(ns(mixed_precision="on")) == "mixed_bfloat16"


def test_examples_are_not_an_installed_package(monkeypatch):
    # A top-level `examples` package in site-packages would clash with any
    # other distribution's; the examples run from the repository root.
    from setuptools.config.setupcfg import read_configuration

    monkeypatch.chdir(ROOT)  # `packages = find:` searches the working dir
    options = read_configuration(os.path.join(ROOT, "setup.cfg"))["options"]
    packages = options["packages"]
    assert "keras_attention" in packages
    assert "keras_attention.layers" in packages
    assert [p for p in packages if not p.startswith("keras_attention")] == []
    assert "examples" not in options.get("package_data", {})


def test_split_of_key_is_a_stable_hash_split():
    import zlib

    from examples.common import datasets

    assert [datasets.split_of_index(i, 20) for i in (0, 1, 2, 19, 20, 41)] == [
        "test",
        "validation",
        "train",
        "train",
        "test",
        "validation",
    ]
    keys = [f"key {i}" for i in range(20000)]
    splits = np.array([datasets.split_of_key(k, 20) for k in keys])
    for split, share in [("train", 0.9), ("validation", 0.05), ("test", 0.05)]:
        assert abs(np.mean(splits == split) - share) < 0.01
    # The shipped datasets' splits, as they were written before: CRC-32 of
    # the UTF-8 key, bucket 0 tests and bucket 1 validates.
    for key in ("Ich möchte ein Bier.", "2026-11-29", "00005930"):
        bucket = zlib.crc32(key.encode("utf-8")) % 10
        expected = {0: "test", 1: "validation"}.get(bucket, "train")
        assert datasets.split_of_key(key, 10) == expected


def test_split_names_fall_back_to_a_holdout_of_train():
    from examples.common import datasets

    class Builder:
        def __init__(self, *splits):
            self.info = argparse.Namespace(splits=dict.fromkeys(splits))

    assert datasets.split_names(Builder("train", "validation", "test"), 5) == [
        "train",
        "validation",
        "test",
    ]
    assert datasets.split_names(Builder("train", "test"), 10) == [
        "train[:90%]",
        "train[90%:]",
        "test",
    ]
    assert datasets.split_names(Builder("train"), 5) == [
        "train[:95%]",
        "train[95%:]",
        "train[95%:]",
    ]


def test_shipped_builders_keep_their_tfds_names_and_configurations():
    # Prepared data live under <data_dir>/<name>/<config>/<version>: the
    # shared base class must not change any of them.
    import importlib

    import tensorflow_datasets as tfds

    from examples.common import datasets

    configs = {
        "freedict_deu_eng": [],
        "kjv_bible": ["full", "tiny"],
        "multilingual_dates": ["default", "tiny"],
        "wordnet_glosses": ["full", "tiny"],
    }
    assert sorted(datasets.SHIPPED) == sorted(configs)
    for name, module in datasets.SHIPPED.items():
        importlib.import_module(module)
        builder_cls = tfds.builder_cls(name)
        assert issubclass(builder_cls, datasets.ShippedBuilder)
        assert str(builder_cls.VERSION) == "1.0.0"
        names = [c.name for c in builder_cls.BUILDER_CONFIGS or ()]
        assert names == configs[name], name
        tiny = f"{name}/tiny" if "tiny" in names else name
        assert datasets.tfds_name(name, tiny=True) == tiny
        assert datasets.tfds_name(name) == name


def test_examples_use_only_the_public_api():
    # examples <- generation <- blocks <- layers <- ...: the examples import
    # the library's public names from its public subpackages, nothing else.
    import ast
    import importlib
    import pathlib

    public = {
        "keras_attention.blocks",
        "keras_attention.distribution",
        "keras_attention.generation",
        "keras_attention.interop",
        "keras_attention.layers",
        "keras_attention.masks",
        "keras_attention.mods",
        "keras_attention.ops",
        "keras_attention.scores",
        "keras_attention.visualization",
    }
    found, wrong = 0, []
    for path in sorted(pathlib.Path(ROOT, "examples").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
                wrong += [n for n in names if n.startswith("keras_attention")]
            if not isinstance(node, ast.ImportFrom) or not (
                node.module or ""
            ).startswith("keras_attention"):
                continue
            found += 1
            exported = (
                importlib.import_module(node.module).__all__
                if node.module in public
                else ()
            )
            wrong += [
                f"{path.name}: from {node.module} import {a.name}"
                for a in node.names
                if a.name not in exported
            ]
    assert found > 5 and wrong == []
