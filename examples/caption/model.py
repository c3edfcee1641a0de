"""Models of the `caption` example: a small CNN encoder to a grid of
features, and two decoders that attend over the grid.

- `ShowAttendTell` (Xu et al., 2015, soft attention): an LSTM
  `AttentionRNNDecoder` with `BahdanauAttention` over the flattened grid,
  its state initialised from the mean of the features, and the paper's
  doubly stochastic regularisation `lambda * sum_i (1 - sum_t a_ti)^2`
  added to the loss (`DoublyStochasticPenalty`).
- `TransformerCaptioner`: `TransformerDecoderBlock`s whose
  cross-attention reads the grid.

Both are a Keras training model (teacher forcing: `{"image",
"decoder_ids"} -> logits`) plus `generate(images) -> (ids, attention)`,
greedy decoding of `MAX_STEPS` steps written with `keras.ops` (it runs
eagerly, in `tf.function` and in the exported SavedModel): ids `(b,
MAX_STEPS)` (the words, `[END]`, then padding) and the attention of each
generated word over the grid `(b, MAX_STEPS, rows * columns)`.

`keras_attention.generation.Seq2SeqGenerator` is not used: its encoder
takes token ids (it casts the sources to int32 and masks the padding
id), and an image is not one. A caption is at most six tokens, so the
transformer re-runs its decoder on the prefix at each step (no cache).

Axes in comments: b - batch, t - decoder steps, g - grid cells.
"""

import keras
from keras import ops

from examples.caption.data import END
from examples.caption.data import HEIGHT
from examples.caption.data import MAX_STEPS
from examples.caption.data import PAD
from examples.caption.data import START
from examples.caption.data import VOCABULARY
from examples.caption.data import WIDTH
from keras_attention.blocks import TransformerDecoderBlock
from keras_attention.layers import AttentionRNNDecoder
from keras_attention.layers import BahdanauAttention
from keras_attention.layers import PositionEmbedding
from keras_attention.layers import TokenAndPositionEmbedding

