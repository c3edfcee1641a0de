"""The string-serving SavedModel of the `classify` example.

Tokenization (WordPiece), the classifier and the choice of the class name
run inside the TensorFlow graph. Loading the SavedModel needs TensorFlow
and `tensorflow_text`, which registers the WordPiece ops; neither
keras_attention nor keras_hub:

    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the WordPiece ops)
    served = tf.saved_model.load("runs/classify/saved_model")
    served.classify(tf.constant(["a person who writes poems"]))["label"]
"""

import tensorflow as tf

from examples.classify.model import pad_ids


class ClassifierServer(tf.Module):
    """What the SavedModel serves: raw strings in, class names out.

    `classify(text)` takes a `(batch,)` string tensor and returns
    `{"label": (batch,) string, "probability": (batch,) float32,
    "attention": (batch, max_length) float32}`; tokenization runs inside
    the graph (only TensorFlow and `tensorflow_text` are needed to serve).
    """

    def __init__(self, attention_model, tokenizer, class_names, max_length):
        super().__init__()
        self.attention_model = attention_model
        self.tokenizer = tokenizer
        self.class_names = tf.constant(list(class_names))
        self.max_length = max_length

    @tf.function(
        input_signature=[tf.TensorSpec([None], tf.string, name="text")]
    )
    def classify(self, text):
        ids = pad_ids(self.tokenizer(text), self.max_length)
        probabilities, weights = self.attention_model(ids, training=False)
        best = tf.argmax(probabilities, axis=-1, output_type=tf.int32)
        return {
            "label": tf.gather(self.class_names, best),
            "probability": tf.reduce_max(probabilities, axis=-1),
            "attention": tf.cast(weights, tf.float32),
        }


def export_classifier(
    path, attention_model, tokenizer, class_names, max_length
):
    """Writes the string-serving SavedModel; returns the server module."""
    server = ClassifierServer(
        attention_model, tokenizer, class_names, max_length
    )
    tf.saved_model.save(
        server, path, signatures={"serving_default": server.classify}
    )
    return server
