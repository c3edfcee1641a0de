"""Early stopping of the `translate` example on the validation exact match.

The dates' metric is the exact match of whole translations, which the
teacher-forced validation loss predicts only roughly: near convergence a
lower loss can come with fewer exact answers, and a run stopped after a
fixed number of epochs ends wherever the thread-order noise of
TensorFlow's kernels puts it (96.45 % or 100.00 % for the same seed on the
same machine, issue 36). `ValidationExactMatch` decodes the validation
sources at the end of every epoch and puts their exact match (%) in the
epoch's logs as `val_exact_match`, so that `examples.common.fit`'s
checkpoint and early stopping monitor it (`monitor="val_exact_match",
mode="max"`, passed as one of its `epoch_metrics`): training stops once the
score reaches `target`, or when it has not improved for `--patience`
epochs, or after `--epochs`, and ends with the weights of the best epoch.
"""

import logging

import keras

logger = logging.getLogger("examples")


class ValidationExactMatch(keras.callbacks.Callback):
    """Scores the model after every epoch; stops training at `target`.

    Args:
        score_fn: a function of no arguments returning the validation
            exact match (%) of the model as it is now.
        target: stop training at the end of the first epoch whose score
            is at least `target` (default 100.0: every validation example
            right).
        name: the key of the score in the epoch's logs (what `monitor`
            names).

    It must run before the callbacks that read the score (the checkpoint,
    early stopping): `examples.common.fit` runs its `epoch_metrics` first.
    `scores` lists the score of every epoch of this run.
    """

    def __init__(self, score_fn, target=100.0, name="val_exact_match"):
        super().__init__()
        self.score_fn = score_fn
        self.target = float(target)
        self.name = name
        self.scores = []

    def on_epoch_end(self, epoch, logs=None):
        score = float(self.score_fn())
        self.scores.append(score)
        if logs is not None:
            logs[self.name] = score
        logger.info(
            "epoch %d: validation exact match %.2f %% (best %.2f %%)",
            epoch + 1,
            score,
            max(self.scores),
        )
        if score >= self.target:
            logger.info(
                "validation exact match reached %.2f %%: training stops",
                self.target,
            )
            self.model.stop_training = True
