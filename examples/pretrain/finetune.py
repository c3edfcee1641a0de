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
- Schedule (`WarmupCosineDecay`): linear warm-up from 0 over
  `warmup_steps`, then a cosine decay to a tenth over the step cap.
- `FineTuner`: one compiled classifier for every run (Keras traces its
  training and test steps once per process, not once per run: about 5 s
  of each run on 2 cores); each run sets its initial weights, resets the
  optimizer's state, its step cap and the dropout streams (from the
  run's seed), so a run's result does not depend on the runs before it.
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


class WarmupCosineDecay(keras.optimizers.schedules.LearningRateSchedule):
    """`peak * step / warmup_steps` during the warm-up, then a cosine decay
    from `peak` to `alpha * peak` at `total_steps`, a variable: the
    schedule of a compiled model that each run sets (Keras's `CosineDecay`
    holds its steps as a constant of the traced training step).

    Args:
        peak: the learning rate at the end of the warm-up.
        warmup_steps: the warm-up's steps.
        alpha: the last learning rate over `peak`.
    """

    def __init__(self, peak, warmup_steps, alpha=0.1):
        self.peak = float(peak)
        self.warmup_steps = int(warmup_steps)
        self.alpha = float(alpha)
        self.total_steps = keras.Variable(
            1.0, trainable=False, dtype="float32", name="total_steps"
        )

    def __call__(self, step):
        ops = keras.ops
        step = ops.cast(step, "float32")
        warmup = float(max(self.warmup_steps, 1))
        decay_steps = ops.maximum(self.total_steps - self.warmup_steps, 1.0)
        fraction = ops.clip((step - self.warmup_steps) / decay_steps, 0, 1)
        cosine = 0.5 * (1.0 + ops.cos(math.pi * fraction))
        decayed = self.peak * ((1.0 - self.alpha) * cosine + self.alpha)
        return ops.where(
            step < self.warmup_steps, self.peak * step / warmup, decayed
        )

    def get_config(self):
        return {
            "peak": self.peak,
            "warmup_steps": self.warmup_steps,
            "alpha": self.alpha,
        }


def make_optimizer(recipe, backbone_variables, schedule):
    """The recipe's optimizer on `schedule` (a `WarmupCosineDecay`):
    `backbone_variables` step at `backbone_multiplier` times the head's
    learning rate."""
    return LayerwiseAdamW(
        scaled_variables=backbone_variables,
        multiplier=recipe.backbone_multiplier,
        learning_rate=schedule,
        weight_decay=recipe.weight_decay,
    )


class FineTuner:
    """The recipe on one classifier, compiled once, for many runs.

    Args:
        model: the classifier.
        backbone_variables: its variables of the smaller step.
        recipe: a `Recipe`.
    """

    def __init__(self, model, backbone_variables, recipe):
        self.model = model
        self.recipe = recipe
        self.schedule = WarmupCosineDecay(
            recipe.learning_rate, recipe.warmup_steps
        )
        self.optimizer = make_optimizer(
            recipe, backbone_variables, self.schedule
        )
        model.compile(
            optimizer=self.optimizer,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
        self.optimizer.build(model.trainable_variables)
        self.seed_states = [
            v
            for v in model.variables
            if v.path.endswith("seed_generator_state")
        ]

    def reset(self, weights, seed, total_steps):
        """A run's start: `weights` (as `model.get_weights()`), a fresh
        optimizer, the step cap, dropout streams drawn from `seed`."""
        self.model.set_weights(weights)
        for variable in self.optimizer.variables:
            variable.assign(keras.ops.zeros_like(variable))
        self.schedule.total_steps.assign(float(total_steps))
        states = np.random.default_rng(seed).integers(
            0, 2**31 - 1, size=(len(self.seed_states), 2)
        )
        for variable, state in zip(self.seed_states, states):
            variable.assign(state.astype(variable.dtype))

    def fit(self, weights, train, validation, seed, verbose=0):
        """Fine-tunes the model from `weights` on `train = (x, y)` NumPy
        arrays; returns `{"epochs", "best_epoch", "val_accuracy",
        "steps"}` (the model holds the best validation weights)."""
        import tensorflow as tf

        from examples.common.distributed import build_training_state

        recipe, (x, y) = self.recipe, train
        epoch_steps = recipe.epoch_steps(len(x))
        self.reset(weights, seed, epoch_steps * recipe.max_epochs)
        batches = (
            tf.data.Dataset.from_tensor_slices((x, y))
            .shuffle(len(x), seed=seed)
            .repeat()
            .batch(recipe.batch_size)
        )
        build_training_state(self.model, batches)  # each step traced once
        stop = keras.callbacks.EarlyStopping(
            monitor="val_accuracy",
            mode="max",
            patience=recipe.patience,
            restore_best_weights=True,
        )
        history = self.model.fit(
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


def fit_classifier(
    model, backbone_variables, train, validation, recipe, seed, verbose=0
):
    """Fine-tunes `model` (compiled here) on `train = (x, y)` NumPy arrays
    with the recipe, one run; returns `{"epochs", "best_epoch",
    "val_accuracy", "steps"}` (the model holds the best validation
    weights)."""
    tuner = FineTuner(model, backbone_variables, recipe)
    return tuner.fit(model.get_weights(), train, validation, seed, verbose)
