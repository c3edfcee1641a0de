"""Runtime setup and `model.fit` with the usual callbacks, for all examples.

Typical use in an example's `main()`:

    parser = argparse.ArgumentParser()
    add_training_args(parser, epochs=10, batch_size=64)
    args = parser.parse_args()
    strategy = setup_runtime(args)        # devices, precision, seeds
    with strategy.scope():
        model = build_model(...)
        model.compile(...)
    history = fit(model, train_ds, val_ds, args)

Backends: an example that takes `--backend` (`add_backend_arg`) calls
`select_backend(args.backend)` before anything imports Keras; the data
stays `tf.data` on every backend (Keras's dataset adapter hands `fit` the
batches as NumPy arrays on JAX and PyTorch), and `--strategy mirrored` /
`multiworker` (TensorFlow distribution strategies) need the TensorFlow
backend.

Resuming: `fit` keeps a backup of the weights *and the optimizer state*
under `--backup-dir` (default `<output_dir>/backup`) every `--backup-every`
steps. Started again with
the same arguments after being killed, it restores the last backup and
continues with the batch that followed it: the training stream is the
(seeded, deterministic) repeated training set, skipped by the number of
steps already done, and training stops after `epochs * steps_per_epoch`
steps in total, so a resumed run does exactly the updates of an
uninterrupted one.

Several workers (`--strategy multiworker`, `TF_CONFIG` set on each, see
docs/guides/multi-worker.md): `fit` trains with the `strategy.run` loop of
`examples.common.distributed` (Keras 3's `fit` fails there,
https://github.com/keras-team/keras/issues/20585), and `setup_runtime`
points `args.output_dir` of every worker but the chief to a temporary
directory deleted at exit, so that only the chief writes the shared
output directory (checkpoints, TensorBoard logs, SavedModel, plots); the
backup is read by every worker from the shared `--backup-dir` (it must be
on a file system all workers see) and written by the chief alone.
"""

import argparse
import json
import logging
import os
import random
import sys

import numpy as np

from examples.common import distributed

logger = logging.getLogger("examples")

_METADATA = "training_metadata.json"
BACKENDS = ("tensorflow", "jax", "torch")


class HelpFormatter(
    argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter
):
    """Shows each option's default (unless its help already says it) and
    the epilog (the module docstring's commands) as written."""

    def _get_help_string(self, action):
        if "default:" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def add_training_args(
    parser,
    epochs=10,
    batch_size=64,
    steps_per_epoch=None,
    output_dir=None,
    patience=3,
    backup_every=50,
):
    """Adds the flags shared by all examples to an `argparse` parser."""
    group = parser.add_argument_group("training and runtime")
    group.add_argument("--epochs", type=int, default=epochs)
    group.add_argument("--batch-size", type=int, default=batch_size)
    group.add_argument(
        "--steps-per-epoch",
        type=int,
        default=steps_per_epoch,
        help="steps per epoch"
        + (
            " (default: one pass over the training split)"
            if steps_per_epoch is None
            else f" (default: {steps_per_epoch})"
        ),
    )
    group.add_argument(
        "--output-dir",
        default=output_dir,
        help="checkpoints, backup, TensorBoard logs, plots and the SavedModel",
    )
    group.add_argument(
        "--backup-dir",
        default=None,
        help="where the resumable backup is kept (default: "
        "<output-dir>/backup); with several workers, on a file system that "
        "all of them read",
    )
    group.add_argument(
        "--mixed-precision",
        choices=["auto", "on", "off"],
        default="auto",
        help="auto: on with a GPU (bfloat16 on Ampere+, else float16), off "
        "on CPU; on without a GPU: mixed_bfloat16",
    )
    group.add_argument(
        "--jit-compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="XLA-compile the train step (default: on with a GPU)",
    )
    group.add_argument(
        "--strategy",
        choices=["default", "mirrored", "multiworker"],
        default="default",
        help="tf.distribute strategy; multiworker reads TF_CONFIG",
    )
    group.add_argument(
        "--logical-cpus",
        type=int,
        default=0,
        help="split the CPU into N logical devices (to try --strategy "
        "mirrored without GPUs)",
    )
    group.add_argument("--seed", type=int, default=0)
    group.add_argument(
        "--patience",
        type=int,
        default=patience,
        help="early-stopping patience in epochs",
    )
    group.add_argument(
        "--backup-every",
        type=int,
        default=backup_every,
        help="back up weights and optimizer every N steps",
    )
    return parser


