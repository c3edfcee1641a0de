"""`causal_lm_generator` and `seq2seq_generator`: cached generation on
converted keras-hub models (decoder-only; T5)."""

import keras

from keras_attention.blocks.transformer_decoder_block import (
    TransformerDecoderBlock,
)
from keras_attention.generation.decoder_only import CausalLMGenerator
from keras_attention.interop import _seq2seq
from keras_attention.interop._common import LayerScalar
from keras_attention.layers.token_and_position_embedding import (
    TokenAndPositionEmbedding,
)

# Layers a converted model may run between its token embedding and its
# first block (Gemma's scale, BLOOM's layer norm, dropout).
_EMBEDDING_STEPS = (
    keras.layers.Rescaling,
    keras.layers.LayerNormalization,
    keras.layers.RMSNormalization,
    keras.layers.Dropout,
)
_NORMS = (keras.layers.LayerNormalization, keras.layers.RMSNormalization)
_EMBEDDINGS = (TokenAndPositionEmbedding, keras.layers.ReversibleEmbedding)


class _EmbeddingSteps:
    """The token embedding followed by the model's steps before its first
    block (`Rescaling`, layer norms); passes `start_index` on to a
    position embedding."""

    def __init__(self, embedding, steps):
        self.embedding = embedding
        self.steps = steps

    def __call__(self, token_ids, start_index=0):
        if isinstance(self.embedding, TokenAndPositionEmbedding):
            x = self.embedding(token_ids, start_index=start_index)
        else:
            x = self.embedding(token_ids)
        for step in self.steps:
            x = step(x)
        return x


class _ScaledBlock:
    """A decoder block followed by its `LayerScalar` (Gemma 4's output
    scale): the block's cache protocol (`init_cache`, `cache_window`,
    ...), its output scaled."""

    def __init__(self, block, scale):
        self.block = block
        self.scale = scale

    def __getattr__(self, name):
        return getattr(self.__dict__["block"], name)

    def __call__(self, x, **kwargs):
        x, cache = self.block(x, **kwargs)
        return self.scale(x), cache


def _scaled_blocks(ops):
    """`ops` (the operations between the embedding steps and the final
    norm) as decoder blocks, each `LayerScalar` joined to the block
    before it; None unless `ops` are blocks, each maybe followed by one
    `LayerScalar`."""
    blocks = []
    for op in ops:
        if isinstance(op, TransformerDecoderBlock):
            blocks.append(op)
        elif (
            isinstance(op, LayerScalar)
            and blocks
            and isinstance(blocks[-1], TransformerDecoderBlock)
        ):
            blocks[-1] = _ScaledBlock(blocks[-1], op)
        else:
            return None
    return blocks or None


class _ReverseEmbedding:
    """The logits head: hidden states through the token table's reverse
    projection (`ReversibleEmbedding(..., reverse=True)`)."""

    def __init__(self, table):
        self.table = table

    def __call__(self, hidden):
        return self.table(hidden, reverse=True)


def causal_lm_generator(model, pad_token_id=0, jit_compile=True):
    """A `CausalLMGenerator` on a decoder-only model converted by
    `from_keras_hub` (GPT-2, Llama, Mistral, Mixtral, Gemma, BLOOM, Phi-3,
    Qwen 3, Qwen 3.5, Qwen3-MoE, SmolLM3, gpt-oss; Qwen 2, Qwen-MoE,
    Qwen 3.5-MoE, Falcon, OPT, GPT-NeoX), with
    keras-hub's `CausalLM` head: the logits are the final norm's output
    through the
    token embedding's reverse projection (the tied table, or Llama's and
    Mistral's separate one).

    Greedy generation gives the tokens of keras-hub's `CausalLM.generate`
    with `sampler="greedy"` on the same prompts (tested); a windowed model
    (Mistral) decodes with a rolling cache of the window's size, one
    windowed on some layers only (gpt-oss, `GptOssBackbone`) with a
    mixed cache (rolling for those layers, full for the others).

    Args:
        model: a converted decoder-only model (or one reloaded from its
            `.keras` file): a token embedding (`TokenAndPositionEmbedding`
            or `keras.layers.ReversibleEmbedding`), then
            optional `Rescaling`, norm or dropout layers (Gemma's
            embedding scale, BLOOM's embedding layer norm),
            `TransformerDecoderBlock`s (each maybe followed by a
            `LayerScalar`, Gemma 4's output scale), then a final norm
            (its last layer).
        pad_token_id: int, the prompts' padding id (keras-hub's
            preprocessors pad with 0 by default for these models).
        jit_compile: bool, compile `generate` with XLA (TensorFlow).

    Returns:
        A `keras_attention.generation.CausalLMGenerator`.

    Raises:
        ValueError: when `model` does not have that layout.

    Example:

    >>> import numpy as np
    >>> import keras_hub
    >>> import keras_attention
    >>> backbone = keras_hub.models.GPT2Backbone(
    ...     vocabulary_size=20, num_layers=1, num_heads=2, hidden_dim=8,
    ...     intermediate_dim=16, max_sequence_length=8)
    >>> model = keras_attention.interop.from_keras_hub(backbone)
    >>> lm = keras_attention.interop.causal_lm_generator(
    ...     model, jit_compile=False)
    >>> out, _ = lm.generate(np.array([[5, 7, 0, 0, 0]]), max_length=5)
    >>> tuple(out.shape)
    (1, 5)

    References:
        - Radford et al., 2019, "Language Models are Unsupervised Multitask
          Learners".
    """
    ops = [
        op
        for op in model.operations
        if not isinstance(op, keras.layers.InputLayer)
    ]
    is_block = [isinstance(op, TransformerDecoderBlock) for op in ops]
    first_block = is_block.index(True) if any(is_block) else len(ops)
    embedding = ops[0] if ops else None
    steps = ops[1:first_block]
    blocks, norm = _scaled_blocks(ops[first_block:-1]), ops[-1] if ops else None
    if (
        not isinstance(embedding, _EMBEDDINGS)
        or not all(isinstance(op, _EMBEDDING_STEPS) for op in steps)
        or not blocks
        or not isinstance(norm, _NORMS)
    ):
        raise ValueError(
            "`model` must be a decoder-only model converted by "
            "`from_keras_hub`: a token embedding, maybe rescaling, norm or "
            "dropout layers, decoder blocks, a final norm. Received: "
            f"model={model.name!r} with operations "
            f"{[type(op).__name__ for op in model.operations]!r}"
        )
    table = getattr(embedding, "token_embedding", embedding)
    steps = [op for op in steps if not isinstance(op, keras.layers.Dropout)]
    if steps:
        embedding = _EmbeddingSteps(embedding, steps)
    return CausalLMGenerator(
        embedding,
        blocks,
        [norm, _ReverseEmbedding(table)],
        pad_token_id=pad_token_id,
        jit_compile=jit_compile,
    )


