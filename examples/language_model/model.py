"""Decoder-only transformer, cached generation and metrics of the
`language_model` example.

    logits = Dense(LayerNorm(Block_L(... Block_1(Embedding(ids)))))

Each block is a pre-norm `TransformerDecoderBlock(cross_attention=False)`:
causal self-attention (sliding-window `LocalSelfAttention` with `window`)
and a feed-forward network. `keras_attention.generation.CausalLMGenerator`
drives the `keras_hub` samplers with a fixed-size key/value cache.

Positions, and why (issue 17). The model is trained on windows of
`sequence_length` characters but generates `max_length` of them, which is
longer. A learned absolute position table (`positions="learned"`, the old
setup) leaves positions `sequence_length ..` untrained: the generated text
collapses there. Rotary positions (`positions="rotary"`, the default) make
attention depend on the distance `i - j` only, but with full causal
attention generation still meets distances (and numbers of keys) never
seen in training, and rotary models are known to extrapolate poorly. With
rotary positions *and* a sliding window (`window < sequence_length`: query
`i` sees keys `i - window .. i`) every query at generation sees at most
`window + 1` keys at distances `0 .. window`, exactly what every training
position `>= window` saw, so nothing at generation is out of distribution,
however long it runs. The example
measures it: bits/char on windows of the generation length match the
training-length figure (`positional_bits_per_character`).
"""

import math
import time

import keras
import keras_hub
import numpy as np

from examples.common.packing import SegmentPositions
from examples.language_model.options import POSITIONS
from examples.language_model.options import layer_mixers
from keras_attention.blocks import TransformerDecoderBlock
from keras_attention.distribution import get_layout_map
from keras_attention.generation import CausalLMGenerator
from keras_attention.layers import SinusoidalPositionEncoding
from keras_attention.layers import TokenAndPositionEmbedding
from keras_attention.scores import ALiBi
from keras_attention.scores import T5RelativeBias

SAMPLERS = ("greedy", "beam", "top_k", "top_p")
DISTRIBUTIONS = ("none", "data", "model")


@keras.saving.register_keras_serializable(package="examples_lm")
class TokenAndSinusoidalEmbedding(keras.layers.Layer):
    """Token embedding plus `SinusoidalPositionEncoding` at positions
    `start_index ..` (the generators pass the cache index)."""

    def __init__(self, vocabulary_size, hidden_dim, **kwargs):
        super().__init__(**kwargs)
        self.vocabulary_size = vocabulary_size
        self.hidden_dim = hidden_dim
        self.tokens = keras.layers.Embedding(
            vocabulary_size, hidden_dim, name="tokens"
        )
        self.positions = SinusoidalPositionEncoding(name="sinusoids")

    def build(self, input_shape):
        self.tokens.build(input_shape)
        self.positions.build(tuple(input_shape) + (self.hidden_dim,))

    def call(self, token_ids, start_index=0, positions=None):
        x = self.tokens(token_ids)
        return x + self.positions(
            x, start_index=start_index, positions=positions
        )

    def compute_output_shape(self, input_shape):
        return tuple(input_shape) + (self.hidden_dim,)

    def get_config(self):
        config = super().get_config()
        config.update(
            vocabulary_size=self.vocabulary_size, hidden_dim=self.hidden_dim
        )
        return config


NEWLINE = ord("\n")


def make_sampler(name, seed=0, num_beams=4, k=10, p=0.9, temperature=0.8):
    """A `keras_hub` sampler by name."""
    if name == "greedy":
        return keras_hub.samplers.GreedySampler()
    if name == "beam":
        return keras_hub.samplers.BeamSampler(num_beams=num_beams)
    if name == "top_k":
        return keras_hub.samplers.TopKSampler(
            k=k, seed=seed, temperature=temperature
        )
    if name == "top_p":
        return keras_hub.samplers.TopPSampler(
            p=p, seed=seed, temperature=temperature
        )
    raise ValueError(
        f"`sampler` must be one of {SAMPLERS}. Received: sampler={name!r}"
    )