def parse_choices(parser, flag, value, allowed):
    """The names of a comma-separated command-line value (`--models
    gat,gcn`), each one of `allowed`; `parser.error` (exit status 2)
    names the flag, the unknown names and the allowed ones when a name is
    unknown or none is given."""
    names = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [n for n in names if n not in allowed]
    if unknown or not names:
        listed = ", ".join(unknown) or "none given"
        parser.error(
            f"{flag} takes comma-separated names among "
            f"{', '.join(allowed)}; unknown: {listed}. Received: {value!r}"
        )
    return names


def add_backend_arg(parser):
    """Adds `--backend tensorflow|jax|torch` (see `select_backend`)."""
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default=None,
        help="Keras backend (default: $KERAS_BACKEND, else Keras's own "
        "default, tensorflow); the data pipeline is tf.data on all three",
    )
    return parser


def select_backend(backend, error=None):
    """Makes `backend` Keras's backend; call it before importing Keras.

    Keras reads `KERAS_BACKEND` once, when it is first imported, so this
    sets the variable and refuses (`error(message)`, by default raising
    `ValueError`) what would silently run another backend: a different
    `KERAS_BACKEND` already in the environment, or Keras already imported
    with another backend (a caller in the same process). `backend=None`
    keeps what the environment says.

    Returns:
        the backend name, or None when `backend` is None.
    """
    if backend is None:
        return None
    if backend not in BACKENDS:
        _refuse(
            error, f"--backend must be one of {BACKENDS}. Received: {backend!r}"
        )
    current = os.environ.get("KERAS_BACKEND")
    if current and current != backend:
        _refuse(
            error,
            f"--backend {backend} conflicts with KERAS_BACKEND={current} "
            "in the environment. Unset KERAS_BACKEND, or pass "
            f"--backend {current}.",
        )
    keras = sys.modules.get("keras")
    if keras is not None and keras.backend.backend() != backend:
        _refuse(
            error,
            f"--backend {backend}: Keras is already imported with the "
            f"{keras.backend.backend()} backend in this process; the "
            "backend is chosen before Keras is imported.",
        )
    os.environ["KERAS_BACKEND"] = backend
    return backend


def _refuse(error, message):
    if error is not None:
        error(message)
    raise ValueError(message)


def _gpus():
    """The GPUs the Keras backend computes on."""
    import keras

    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return [d for d in jax.devices() if d.platform == "gpu"]
    if backend == "torch":
        import torch

        return list(range(torch.cuda.device_count()))
    import tensorflow as tf

    return tf.config.list_physical_devices("GPU")


def _compute_capability(gpu):
    import keras

    backend = keras.backend.backend()
    if backend == "jax":
        return tuple(int(v) for v in gpu.compute_capability.split("."))
    if backend == "torch":
        import torch

        return torch.cuda.get_device_capability(gpu)
    import tensorflow as tf

    details = tf.config.experimental.get_device_details(gpu)
    return details.get("compute_capability", (0, 0))


def mixed_precision_policy(args):
    """The Keras dtype policy name that `--mixed-precision` asks for."""
    gpus = _gpus()
    if args.mixed_precision == "off" or (
        args.mixed_precision == "auto" and not gpus
    ):
        return "float32"
    if not gpus:
        return "mixed_bfloat16"
    capability = _compute_capability(gpus[0])
    return "mixed_bfloat16" if capability >= (8, 0) else "mixed_float16"


def setup_logging():
    """Prints the examples' own messages (the `examples` logger, from INFO
    up) and leaves every other logger at Python's default, WARNING.

    The root logger at INFO (`logging.basicConfig(level=logging.INFO)`, as
    the examples had it) also printed the INFO messages of TensorFlow, TFDS
    and absl, none of them for a user to act on: the SavedModel export's
    "Function `_translate` contains input name(s) resource, input_9, ...
    with unsupported characters which will be renamed to ..." (TensorFlow
    names the captured variables and loop inputs of the serving function
    in the file; the signature's own input keeps its name) and "Assets
    written to" (twice: TensorFlow's own handler, then the root's), TFDS's
    "Constructing tf.data.Dataset ..." for every split read.

    Adds a handler to the root logger only when it has none (a fresh
    `python -m examples.<name>`), so a caller's logging setup is kept.
    """
    logging.basicConfig(format="%(message)s")
    logger.setLevel(logging.INFO)