def seq2seq_generator(model, pad_token_id=0, jit_compile=True):
    """A `Seq2SeqGenerator` on an encoder-decoder model converted by
    `from_keras_hub` (T5, BART), with the head of keras-hub's
    `Seq2SeqLM` task: the decoder's output through the reverse projection
    of its token table (T5: times `hidden_dim ** -0.5` when the table is
    tied, as `T5Seq2SeqLM`).

    The pieces are read from the model's functional graph, not by family
    (`interop._seq2seq`): the decoder's embedding is the chain of layers
    from `decoder_token_ids` to the first decoder block (a token table,
    maybe a learned position table, which decoding gives the absolute
    position, a norm, a scale), the head the layers after the last block
    (a final norm) then the token table reversed, the encoder the model
    from the other inputs to `encoder_sequence_output`. The sources are
    encoded once (token sources: their padding is `pad_token_id`); each
    decoder block's cross-attention keys/values are computed once per
    source and the self-attention keys/values cached. T5 starts its
    targets with the padding id: pass `padding_mask` to
    `generate` (`Seq2SeqGenerator.generate`) so that the start token
    counts as real. Greedy generation gives the tokens of keras-hub's
    `T5Seq2SeqLM` and `BartSeq2SeqLM` (tested).

    Args:
        model: a converted encoder-decoder model (or one reloaded from its
            `.keras` file): inputs `decoder_token_ids`,
            `decoder_padding_mask` and the encoder's
            (`encoder_token_ids`, `encoder_padding_mask`), outputs
            `encoder_sequence_output` and `decoder_sequence_output`,
            `TransformerDecoderBlock`s with cross-attention after a
            `ReversibleEmbedding` of `decoder_token_ids`.
        pad_token_id: int, the padding id of sources and targets (T5's 0,
            BART's 1).
        jit_compile: bool, compile `generate` with XLA (TensorFlow).

    Returns:
        A `keras_attention.generation.Seq2SeqGenerator`.

    Raises:
        ValueError: when `model` does not have that layout.

    Example:

    >>> import numpy as np
    >>> import keras_hub
    >>> import keras_attention
    >>> backbone = keras_hub.models.T5Backbone(
    ...     vocabulary_size=20, num_layers=1, num_heads=2, hidden_dim=8,
    ...     intermediate_dim=16)
    >>> model = keras_attention.interop.from_keras_hub(backbone)
    >>> t5 = keras_attention.interop.seq2seq_generator(
    ...     model, jit_compile=False)
    >>> prompt = np.zeros((1, 6), "int32")  # the start token, 0
    >>> start = np.arange(6)[None] < 1
    >>> out, _ = t5.generate(
    ...     np.array([[5, 7, 9, 0]]), prompt, padding_mask=start)
    >>> tuple(out.shape)
    (1, 6)

    References:
        - Raffel et al., 2020, "Exploring the Limits of Transfer Learning
          with a Unified Text-to-Text Transformer" (T5).
    """
    try:
        return _seq2seq.build_generator(model, pad_token_id, jit_compile)
    except _seq2seq.LayoutError as error:
        inputs = model.input if isinstance(model.input, dict) else {}
        raise ValueError(
            "`model` must be an encoder-decoder model converted by "
            "`from_keras_hub`: inputs `decoder_token_ids`, "
            "`decoder_padding_mask` and its encoder's, outputs "
            "`encoder_sequence_output` and `decoder_sequence_output`, "
            "decoder blocks with cross-attention after a reversible token "
            f"table ({error}). Received: model={model.name!r} with inputs "
            f"{sorted(inputs)!r} and layers "
            f"{sorted(layer.name for layer in model.layers)!r}"
        ) from None
