"""What the keras-hub converters share (private to `interop`): the inputs
of a converted model, the blocks composed of their layers, and the copy
of the backbone's weights by a table of path prefixes (their weight path
-> ours).

Each converter states a block's layers: its self-attention
(`self_attention`: `SelfAttention`, `LocalSelfAttention` or
`GatedDeltaNet`), its feed-forward (`feed_forward`: `FeedForward` or
`mixture_of_experts`) and, in T5's decoder, its cross-attention
(`cross_attention`), and composes them into a block (`decoder_block`,
`encoder_block`) that adds the norms, residuals and dropouts. The layers
are named as the blocks name the sublayers they build (`self_attention`,
`feed_forward`, `cross_attention`), so the weight paths, and the tables
mapping the backbones' to them, are those of a block built from options.
"""

import keras
import numpy as np

from keras_attention.blocks.transformer_decoder_block import (
    TransformerDecoderBlock,
)
from keras_attention.blocks.transformer_encoder_block import (
    TransformerEncoderBlock,
)
from keras_attention.layers.activations import gelu_approximate
from keras_attention.layers.cross_attention import CrossAttention
from keras_attention.layers.feed_forward import FeedForward
from keras_attention.layers.gated_delta_net import GatedDeltaNet
from keras_attention.layers.local_self_attention import LocalSelfAttention
from keras_attention.layers.mixture_of_experts import MixtureOfExperts
from keras_attention.layers.self_attention import SelfAttention
from keras_attention.layers.token_and_position_embedding import (
    TokenAndPositionEmbedding,
)


@keras.saving.register_keras_serializable(package="keras_attention")
class LayerScalar(keras.layers.Layer):
    """Its input times one stored number, the weight `layer_scalar` of
    shape `(1,)` (not trainable, initially 1): Gemma 4's scale of each
    decoder block's whole output, residual included (keras-hub's and
    transformers' `layer_scalar`), placed after the block it scales.
    `causal_lm_generator` applies it to the block's output when
    decoding with a cache."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True

    def build(self, input_shape):
        self.layer_scalar = self.add_weight(
            name="layer_scalar",
            shape=(1,),
            initializer="ones",
            trainable=False,
        )

    def call(self, inputs):
        return inputs * keras.ops.cast(self.layer_scalar, inputs.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return super().get_config()  # no options beyond a layer's


def token_inputs(*names):
    """`keras.Input`s `(batch, T)` int32 named as keras-hub names them."""
    return {
        name: keras.Input(shape=(None,), dtype="int32", name=name)
        for name in names
    }


def self_attention(num_heads, key_dim, causal, window_size=None, **options):
    """A block's self-attention, named `self_attention`: a
    `SelfAttention`, or with `window_size` a banded `LocalSelfAttention`
    of that window. `options`: `MultiHeadAttention`'s other arguments
    (`num_key_value_heads`, `rotary_max_wavelength`, `qk_norm`, `dtype`,
    ...)."""
    if window_size is not None:
        return LocalSelfAttention(
            num_heads,
            key_dim,
            window_size,
            causal=causal,
            name="self_attention",
            **options,
        )
    return SelfAttention(
        num_heads, key_dim, causal=causal, name="self_attention", **options
    )


def gated_delta_net(hidden_size, **options):
    """A block's self-attention `GatedDeltaNet` (the gated delta rule),
    named `self_attention`; `options`: its other arguments."""
    return GatedDeltaNet(hidden_size, name="self_attention", **options)


def cross_attention(num_heads, key_dim, **options):
    """A decoder block's `CrossAttention`, named `cross_attention`;
    `options`: `MultiHeadAttention`'s other arguments."""
    return CrossAttention(num_heads, key_dim, name="cross_attention", **options)


def feed_forward(intermediate_dim, **options):
    """A block's `FeedForward`, named `feed_forward`; `options`: its other
    arguments (`activation`, `gated`, `use_bias`, `dropout`, `dtype`)."""
    return FeedForward(intermediate_dim, name="feed_forward", **options)


def mixture_of_experts(arguments, dtype):
    """A block's `MixtureOfExperts` of `arguments` (a dict: `num_experts`,
    `top_k`, `intermediate_dim`, ...), named `feed_forward`."""
    return MixtureOfExperts(**arguments, dtype=dtype, name="feed_forward")


def decoder_block(name, self_attention, feed_forward, **options):
    """A `TransformerDecoderBlock` named `name` composed of the given
    layers (`cross_attention=False` unless `options` give one); `options`:
    the block's own (`norm_first`, `normalization`,
    `layer_norm_epsilon`, `sandwich_norm`, the residual `dropout`,
    `dtype`)."""
    options.setdefault("cross_attention", False)
    return TransformerDecoderBlock(
        self_attention=self_attention,
        feed_forward=feed_forward,
        name=name,
        **options,
    )