def setup_runtime(args):
    """Devices, precision and seeds; returns the `tf.distribute.Strategy`.

    Call it first thing (before any other TensorFlow op): it configures the
    logical devices and, for `multiworker`, the collective runtime. On the
    JAX and PyTorch backends TensorFlow only reads the data: it is kept off
    the GPUs (which the backend uses), the strategy is TensorFlow's default
    (a no-op scope) and `--jit-compile` defaults to on for JAX (XLA; eager
    JAX is slow) and off for PyTorch (`torch.compile` takes minutes).

    With `--strategy multiworker`, a worker other than the chief gets a
    temporary `args.output_dir` (deleted at exit) and `args.backup_dir`
    is set to the shared one (`<output-dir>/backup` unless given), so that
    everything the example writes under `args.output_dir` is written by
    the chief alone.
    """
    import keras
    import tensorflow as tf

    setup_logging()
    backend = keras.backend.backend()
    if backend != "tensorflow":
        if args.strategy != "default":
            raise ValueError(
                f"--strategy {args.strategy} is a TensorFlow distribution "
                "strategy: it needs --backend tensorflow. "
                f"Received: backend={backend!r}"
            )
        tf.config.set_visible_devices([], "GPU")
    if args.logical_cpus and args.logical_cpus > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu,
            [tf.config.LogicalDeviceConfiguration()] * args.logical_cpus,
        )
    if args.strategy == "multiworker":
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        _chief_only_output(args, strategy)
    elif args.strategy == "mirrored":
        gpus = tf.config.list_logical_devices("GPU")
        devices = [d.name for d in gpus] or [
            d.name for d in tf.config.list_logical_devices("CPU")
        ]
        strategy = tf.distribute.MirroredStrategy(devices)
    else:
        strategy = tf.distribute.get_strategy()
    gpus = _gpus()
    policy = mixed_precision_policy(args)
    keras.config.set_dtype_policy(policy)
    if args.jit_compile is None:
        args.jit_compile = (
            backend == "jax" if backend != "tensorflow" else bool(gpus)
        )
    seed = args.seed
    random.seed(seed)
    np.random.seed(seed)
    keras.utils.set_random_seed(seed)
    logger.info(
        "backend: %s | devices: %s | strategy: %s (%d replicas) | "
        "precision: %s | jit_compile: %s",
        backend,
        ", ".join(
            [d.name for d in tf.config.list_logical_devices()]
            if backend == "tensorflow"
            else [str(d) for d in gpus] or ["CPU"]
        ),
        type(strategy).__name__,
        strategy.num_replicas_in_sync,
        policy,
        args.jit_compile,
    )
    return strategy


def _chief_only_output(args, strategy):
    shared = args.output_dir or "runs/example"
    if getattr(args, "backup_dir", None) is None:
        args.backup_dir = os.path.join(shared, "backup")
    args.output_dir = distributed.worker_output_dir(shared, strategy)


def backup_dir(args):
    """`--backup-dir`, by default `<output_dir>/backup`."""
    return getattr(args, "backup_dir", None) or os.path.join(
        args.output_dir or "runs/example", "backup"
    )


def count_batches(ds):
    """Number of elements of a finite dataset (iterates it if unknown)."""
    import tensorflow as tf

    n = int(ds.cardinality())
    if n >= 0:
        return n
    if n == int(tf.data.INFINITE_CARDINALITY):
        raise ValueError(
            "The training dataset is infinite: pass --steps-per-epoch."
        )
    return int(ds.reduce(np.int64(0), lambda count, _: count + 1))


def read_backup(output_dir, backup_dir=None):
    """`{"epoch", "batch", "step"}` of the last backup (in `backup_dir`, by
    default `<output_dir>/backup`), or None."""
    backup_dir = backup_dir or os.path.join(output_dir, "backup")
    path = os.path.join(backup_dir, _METADATA)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def _backup_callback(keras, backup_dir, save_freq, initial_epoch, scratch):
    class StepBackupAndRestore(keras.callbacks.BackupAndRestore):
        """Also records the global step, so `fit` can skip seen batches.

        With a `scratch` directory (a worker other than the chief), the
        backup is restored from the shared `backup_dir` but saved to
        `scratch` (deleted with the worker's temporary output), and the
        shared backup is not deleted at the end.
        """

        def on_train_begin(self, logs=None):
            super().on_train_begin(logs)
            # Epochs count from the restored global step (see `fit`).
            self.model._initial_epoch = initial_epoch
            self._current_epoch = initial_epoch

        def on_train_end(self, logs=None):
            if scratch is None:
                super().on_train_end(logs)

        def _save_model(self):
            if scratch is not None:
                os.makedirs(scratch, exist_ok=True)
                self.model.save_weights(
                    os.path.join(scratch, "backup.weights.h5"), overwrite=True
                )
                return
            super()._save_model()
            with open(self._training_metadata_path) as f:
                metadata = json.load(f)
            metadata["step"] = int(self.model.optimizer.iterations.numpy())
            with open(self._training_metadata_path, "w") as f:
                json.dump(metadata, f)

    return StepBackupAndRestore(
        backup_dir, save_freq=save_freq, double_checkpoint=True
    )


