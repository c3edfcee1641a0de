"""`causal_lm_generator` and `seq2seq_generator`: cached generation on
converted keras-hub models (decoder-only; T5)."""

import keras

from keras_attention.blocks.transformer_decoder_block import (
    TransformerDecoderBlock,
)
from keras_attention.generation.decoder_only import CausalLMGenerator
from keras_attention.generation.encoder_decoder import Seq2SeqGenerator
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
    Qwen 3, Qwen 3.5, Qwen3-MoE, SmolLM3, gpt-oss), with
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
            `TransformerDecoderBlock`s, then a final norm (its last
            layer).
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
    blocks, norm = ops[first_block:-1], ops[-1] if ops else None
    if (
        not isinstance(embedding, _EMBEDDINGS)
        or not all(isinstance(op, _EMBEDDING_STEPS) for op in steps)
        or not blocks
        or not all(isinstance(op, TransformerDecoderBlock) for op in blocks)
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
    `from_keras_hub` (T5), with keras-hub's `T5Seq2SeqLM` head: the
    decoder's final norm, times `hidden_dim ** -0.5` when the token table
    is tied, then the table's reverse projection.

    The sources are encoded once (their padding is `pad_token_id`); each
    decoder block's cross-attention keys/values are computed once per
    source and the self-attention keys/values cached. T5 starts its
    targets with the padding id: pass `padding_mask` to
    `generate` (`Seq2SeqGenerator.generate`) so that the start token
    counts as real. Greedy generation gives the tokens of keras-hub's
    `T5Seq2SeqLM` (tested).

    Args:
        model: a converted T5 model (or one reloaded from its `.keras`
            file): inputs `encoder_token_ids`, `encoder_padding_mask`,
            `decoder_token_ids`, `decoder_padding_mask`; a
            `token_embedding`, `TransformerDecoderBlock`s with
            cross-attention and the norms `encoder_output_layer_norm` and
            `decoder_output_layer_norm`.
        pad_token_id: int, the padding id of sources and targets (T5's 0).
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
    names = (
        "encoder_token_ids",
        "encoder_padding_mask",
        "decoder_token_ids",
        "decoder_padding_mask",
    )
    inputs = model.input if isinstance(model.input, dict) else {}
    layers = {layer.name: layer for layer in model.layers}
    blocks = [
        layer
        for layer in model.layers
        if isinstance(layer, TransformerDecoderBlock)
    ]
    needed = ("token_embedding", "decoder_output_layer_norm")
    outputs = model.output if isinstance(model.output, dict) else {}
    if (
        sorted(inputs) != sorted(names)
        or not all(name in layers for name in needed)
        or "encoder_sequence_output" not in outputs
        or not blocks
        or not all(block.cross_attention for block in blocks)
        or not isinstance(
            layers["token_embedding"], keras.layers.ReversibleEmbedding
        )
    ):
        raise ValueError(
            "`model` must be an encoder-decoder model converted by "
            "`from_keras_hub` (T5): inputs "
            f"{names!r}, a `token_embedding` (`ReversibleEmbedding`), "
            "decoder blocks with cross-attention and a "
            "`decoder_output_layer_norm`. Received: "
            f"model={model.name!r} with inputs {sorted(inputs)!r} and "
            f"layers {sorted(layers)!r}"
        )
    encoder_model = keras.Model(
        {name: inputs[name] for name in names[:2]},
        outputs["encoder_sequence_output"],
    )

    def encoder(token_ids):
        padding = keras.ops.cast(
            keras.ops.not_equal(token_ids, pad_token_id), "int32"
        )
        return encoder_model(
            {"encoder_token_ids": token_ids, "encoder_padding_mask": padding}
        )

    embedding = layers["token_embedding"]
    head = [layers["decoder_output_layer_norm"]]
    if embedding.tie_weights:  # T5Seq2SeqLM's rescaling of a tied head
        hidden = embedding.output_dim
        head.append(
            keras.layers.Rescaling(hidden**-0.5, dtype=embedding.dtype_policy)
        )
    head.append(_ReverseEmbedding(embedding))
    return Seq2SeqGenerator(
        encoder,
        embedding,
        blocks,
        head,
        pad_token_id=pad_token_id,
        jit_compile=jit_compile,
    )