def rms_decoder_model(
    num_layers,
    sublayers,
    *,
    vocabulary_size,
    hidden_dim,
    tie_word_embeddings,
    epsilon,
    dtype,
    name,
    dropout=0.0,
    sandwich_norm=False,
):
    """The decoder-only model that the Llama, Qwen 3.5, DeepSeek and Kimi
    Linear builders share: inputs `token_ids` and `padding_mask`, a token
    embedding (`ReversibleEmbedding` named `token_embedding`, tied or
    not), `num_layers` pre-norm decoder blocks with RMS norms of
    `epsilon` named `transformer_layer_{i}`, composed of
    `sublayers(i)` -> `(self_attention, feed_forward)` (called as each
    block is built), with the residual `dropout` and `sandwich_norm`,
    then the final RMS norm `sequence_output_layernorm`; a `keras.Model`
    named `name` whose output is that norm's."""
    inputs = token_inputs("token_ids", "padding_mask")
    x = keras.layers.ReversibleEmbedding(
        vocabulary_size,
        hidden_dim,
        tie_weights=tie_word_embeddings,
        dtype=dtype,
        name="token_embedding",
    )(inputs["token_ids"])
    for i in range(num_layers):
        attention, ff = sublayers(i)
        x = decoder_block(
            f"transformer_layer_{i}",
            self_attention=attention,
            feed_forward=ff,
            dropout=dropout,
            norm_first=True,
            layer_norm_epsilon=epsilon,
            normalization="rms_norm",
            sandwich_norm=sandwich_norm,
            dtype=dtype,
        )(x, padding_mask=inputs["padding_mask"])
    x = keras.layers.RMSNormalization(
        epsilon=epsilon, dtype=dtype, name="sequence_output_layernorm"
    )(x)
    return keras.Model(inputs=inputs, outputs=x, name=name)


def encoder_block(name, self_attention, feed_forward, **options):
    """A `TransformerEncoderBlock` named `name` composed of the given
    layers; `options`: the block's own (as `decoder_block`'s)."""
    return TransformerEncoderBlock(
        self_attention=self_attention,
        feed_forward=feed_forward,
        name=name,
        **options,
    )


def layer_prefixes(table, num_layers):
    """`table` (pairs of path prefixes; `{i}` stands for a layer index)
    made concrete for layers `0 .. num_layers - 1`: `{their prefix: our
    prefix}`."""
    out = {}
    for theirs, ours in table:
        if "{i}" in theirs:
            for i in range(num_layers):
                out[theirs.format(i=i)] = ours.format(i=i)
        else:
            out[theirs] = ours
    return out


def stack_prefixes(table, num_layers, stacks=("encoder", "decoder")):
    """`table` made concrete as `layer_prefixes`, `{stack}` standing for
    each of `stacks` (an encoder-decoder's) in the pairs that hold it."""
    out = []
    for theirs, ours in table:
        for stack in stacks if "{stack}" in theirs else ("",):
            out.append(
                (
                    theirs.replace("{stack}", stack),
                    ours.replace("{stack}", stack),
                )
            )
    return layer_prefixes(out, num_layers)


def our_path(path, prefixes):
    """Our weight path for the backbone's `path`: its longest prefix (whole
    path segments) found in `prefixes` replaced by ours; None if none."""
    parts = path.split("/")
    for n in range(len(parts), 0, -1):
        head = "/".join(parts[:n])
        if head in prefixes:
            return "/".join([prefixes[head]] + parts[n:])
    return None


def copy_weights(backbone, model, prefixes, transform=None):
    """Copies (never shares) every weight of `backbone` into `model`.

    Each backbone weight goes to the weight of `model` at `our_path`; every
    weight of both must be matched exactly once and shapes must agree, else
    `ValueError` (a keras-hub version whose layout the table does not
    describe). `transform(their_path, value)`, when given, maps each NumPy
    value first (a transposed kernel, an offset scale). Returns the list of
    `(their path, our path)` pairs.
    """
    ours = {w.path: w for w in model.weights}
    pairs = []
    for weight in backbone.weights:
        target = ours.get(our_path(weight.path, prefixes))
        if target is None:
            continue  # reported by `copy_pairs` as without a place
        value = None
        if transform is not None:
            value = transform(weight.path, numpy_value(weight))
        pairs.append((weight, target, value))
    copy_pairs(backbone, model, pairs)
    return [(theirs.path, target.path) for theirs, target, _ in pairs]


def numpy_value(weight):
    """A NumPy copy of a variable's value."""
    return np.array(keras.ops.convert_to_numpy(weight.value))


