"""`fit` and `evaluate` that also work under `MultiWorkerMirroredStrategy`.

Keras 3's TensorFlow trainer cannot train or evaluate with two or more
workers of `tf.distribute.MultiWorkerMirroredStrategy`
(https://github.com/keras-team/keras/issues/20585, open in Keras 3.15):
before the first step `fit` and `evaluate` reduce the whole first
distributed batch across the workers (`_maybe_symbolic_build`), and after
each step they reduce the scalar metric results "along axis 0"
(`reduce_per_replica`); both fail with `ValueError: Attempt to convert a
value (PerReplica:{...}) ... to a Tensor`. The layers and the models are
not at fault: the same model trains with a loop on `strategy.run`.

The choice made here: no patch of Keras (a global monkeypatch would change
every other `fit` in the process and break silently when Keras changes),
but a training loop of our own for that strategy only, on Keras's public
per-step API:

- every other strategy (none, `MirroredStrategy`, ...) calls `model.fit` /
  `model.evaluate` unchanged;
- under `MultiWorkerMirroredStrategy` a `tf.function` takes the next
  element of the distributed dataset (each global batch split between the
  replicas: `AutoShardPolicy.DATA`), runs `model.train_step` on every
  replica with `strategy.run` (Keras's compiled loss is the replica's mean
  divided by the number of replicas, i.e. the sum over the global batch
  divided by its size; the optimizer all-reduces the gradients and applies
  them once per step), then reads `model.get_metrics_result()` in the
  cross-replica context, where the metrics' "on read" sums are all-reduced
  across the workers: the loss and metrics are those of the global batch;
- the same callbacks are driven as `fit` drives them (`CallbackList` with
  History and the progress bar; train begin/end, epoch begin/end with the
  epoch's logs and the `val_` logs, batch begin/end with the step's logs,
  test begin/end around validation, `model.stop_training` honoured after
  each batch and each epoch), so `ModelCheckpoint`, `TensorBoard`,
  `BackupAndRestore`, `EarlyStopping` behave as in `fit`; the returned
  value is the `History`.

Not supported by the loop (ignored, as there is no use of them in the
examples): `steps_per_execution` > 1, `class_weight`, `validation_freq`,
and XLA compilation of the step (`jit_compile`: the step runs as a plain
`tf.function`). When Keras fixes the issue, `uses_custom_loop` can return
False for the fixed versions.

Chief-only writing: `is_chief(strategy)` tells the worker that writes the
shared output, and `worker_output_dir(output_dir, strategy)` gives the
other workers a temporary directory, deleted when the process exits (the
TensorFlow multi-worker convention: every worker runs the same saving code,
which may need collectives, but only the chief's files are kept).
"""

import atexit
import logging
import shutil
import tempfile

logger = logging.getLogger("examples")

KERAS_ISSUE = "https://github.com/keras-team/keras/issues/20585"


def _tf():
    import tensorflow as tf

    return tf


def uses_custom_loop(strategy):
    """Whether `fit`/`evaluate` run our loop (MultiWorkerMirroredStrategy)
    instead of Keras's, see the module docstring."""
    if strategy is None:
        return False
    tf = _tf()
    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)


def is_chief(strategy=None):
    """True on the worker that writes the shared output.

    The "chief" task when the cluster has one, else worker 0; True for
    every strategy that is not multi-worker (one process).
    """
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None:
        return True
    cluster = resolver.cluster_spec().as_dict()
    task_type, task_id = resolver.task_type, resolver.task_id
    if not cluster or task_type is None:
        return True
    if task_type == "chief":
        return True
    return "chief" not in cluster and task_type == "worker" and task_id == 0


