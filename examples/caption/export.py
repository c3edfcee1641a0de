"""The image-in, caption-out SavedModel of the `caption` example.

The served function runs greedy decoding (`Captioner.generate`) inside
the TensorFlow graph and turns the ids into words there (a lookup in the
vocabulary, joined with spaces). Serving needs TensorFlow alone, neither
keras_attention nor keras:

    import tensorflow as tf
    served = tf.saved_model.load("runs/caption/show_attend_tell/saved_model")
    served.caption(images)  # (b, 16, 64) float32 in [0, 1]
    # -> {"caption": [b"four one seven", ...], "attention": (b, 6, 64)}
"""

import tensorflow as tf

from examples.caption.data import END
from examples.caption.data import FIRST_WORD
from examples.caption.data import HEIGHT
from examples.caption.data import VOCABULARY
from examples.caption.data import WIDTH


class CaptionServer(tf.Module):
    """`caption(images)`: `(b, HEIGHT, WIDTH)` float32 canvases in [0, 1]
    -> `{"caption": (b,) string, "attention": (b, steps, cells)}` (each
    generated token's attention over the grid; zeros after `[END]`)."""

    def __init__(self, captioner):
        super().__init__(name="captioner")
        self.captioner = captioner
        self.model = captioner.model  # tracks the variables for saving
        self.vocabulary = tf.constant(VOCABULARY)
        self.caption = tf.function(
            self._caption,
            input_signature=[
                tf.TensorSpec([None, HEIGHT, WIDTH], tf.float32, name="image")
            ],
            autograph=False,  # no Python control flow on tensors
        )

    def _caption(self, images):
        ids, attention = self.captioner.generate(images[..., tf.newaxis])
        ids = tf.convert_to_tensor(ids)
        before_end = tf.equal(tf.cumsum(tf.cast(ids == END, tf.int32), 1), 0)
        keep = (ids >= FIRST_WORD) & before_end
        words = tf.ragged.boolean_mask(tf.gather(self.vocabulary, ids), keep)
        return {
            "caption": tf.strings.reduce_join(words, axis=-1, separator=" "),
            "attention": tf.convert_to_tensor(attention),
        }


def export(captioner, path):
    """Writes the SavedModel (`caption`, also `serving_default`)."""
    server = CaptionServer(captioner)
    tf.saved_model.save(
        server, path, signatures={"serving_default": server.caption}
    )
    return server