def copy_pairs(backbone, model, pairs, recomputed=()):
    """Assigns each `(their variable, our variable, value)` of `pairs`
    (`value` None: their variable's value), checking shapes and that
    every weight of both models is matched exactly once (`ValueError`
    otherwise, naming the weights left over). `recomputed`: their
    variables the converted model computes instead of storing (checked by
    the caller; SmolLM3's RoPE inverse frequencies), not matched."""
    skipped = {id(w) for w in recomputed}
    theirs = {id(w): w for w in backbone.weights if id(w) not in skipped}
    ours = {id(w): w for w in model.weights}
    assigned = set()
    for their_weight, our_weight, value in pairs:
        if id(our_weight) in assigned:
            raise ValueError(
                f"Two weights of {type(backbone).__name__} map to the "
                f"converted {our_weight.path!r} (the second: "
                f"{their_weight.path!r})."
            )
        assigned.add(id(our_weight))
        value = numpy_value(their_weight) if value is None else value
        value = np.asarray(value)
        if tuple(our_weight.shape) != value.shape:
            raise ValueError(
                f"Weight {their_weight.path!r} of {type(backbone).__name__} "
                f"has shape {value.shape!r} but the converted "
                f"{our_weight.path!r} has {tuple(our_weight.shape)!r}."
            )
        our_weight.assign(value)
        theirs.pop(id(their_weight), None)
        ours.pop(id(our_weight), None)
    if theirs or ours:
        raise ValueError(
            f"The conversion of {type(backbone).__name__} does not match "
            "its weights (an unsupported variant or keras-hub version). "
            "Backbone weights without a place: "
            f"{sorted(w.path for w in theirs.values())!r}; converted "
            "weights left without a value: "
            f"{sorted(w.path for w in ours.values())!r}."
        )


def config_value(backbone, name):
    """`backbone.name` of its config, `ValueError` naming it if missing."""
    value = getattr(backbone, name, None)
    if value is None:
        value = backbone.get_config().get(name)
    if value is None:
        raise ValueError(
            f"{type(backbone).__name__} has no `{name}` in its config; this "
            "keras-hub version is not supported. Received: "
            f"backbone={backbone.name!r}"
        )
    return value


# keras-hub's `TransformerEncoder` (BERT, RoBERTa, DistilBERT, ALBERT,
# ELECTRA): its sublayers' path prefixes -> those of our
# `TransformerEncoderBlock` composed by `keras_hub_encoder_block` (the
# weights under each have the same names and shapes on both sides).
ENCODER_LAYER_TABLE = (
    ("self_attention_layer", "self_attention"),
    ("self_attention_layer_norm", "self_attention_norm"),
    ("feedforward_intermediate_dense", "feed_forward/intermediate_dense"),
    ("feedforward_output_dense", "feed_forward/output_dense"),
    ("feedforward_layer_norm", "feed_forward_norm"),
)


def encoder_layer_table(theirs, ours):
    """`ENCODER_LAYER_TABLE` under their layer `theirs` and our block
    `ours` (`{i}` allowed in both, as in `layer_prefixes`)."""
    return tuple(
        (f"{theirs}/{their_part}", f"{ours}/{our_part}")
        for their_part, our_part in ENCODER_LAYER_TABLE
    )


def bert_embeddings(inputs, config, embedding_dim, epsilon, dtype):
    """BERT-style embeddings of `inputs["token_ids"]`: a
    `TokenAndPositionEmbedding` (named `embeddings`) of `embedding_dim`,
    plus a `segment_embedding` of `inputs["segment_ids"]` when `inputs`
    has them, then a layer norm of `epsilon` and dropout (named as
    keras-hub names them). `config`: `vocabulary_size`,
    `max_sequence_length`, `dropout` and, with segments, `num_segments`."""
    x = TokenAndPositionEmbedding(
        config["vocabulary_size"],
        config["max_sequence_length"],
        embedding_dim,
        dtype=dtype,
        name="embeddings",
    )(inputs["token_ids"])
    if "segment_ids" in inputs:
        segments = keras.layers.Embedding(
            config["num_segments"],
            embedding_dim,
            dtype=dtype,
            name="segment_embedding",
        )(inputs["segment_ids"])
        x = keras.layers.Add(dtype=dtype, name="embeddings_add")([x, segments])
    x = keras.layers.LayerNormalization(
        epsilon=epsilon, dtype=dtype, name="embeddings_layer_norm"
    )(x)
    return keras.layers.Dropout(
        config["dropout"], dtype=dtype, name="embeddings_dropout"
    )(x)


