"""String-in, string-out serving of a `Translator`, and its SavedModel.

The serving function runs the whole pipeline inside the TensorFlow graph:
tokenize (keras_hub tokenizer ops), pad, encode, the sampler's generation
loop over the decoder, strip the special tokens, detokenize. Loading the
exported SavedModel needs TensorFlow and `tensorflow_text`, whose ops the
tokenizers run in the graph (`CaseFoldUTF8` lowercases the dates' sources;
WordPiece for language pairs): without `import tensorflow_text` loading
fails with `Op type not registered 'CaseFoldUTF8'`. It needs neither
keras_attention nor keras:

    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the tokenizers' ops)
    translator = tf.saved_model.load(path)
    translator.translate(tf.constant(["29 novembre 2026"]))
    # -> [b"2026-11-29"]
"""

import tensorflow as tf

from examples.common import text


class StringTranslator(tf.Module):
    """A `tf.Module` whose `translate(strings) -> strings` serves a model."""

    def __init__(
        self, translator, source_tokenizer, target_tokenizer, max_source_length
    ):
        super().__init__(name="translator")
        self.translator = translator
        self.model = translator.model  # tracks the variables for saving
        self.source_tokenizer = source_tokenizer
        self.target_tokenizer = target_tokenizer
        self.max_source_length = max_source_length
        self.translate = tf.function(
            self._translate,
            input_signature=[tf.TensorSpec([None], tf.string)],
            # No Python control flow on tensors (the samplers loop with
            # `while_loop`): AutoGraph would only add seconds of tracing.
            autograph=False,
        )

    def tokenize(self, sentences):
        """Padded `(b, s)` source ids of a batch of strings."""
        ids = self.source_tokenizer(sentences)
        if isinstance(ids, tf.RaggedTensor):
            ids = ids[:, : self.max_source_length].to_tensor(0)
        # One padding column more: empty inputs still give a (b, 1) batch.
        return tf.pad(tf.cast(ids, "int32"), [[0, 0], [0, 1]])

    def detokenize(self, ids):
        """Strings of generated `(b, t)` ids (special tokens removed)."""
        pad, start, end = text.special_ids(self.target_tokenizer)
        keep = (ids != pad) & (ids != start) & (ids != end)
        tokens = tf.ragged.boolean_mask(ids, keep)
        strings = self.target_tokenizer.detokenize(tokens)
        return tf.strings.strip(strings)

    def _translate(self, sentences):
        ids = self.translator.generate(self.tokenize(sentences))
        return self.detokenize(tf.convert_to_tensor(ids))


def export(string_translator, path):
    """Writes the SavedModel with a `translate` serving signature."""
    tf.saved_model.save(
        string_translator,
        path,
        signatures={"serving_default": string_translator.translate},
    )
    return path