def worker_output_dir(output_dir, strategy=None):
    """`output_dir` on the chief; a new temporary directory elsewhere.

    The temporary directory of a non-chief worker is deleted when the
    process exits normally.
    """
    if is_chief(strategy):
        return output_dir
    resolver = strategy.cluster_resolver
    path = tempfile.mkdtemp(
        prefix=f"{resolver.task_type}-{resolver.task_id}-output-"
    )
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    logger.info(
        "%s %s is not the chief: it writes to %s (deleted at exit), the "
        "chief to %s",
        resolver.task_type,
        resolver.task_id,
        path,
        output_dir,
    )
    return path


def fit(
    model,
    train_ds,
    *,
    epochs,
    steps_per_epoch,
    validation_data=None,
    callbacks=(),
    strategy=None,
    initial_epoch=0,
    verbose="auto",
):
    """`model.fit(train_ds, ...)`, or the loop of the module docstring
    under `MultiWorkerMirroredStrategy`.

    Args:
        model: a compiled, built Keras model, created under
            `strategy.scope()`.
        train_ds: a `tf.data.Dataset` of global batches with at least
            `(epochs - initial_epoch) * steps_per_epoch` of them (a
            repeated dataset).
        epochs: index of the last epoch, as in `model.fit`.
        steps_per_epoch: training steps per epoch.
        validation_data: a finite `tf.data.Dataset` of global batches or
            None.
        callbacks: Keras callbacks.
        strategy: the `tf.distribute.Strategy`; by default the model's.
        initial_epoch: epoch to start from.
        verbose: as in `model.fit`.

    Returns:
        the `keras.callbacks.History`.
    """
    strategy = strategy or getattr(model, "distribute_strategy", None)
    if not uses_custom_loop(strategy):
        build_training_state(model, train_ds, strategy)
        return model.fit(
            train_ds,
            validation_data=validation_data,
            epochs=epochs,
            initial_epoch=initial_epoch,
            steps_per_epoch=steps_per_epoch,
            callbacks=list(callbacks),
            verbose=verbose,
            # The pipeline shuffles (seeded); Keras cannot shuffle a
            # tf.data.Dataset and warns that it ignores its default True.
            shuffle=False,
        )
    import keras

    callback_list = keras.callbacks.CallbackList(
        list(callbacks),
        add_history=True,
        add_progbar=verbose != 0,
        verbose=verbose,
        epochs=epochs,
        steps=steps_per_epoch,
        model=model,
    )
    _build(model, train_ds, strategy)
    iterator = iter(_distribute(train_ds, strategy))
    train_function = _train_function(model, strategy)
    test_function = _test_function(model, strategy)
    model.stop_training = False
    callback_list.on_train_begin()
    training_logs = None
    logs = {}
    for epoch in range(initial_epoch, epochs):
        model.reset_metrics()
        callback_list.on_epoch_begin(epoch)
        for step in range(steps_per_epoch):
            callback_list.on_train_batch_begin(step)
            logs = _pythonify(train_function(iterator))
            callback_list.on_train_batch_end(step, logs)
            if model.stop_training:
                break
        epoch_logs = dict(logs)
        if validation_data is not None:
            val_logs = _run_evaluation(
                model, validation_data, strategy, test_function, callback_list
            )
            epoch_logs.update({f"val_{k}": v for k, v in val_logs.items()})
        callback_list.on_epoch_end(epoch, epoch_logs)
        training_logs = epoch_logs
        if model.stop_training:
            break
    callback_list.on_train_end(logs=training_logs)
    return model.history


def with_known_size(dataset):
    """`dataset` with its number of elements known to `tf.data`.

    Batches by length (`bucket_by_sequence_length`) have an unknown
    cardinality, and Keras, reaching the end of such a dataset in
    `evaluate` or in `fit`'s validation, warns "Your input ran out of
    data; interrupting training" although the whole set was read. Counting
    the batches reads the dataset once (and completes its in-memory cache,
    which the evaluation then reads).
    """
    tf = _tf()
    if int(dataset.cardinality()) >= 0:
        return dataset
    from examples.common.training import count_batches

    return dataset.apply(
        tf.data.experimental.assert_cardinality(count_batches(dataset))
    )