def build_language_model(
    vocabulary_size,
    max_length,
    hidden_dim=128,
    num_layers=3,
    num_heads=4,
    dropout=0.1,
    window=None,
    positions="rotary",
    rotary_max_wavelength=10_000,
    mixer="attention",
):
    """Returns `(model, generator)`.

    `model`: token ids `(batch, T)` -> next-token logits `(batch, T, V)`.
    `generator`: a `CausalLMGenerator` over the same layers (XLA off, so
    that it also runs inside a SavedModel as is).

    `positions="rope"` (default; `"rotary"` too): a token embedding
    without position table, rotary positions in every self-attention; any
    `T`, but only distances seen in training generalize (see the module
    docstring: use a `window` shorter than the training windows to
    generate longer texts). `positions="learned"`:
    `TokenAndPositionEmbedding` with a table of `max_length` positions
    (`T <= max_length`); positions beyond the training windows stay
    untrained. `"sinusoidal"`: fixed sinusoids added to the token
    embeddings (any `T`). `"alibi"`: no position input, `ALiBi` in every
    self-attention. `"t5"`: no position input, one `T5RelativeBias`
    (causal buckets) shared by every block's self-attention.

    `mixer` (`options.MIXERS`): the blocks' token mixer, per block as
    `options.layer_mixers` says: softmax self-attention (`"attention"`),
    `LinearAttention` with a gated decay (`"linear"`), `GatedDeltaNet`
    (`"gated_delta"`, its heads as the attention's: `num_heads` of
    `hidden_dim // num_heads`), or gated delta nets with an attention
    block every fourth and last (`"hybrid"`). `window` and the positions
    of the blocks (rotary, ALiBi, T5) go to the attention blocks only; a
    mixer block keeps a recurrent state, and the order of the tokens
    enters through it (and `GatedDeltaNet`'s short convolution).
    """
    if positions not in POSITIONS:
        raise ValueError(
            f"`positions` must be one of {POSITIONS}. "
            f"Received: positions={positions!r}"
        )
    # b - batch, t - positions, d - features, v - vocabulary
    ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    block_kwargs = {} if window is None else {"window_size": window}
    if positions == "learned":
        embedding = TokenAndPositionEmbedding(
            vocabulary_size, max_length, hidden_dim, name="embedding"
        )
    elif positions == "sinusoidal":
        embedding = TokenAndSinusoidalEmbedding(
            vocabulary_size, hidden_dim, name="embedding"
        )
    else:
        embedding = keras.layers.Embedding(
            vocabulary_size, hidden_dim, name="embedding"
        )
    if positions in ("rope", "rotary"):
        block_kwargs["rotary_max_wavelength"] = rotary_max_wavelength
    elif positions == "alibi":
        block_kwargs["score_mod"] = ALiBi()
    elif positions == "t5":  # one table for the stack, as in T5
        block_kwargs["score_mod"] = T5RelativeBias(bidirectional=False)
    blocks = [
        TransformerDecoderBlock(
            num_heads=num_heads,
            intermediate_dim=4 * hidden_dim,
            cross_attention=False,
            norm_first=True,
            dropout=dropout,
            name=f"decoder_block_{i}",
            **(
                block_kwargs
                if kind == "attention"
                else mixer_arguments(kind, hidden_dim, num_heads)
            ),
        )
        for i, kind in enumerate(layer_mixers(mixer, num_layers))
    ]
    final_norm = keras.layers.LayerNormalization(name="final_norm")
    to_logits = keras.layers.Dense(
        vocabulary_size, dtype="float32", name="logits"
    )
    x = embedding(ids)  # (b, t, d)
    for block in blocks:
        x = block(x)
    logits = to_logits(final_norm(x))  # (b, t, v)
    model = keras.Model(ids, logits, name="char_transformer_lm")
    generator = CausalLMGenerator(
        embedding,
        blocks,
        [final_norm, to_logits],
        pad_token_id=0,
        jit_compile=False,
    )
    return model, generator


def mixer_arguments(mixer, hidden_dim, num_heads):
    """The block arguments of a linear-time mixer (`"linear"` or
    `"gated_delta"`) in `build_language_model`: as many heads as the
    attention's, of the same size."""
    if mixer == "linear":
        return dict(mixer="linear", mixer_options=dict(decay="gated"))
    head_dim = hidden_dim // num_heads
    return dict(
        mixer="gated_delta",
        mixer_options=dict(
            linear_num_key_heads=num_heads,
            linear_num_value_heads=num_heads,
            linear_key_head_dim=head_dim,
            linear_value_head_dim=head_dim,
        ),
    )


def block_mixers(model):
    """The `mixer` of each `TransformerDecoderBlock` of `model`, in order
    (what a run built).

    Example:

    >>> from examples.language_model.model import block_mixers
    >>> from examples.language_model.model import build_language_model
    >>> model, _ = build_language_model(
    ...     40, 24, hidden_dim=8, num_heads=2, num_layers=2, mixer="hybrid")
    >>> block_mixers(model)
    ['gated_delta', 'attention']
    """
    return [
        layer.mixer
        for layer in model.layers
        if isinstance(layer, TransformerDecoderBlock)
    ]


