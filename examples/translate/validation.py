"""Early stopping of the `translate` example on the validation exact match.

The 2-epoch default used to end wherever the thread-order noise of
TensorFlow's kernels put it (96.45 % or 100.00 % test exact match for the
same seed on the same machine, issue 36). `ValidationExactMatch` decodes
the validation sources at the end of every epoch, puts their exact match
(%) in the epoch's logs as `val_exact_match` (History, TensorBoard), keeps
the weights of the best epoch and stops the training: once `target_epochs`
epochs have reached the `target` exact match, or after `patience` epochs
without a better one (or at `--epochs`, the most). The best epoch is the
one with the highest exact match, ties broken by the lower validation
loss. Measured (5 epochs, no stopping, seeds 0-2): the validation exact
match is 99.9-100 % after one epoch, but with seed 0 the test's is still
99.95 % then (one date of 2,000) and 100.00 % after the second epoch,
whose validation loss is 5.7 times lower; with seed 1 the third epoch
falls back to 98.7 % (test 99.00 %) before the fourth is at 100 % again.
So the first perfect epoch is not the one to keep, nor the last one.

`examples.common.fit` runs it first among the callbacks (`epoch_metrics`)
and, with `monitor=None`, leaves the choice of weights to it.
"""

import logging
import math

import keras

logger = logging.getLogger("examples")


class ValidationExactMatch(keras.callbacks.Callback):
    """Scores the model after every epoch, stops, restores the best epoch.

    Args:
        score_fn: a function of no arguments returning the validation
            exact match (%) of the model as it is now.
        target: the score at which an epoch counts towards stopping
            (default 100.0: every validation example right).
        target_epochs: stop at the end of the `target_epochs`-th epoch
            whose score reaches `target` (default 2).
        patience: stop after `patience` epochs in a row without a better
            epoch than the best so far.
        loss: the key of the tie-breaking loss in the epoch's logs (lower
            is better; missing: no tie-breaking).
        name: the key the score is written to in the epoch's logs.

    An epoch is better than another when its score is higher, or equal with
    a lower `loss`. At the end of the training the model gets the best
    epoch's weights. `scores` lists the score of every epoch of this run,
    `best_epoch` is the index of the best (0-based) and `stop_reason` says
    why the training stopped ("target", "patience", or None when it ran
    all its epochs). A run resumed from a backup starts the choice anew.
    """

    def __init__(
        self,
        score_fn,
        target=100.0,
        target_epochs=2,
        patience=2,
        loss="val_loss",
        name="val_exact_match",
    ):
        super().__init__()
        self.score_fn = score_fn
        self.target = float(target)
        self.target_epochs = int(target_epochs)
        self.patience = int(patience)
        self.loss = loss
        self.name = name
        self._reset()

    def _reset(self):
        self.scores = []
        self.best = None
        self.best_epoch = None
        self.best_weights = None
        self.waited = 0
        self.reached = 0
        self.stop_reason = None

    def on_train_begin(self, logs=None):
        self._reset()

    def on_epoch_end(self, epoch, logs=None):
        logs = {} if logs is None else logs
        score = float(self.score_fn())
        logs[self.name] = score
        self.scores.append(score)
        rank = (score, -float(logs.get(self.loss, math.inf)))
        if self.best is None or rank > self.best:
            self.best, self.best_epoch, self.waited = rank, epoch, 0
            self.best_weights = self.model.get_weights()
        else:
            self.waited += 1
        self.reached += score >= self.target
        if self.reached >= self.target_epochs:
            self.stop_reason = "target"
        elif self.waited >= self.patience:
            self.stop_reason = "patience"
        logger.info(
            "epoch %d: validation exact match %.2f %% (best: epoch %d, "
            "%.2f %%)%s",
            epoch + 1,
            score,
            self.best_epoch + 1,
            self.best[0],
            {
                "target": f"; {self.reached} epochs at {self.target:.2f} %: "
                "training stops",
                "patience": f"; no better epoch in {self.waited}: "
                "training stops",
            }.get(self.stop_reason, ""),
        )
        if self.stop_reason is not None:
            self.model.stop_training = True

    def on_train_end(self, logs=None):
        if self.best_weights is not None:
            self.model.set_weights(self.best_weights)
            logger.info(
                "restored the weights of epoch %d (validation exact match "
                "%.2f %%)",
                self.best_epoch + 1,
                self.best[0],
            )