def evaluate(model, dataset, *, strategy=None, callbacks=(), verbose=0):
    """`model.evaluate(dataset, return_dict=True)`, or a `strategy.run`
    loop under `MultiWorkerMirroredStrategy` (module docstring).

    Returns:
        a dict of the metrics (`loss` and the compiled metrics), over the
        whole dataset.
    """
    strategy = strategy or getattr(model, "distribute_strategy", None)
    dataset = with_known_size(dataset)
    if not uses_custom_loop(strategy):
        return model.evaluate(
            dataset,
            callbacks=list(callbacks),
            verbose=verbose,
            return_dict=True,
        )
    import keras

    callback_list = keras.callbacks.CallbackList(
        list(callbacks),
        add_progbar=verbose != 0,
        verbose=verbose,
        model=model,
    )
    _build(model, dataset, strategy)
    return _run_evaluation(
        model,
        dataset,
        strategy,
        _test_function(model, strategy),
        callback_list,
    )


def _run_evaluation(model, dataset, strategy, test_function, callback_list):
    model.reset_metrics()
    callback_list.on_test_begin()
    logs = {}
    # The distributed iterator agrees between the workers on the end of
    # the data (a last partial batch may leave some replicas empty).
    for step, batch in enumerate(_distribute(dataset, strategy)):
        callback_list.on_test_batch_begin(step)
        logs = _pythonify(test_function(batch))
        callback_list.on_test_batch_end(step, logs)
    callback_list.on_test_end(logs)
    return logs


def _distribute(dataset, strategy):
    tf = _tf()
    options = tf.data.Options()
    # Every worker reads the same (seeded) pipeline and keeps its replicas'
    # parts of each global batch: the same updates as one process.
    options.experimental_distribute.auto_shard_policy = (
        tf.data.experimental.AutoShardPolicy.DATA
    )
    return strategy.experimental_distribute_dataset(
        dataset.with_options(options)
    )


def build_training_state(model, dataset, strategy=None):
    """Creates the optimizer's variables and the compiled metrics' and
    loss's state of a compiled, built `model` now, from the shapes of
    `dataset`'s elements, before `fit` or `evaluate` run.

    Without a distribution strategy, Keras's TensorFlow trainer creates
    them while it traces the first training (or evaluation) step, and a
    `tf.function` that creates variables while it traces is traced a
    second time: created first, every step is traced once. The same
    numbers either way (the state starts at zero). Other backends build
    it before they trace: nothing to do there.
    """
    strategy = strategy or getattr(model, "distribute_strategy", None)
    if strategy is not None:  # TensorFlow
        _build(model, dataset, strategy)


def _build(model, dataset, strategy):
    """Creates the optimizer and compiled metric/loss state outside the
    step function (variables cannot be created inside `strategy.run`).

    Keras's own symbolic build does it from the shapes of a local batch;
    `fit` calls it on the *reduced* distributed batch, one of the two
    defects of the issue.
    """
    with strategy.scope():
        if model.optimizer is not None and not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        # Keras's own (private) build from the shapes of the elements (not
        # from a batch: iterating the dataset here would advance the seed
        # of its shuffle); the examples build their models first, so only
        # the compiled metrics and loss are left to build.
        model._symbolic_build(data_batch=dataset.element_spec)


def _train_function(model, strategy):
    tf = _tf()

    @tf.function
    def train_function(iterator):
        strategy.run(model.train_step, args=(next(iterator),))
        # Cross-replica context: each metric's sums are all-reduced.
        return model.get_metrics_result()

    return train_function


def _test_function(model, strategy):
    tf = _tf()

    @tf.function(reduce_retracing=True)
    def test_function(batch):
        strategy.run(model.test_step, args=(batch,))
        return model.get_metrics_result()

    return test_function


def _pythonify(logs):
    return {k: float(v) for k, v in logs.items()}