def keras_hub_encoder_options(backbone, layer):
    """What our encoder block takes of a keras-hub `TransformerEncoder`
    `layer` of `backbone`, read from the layer: `{"norm_first",
    "layer_norm_epsilon", "activation"}` (the activation by a name that
    reloads with `safe_mode=True`). `ValueError` naming `activation` for
    one without such a name."""
    # keras-hub: an optional extra, needed only to convert.
    from keras_hub.src.utils.keras_utils import gelu_approximate as theirs

    function = layer.activation
    if function is theirs:
        activation = gelu_approximate
    else:
        activation = getattr(function, "__name__", None)
        try:
            known = keras.activations.get(activation) is function
        except ValueError:  # not a Keras activation's name
            known = False
        if activation is None or not known:
            raise ValueError(
                f"The `activation` of {layer.name!r} of "
                f"{type(backbone).__name__} is not a Keras activation or "
                "keras-hub's `gelu_approximate`; it cannot be converted. "
                f"Received: activation={function!r}"
            )
    return {
        "norm_first": bool(layer.normalize_first),
        "layer_norm_epsilon": float(layer.layer_norm_epsilon),
        "activation": activation,
    }


def keras_hub_encoder_block(name, config, options, dtype):
    """Our `TransformerEncoderBlock` `name` computing as a keras-hub
    `TransformerEncoder` (`config`: `num_heads`, `hidden_dim`,
    `intermediate_dim`, `dropout`; `options`: `keras_hub_encoder_options`):
    a `SelfAttention` of heads `hidden_dim // num_heads` with attention
    dropout, a `FeedForward` without dropout on its hidden layer (keras-hub
    has none there), the residual dropout."""
    options = dict(options)
    heads = config["num_heads"]
    return encoder_block(
        name,
        self_attention=self_attention(
            heads,
            config["hidden_dim"] // heads,
            causal=False,
            dropout=config["dropout"],
            dtype=dtype,
        ),
        feed_forward=feed_forward(
            config["intermediate_dim"],
            activation=options.pop("activation"),
            dtype=dtype,
        ),
        dropout=config["dropout"],
        dtype=dtype,
        **options,
    )


def pooled_output(x, hidden_dim, dtype):
    """BERT's pooler: a tanh `Dense` (named `pooled_dense`) of the first
    token of `x`."""
    return keras.layers.Dense(
        hidden_dim, activation="tanh", dtype=dtype, name="pooled_dense"
    )(x[:, 0, :])


def keras_hub_encoder_stack(backbone, x, padding_mask, calls, config, dtype):
    """`x` through our `TransformerEncoderBlock`s computing as the
    keras-hub `TransformerEncoder`s `calls` of `backbone` (their layers in
    call order): one block per distinct layer, named as it, and a layer
    called again (ALBERT's shared layers) calls its block again, so that
    the block's weights are shared as theirs. `config`: as
    `keras_hub_encoder_block`'s."""
    blocks = {}
    for layer in calls:
        if id(layer) not in blocks:
            blocks[id(layer)] = keras_hub_encoder_block(
                layer.name,
                config,
                keras_hub_encoder_options(backbone, layer),
                dtype,
            )
        x = blocks[id(layer)](x, padding_mask=padding_mask)
    return x


def convert_bert_like(backbone, config, prefixes, calls, projection=None):
    """A `keras.Model` of our blocks equal to a keras-hub BERT-style
    `backbone` (RoBERTa, DistilBERT, ALBERT, ELECTRA), with a copy of its
    weights: its inputs (`token_ids`, `padding_mask`, and `segment_ids`
    where the backbone takes them), `bert_embeddings` of
    `config["embedding_dim"]` (default `hidden_dim`; the layer norm's
    epsilon read from the backbone's `embeddings_layer_norm`), a `Dense`
    named `projection` to `hidden_dim` when given (ALBERT's and ELECTRA's
    factorized embeddings), the encoder blocks of `calls`
    (`keras_hub_encoder_stack`) and, when the backbone's output is a dict,
    `{"sequence_output", "pooled_output"}` (`pooled_output`), else the
    hidden states. `prefixes`: `{their weight path prefix: ours}`
    (`copy_weights`)."""
    dtype = backbone.dtype_policy
    names = ("token_ids", "segment_ids", "padding_mask")
    inputs = token_inputs(*(n for n in names if n in backbone.input))
    embedding_dim = config.get("embedding_dim", config["hidden_dim"])
    epsilon = float(backbone.embeddings_layer_norm.epsilon)
    x = bert_embeddings(inputs, config, embedding_dim, epsilon, dtype)
    if projection is not None:
        x = keras.layers.Dense(
            config["hidden_dim"], dtype=dtype, name=projection
        )(x)
    x = keras_hub_encoder_stack(
        backbone, x, inputs["padding_mask"], calls, config, dtype
    )
    outputs = x
    if isinstance(backbone.output, dict):
        pooled = pooled_output(x, config["hidden_dim"], dtype)
        outputs = {"sequence_output": x, "pooled_output": pooled}
    model = keras.Model(inputs=inputs, outputs=outputs, name=backbone.name)
    copy_weights(backbone, model, prefixes)
    return model
