"""How `seq2seq_generator` reads a converted encoder-decoder model (private
to `interop`): its pieces found in its functional graph, not by family.

A converted encoder-decoder model has the inputs `decoder_token_ids` and
`decoder_padding_mask` beside its encoder's, the outputs
`encoder_sequence_output` and `decoder_sequence_output`, and a chain of
`TransformerDecoderBlock`s with cross-attention. Read from the graph:

- the decoder's embedding: the operations from `decoder_token_ids` to the
  first block's input (a token table, maybe a learned position table
  added, a norm, a scale), replayed with the absolute position passed to
  those that take `start_index`;
- the head: the operations from the last block's output to
  `decoder_sequence_output` (a final norm), then the reverse projection of
  the token table that embeds `decoder_token_ids`;
- the encoder: the model from the other inputs to the context the blocks
  cross-attend to and, where the blocks are given one that is not an
  input, the context's padding mask (computed by the model: Moonshine's
  mask of its downsampled frames).

Sources of token ids (`encoder_token_ids`, `encoder_padding_mask`) go
through `Seq2SeqGenerator`; other encoder inputs (audio features, raw
audio and its mask) through `EncoderInputsGenerator`, whose sources are
those inputs.
"""

import inspect

import keras
from keras import ops

from keras_attention.blocks.transformer_decoder_block import (
    TransformerDecoderBlock,
)
from keras_attention.generation.encoder_decoder import Seq2SeqGenerator

DECODER_INPUTS = ("decoder_token_ids", "decoder_padding_mask")
TOKEN_SOURCES = ("encoder_token_ids", "encoder_padding_mask")
# The final norm of a converted T5 (`interop.t5`): keras-hub's
# `T5Seq2SeqLM` scales the logits of a tied table by `hidden ** -0.5`.
T5_FINAL_NORM = "decoder_output_layer_norm"


class LayoutError(ValueError):
    """A model whose graph is not that of a converted encoder-decoder."""


def _node(tensor):
    """The graph node that produced the symbolic `tensor`."""
    operation, node_index, _ = tensor._keras_history
    return operation._inbound_nodes[node_index]


def _subgraph(target, stop):
    """The nodes computing `target` from the tensors where `stop(tensor)`
    holds, in an order that computes each after its inputs; raises
    `LayoutError` when a path reaches a model input that is no stop."""
    order, seen = [], set()

    def visit(tensor):
        if stop(tensor):
            return
        node = _node(tensor)
        if id(node) in seen:
            return
        seen.add(id(node))
        if node.is_input:
            raise LayoutError(f"an unexpected input {tensor.name!r}")
        for parent in node.arguments.keras_tensors:
            visit(parent)
        order.append(node)

    visit(target)
    return order


def _takes_start_index(operation):
    """Whether the operation's `call` takes `start_index` (a position
    embedding: the absolute position of its first step)."""
    call = getattr(operation, "call", operation)
    try:
        return "start_index" in inspect.signature(call).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        return False


def _run(nodes, values, start_index=0):
    """Replays `nodes` from `values` (`{id(symbolic tensor): value}`),
    passing `start_index` to the operations whose call takes one; returns
    `values` completed."""
    for node in nodes:
        args, kwargs = node.arguments.fill_in(values)
        if _takes_start_index(node.operation):
            kwargs = dict(kwargs, start_index=start_index)
        outputs = keras.tree.flatten(node.operation(*args, **kwargs))
        for symbolic, value in zip(node.outputs, outputs):
            values[id(symbolic)] = value
    return values


class GraphSteps(keras.layers.Layer):
    """Replays the operations of a model's graph between one tensor and
    another (a decoder's embedding, its final norm): a layer holding the
    model's layers (shared, not copied), so that the generators find a
    learned position table in it. Not saved: made anew from the model."""

    def __init__(self, nodes, source, target, **kwargs):
        super().__init__(**kwargs)
        self._nodes = list(nodes)
        self.steps = [node.operation for node in self._nodes]
        self._source, self._target = source, target
        self.built = True

    def call(self, inputs, start_index=0):
        values = _run(self._nodes, {id(self._source): inputs}, start_index)
        return values[id(self._target)]

    def compute_mask(self, inputs, mask=None):
        return None


