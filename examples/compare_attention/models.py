"""The attention variants of the study, built on the `translate` models.

Variants the `translate` example's `build_translator` already offers
(Bahdanau, Luong dot / general / concat / local-m / local-p, the full
transformer) are built by it. The others need a hook its builders do not
have, so they are small subclasses that reuse its decoding
(`generate`, `cross_attention`):

- `rnn-bahdanau-norm`: `BahdanauAttention(normalize=True)` (weight-
  normalized score vector, Luong-style scale `g`);
- `rnn-none`: no attention at all: one fixed vector, the `EncoderBridge`
  state, starts the decoder and is fed at every step (Cho et al., 2014,
  the baseline of Bahdanau et al., 2015);
- `transformer-local`: every block's self-attention in a `window_size`
  band (`LocalSelfAttention`); cross-attention stays full;
- `transformer-gqa`: grouped-query attention, `num_key_value_heads=1`
  (one key/value head shared by all query heads, i.e. multi-query);
- `transformer-alibi`, `transformer-t5`, `transformer-softcap`: the full
  transformer with ALiBi, a T5 relative position bias, or soft-capped
  scores (`SOFT_CAP`) in every self-attention (`keras_attention.scores`).

Axes in comments: b - batch, s - source positions, t - target positions.
"""

import keras
import keras_hub
from keras import ops

from examples.compare_attention import options
from examples.translate.model import PAD
from examples.translate.model import RNNTranslator
from examples.translate.model import TransformerTranslator
from examples.translate.model import Translator
from examples.translate.model import build_translator
from keras_attention.blocks import TransformerDecoderBlock
from keras_attention.blocks import TransformerEncoderBlock
from keras_attention.generation import Seq2SeqGenerator
from keras_attention.layers import AttentionRNNDecoder
from keras_attention.layers import BahdanauAttention
from keras_attention.layers import EncoderBridge
from keras_attention.layers import TokenAndPositionEmbedding
from keras_attention.scores import ALiBi
from keras_attention.scores import SoftCap
from keras_attention.scores import T5RelativeBias

# name -> (family, options); the order is the order of the report.
VARIANTS = {
    "rnn-none": ("rnn", {"attention": None}),
    "rnn-bahdanau": ("rnn", {"attention": "bahdanau"}),
    "rnn-bahdanau-norm": ("rnn", {"attention": "bahdanau", "normalize": True}),
    "rnn-luong-dot": ("rnn", {"attention": "luong", "score": "dot"}),
    "rnn-luong-general": ("rnn", {"attention": "luong", "score": "general"}),
    "rnn-luong-concat": ("rnn", {"attention": "luong", "score": "concat"}),
    "rnn-luong-local-m": (
        "rnn",
        {"attention": "luong", "score": "general", "alignment": "local-m"},
    ),
    "rnn-luong-local-p": (
        "rnn",
        {"attention": "luong", "score": "general", "alignment": "local-p"},
    ),
    "transformer-full": ("transformer", {}),
    "transformer-local": ("transformer", {"local": True}),
    "transformer-gqa": ("transformer", {"num_key_value_heads": 1}),
    "transformer-alibi": ("transformer", {"score": "alibi"}),
    "transformer-t5": ("transformer", {"score": "t5"}),
    "transformer-softcap": ("transformer", {"score": "softcap"}),
}

assert tuple(VARIANTS) == options.VARIANTS  # the command line's names

# The soft-capping variant's cap: Gemma 2 caps attention logits at 50,
# on far larger scores than this study's small models reach; 5 makes
# the cap act here (scores stay in (-5, 5)).
SOFT_CAP = 5.0


def make_score(kind, causal):
    """A new score object of `kind` for one block's self-attention:
    ALiBi's per-head linear distance penalty (symmetric in the encoder),
    a T5 relative position bias (its own weights per block; causal
    buckets in the decoder), or soft-capping."""
    if kind == "alibi":
        return ALiBi(bidirectional=not causal)
    if kind == "t5":
        return T5RelativeBias(bidirectional=not causal)
    if kind == "softcap":
        return SoftCap(SOFT_CAP)
    raise ValueError(
        f"`kind` must be 'alibi', 't5' or 'softcap'. Received: kind={kind!r}"
    )