DECODERS = ("show_attend_tell", "transformer")
DECODER_NAMES = {
    "show_attend_tell": "Show, Attend and Tell (LSTM + Bahdanau)",
    "transformer": "transformer decoder",
}
POOLS = 2  # 2x2 max-pools: the grid is (HEIGHT / 4) x (WIDTH / 4)
GRID = (HEIGHT // 2**POOLS, WIDTH // 2**POOLS)


def build_encoder(features, filters=(32, 64), name="encoder"):
    """Image `(b, HEIGHT, WIDTH, 1)` -> grid features `(b, g, features)`:
    two conv blocks (two 3x3 convolutions and a 2x2 max-pool each), a
    1x1 convolution to `features`, flattened row by row, plus a learned
    embedding of each cell's position (the decoders read where a digit
    is from it)."""
    image = keras.Input((HEIGHT, WIDTH, 1), name="image")
    x = image
    for block, width in enumerate(filters):
        for k in range(2):
            x = keras.layers.Conv2D(
                width,
                3,
                padding="same",
                activation="relu",
                name=f"conv{block}_{k}",
            )(x)
        x = keras.layers.MaxPooling2D(2, name=f"pool{block}")(x)
    x = keras.layers.Conv2D(features, 1, name="project")(x)
    grid = keras.layers.Reshape((GRID[0] * GRID[1], features), name="grid")(x)
    grid = grid + PositionEmbedding(GRID[0] * GRID[1], name="cells")(grid)
    grid = keras.layers.LayerNormalization(name="grid_norm")(grid)
    return keras.Model(image, grid, name=name)


@keras.saving.register_keras_serializable(package="examples.caption")
class DoublyStochasticPenalty(keras.layers.Layer):
    """Adds Xu et al.'s (2015, eq. 14) doubly stochastic regularisation to
    the model's losses: `weight * sum_g (1 - sum_t a_tg)^2`, averaged over
    the batch. At each step the weights sum to 1 over the grid; the
    penalty asks every cell to be looked at about once over the caption.
    Padded steps carry zero weights (`AttentionRNNDecoder` zeroes them),
    so the sum over `t` covers the caption's real steps. Called as
    `penalty(logits, alignment)`, it returns the logits unchanged: a
    layer on the path to the model's output (a functional model keeps
    only those, and their losses)."""

    def __init__(self, weight, **kwargs):
        super().__init__(**kwargs)
        self.weight = float(weight)
        self.supports_masking = True  # the logits' target mask passes

    def call(self, logits, alignment, mask=None):
        # b t g -> b g -> b
        coverage = ops.sum(ops.cast(alignment, "float32"), axis=1)
        penalty = ops.mean(ops.sum(ops.square(1.0 - coverage), axis=-1))
        if self.weight:
            self.add_loss(self.weight * penalty)
        return logits

    def get_config(self):
        return {**super().get_config(), "weight": self.weight}


class Captioner:
    """A trained model plus its greedy decoding. Subclasses set
    `self.model`, `self.encoder` and `_step`."""

    kind = None

    def generate(self, images):
        """Greedy captions of `(b, HEIGHT, WIDTH, 1)` images: `(ids (b,
        MAX_STEPS) int32, attention (b, MAX_STEPS, g) float32)`; after the
        first `[END]`, ids are `PAD` and attention rows zeros."""
        raise NotImplementedError


def _finish(tokens, weights):
    """Stacks the steps' tokens and attention; pads after `[END]`."""
    ids = ops.stack(tokens, axis=1)  # b t
    attention = ops.stack(weights, axis=1)  # b t g
    is_end = ops.cast(ops.equal(ids, END), "int32")
    after = ops.cumsum(is_end, axis=1) - is_end  # ends before this step
    keep = ops.equal(after, 0)
    ids = ops.where(keep, ids, ops.cast(PAD, ids.dtype))
    attention = ops.where(keep[..., None], attention, 0.0)
    return ids, attention


class ShowAttendTell(Captioner):
    """Soft attention of Show, Attend and Tell (Xu et al., 2015): at step
    `t` the LSTM's previous state queries the grid with Bahdanau
    attention, and the context is fed to the cell with the embedded
    previous word (`AttentionRNNDecoder(attention_style="bahdanau")`);
    `h_0, c_0` are `tanh` layers of the mean grid feature, as in the
    paper; the word comes from the output state (dropout, `Dense`)."""

    kind = "show_attend_tell"

    def __init__(
        self,
        features=128,
        units=256,
        attention_units=128,
        embedding_dim=64,
        dropout=0.3,
        penalty=0.0,
    ):
        self.encoder = build_encoder(features)
        image = keras.Input((HEIGHT, WIDTH, 1), name="image")
        decoder_ids = keras.Input(
            (MAX_STEPS,), dtype="int32", name="decoder_ids"
        )
        grid = self.encoder(image)
        mean = keras.layers.GlobalAveragePooling1D(name="mean_grid")(grid)
        self.init_h = keras.layers.Dense(
            units, activation="tanh", name="init_h"
        )
        self.init_c = keras.layers.Dense(
            units, activation="tanh", name="init_c"
        )
        self.embedding = keras.layers.Embedding(
            len(VOCABULARY), embedding_dim, mask_zero=True, name="words"
        )
        self.decoder = AttentionRNNDecoder(
            units,
            attention=BahdanauAttention(attention_units),
            cell="lstm",
            attention_style="bahdanau",
            return_attention_scores=True,
            name="decoder",
        )
        self.dropout = keras.layers.Dropout(dropout, name="output_dropout")
        self.head = keras.layers.Dense(
            len(VOCABULARY), dtype="float32", name="logits"
        )
        self.penalty = DoublyStochasticPenalty(
            penalty, name="doubly_stochastic"
        )
        outputs, alignment = self.decoder(
            self.embedding(decoder_ids),
            grid,
            initial_state=[self.init_h(mean), self.init_c(mean)],
        )
        logits = self.penalty(self.head(self.dropout(outputs)), alignment)
        self.model = keras.Model(
            {"image": image, "decoder_ids": decoder_ids},
            logits,
            name="show_attend_tell",
        )

    def generate(self, images):
        grid = self.encoder(images)
        mean = ops.mean(grid, axis=1)
        batch = ops.shape(images)[0]
        states = self.decoder.get_initial_state(
            batch, [self.init_h(mean), self.init_c(mean)]
        )
        prepared = self.decoder.prepare_memory(grid)
        token = ops.full((batch,), START, "int32")
        tokens, weights = [], []
        for t in range(MAX_STEPS):
            output, states, alpha = self.decoder.step(
                self.embedding(token),
                states,
                grid,
                step_index=t,
                prepared_memory=prepared,
            )
            token = ops.cast(ops.argmax(self.head(output), axis=-1), "int32")
            tokens.append(token)
            weights.append(ops.cast(alpha, "float32"))
        return _finish(tokens, weights)


class TransformerCaptioner(Captioner):
    """Decoder blocks (causal self-attention over the words so far,
    cross-attention to the grid, feed-forward; post-norm) on learned
    word and position embeddings. The attention of a word over the image
    is the last block's cross-attention, averaged over its heads."""

    kind = "transformer"

    def __init__(
        self,
        features=128,
        num_layers=2,
        num_heads=4,
        intermediate_dim=256,
        dropout=0.1,
    ):
        self.encoder = build_encoder(features)
        image = keras.Input((HEIGHT, WIDTH, 1), name="image")
        decoder_ids = keras.Input((None,), dtype="int32", name="decoder_ids")
        self.embedding = TokenAndPositionEmbedding(
            len(VOCABULARY), MAX_STEPS, features, mask_zero=True, name="words"
        )
        self.blocks = [
            TransformerDecoderBlock(
                num_heads, intermediate_dim, dropout=dropout, name=f"block_{i}"
            )
            for i in range(num_layers)
        ]
        self.head = keras.layers.Dense(
            len(VOCABULARY), dtype="float32", name="logits"
        )
        grid = self.encoder(image)
        y = self.embedding(decoder_ids)
        for block in self.blocks:
            y = block(y, grid)
        self.model = keras.Model(
            {"image": image, "decoder_ids": decoder_ids},
            self.head(y),
            name="transformer_captioner",
        )

    def decode(self, grid, decoder_ids):
        """Logits `(b, t, vocabulary)` and the last block's cross-attention
        averaged over heads `(b, t, g)` of the prefixes `decoder_ids`."""
        y = self.embedding(decoder_ids)
        padding = ops.not_equal(decoder_ids, PAD)
        for block in self.blocks:
            y, _, cross = block(
                y, grid, padding_mask=padding, return_attention_scores=True
            )
        return self.head(y), ops.mean(ops.cast(cross, "float32"), axis=1)

    def generate(self, images):
        grid = self.encoder(images)
        batch = ops.shape(images)[0]
        prefix = ops.full((batch, 1), START, "int32")
        tokens = []
        for _ in range(MAX_STEPS):
            logits, cross = self.decode(grid, prefix)
            token = ops.cast(ops.argmax(logits[:, -1], axis=-1), "int32")
            tokens.append(token)
            prefix = ops.concatenate([prefix, token[:, None]], axis=1)
        # The attention of each generated word: the last pass's rows (the
        # decoder is causal, so row t is what step t saw).
        weights = [cross[:, t] for t in range(MAX_STEPS)]
        return _finish(tokens, weights)


def build_captioner(kind, **kwargs):
    if kind == "show_attend_tell":
        return ShowAttendTell(**kwargs)
    if kind == "transformer":
        return TransformerCaptioner(**kwargs)
    raise ValueError(f"`kind` must be one of {DECODERS}. Received: {kind!r}")