def _stop_at_step(keras, total_steps):
    class StopAtStep(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if int(self.model.optimizer.iterations.numpy()) >= total_steps:
                self.model.stop_training = True

    return StopAtStep()


def _tensorboard(keras, log_dir):
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        logger.warning("tensorboard is not installed: no training logs")
        return []
    return [keras.callbacks.TensorBoard(log_dir)]


def fit(
    model,
    train_ds,
    val_ds,
    args,
    monitor="val_loss",
    mode="min",
    callbacks=(),
    verbose="auto",
    epoch_metrics=(),
):
    """`model.fit` with checkpointing, resumable backup, early stopping, logs.

    Args:
        model: a compiled, built Keras model (build it by calling it on a
            batch: the backup restores into existing variables).
        train_ds: finite `tf.data.Dataset` of training batches (one epoch),
            deterministic for a given seed (seeded shuffle).
        val_ds: validation batches or None.
        args: the parsed flags of `add_training_args`.
        monitor, mode: metric for the best checkpoint and early stopping;
            `monitor=None`: neither (a callback of the caller stops the
            training and restores the weights it chose).
        callbacks: extra callbacks.
        verbose: passed to `model.fit` (the progress bar by default).
        epoch_metrics: callbacks that add scores to the epoch's logs in
            `on_epoch_end` (e.g. a validation score computed by decoding);
            they run before the checkpoint, early stopping and TensorBoard,
            so that `monitor` can name what they add.

    Under `MultiWorkerMirroredStrategy` (the model's strategy), the
    training runs on `examples.common.distributed.fit`'s `strategy.run`
    loop instead of `model.fit` (keras-team/keras#20585), with the same
    callbacks.

    Returns:
        the `keras.callbacks.History` of this (possibly resumed) run. The
        model ends with the best weights seen (by `monitor`) when a
        validation set is given.
    """
    import keras

    output_dir = args.output_dir or "runs/example"
    os.makedirs(output_dir, exist_ok=True)
    # Only TensorFlow models have a `tf.distribute` strategy.
    strategy = getattr(model, "distribute_strategy", None)
    steps = args.steps_per_epoch or count_batches(train_ds)
    total_steps = args.epochs * steps
    backups = backup_dir(args)
    backup = read_backup(output_dir, backups)
    done = int(backup.get("step", 0)) if backup else 0
    if done >= total_steps:
        logger.info("backup says training already finished (%d steps)", done)
    stream = train_ds.repeat()
    if done:
        logger.info(
            "resuming from the backup at step %d (epoch %d)",
            done,
            done // steps + 1,
        )
        stream = stream.skip(done)
    checkpoint_path = os.path.join(output_dir, "checkpoints", "best.weights.h5")
    os.makedirs(os.path.dirname(checkpoint_path), exist_ok=True)
    has_val = val_ds is not None
    if has_val:
        val_ds = distributed.with_known_size(val_ds)
    if monitor is not None and not has_val and monitor.startswith("val_"):
        monitor = monitor[len("val_") :]
    selection = [
        keras.callbacks.ModelCheckpoint(
            checkpoint_path,
            monitor=monitor,
            mode=mode,
            save_best_only=True,
            save_weights_only=True,
        ),
        keras.callbacks.EarlyStopping(
            monitor=monitor, mode=mode, patience=args.patience
        ),
    ]
    all_callbacks = [
        _backup_callback(
            keras,
            backups,
            args.backup_every,
            done // steps,
            None
            if distributed.is_chief(strategy)
            else os.path.join(output_dir, "backup"),
        ),
        _stop_at_step(keras, total_steps),
        *epoch_metrics,
        *(selection if monitor is not None else []),
        *_tensorboard(keras, os.path.join(output_dir, "logs")),
        *callbacks,
    ]
    history = distributed.fit(
        model,
        stream,
        validation_data=val_ds,
        epochs=args.epochs,
        initial_epoch=done // steps,
        steps_per_epoch=steps,
        callbacks=all_callbacks,
        strategy=strategy,
        verbose=verbose,
    )
    if (
        monitor is not None
        and os.path.exists(checkpoint_path)
        and history.history
    ):
        model.load_weights(checkpoint_path)
        logger.info("restored the best weights from %s", checkpoint_path)
    return history