# Model sizes: the study's (default and `--full`) and `--quick`'s.
SIZES = {
    "default": dict(
        embedding_dim=64,
        encoder_units=64,
        decoder_units=128,
        hidden_dim=64,
        num_heads=4,
        intermediate_dim=128,
        num_layers=2,
    ),
    "quick": dict(
        embedding_dim=16,
        encoder_units=16,
        decoder_units=32,
        hidden_dim=16,
        num_heads=2,
        intermediate_dim=32,
        num_layers=1,
    ),
}


class NoAttentionTranslator(Translator):
    """Bidirectional GRU encoder, `EncoderBridge`, plain GRU decoder: the
    whole source reaches the decoder through one fixed vector, the bridge
    state `c`, which starts the decoder (`s_0 = c`) and is fed with every
    target embedding, as in Cho et al. (2014)'s RNN encoder-decoder, the
    baseline of Bahdanau et al. (2015). Same embeddings and sizes as
    `RNNTranslator`."""

    def __init__(
        self,
        source_vocabulary_size,
        target_vocabulary_size,
        start_id,
        end_id,
        max_target_length,
        embedding_dim=64,
        encoder_units=128,
        decoder_units=256,
        dropout=0.0,
        **kwargs,
    ):
        super().__init__(start_id, end_id, max_target_length, **kwargs)
        encoder_ids = keras.Input((None,), dtype="int32", name="encoder_ids")
        decoder_ids = keras.Input((None,), dtype="int32", name="decoder_ids")
        x = keras.layers.Embedding(
            source_vocabulary_size, embedding_dim, mask_zero=True
        )(encoder_ids)
        _, forward_state, backward_state = keras.layers.Bidirectional(
            keras.layers.GRU(encoder_units, return_state=True),
            name="encoder_gru",
        )(x)
        state = EncoderBridge(decoder_units, name="bridge")(
            forward_state, backward_state
        )
        self.encoder = keras.Model(encoder_ids, state, name="encoder")
        self.embedding = keras.layers.Embedding(
            target_vocabulary_size,
            embedding_dim,
            mask_zero=True,
            name="target_embedding",
        )
        self.decoder = keras.layers.GRU(
            decoder_units, return_sequences=True, dropout=dropout
        )
        self.head = keras.layers.Dense(
            target_vocabulary_size, dtype="float32", name="logits"
        )
        context = self.encoder(encoder_ids)  # b, d
        embedded = self.embedding(decoder_ids)  # b, t, e
        repeated = keras.layers.Lambda(
            lambda a: ops.repeat(
                ops.expand_dims(a[0], 1), ops.shape(a[1])[1], axis=1
            ),
            name="repeat_context",
        )([context, decoder_ids])  # b, t, d
        inputs = keras.layers.Concatenate(name="with_context")(
            [embedded, repeated]
        )
        outputs = self.decoder(inputs, initial_state=context)
        self.model = keras.Model(
            {"encoder_ids": encoder_ids, "decoder_ids": decoder_ids},
            self.head(outputs),
            name="no_attention_translator",
        )

    def _next(self, prompt, cache, index):
        # cache: the decoder state and the context, side by side (b, 2d).
        state, context = ops.split(cache, 2, axis=-1)
        token = ops.take(prompt, index - 1, axis=1)  # b
        # The embedding's rows, not the layer: its output carries a padding
        # mask, which the GRU cell (no masking) would drop with a warning.
        embedded = ops.cast(
            ops.take(self.embedding.embeddings, token, axis=0),
            self.embedding.compute_dtype,
        )
        inputs = ops.concatenate(
            [embedded, ops.cast(context, embedded.dtype)], axis=-1
        )
        output, new_state = self.decoder.cell(inputs, [state])
        cache = ops.concatenate([new_state[0], context], axis=-1)
        return self.head(output), output, cache

    def generate(self, encoder_ids):
        prompt = self._prompt(encoder_ids)
        context = self.encoder(encoder_ids)
        ids = keras_hub.samplers.GreedySampler()(
            next=self._next,
            prompt=prompt,
            cache=ops.concatenate([context, context], axis=-1),
            index=1,
            mask=ops.not_equal(prompt, PAD),
            stop_token_ids=(self.end_id,),
        )
        # The sampler goes on writing rows that ended: pad after [END].
        is_end = ops.cast(ops.equal(ids, self.end_id), "int32")
        after_end = ops.greater(ops.cumsum(is_end, axis=1) - is_end, 0)
        return ops.where(after_end, ops.cast(PAD, ids.dtype), ids)

    def cross_attention(self, encoder_ids, decoder_ids):
        raise NotImplementedError("no attention to show")


