"""Packed sequences, shared by the pretraining and language-model
examples: positions restarting per packed document, and the padding
fraction of a pipeline's batches."""

import keras

from keras_attention.masks import segment_positions


@keras.saving.register_keras_serializable(package="examples_common")
class SegmentPositions(keras.layers.Layer):
    """`segment_ids (batch, T)` -> positions restarting at 0 in each
    packed document (`keras_attention.masks.segment_positions`)."""

    def call(self, segment_ids):
        return segment_positions(segment_ids)

    def compute_output_spec(self, segment_ids):
        return keras.KerasTensor(segment_ids.shape, dtype="int32")


def real_tokens(batches, steps):
    """`(real, total)` input token counts of the first `steps` batches of
    a `tf.data` pipeline (all of them for `steps=-1`): `token_ids != 0`
    (the `"token_ids"` entry of dict inputs), and all. The padding
    fraction is `1 - real / total`."""
    real = total = 0
    for inputs, *_ in batches.take(steps).as_numpy_iterator():
        ids = inputs["token_ids"] if isinstance(inputs, dict) else inputs
        real += int((ids != 0).sum())
        total += int(ids.size)
    return real, total
