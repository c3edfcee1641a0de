"""The models of the `pretrain` example: one backbone, three heads.

The backbone is a stack of `TransformerEncoderBlock`s over a
`TokenAndPositionEmbedding`. The three objectives differ only in the
attention mask the blocks get and in the head on top:

Every self-attention of the backbone has one mask object,
`keras_attention.mods.PrefixLMMask()`: query `i` may attend to key `j`
when `j <= i` or `j < p`, with a prefix length `p` per example given at
call time (`mod_inputs={"prefix_length": p}`); no `(batch, T, T)` mask is
built, and the blockwise path skips the tiles it masks out.

- `mlm` (BERT): `p = T` (bidirectional over the real tokens); a
  `keras_hub.layers.MaskedLMHead` predicts the masked tokens.
- `clm` (GPT): `p = 0`, i.e. causal; a dense head predicts the next token
  at every position.
- `prefix_lm` (UniLM, T5's prefix LM): a random `p` per example:
  bidirectional over the prefix, causal after it; the next-token loss
  covers the tokens after the prefix only.
- the classifier: `p = T` (bidirectional).

Packed batches (`--pack`, `mlm` and `clm`) add `segment_ids` `(batch, T)`:
each packed document attends only to itself (the blocks' `segment_ids=`)
and its positions restart at 0 (`masks.segment_positions`).

The models are flat functional models calling the *same* layer objects
(`Backbone`), so a classifier built on a pretrained backbone starts from
its weights, and every attention layer is a layer of the model.
"""

import keras
import keras_hub
from keras import ops

from examples.common.packing import SegmentPositions
from keras_attention.blocks import TransformerEncoderBlock
from keras_attention.layers import AttentionPooling
from keras_attention.layers import TokenAndPositionEmbedding
from keras_attention.mods import PrefixLMMask

OBJECTIVES = ("mlm", "clm", "prefix_lm")
PACKABLE = ("mlm", "clm")  # prefix-LM's prefix is per row, not document


@keras.saving.register_keras_serializable(package="examples_pretrain")
class FullPrefix(keras.layers.Layer):
    """`token_ids (batch, T)` -> `(batch,)` int32, all `T`: the prefix
    length that makes `PrefixLMMask` bidirectional."""

    def call(self, token_ids):
        shape = ops.shape(token_ids)
        return ops.full((shape[0],), shape[1], dtype="int32")

    def compute_output_spec(self, token_ids):
        return keras.KerasTensor(token_ids.shape[:1], dtype="int32")


@keras.saving.register_keras_serializable(package="examples_pretrain")
class DropPaddingMask(keras.layers.Layer):
    """The identity, without the padding mask Keras attaches to its input.

    `keras_hub.layers.MaskedLMHead` takes no mask (it reads the positions
    `mask_positions` names, all of them real tokens), and Keras warns that
    it "does not support masking and will therefore destroy the mask
    information" when its input carries the backbone's padding mask.
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True

    def call(self, inputs):
        # A new tensor: Keras keeps the mask attached to the input tensor.
        return ops.copy(inputs)

    def compute_mask(self, inputs, mask=None):
        return None


class Backbone:
    """The layers of the transformer encoder (no weights until called)."""

    def __init__(
        self,
        vocabulary_size,
        max_length,
        hidden_dim=128,
        num_layers=2,
        num_heads=4,
        dropout=0.1,
    ):
        self.vocabulary_size = vocabulary_size
        self.hidden_dim = hidden_dim
        self.embedding = TokenAndPositionEmbedding(
            vocabulary_size,
            max_length,
            hidden_dim,
            mask_zero=True,
            name="embedding",
        )
        self.dropout = keras.layers.Dropout(dropout, name="embedding_dropout")
        self.blocks = [
            TransformerEncoderBlock(
                num_heads=num_heads,
                intermediate_dim=2 * hidden_dim,
                dropout=dropout,
                activation="gelu",
                norm_first=True,
                mask_mod=PrefixLMMask(),  # prefix length per call
                name=f"encoder_block_{i}",
            )
            for i in range(num_layers)
        ]
        self.norm = keras.layers.LayerNormalization(name="final_norm")

    def __call__(self, token_ids, prefix_length=None, segment_ids=None):
        """`(batch, T)` ids (0 pads) -> `(batch, T, hidden_dim)`.

        `prefix_length` `(batch,)`: 0 causal, `T` (the default)
        bidirectional; `segment_ids` `(batch, T)`: packed documents."""
        if prefix_length is None:
            prefix_length = FullPrefix(name="full_prefix")(token_ids)
        extra = {}
        if segment_ids is None:
            x = self.embedding(token_ids)
        else:
            positions = SegmentPositions(name="segment_positions")(segment_ids)
            x = self.embedding(token_ids, positions=positions)
            extra["segment_ids"] = segment_ids
        x = self.dropout(x)
        for block in self.blocks:
            x = block(x, mod_inputs={"prefix_length": prefix_length}, **extra)
        return self.norm(x)


def build_pretraining_model(backbone, objective, packed=False):
    """The model `objective` trains: inputs as `data.objective_batches`
    makes them (with `segment_ids` when `packed`), logits `(batch,
    positions, vocabulary)` out."""
    # b - batch, t - token positions, p - masked positions, v - vocabulary
    if packed and objective not in PACKABLE:
        raise ValueError(
            f"Packed batches are for the objectives {PACKABLE}. "
            f"Received: objective={objective!r}"
        )
    ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    segments = None
    if packed:
        segments = keras.Input(shape=(None,), dtype="int32", name="segment_ids")
    if objective == "mlm":
        positions = keras.Input(
            shape=(None,), dtype="int32", name="mask_positions"
        )
        x = backbone(ids, segment_ids=segments)  # (b, t, d), bidirectional
        x = DropPaddingMask(name="drop_padding_mask")(x)
        logits = keras_hub.layers.MaskedLMHead(
            vocabulary_size=backbone.vocabulary_size,
            intermediate_activation="gelu",
            dtype="float32",
            name="mlm_head",
        )(x, mask_positions=positions)  # (b, p, v)
        inputs = {"token_ids": ids, "mask_positions": positions}
    elif objective in ("clm", "prefix_lm"):
        prefix = keras.Input(shape=(), dtype="int32", name="prefix_length")
        x = backbone(ids, prefix_length=prefix, segment_ids=segments)
        logits = keras.layers.Dense(
            backbone.vocabulary_size, dtype="float32", name="logits"
        )(x)  # (b, t, v)
        inputs = {"token_ids": ids, "prefix_length": prefix}
    else:
        raise ValueError(
            f"`objective` must be one of {OBJECTIVES}. "
            f"Received: objective={objective!r}"
        )
    if packed:
        inputs["segment_ids"] = segments
    return keras.Model(inputs, logits, name=f"{objective}_pretraining")


def build_classifier(backbone, num_classes, dropout=0.1):
    """Token ids `(batch, T)` -> class logits `(batch, C)`: the backbone
    (bidirectional), `AttentionPooling`, a dense layer."""
    ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    x = backbone(ids)
    pooled = AttentionPooling(units=backbone.hidden_dim, name="pooling")(x)
    pooled = keras.layers.Dropout(dropout)(pooled)
    logits = keras.layers.Dense(num_classes, dtype="float32", name="logits")(
        pooled
    )
    return keras.Model(ids, logits, name="classifier")