def packed_language_model(model):
    """The model of `build_language_model` (the same layers and weights)
    reading packed windows (`--pack`): `{"token_ids", "segment_ids"}`
    `(batch, T)` -> logits `(batch, T, V)`.

    Each token attends only within its document (the blocks'
    `segment_ids=`), and positions restart at 0 in each document: the
    rotary positions inside the blocks, the `positions=` of a learned or
    sinusoidal embedding (ALiBi and T5 biases depend on distances within
    the document only). A document's logits are those it gets alone.
    """
    # b - batch, t - positions, d - features, v - vocabulary
    ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    segments = keras.Input(shape=(None,), dtype="int32", name="segment_ids")
    embedding = model.get_layer("embedding")
    if isinstance(embedding, keras.layers.Embedding):
        x = embedding(ids)  # (b, t, d), positions in the blocks if any
    else:
        positions = SegmentPositions(name="segment_positions")(segments)
        x = embedding(ids, positions=positions)  # (b, t, d)
    for layer in model.layers:
        if isinstance(layer, TransformerDecoderBlock):
            x = layer(x, segment_ids=segments)
    x = model.get_layer("final_norm")(x)
    logits = model.get_layer("logits")(x)  # (b, t, v)
    return keras.Model(
        {"token_ids": ids, "segment_ids": segments},
        logits,
        name="packed_char_transformer_lm",
    )


