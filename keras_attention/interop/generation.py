"""`causal_lm_generator`: cached generation on a converted decoder-only
keras-hub model."""

import keras

from keras_attention.blocks.transformer_decoder_block import (
    TransformerDecoderBlock,
)
from keras_attention.generation.decoder_only import CausalLMGenerator
from keras_attention.layers.token_and_position_embedding import (
    TokenAndPositionEmbedding,
)


class _ScaledEmbedding:
    """The token embedding followed by the model's `Rescaling` (Gemma's
    `sqrt(hidden_dim)`)."""

    def __init__(self, embedding, rescaling):
        self.embedding = embedding
        self.rescaling = rescaling

    def __call__(self, token_ids):
        return self.rescaling(self.embedding(token_ids))


class _ReverseEmbedding:
    """The logits head: hidden states through the token table's reverse
    projection (`ReversibleEmbedding(..., reverse=True)`)."""

    def __init__(self, table):
        self.table = table

    def __call__(self, hidden):
        return self.table(hidden, reverse=True)


def causal_lm_generator(model, pad_token_id=0, jit_compile=True):
    """A `CausalLMGenerator` on a decoder-only model converted by
    `from_keras_hub` (GPT-2, Llama, Mistral, Gemma), with keras-hub's
    `CausalLM` head: the logits are the final norm's output through the
    token embedding's reverse projection (the tied table, or Llama's and
    Mistral's separate one).

    Greedy generation gives the tokens of keras-hub's `CausalLM.generate`
    with `sampler="greedy"` on the same prompts (tested); a windowed model
    (Mistral) decodes with a rolling cache of the window's size.

    Args:
        model: a converted decoder-only model (or one reloaded from its
            `.keras` file): a token embedding (`TokenAndPositionEmbedding`
            or `keras.layers.ReversibleEmbedding`), then
            an optional `keras.layers.Rescaling` (Gemma's embedding
            scale), `TransformerDecoderBlock`s, then a final norm (its last
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
    embeddings = [
        layer
        for layer in model.layers
        if isinstance(
            layer, (TokenAndPositionEmbedding, keras.layers.ReversibleEmbedding)
        )
    ]
    blocks = [
        layer
        for layer in model.layers
        if isinstance(layer, TransformerDecoderBlock)
    ]
    norm = model.layers[-1] if model.layers else None
    rescalings = [
        layer
        for layer in model.layers
        if isinstance(layer, keras.layers.Rescaling)
    ]
    # What the generator runs (dropout is the identity at inference); it
    # would skip any other step.
    known = (keras.layers.InputLayer, keras.layers.Dropout)
    others = [
        type(op).__name__
        for op in model.operations
        if not isinstance(op, known)
        and op is not norm
        and op not in embeddings
        and op not in blocks
        and op not in rescalings
    ]
    if (
        others
        or len(rescalings) > 1
        or len(embeddings) != 1
        or not blocks
        or not isinstance(
            norm,
            (keras.layers.LayerNormalization, keras.layers.RMSNormalization),
        )
    ):
        raise ValueError(
            "`model` must be a decoder-only model converted by "
            "`from_keras_hub` (one token embedding, maybe a rescaling, "
            "decoder blocks, a final norm, nothing else). Received: "
            f"model={model.name!r} with operations "
            f"{[type(op).__name__ for op in model.operations]!r}"
        )
    embedding = embeddings[0]
    table = getattr(embedding, "token_embedding", embedding)
    if rescalings:
        embedding = _ScaledEmbedding(embedding, rescalings[0])
    return CausalLMGenerator(
        embedding,
        blocks,
        [norm, _ReverseEmbedding(table)],
        pad_token_id=pad_token_id,
        jit_compile=jit_compile,
    )