class _ReverseEmbedding:
    """The logits: hidden states through a token table's reverse
    projection."""

    def __init__(self, table):
        self.table = table

    def __call__(self, hidden):
        return self.table(hidden, reverse=True)


def _block_arguments(node):
    """A decoder block's call arguments in `node`, by name."""
    bound = inspect.signature(node.operation.call).bind(
        *node.arguments.args, **node.arguments.kwargs
    )
    return bound.arguments


def _decoder_blocks(output):
    """`(blocks, first block node, head nodes, last output, embedding
    output)`: the chain of decoder blocks ending before `output`, the node
    of the first, the nodes after the last, the last one's output and the
    tensor the first takes."""

    def made_by_block(tensor):
        return isinstance(_node(tensor).operation, TransformerDecoderBlock)

    head = _subgraph(output, made_by_block)
    last = output
    for node in head:
        for parent in node.arguments.keras_tensors:
            if made_by_block(parent):
                last = parent
    if not made_by_block(last):
        raise LayoutError("no decoder block before the decoder's output")
    blocks, node = [], _node(last)
    while True:
        blocks.insert(0, node.operation)
        x = _block_arguments(node)["inputs"]
        if not made_by_block(x):
            return blocks, node, head, last, x
        node = _node(x)


def read_layout(model):
    """The pieces of a converted encoder-decoder `model`: a dict with
    `blocks`, `embedding` (the one layer on `decoder_token_ids`, else a
    `GraphSteps`), `table` (the decoder's `ReversibleEmbedding`), `head`
    (a `GraphSteps` from the last block to `decoder_sequence_output`) and
    `head_names` (its layers' names), `encoder_inputs` (their names),
    `context` and `context_mask` (symbolic tensors; the mask None when the
    blocks take none or an encoder input)."""
    inputs = model.input if isinstance(model.input, dict) else {}
    outputs = model.output if isinstance(model.output, dict) else {}
    needed = ("encoder_sequence_output", "decoder_sequence_output")
    if not all(name in inputs for name in DECODER_INPUTS) or not all(
        name in outputs for name in needed
    ):
        raise LayoutError(
            f"inputs {sorted(inputs)!r}, outputs {sorted(outputs)!r}"
        )
    output = outputs["decoder_sequence_output"]
    blocks, first, head, last, embedded = _decoder_blocks(output)
    if not all(block.cross_attention for block in blocks):
        raise LayoutError("decoder blocks without cross-attention")
    ids = inputs["decoder_token_ids"]
    steps = _subgraph(embedded, lambda tensor: tensor is ids)
    table = steps[0].operation if steps else None
    if not isinstance(table, keras.layers.ReversibleEmbedding):
        table = getattr(table, "token_embedding", table)
    if not isinstance(table, keras.layers.ReversibleEmbedding):
        raise LayoutError("no reversible token table on `decoder_token_ids`")
    arguments = _block_arguments(first)
    context_mask = arguments.get("context_padding_mask")
    if any(context_mask is tensor for tensor in inputs.values()):
        context_mask = None  # an encoder input: the sources' own mask
    if len(steps) == 1:
        embedding = steps[0].operation  # one layer: its vocabulary checked
    else:
        embedding = GraphSteps(steps, ids, embedded, name="decoder_embedding")
    return dict(
        blocks=blocks,
        embedding=embedding,
        table=table,
        head=GraphSteps(head, last, output, name="decoder_head"),
        head_names=[node.operation.name for node in head],
        encoder_inputs=sorted(n for n in inputs if n not in DECODER_INPUTS),
        context=arguments["context"],
        context_mask=context_mask,
    )


