"""Models of the `translate` example, built from `keras_attention.layers`.

Each builder returns a `Translator`: the Keras training model (teacher
forcing: `{"encoder_ids", "decoder_ids"} -> logits`) and the pieces that
decode step by step with the `keras_hub` samplers (greedy or beam) and that
give the cross-attention weights of a translation (for the heatmaps).

Axes in comments: b - batch, s - source positions, t - target positions.
"""

import keras
import keras_hub
from keras import ops

from keras_attention.blocks import TransformerDecoderBlock
from keras_attention.blocks import TransformerEncoderBlock
from keras_attention.generation import Seq2SeqGenerator
from keras_attention.layers import AttentionRNNDecoder
from keras_attention.layers import BahdanauAttention
from keras_attention.layers import EncoderBridge
from keras_attention.layers import LuongAttention
from keras_attention.layers import TokenAndPositionEmbedding

PAD = 0


def _sampler(decode, beam_size):
    if decode == "beam":
        return keras_hub.samplers.BeamSampler(num_beams=beam_size)
    return keras_hub.samplers.GreedySampler()


class Translator:
    """A trained model plus its decoding. Subclasses set `self.model`."""

    def __init__(
        self,
        start_id,
        end_id,
        max_target_length,
        decode="greedy",
        beam_size=4,
        jit_compile=False,
    ):
        self.start_id, self.end_id = start_id, end_id
        self.max_target_length = max_target_length
        self.decode = decode
        self.beam_size = beam_size
        self.jit_compile = jit_compile

    def _prompt(self, encoder_ids):
        # b, t: [START] then padding up to the output length.
        batch = ops.shape(encoder_ids)[0]
        start = ops.full((batch, 1), self.start_id, "int32")
        pad = ops.zeros((batch, self.max_target_length - 1), "int32")
        return ops.concatenate([start, pad], axis=1)

    def generate(self, encoder_ids):
        """`(b, max_target_length)` ids: [START], tokens, [END], padding."""
        raise NotImplementedError

    def cross_attention(self, encoder_ids, decoder_ids):
        """`(b, t, s)` attention of each target position to the source,
        teacher-forced on `decoder_ids` (e.g. a generated translation)."""
        raise NotImplementedError


