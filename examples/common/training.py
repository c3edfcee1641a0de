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

Resuming: `fit` keeps a backup of the weights *and the optimizer state*
under `<output_dir>/backup` every `--backup-every` steps. Started again with
the same arguments after being killed, it restores the last backup and
continues with the batch that followed it: the training stream is the
(seeded, deterministic) repeated training set, skipped by the number of
steps already done, and training stops after `epochs * steps_per_epoch`
steps in total, so a resumed run does exactly the updates of an
uninterrupted one.
"""

import argparse
import json
import logging
import os
import random

import numpy as np

logger = logging.getLogger("examples")

_METADATA = "training_metadata.json"


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


def _gpus():
    import tensorflow as tf

    return tf.config.list_physical_devices("GPU")


def mixed_precision_policy(args):
    """The Keras dtype policy name that `--mixed-precision` asks for."""
    gpus = _gpus()
    if args.mixed_precision == "off" or (
        args.mixed_precision == "auto" and not gpus
    ):
        return "float32"
    if not gpus:
        return "mixed_bfloat16"
    import tensorflow as tf

    details = tf.config.experimental.get_device_details(gpus[0])
    capability = details.get("compute_capability", (0, 0))
    return "mixed_bfloat16" if capability >= (8, 0) else "mixed_float16"


def setup_runtime(args):
    """Devices, precision and seeds; returns the `tf.distribute.Strategy`.

    Call it first thing (before any other TensorFlow op): it configures the
    logical devices and, for `multiworker`, the collective runtime.
    """
    import keras
    import tensorflow as tf

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.logical_cpus and args.logical_cpus > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu,
            [tf.config.LogicalDeviceConfiguration()] * args.logical_cpus,
        )
    if args.strategy == "multiworker":
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
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
        args.jit_compile = bool(gpus)
    seed = args.seed
    random.seed(seed)
    np.random.seed(seed)
    keras.utils.set_random_seed(seed)
    logger.info(
        "devices: %s | strategy: %s (%d replicas) | precision: %s | "
        "jit_compile: %s",
        ", ".join(d.name for d in tf.config.list_logical_devices()),
        type(strategy).__name__,
        strategy.num_replicas_in_sync,
        policy,
        args.jit_compile,
    )
    return strategy


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


def read_backup(output_dir):
    """`{"epoch", "batch", "step"}` of the last backup, or None."""
    path = os.path.join(output_dir, "backup", _METADATA)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def _backup_callback(keras, backup_dir, save_freq, initial_epoch):
    class StepBackupAndRestore(keras.callbacks.BackupAndRestore):
        """Also records the global step, so `fit` can skip seen batches."""

        def on_train_begin(self, logs=None):
            super().on_train_begin(logs)
            # Epochs count from the restored global step (see `fit`).
            self.model._initial_epoch = initial_epoch
            self._current_epoch = initial_epoch

        def _save_model(self):
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
):
    """`model.fit` with checkpointing, resumable backup, early stopping, logs.

    Args:
        model: a compiled, built Keras model (build it by calling it on a
            batch: the backup restores into existing variables).
        train_ds: finite `tf.data.Dataset` of training batches (one epoch),
            deterministic for a given seed (seeded shuffle).
        val_ds: validation batches or None.
        args: the parsed flags of `add_training_args`.
        monitor, mode: metric for the best checkpoint and early stopping.
        callbacks: extra callbacks.
        verbose: passed to `model.fit` (the progress bar by default).

    Returns:
        the `keras.callbacks.History` of this (possibly resumed) run. The
        model ends with the best weights seen (by `monitor`) when a
        validation set is given.
    """
    import keras
    import tensorflow as tf

    output_dir = args.output_dir or "runs/example"
    os.makedirs(output_dir, exist_ok=True)
    steps = args.steps_per_epoch or count_batches(train_ds)
    total_steps = args.epochs * steps
    backup = read_backup(output_dir)
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
    if has_val and int(val_ds.cardinality()) < 0:
        # A known size keeps Keras from warning that the data "ran out".
        val_ds = val_ds.apply(
            tf.data.experimental.assert_cardinality(count_batches(val_ds))
        )
    if not has_val and monitor.startswith("val_"):
        monitor = monitor[len("val_") :]
    all_callbacks = [
        _backup_callback(
            keras,
            os.path.join(output_dir, "backup"),
            args.backup_every,
            done // steps,
        ),
        _stop_at_step(keras, total_steps),
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
        *_tensorboard(keras, os.path.join(output_dir, "logs")),
        *callbacks,
    ]
    history = model.fit(
        stream,
        validation_data=val_ds,
        epochs=args.epochs,
        initial_epoch=done // steps,
        steps_per_epoch=steps,
        callbacks=all_callbacks,
        verbose=verbose,
    )
    if os.path.exists(checkpoint_path) and history.history:
        model.load_weights(checkpoint_path)
        logger.info("restored the best weights from %s", checkpoint_path)
    return history
