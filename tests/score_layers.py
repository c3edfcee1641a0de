"""Score layers shared by tests (one module, imported by name: a test file
loaded again under another module name, as the collect-attention harness
test does, must not register a second class under the same name)."""

import keras
from keras import ops

from keras_attention import mods


@keras.saving.register_keras_serializable(package="keras_attention_tests")
class HeadDistanceBias(mods.ScoreLayer):
    """A learned per-head slope of the distance (test score layer)."""

    def build(self, num_heads=None):
        self.slopes = self.add_weight(
            shape=(num_heads,),
            initializer=keras.initializers.Constant(0.3),
            name="slopes",
        )
        self.built = True

    def score_fn(self, score, batch, head, q_idx, kv_idx):
        distance = ops.cast(ops.abs(q_idx - kv_idx), "float32")
        return score - ops.take(self.slopes, head) * distance