class TransformerTranslator(Translator):
    """Transformer encoder-decoder (Vaswani et al., 2017): post-norm
    encoder blocks, decoder blocks with cross-attention, cached generation
    through `keras_attention.generation.Seq2SeqGenerator`.

    Positions are learned tables of `max_source_length` and
    `max_target_length` entries. Training targets are truncated to
    `max_target_length` ids and generation produces exactly that many, so
    decoding never reaches a position the training targets did not (unlike
    issue 17's language model); the generator refuses a longer length at
    its start (`check_length_fits`)."""

    def __init__(
        self,
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
        super().__init__(start_id, end_id, max_target_length, **kwargs)
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
            )
            for i in range(num_layers)
        ]
        # Logits in float32 under mixed precision.
        self.head = keras.layers.Dense(
            target_vocabulary_size, dtype="float32", name="logits"
        )
        context = self.encoder(encoder_ids)
        context_mask = ops.not_equal(encoder_ids, PAD)
        y = self.embedding(decoder_ids)
        for block in self.blocks:
            y = block(y, context, context_padding_mask=context_mask)
        logits = self.head(y)
        self.model = keras.Model(
            {"encoder_ids": encoder_ids, "decoder_ids": decoder_ids},
            logits,
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

    def generate(self, encoder_ids):
        ids, _ = self.generator.generate(
            encoder_ids,
            self._prompt(encoder_ids),
            sampler=_sampler(self.decode, self.beam_size),
            stop_token_ids=(self.end_id,),
        )
        return ids

    def cross_attention(self, encoder_ids, decoder_ids):
        context = self.encoder(encoder_ids)
        context_mask = ops.not_equal(encoder_ids, PAD)
        y = self.embedding(decoder_ids)
        for block in self.blocks:
            y, _, weights = block(
                y,
                context,
                padding_mask=ops.not_equal(decoder_ids, PAD),
                context_padding_mask=context_mask,
                return_attention_scores=True,
            )
        # b, heads, t, s -> b, t, s (of the last block)
        return ops.mean(weights, axis=1)


class RNNTranslator(Translator):
    """Bidirectional GRU encoder, `EncoderBridge`, `AttentionRNNDecoder`
    with Bahdanau (Bahdanau et al., 2015) or Luong (Luong et al., 2015)
    attention; teacher forcing in training, step-by-step decoding with the
    `keras_hub` samplers (greedy or beam) through the decoder's `step`."""

    def __init__(
        self,
        source_vocabulary_size,
        target_vocabulary_size,
        max_source_length,
        max_target_length,
        start_id,
        end_id,
        embedding_dim=64,
        encoder_units=128,
        decoder_units=256,
        attention="bahdanau",
        score="general",
        alignment="global",
        window=None,
        dropout=0.0,
        **kwargs,
    ):
        super().__init__(start_id, end_id, max_target_length, **kwargs)
        del max_source_length  # RNNs take any length.
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
        # s_0 = tanh(W [h_fwd_T; h_bwd_1] + b)
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
            attention=_attention_layer(
                attention, decoder_units, score, alignment, window
            ),
            attention_style=attention,
            return_attention_scores=True,  # the alignment, for the plots
            dropout=dropout,
            name="decoder",
        )
        self.head = keras.layers.Dense(
            target_vocabulary_size, dtype="float32", name="logits"
        )
        memory, state = self.encoder(encoder_ids)
        memory_mask = ops.not_equal(encoder_ids, PAD)
        outputs, _ = self.decoder(
            self.embedding(decoder_ids),
            memory,
            initial_state=state,
            memory_mask=memory_mask,
        )
        self.model = keras.Model(
            {"encoder_ids": encoder_ids, "decoder_ids": decoder_ids},
            self.head(outputs),
            name="rnn_translator",
        )

    def _next(self, prompt, cache, index):
        """The sampler callback: logits of position `index` from the token
        at `index - 1` and the carried decoder states and memory."""
        states, memory, prepared, memory_mask = cache
        token = ops.take(prompt, index - 1, axis=1)  # b
        output, states, _ = self.decoder.step(
            self.embedding(token),
            list(states),
            memory,
            memory_mask=ops.cast(memory_mask, "bool"),
            step_index=index - 1,
            prepared_memory=prepared,
        )
        cache = (tuple(states), memory, prepared, memory_mask)
        return self.head(output), output, cache

    def generate(self, encoder_ids):
        memory, state = self.encoder(encoder_ids)
        states = self.decoder.get_initial_state(
            ops.shape(encoder_ids)[0], state
        )
        memory_mask = ops.cast(ops.not_equal(encoder_ids, PAD), "int32")
        prepared = self.decoder.prepare_memory(memory)
        prompt = self._prompt(encoder_ids)
        ids = _sampler(self.decode, self.beam_size)(
            next=self._next,
            prompt=prompt,
            cache=(tuple(states), memory, prepared, memory_mask),
            index=1,
            mask=ops.not_equal(prompt, PAD),
            stop_token_ids=(self.end_id,),
        )
        return _pad_after_end(ids, self.end_id)

    def cross_attention(self, encoder_ids, decoder_ids):
        memory, state = self.encoder(encoder_ids)
        _, weights = self.decoder(
            self.embedding(decoder_ids),
            memory,
            initial_state=state,
            memory_mask=ops.not_equal(encoder_ids, PAD),
        )
        return weights  # b, t, s


def _pad_after_end(ids, end_id):
    """Keeps `[START]` and the tokens up to the first generated `[END]`,
    pads the rest (a sampler goes on writing rows that ended early)."""
    # b - batch, t - positions; position 0 holds [START].
    is_end = ops.cast(ops.equal(ids[:, 1:], end_id), "int32")
    ended_before = ops.cumsum(is_end, axis=1) - is_end  # b, t - 1
    keep = ops.concatenate(
        [ops.ones_like(ids[:, :1], "bool"), ops.equal(ended_before, 0)], axis=1
    )
    return ops.where(keep, ids, ops.cast(PAD, ids.dtype))


def _attention_layer(kind, units, score, alignment, window):
    if kind == "bahdanau":
        return BahdanauAttention(units)
    return LuongAttention(
        score_mode=score,
        alignment=alignment,
        window=window,
        units=units if score == "concat" else None,
    )


def build_translator(kind, **kwargs):
    """`kind` is "rnn" or "transformer"; see the two classes for kwargs."""
    if kind == "transformer":
        for name in (
            "embedding_dim",
            "encoder_units",
            "decoder_units",
            "attention",
            "score",
            "alignment",
            "window",
        ):
            kwargs.pop(name, None)
        return TransformerTranslator(**kwargs)
    for name in ("hidden_dim", "num_heads", "intermediate_dim", "num_layers"):
        kwargs.pop(name, None)
    return RNNTranslator(**kwargs)