class AttentionLayerRNNTranslator(RNNTranslator):
    """`RNNTranslator` with a given attention layer (here Bahdanau with
    `normalize=True`, which `build_translator` cannot ask for)."""

    def __init__(
        self,
        attention_layer,
        source_vocabulary_size,
        target_vocabulary_size,
        start_id,
        end_id,
        max_target_length,
        embedding_dim=64,
        encoder_units=128,
        decoder_units=256,
        attention_style="bahdanau",
        dropout=0.0,
        **kwargs,
    ):
        Translator.__init__(self, start_id, end_id, max_target_length, **kwargs)
        encoder_ids = keras.Input((None,), dtype="int32", name="encoder_ids")
        decoder_ids = keras.Input((None,), dtype="int32", name="decoder_ids")
        x = keras.layers.Embedding(
            source_vocabulary_size,
            embedding_dim,
            mask_zero=True,
            name="source_embedding",
        )(encoder_ids)
        memory, forward_state, backward_state = keras.layers.Bidirectional(
            keras.layers.GRU(
                encoder_units, return_sequences=True, return_state=True
            ),
            name="encoder_gru",
        )(x)
        initial_state = EncoderBridge(decoder_units, name="bridge")(
            forward_state, backward_state
        )
        self.encoder = keras.Model(
            encoder_ids, [memory, initial_state], name="encoder"
        )
        self.embedding = keras.layers.Embedding(
            target_vocabulary_size,
            embedding_dim,
            mask_zero=True,
            name="target_embedding",
        )
        self.decoder = AttentionRNNDecoder(
            decoder_units,
            attention=attention_layer,
            attention_style=attention_style,
            return_attention_scores=True,
            dropout=dropout,
            name="decoder",
        )
        self.head = keras.layers.Dense(
            target_vocabulary_size, dtype="float32", name="logits"
        )
        memory, state = self.encoder(encoder_ids)
        outputs, _ = self.decoder(
            self.embedding(decoder_ids),
            memory,
            initial_state=state,
            memory_mask=ops.not_equal(encoder_ids, PAD),
        )
        self.model = keras.Model(
            {"encoder_ids": encoder_ids, "decoder_ids": decoder_ids},
            self.head(outputs),
            name="rnn_translator",
        )


