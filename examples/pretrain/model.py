"""The models of the `pretrain` example: one backbone, three heads.

The backbone is a stack of `TransformerEncoderBlock`s over a
`TokenAndPositionEmbedding`. The three objectives differ only in the
attention mask the blocks get and in the head on top:

- `mlm` (BERT): no attention mask (bidirectional over the real tokens);
  a `keras_hub.layers.MaskedLMHead` predicts the masked tokens.
- `clm` (GPT): `masks.prefix_lm_mask(T, 0)`, i.e. causal; a dense head
  predicts the next token at every position.
- `prefix_lm` (UniLM, T5's prefix LM): `masks.prefix_lm_mask(T, p)` with a
  prefix length `p` per example: bidirectional over the prefix, causal
  after it; the next-token loss covers the tokens after the prefix only.

The models are flat functional models calling the *same* layer objects
(`Backbone`), so a classifier built on a pretrained backbone starts from
its weights, and every attention layer is a layer of the model.
"""

import keras
import keras_hub
from keras import ops

from keras_attention.blocks import TransformerEncoderBlock
from keras_attention.layers import AttentionPooling
from keras_attention.layers import TokenAndPositionEmbedding
from keras_attention.masks import prefix_lm_mask

OBJECTIVES = ("mlm", "clm", "prefix_lm")


@keras.saving.register_keras_serializable(package="examples_pretrain")
class PrefixLMMask(keras.layers.Layer):
    """`(token_ids (batch, T), prefix_length (batch,))` -> boolean
    `(batch, T, T)`: `keras_attention.masks.prefix_lm_mask`. A prefix length
    of 0 gives the causal mask, one of `T` or more full attention."""

    def call(self, token_ids, prefix_length):
        length = ops.shape(token_ids)[1]
        return prefix_lm_mask(length, ops.cast(prefix_length, "int32"))

    def compute_output_spec(self, token_ids, prefix_length):
        batch, length = token_ids.shape
        return keras.KerasTensor((batch, length, length), dtype="bool")


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
                name=f"encoder_block_{i}",
            )
            for i in range(num_layers)
        ]
        self.norm = keras.layers.LayerNormalization(name="final_norm")

    def __call__(self, token_ids, attention_mask=None):
        """`(batch, T)` ids (0 pads) -> `(batch, T, hidden_dim)`."""
        x = self.dropout(self.embedding(token_ids))
        for block in self.blocks:
            x = block(x, attention_mask=attention_mask)
        return self.norm(x)


def build_pretraining_model(backbone, objective):
    """The model `objective` trains: inputs as `data.objective_batches`
    makes them, logits `(batch, positions, vocabulary)` out."""
    # b - batch, t - token positions, p - masked positions, v - vocabulary
    ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    if objective == "mlm":
        positions = keras.Input(
            shape=(None,), dtype="int32", name="mask_positions"
        )
        x = backbone(ids)  # (b, t, d), bidirectional
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
        mask = PrefixLMMask(name="prefix_lm_mask")(ids, prefix)  # (b, t, t)
        x = backbone(ids, attention_mask=mask)
        logits = keras.layers.Dense(
            backbone.vocabulary_size, dtype="float32", name="logits"
        )(x)  # (b, t, v)
        inputs = {"token_ids": ids, "prefix_length": prefix}
    else:
        raise ValueError(
            f"`objective` must be one of {OBJECTIVES}. "
            f"Received: objective={objective!r}"
        )
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