class EncoderInputsGenerator(Seq2SeqGenerator):
    """A `Seq2SeqGenerator` whose sources are the encoder's inputs (audio
    features; raw audio and its padding mask) instead of token ids: a
    dict of them by input name, or the one input's array.

    `encoder(sources)` returns `(context, context_mask)` (the mask None:
    every encoder position is real)."""

    _input_names = ("sources",)

    def __init__(self, encoder, names, *args, **kwargs):
        super().__init__(encoder, *args, **kwargs)
        self.source_names = tuple(names)

    def encode(self, sources):
        """Returns `(context, context_mask)` for the sources."""
        context, mask = self.encoder(sources)
        if mask is None:
            mask = ops.ones(ops.shape(context)[:2], "bool")
        return context, ops.cast(mask, "bool")

    def _cache_inputs(self, sources=None):
        context, context_mask = self.encode(sources)
        return dict(context=context, context_padding_mask=context_mask)

    def generate(
        self,
        sources,
        decoder_token_ids,
        max_length=None,
        sampler="greedy",
        stop_token_ids=None,
        padding_mask=None,
    ):
        """Generates target sequences for `sources`: the encoder's inputs,
        a dict by name (`source_names`), or for an encoder of one input
        its `(batch, ...)` array; the other arguments and the outputs as
        `Seq2SeqGenerator.generate` (prompts `(batch, T)` only)."""
        token_ids, padding_mask, unbatched = self._prepare(
            decoder_token_ids, padding_mask, max_length, "decoder_token_ids"
        )
        if unbatched:
            raise ValueError(
                "`decoder_token_ids` must be a `(batch, T)` batch of prompts "
                "for an encoder of inputs "
                f"{self.source_names!r}. Received: decoder_token_ids.shape="
                f"{tuple(ops.shape(decoder_token_ids))!r}"
            )
        sources = self._check_sources(sources, token_ids.shape[0])
        return self._generate(
            sampler, stop_token_ids, token_ids, padding_mask, False, sources
        )

    def _check_sources(self, sources, batch):
        """`sources` as a dict of the encoder's inputs, one row per prompt."""
        if not isinstance(sources, dict):
            if len(self.source_names) != 1:
                raise ValueError(
                    "`sources` must be a dict of the encoder's inputs "
                    f"{self.source_names!r}. Received: sources={sources!r}"
                )
            sources = {self.source_names[0]: sources}
        if sorted(sources) != sorted(self.source_names):
            raise ValueError(
                f"`sources` must hold the encoder's inputs "
                f"{self.source_names!r}. Received: keys {sorted(sources)!r}"
            )
        sources = {k: ops.convert_to_tensor(v) for k, v in sources.items()}
        for name, value in sources.items():
            rows = value.shape[0] if len(value.shape) else None
            if batch is not None and rows is not None and rows != batch:
                raise ValueError(
                    f"`sources[{name!r}]` must hold one row per prompt "
                    f"({batch!r}). Received: sources[{name!r}].shape="
                    f"{tuple(value.shape)!r}"
                )
        return sources


def build_generator(model, pad_token_id, jit_compile):
    """The generator of a converted encoder-decoder `model` (see the module
    docstring); raises `LayoutError` when it has not that layout."""
    layout = read_layout(model)
    inputs, outputs = model.input, model.output
    table = layout["table"]
    head = [layout["head"]]
    if T5_FINAL_NORM in layout["head_names"] and table.tie_weights:
        # keras-hub's `T5Seq2SeqLM` rescales a tied table's logits.
        head.append(
            keras.layers.Rescaling(
                table.output_dim**-0.5, dtype=table.dtype_policy
            )
        )
    head.append(_ReverseEmbedding(table))
    context = outputs["encoder_sequence_output"]
    if layout["encoder_inputs"] == sorted(TOKEN_SOURCES):
        encoder_model = keras.Model(
            {name: inputs[name] for name in TOKEN_SOURCES}, context
        )

        def encoder(token_ids):
            padding = ops.cast(ops.not_equal(token_ids, pad_token_id), "int32")
            return encoder_model(
                {
                    "encoder_token_ids": token_ids,
                    "encoder_padding_mask": padding,
                }
            )

        return Seq2SeqGenerator(
            encoder,
            layout["embedding"],
            layout["blocks"],
            head,
            pad_token_id=pad_token_id,
            jit_compile=jit_compile,
        )
    names = layout["encoder_inputs"]
    mask = layout["context_mask"]
    encoder_model = keras.Model(
        {name: inputs[name] for name in names},
        context if mask is None else (context, mask),
    )

    def encode(sources):
        if mask is None:
            return encoder_model(sources), None
        return encoder_model(sources)

    return EncoderInputsGenerator(
        encode,
        names,
        layout["embedding"],
        layout["blocks"],
        head,
        pad_token_id=pad_token_id,
        jit_compile=jit_compile,
    )