class BlockOptionsTransformerTranslator(TransformerTranslator):
    """`TransformerTranslator` whose encoder and decoder blocks take extra
    options (`window_size`, `num_key_value_heads`), which
    `build_translator` does not pass, and a score object of `score`
    (`make_score`) in every self-attention (the learned absolute positions
    stay: the study changes one thing at a time)."""

    def __init__(
        self,
        block_options,
        score,
        source_vocabulary_size,
        target_vocabulary_size,
        max_source_length,
        max_target_length,
        start_id,
        end_id,
        hidden_dim=128,
        num_heads=4,
        intermediate_dim=512,
        num_layers=2,
        dropout=0.1,
        **kwargs,
    ):
        Translator.__init__(self, start_id, end_id, max_target_length, **kwargs)
        encoder_ids = keras.Input((None,), dtype="int32", name="encoder_ids")
        decoder_ids = keras.Input((None,), dtype="int32", name="decoder_ids")
        x = TokenAndPositionEmbedding(
            source_vocabulary_size,
            max_source_length,
            hidden_dim,
            mask_zero=True,
            name="source_embedding",
        )(encoder_ids)
        for i in range(num_layers):
            x = TransformerEncoderBlock(
                num_heads,
                intermediate_dim,
                dropout=dropout,
                name=f"encoder_block_{i}",
                score_mod=score and make_score(score, causal=False),
                **block_options,
            )(x)
        self.encoder = keras.Model(encoder_ids, x, name="encoder")
        self.embedding = TokenAndPositionEmbedding(
            target_vocabulary_size,
            max_target_length,
            hidden_dim,
            mask_zero=True,
            name="target_embedding",
        )
        self.blocks = [
            TransformerDecoderBlock(
                num_heads,
                intermediate_dim,
                dropout=dropout,
                name=f"decoder_block_{i}",
                score_mod=score and make_score(score, causal=True),
                **block_options,
            )
            for i in range(num_layers)
        ]
        self.head = keras.layers.Dense(
            target_vocabulary_size, dtype="float32", name="logits"
        )
        context = self.encoder(encoder_ids)
        context_mask = ops.not_equal(encoder_ids, PAD)
        y = self.embedding(decoder_ids)
        for block in self.blocks:
            y = block(y, context, context_padding_mask=context_mask)
        self.model = keras.Model(
            {"encoder_ids": encoder_ids, "decoder_ids": decoder_ids},
            self.head(y),
            name="transformer_translator",
        )
        self.generator = Seq2SeqGenerator(
            self.encoder,
            self.embedding,
            self.blocks,
            self.head,
            pad_token_id=PAD,
            jit_compile=self.jit_compile,
        )


def build_variant(
    name,
    source_vocabulary_size,
    target_vocabulary_size,
    max_source_length,
    max_target_length,
    start_id,
    end_id,
    size="default",
    window=8,
    dropout=0.0,
):
    """The `Translator` of variant `name` (a key of `VARIANTS`).

    `window` is the Luong local half-width `D` and the transformer's
    `window_size` (each position sees `window` positions on each side).
    """
    family, options = VARIANTS[name]
    sizes = SIZES[size]
    common = dict(
        source_vocabulary_size=source_vocabulary_size,
        target_vocabulary_size=target_vocabulary_size,
        max_target_length=max_target_length,
        start_id=start_id,
        end_id=end_id,
        dropout=dropout,
    )
    rnn_sizes = {
        k: sizes[k] for k in ("embedding_dim", "encoder_units", "decoder_units")
    }
    block_sizes = {
        k: sizes[k]
        for k in ("hidden_dim", "num_heads", "intermediate_dim", "num_layers")
    }
    if family == "transformer":
        block_options = {}
        if options.get("local"):
            block_options["window_size"] = window
        if "num_key_value_heads" in options:
            block_options["num_key_value_heads"] = options[
                "num_key_value_heads"
            ]
        if not block_options and "score" not in options:
            return build_translator(
                "transformer",
                max_source_length=max_source_length,
                **block_sizes,
                **common,
            )
        return BlockOptionsTransformerTranslator(
            block_options,
            options.get("score"),
            max_source_length=max_source_length,
            **block_sizes,
            **common,
        )
    if options["attention"] is None:
        return NoAttentionTranslator(**rnn_sizes, **common)
    if options.get("normalize"):
        layer = BahdanauAttention(sizes["decoder_units"], normalize=True)
        return AttentionLayerRNNTranslator(layer, **rnn_sizes, **common)
    alignment = options.get("alignment", "global")
    return build_translator(
        "rnn",
        max_source_length=max_source_length,
        attention=options["attention"],
        score=options.get("score", "general"),
        alignment=alignment,
        window=None if alignment == "global" else window,
        **rnn_sizes,
        **common,
    )