def make_distribution(kind, model_axis_size=2):
    """A Keras distribution (JAX backend) over all devices, or None.

    `"data"`: `keras.distribution.DataParallel` (weights replicated, each
    batch split over the devices). `"model"`: `ModelParallel` on a
    `(devices // model_axis_size, model_axis_size)` mesh with axes
    `("batch", "model")`, the weights sharded by
    `keras_attention.distribution.get_layout_map` (attention by heads, the
    feed-forward networks Megatron-style) and the batch split over
    `"batch"`. `"none"`: None (one device).

    On a CPU-only machine, JAX shows N virtual devices with
    `XLA_FLAGS=--xla_force_host_platform_device_count=N` set before it
    starts.
    """
    if kind not in DISTRIBUTIONS:
        raise ValueError(
            f"`kind` must be one of {DISTRIBUTIONS}. Received: kind={kind!r}"
        )
    if kind == "none":
        return None
    devices = keras.distribution.list_devices()
    if kind == "data":
        return keras.distribution.DataParallel(devices=devices)
    if len(devices) % model_axis_size:
        raise ValueError(
            f"`model_axis_size` must divide the number of devices "
            f"({len(devices)}). Received: model_axis_size={model_axis_size!r}"
        )
    mesh = keras.distribution.DeviceMesh(
        (len(devices) // model_axis_size, model_axis_size),
        ("batch", "model"),
        devices,
    )
    return keras.distribution.ModelParallel(
        layout_map=get_layout_map(mesh),
        batch_dim_name="batch",
    )


def generates_any_length(generator):
    """Whether `generator` completes prompts of any length: every block's
    self-attention is windowed (the generator keeps a rolling cache of
    the window, whatever the length) or a linear-time mixer (a recurrent
    state of constant size), and the embedding has no learned position
    table (`positions="learned"`).

    Example:

    >>> from examples.language_model.model import build_language_model
    >>> from examples.language_model.model import generates_any_length
    >>> _, generator = build_language_model(40, 24, hidden_dim=8, window=4)
    >>> generates_any_length(generator)
    True
    """
    windowed = all(  # a mixer's recurrent state: any length too
        block.mixer != "attention"
        or block.self_attention.cache_window() is not None
        for block in generator.blocks
    )
    learned = isinstance(generator.embedding, TokenAndPositionEmbedding)
    return windowed and not learned


def complete(generator, prompts, sampler, max_length, vocabulary_size):
    """Completes strings with the cached generator, on any backend.

    What the exported SavedModel's signatures do inside the TensorFlow graph
    (`export.LanguageModelServer`), in NumPy around `generator.generate`:
    each prompt, after a newline (lines start after one in training), is
    encoded as code points (those above the vocabulary map to its last id,
    as in `examples.common.text.character_tokenizer`). A windowed model
    (`generates_any_length`: a rolling cache) reads the whole prompt and
    completes it up to the end of the line or `max_length` characters;
    otherwise the prompt is cut to its last `max_length // 2` and completed
    up to the end of the line or `max_length` characters in all.

    Args:
        generator: the `CausalLMGenerator` of `build_language_model`.
        prompts: a sequence of strings.
        sampler: a `keras_hub` sampler or its name.
        max_length: completion characters (a windowed model), or prompt +
            completion characters.
        vocabulary_size: the model's vocabulary size.

    Returns:
        a list of strings, the completions (without the prompts).
    """
    # b - prompts, t - character positions
    any_length = generates_any_length(generator)
    encoded = []
    for prompt in prompts:
        codes = [min(ord(c), vocabulary_size - 1) for c in "\n" + prompt]
        encoded.append(codes if any_length else codes[-(max_length // 2) :])
    lengths = np.array([[len(codes)] for codes in encoded], "int32")
    width = int(lengths.max()) + max_length if any_length else max_length
    ids = np.zeros((len(prompts), width), "int32")
    for row, codes in enumerate(encoded):
        ids[row, : len(codes)] = codes
    out, mask = generator.generate(
        ids, sampler=sampler, stop_token_ids=(NEWLINE,)
    )
    out = keras.ops.convert_to_numpy(out)  # (b, t)
    mask = keras.ops.convert_to_numpy(mask).astype(bool)  # (b, t)
    positions = np.arange(width)
    keep = (positions >= lengths) & mask & (out != NEWLINE)
    if any_length:
        keep &= positions < lengths + max_length
    return ["".join(map(chr, row[k])) for row, k in zip(out, keep)]


def stream_text(
    generator,
    prompt,
    sampler,
    max_length,
    vocabulary_size,
    sink_tokens=0,
    piece=256,
):
    """Streams a completion of `prompt` as it is produced, on any backend.

    `generator.generate(..., stream=piece)`: with a windowed model the
    generator keeps a rolling cache (`window + 1 + sink_tokens` positions
    per block), so time per character and memory do not grow with
    `max_length`, and nothing of the text is kept here either.

    Args:
        generator: the `CausalLMGenerator` of `build_language_model` (with
            a `window`).
        prompt: a string (a newline is put before it, as in `complete`).
        sampler: a `keras_hub` sampler or its name that draws each token
            from the logits (greedy, top-k, top-p).
        max_length: prompt + completion characters.
        vocabulary_size: the model's vocabulary size.
        sink_tokens: the first positions kept visible beside the window.
        piece: characters per piece.

    Yields:
        strings, the completion piece by piece (newlines included: the
        text does not stop at the end of a line).
    """
    codes = [min(ord(c), vocabulary_size - 1) for c in "\n" + prompt]
    pieces = generator.generate(
        np.array(codes, "int32"),
        max_length=max(max_length, len(codes)),
        sampler=sampler,
        stream=piece,
        # a stack without windowed attention keeps no rolling cache
        **({"sink_tokens": sink_tokens} if sink_tokens else {}),
    )
    skip = len(codes)
    for tokens in pieces:
        yield "".join(map(chr, tokens[skip:]))
        skip = 0


class StepTimer(keras.callbacks.Callback):
    """Wall-clock time of each training step (to compare backends)."""

    def __init__(self):
        super().__init__()
        self.times = []

    def on_train_batch_begin(self, batch, logs=None):
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.times.append(time.perf_counter() - self._start)

    def median_ms(self):
        """Median step time in ms, the first (compiling) step left out."""
        times = self.times[1:] or self.times
        return 1000 * float(np.median(times)) if times else float("nan")


def bits_per_character(loss):
    """Mean cross-entropy in nats per character -> bits per character."""
    return loss / math.log(2.0)


def positional_bits_per_character(model, batches):
    """Teacher-forced bits per character at each position of the windows.

    Args:
        model: token ids `(batch, T)` -> logits `(batch, T, V)`.
        batches: `(inputs, targets)` batches of int `(batch, T)` windows
            (NumPy arrays or tensors).

    Returns:
        float64 `(T,)`: `mean_b -log2 softmax(logits[b, t])[targets[b, t]]`.
    """
    # b - windows, t - positions, v - vocabulary
    # Eager JAX compiles every operation for every new shape: the model's
    # predict function (`predict_on_batch`, jitted unless the model was
    # compiled with `jit_compile=False`), once per batch shape, is cheaper.
    # Eager TensorFlow and PyTorch run the operations as they come.
    use_predict = keras.backend.backend() == "jax"
    total, count = 0.0, 0
    for inputs, targets in batches:
        inputs = np.asarray(inputs)
        logits = keras.ops.convert_to_numpy(
            model.predict_on_batch(inputs)
            if use_predict
            else model(inputs, training=False)
        )
        logits = logits.astype("float64")
        logits -= logits.max(-1, keepdims=True)
        log_z = np.log(np.exp(logits).sum(-1))  # (b, t)
        targets = np.asarray(targets)
        picked = np.take_along_axis(logits, targets[..., None], -1)[..., 0]
        total = total + (log_z - picked).sum(0)  # (t,)
        count += targets.shape[0]
    if not count:
        raise ValueError("`batches` is empty: no window to evaluate.")
    return total / count / math.log(2.0)
