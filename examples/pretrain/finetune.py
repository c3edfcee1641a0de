"""The fine-tuning recipe of the `pretrain` example, the same for every
objective and for the model trained from scratch.

- Labelled subsets (`label_subsets`): for each seed, one seeded
  permutation of the labelled training split; the `n` examples of a label
  count are its first `n`, so the subsets of one seed are nested (the 300
  contain the 100).
- Optimizer (`LayerwiseAdamW`): AdamW whose step on the backbone's
  variables is `backbone_multiplier` times the head's (Keras 3.15's
  optimizers have one learning rate for all variables; this one scales
  the learning rate per variable in `update_step`).
- Schedule: linear warm-up from 0 over `warmup_steps`, then a cosine
  decay to a tenth over the step cap.
- Early stopping on the validation split's accuracy (checked every
  "epoch": one pass over the labelled examples, at least
  `min_epoch_steps` and at most `max_epoch_steps` steps), restoring the
  weights of the best validation epoch.
"""

import math

import keras
import numpy as np


class Recipe:
    """The fine-tuning hyperparameters (one recipe for every model)."""

    def __init__(
        self,
        learning_rate=2e-3,
        backbone_multiplier=0.25,
        weight_decay=0.01,
        batch_size=32,
        warmup_steps=30,
        min_epoch_steps=10,
        max_epoch_steps=200,
        max_epochs=15,
        patience=4,
    ):
        if min_epoch_steps > max_epoch_steps:
            raise ValueError(
                f"min_epoch_steps={min_epoch_steps!r} exceeds "
                f"max_epoch_steps={max_epoch_steps!r}"
            )
        self.learning_rate = learning_rate
        self.backbone_multiplier = backbone_multiplier
        self.weight_decay = weight_decay
        self.batch_size = batch_size
        self.warmup_steps = warmup_steps
        self.min_epoch_steps = min_epoch_steps
        self.max_epoch_steps = max_epoch_steps
        self.max_epochs = max_epochs
        self.patience = patience

    def epoch_steps(self, num_examples):
        """Steps between two validation checks: one pass over the
        examples, at least `min_epoch_steps`, at most `max_epoch_steps`
        (many labels: validation every `max_epoch_steps` steps, and the
        step cap `max_epochs * max_epoch_steps`)."""
        steps = math.ceil(num_examples / self.batch_size)
        return min(max(steps, self.min_epoch_steps), self.max_epoch_steps)

    def describe(self):
        return (
            f"AdamW (weight decay {self.weight_decay}), batch "
            f"{self.batch_size}, head learning rate {self.learning_rate:g}, "
            f"backbone x{self.backbone_multiplier:g}, linear warm-up "
            f"{self.warmup_steps} steps then cosine decay to a tenth, "
            f"early stopping on validation accuracy (patience "
            f"{self.patience}, at most {self.max_epochs} epochs of "
            f"{self.min_epoch_steps} to {self.max_epoch_steps} steps, best "
            f"weights restored)"
        )


def label_subsets(num_examples, counts, seed):
    """`{count: indices}`: the first `count` of one seeded permutation of
    `range(num_examples)` (nested subsets; a count above `num_examples`
    takes them all)."""
    order = np.random.default_rng(seed).permutation(num_examples)
    return {n: order[: min(n, num_examples)] for n in counts}


class LayerwiseAdamW(keras.optimizers.AdamW):
    """AdamW whose step on `scaled_variables` is `multiplier` times the
    others' (the learning rate scaled per variable in `update_step`; the
    weight decay stays at the base learning rate).

    Args:
        scaled_variables: the variables of the smaller (or larger) step.
        multiplier: their learning-rate multiplier.
    """

    def __init__(self, scaled_variables=(), multiplier=1.0, **kwargs):
        super().__init__(**kwargs)
        self.multiplier = float(multiplier)
        self._scaled = {self._var_key(v) for v in scaled_variables}

    def update_step(self, gradient, variable, learning_rate):
        if self._var_key(variable) in self._scaled:
            learning_rate = keras.ops.multiply(learning_rate, self.multiplier)
        return super().update_step(gradient, variable, learning_rate)


def make_optimizer(recipe, backbone_variables, total_steps):
    """The recipe's optimizer: `backbone_variables` step at
    `backbone_multiplier` times the head's learning rate."""
    schedule = keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0,
        decay_steps=max(1, total_steps - recipe.warmup_steps),
        alpha=0.1,
        warmup_target=recipe.learning_rate,
        warmup_steps=recipe.warmup_steps,
    )
    return LayerwiseAdamW(
        scaled_variables=backbone_variables,
        multiplier=recipe.backbone_multiplier,
        learning_rate=schedule,
        weight_decay=recipe.weight_decay,
    )


def fit_classifier(
    model, backbone_variables, train, validation, recipe, seed, verbose=0
):
    """Fine-tunes `model` (compiled here) on `train = (x, y)` NumPy arrays
    with the recipe; returns `{"epochs", "best_epoch",
    "val_accuracy"}` (the model holds the best validation weights)."""
    import tensorflow as tf

    x, y = train
    epoch_steps = recipe.epoch_steps(len(x))
    model.compile(
        optimizer=make_optimizer(
            recipe, backbone_variables, epoch_steps * recipe.max_epochs
        ),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    batches = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .shuffle(len(x), seed=seed)
        .repeat()
        .batch(recipe.batch_size)
    )
    stop = keras.callbacks.EarlyStopping(
        monitor="val_accuracy",
        mode="max",
        patience=recipe.patience,
        restore_best_weights=True,
    )
    history = model.fit(
        batches,
        epochs=recipe.max_epochs,
        steps_per_epoch=epoch_steps,
        validation_data=validation,
        validation_batch_size=256,
        callbacks=[stop],
        verbose=verbose,
        shuffle=False,  # the pipeline shuffles (Keras would warn)
    )
    accuracy = history.history["val_accuracy"]
    return {
        "epochs": len(accuracy),
        "best_epoch": int(np.argmax(accuracy)) + 1,
        "val_accuracy": float(np.max(accuracy)),
        "steps": len(accuracy) * epoch_steps,
    }
