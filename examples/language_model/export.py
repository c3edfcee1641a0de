"""The string-serving SavedModel of the `language_model` example.

The served functions run the whole pipeline inside the TensorFlow graph:
tokenization (Unicode code points), the cached generation loop of
`CausalLMGenerator` with a `keras_hub` sampler, detokenization. Serving
needs neither keras_attention nor keras_hub:

    import tensorflow as tf
    served = tf.saved_model.load("runs/language_model/saved_model")
    served.top_p(tf.constant(["And the LORD said unto Moses,"]))
"""

import tensorflow as tf

from examples.language_model.model import SAMPLERS
from examples.language_model.model import generates_any_length
from examples.language_model.model import make_sampler


class LanguageModelServer(tf.Module):
    """What the SavedModel serves: prompts in, completions out.

    One signature per sampler (`greedy`, `beam`, `top_k`, `top_p`), each
    `(batch,) string -> {"completion": (batch,) string}`: the text generated
    after the prompt, up to the end of the line (the model's "verse end").
    A windowed model (`generates_any_length`) generates with the rolling
    cache: it reads prompts of any length whole and completes each with up
    to `max_length` characters, in memory that grows with neither.
    Otherwise prompts are cut to their last `max_length // 2` characters
    and the completion stops at `max_length` characters in all.
    Tokenization (Unicode code points), the cached generation loop and
    detokenization run inside the graph (as `model.complete` does around
    the generator).
    """

    def __init__(
        self, model, generator, tokenizer, max_length, samplers=SAMPLERS, seed=0
    ):
        super().__init__()
        self.model = model  # tracks the weights the generator's layers use
        self.generator = generator
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.any_length = generates_any_length(generator)
        self.samplers = {
            name: make_sampler(name, seed=seed) for name in samplers
        }
        # The random samplers' seed states are variables too.
        self.sampler_seeds = [
            v for s in self.samplers.values() for v in s.variables
        ]
        spec = tf.TensorSpec([None], tf.string, name="prompt")
        for name in samplers:
            # No AutoGraph: nothing in `_complete` branches on a tensor in
            # Python (the generator's loop is a `tf.function` of its own);
            # converting it only made tracing (the export) slower.
            fn = tf.function(
                lambda prompt, name=name: self._complete(prompt, name),
                input_signature=[spec],
                autograph=False,
            )
            setattr(self, name, fn)

    def _complete(self, prompt, sampler):
        # b - prompts, t - character positions
        # A newline first: the model learned that lines start after one.
        ids = self.tokenizer(tf.strings.join(["\n", prompt]))
        ids = tf.cast(ids, tf.int32)  # ragged
        if self.any_length:
            # The whole prompts, then `max_length` positions to generate:
            # a buffer whose length is known at run time only.
            dense = tf.pad(ids.to_tensor(0), [[0, 0], [0, self.max_length]])
        else:
            ids = ids[:, -(self.max_length // 2) :]
            dense = ids.to_tensor(0, shape=[None, self.max_length])
        lengths = tf.cast(ids.row_lengths(), tf.int32)[:, tf.newaxis]
        out, mask = self.generator.generate(
            dense, sampler=self.samplers[sampler], stop_token_ids=(ord("\n"),)
        )
        positions = tf.range(tf.shape(dense)[1])[tf.newaxis, :]
        keep = (
            (positions >= lengths)
            & tf.cast(mask, tf.bool)
            & tf.not_equal(out, ord("\n"))
        )
        if self.any_length:
            keep &= positions < lengths + self.max_length
        completion = tf.ragged.boolean_mask(out, keep)
        return {"completion": self.tokenizer.detokenize(completion)}


def export_language_model(
    path, model, generator, tokenizer, max_length, samplers=SAMPLERS
):
    """Writes the string-serving SavedModel; returns the server module."""
    server = LanguageModelServer(
        model, generator, tokenizer, max_length, samplers
    )
    signatures = {name: getattr(server, name) for name in samplers}
    signatures["serving_default"] = getattr(server, samplers[0])
    tf.saved_model.save(server, path, signatures=signatures)
    return server
