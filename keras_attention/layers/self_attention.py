import keras
import numpy as np
from keras import ops

from keras_attention.layers import recording
from keras_attention.layers.multi_head_attention import MultiHeadAttention
from keras_attention.utils import keras_utils
from keras_attention.utils import validation


@keras.saving.register_keras_serializable(package="keras_attention")
class SelfAttention(MultiHeadAttention):
    """Multi-head self-attention over one sequence.

    `MultiHeadAttention` with `query = key = value = inputs`; same weights,
    so weights move between the two with `set_weights`. The Keras padding
    mask of `inputs` (for example from `Embedding(mask_zero=True)`) masks
    both padded keys and padded queries, and is propagated to the output.

    Layer scale (`layer_scale=v`, as in CaiT and DINOv2): the output
    times a learned per-feature vector `layer_scale` (of the output's
    feature shape) initialised to `v`; the attention weights are not
    changed.

    Args:
        num_heads: int, number of attention heads.
        key_dim: int, size of each query/key head.
        causal: bool, if True position `i` attends only to positions `<= i`.
        layer_scale: optional positive float, the initial value of a
            learned per-feature scale of the output (a weight named
            `layer_scale`); None (default): no scale.
        **kwargs: the other arguments of `MultiHeadAttention` (`value_dim`,
            `num_key_value_heads`, `dropout`, `use_bias`, `output_shape`,
            initializers, ...) and base layer arguments.

    Call arguments:
        inputs: `(batch, T, features)`.
        mask: optional boolean `(batch, T)` padding mask; when omitted, the
            Keras mask of `inputs` is read (also when `attention_mask` or
            `cache` is passed, where Keras itself would not fill `mask`).
        attention_mask: optional boolean mask `(T, T)`, `(batch, T, T)` or
            `(batch, heads, T, T)`, combined with the padding/causal masks.
        return_attention_scores: bool, also return `(batch, heads, T, T)`.
        training: bool.
        cache, cache_update_index: incremental decoding, see
            `MultiHeadAttention`. With a cache, `mask` covers only this
            call's queries; mask padded cache slots with `attention_mask`
            (a cache of `init_cache` keeps its key mask itself: its
            tokens' `mask` goes into it).
        padding_mask: the `TokenMixer` name of `mask` (either one).
        segment_ids: optional integer `(batch, T)` (no cache): packed
            documents; a token attends only within its
            document (tiles between documents skipped on the blockwise
            path) and rotary positions restart at each document
            (`keras_attention.masks.segment_positions`).
        positions: optional integer `(batch, T)` or `(T,)`: the rotary
            positions of this call's tokens (needs `rotary_max_wavelength`),
            e.g. restarting at each packed document (with a mask keeping
            each token in its document, or `segment_ids`); see
            `MultiHeadAttention`.

    Returns:
        `(batch, T, output_dim)`, then the scores if requested, then the
        updated cache if one was given.

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> layer = keras_attention.layers.SelfAttention(
    ...     num_heads=2, key_dim=4, causal=True
    ... )
    >>> tuple(layer(np.ones((2, 6, 8), "float32")).shape)
    (2, 6, 8)

    With padding (`valid`, True on real tokens) and a prefix-LM mask:

    >>> valid = np.array([[True] * 4 + [False] * 2, [True] * 6])
    >>> prefix = keras_attention.masks.prefix_lm_mask(6, 2)
    >>> y = layer(np.ones((2, 6, 8), "float32"), mask=valid,
    ...           attention_mask=prefix)
    >>> tuple(y.shape)
    (2, 6, 8)

    References:
        - Vaswani et al., 2017, "Attention Is All You Need".
        - Touvron et al., 2021, "Going deeper with Image Transformers"
          (CaiT; `layer_scale`).
    """

    attention_kind = "self"

    def __init__(
        self, num_heads, key_dim, causal=False, layer_scale=None, **kwargs
    ):
        super().__init__(num_heads=num_heads, key_dim=key_dim, **kwargs)
        self.causal = validation.check_bool("causal", causal)
        self.layer_scale = validation.check_positive_number(
            "layer_scale", layer_scale, allow_none=True
        )

    def build(self, inputs_shape):
        super().build(inputs_shape, inputs_shape)
        self.layer_scale_weight = None
        if self.layer_scale is not None:
            features = self._output_shapes or (tuple(inputs_shape)[-1],)
            self.layer_scale_weight = self.add_weight(
                name="layer_scale",
                shape=tuple(features),
                initializer=keras.initializers.Constant(
                    np.float64(self.layer_scale)
                ),
            )

    def _scaled(self, outputs):
        """`outputs` (the output, or a tuple led by it) with the output
        times `layer_scale`."""
        if getattr(self, "layer_scale_weight", None) is None:
            return outputs
        rest = outputs[1:] if isinstance(outputs, tuple) else None
        output = outputs[0] if rest is not None else outputs
        output = output * ops.cast(self.layer_scale_weight, output.dtype)
        return output if rest is None else (output, *rest)

    def call(
        self,
        inputs,
        mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        cache=None,
        cache_update_index=None,
        mod_inputs=None,
        step_inputs=None,
        segment_ids=None,
        cache_sink_tokens=None,
        positions=None,
        padding_mask=None,
    ):
        self._check_call_inputs(inputs, inputs, inputs, ("inputs",) * 3)
        if padding_mask is not None:  # `TokenMixer`'s name of `mask`
            mask = padding_mask
        mask = self._padding_mask(inputs, mask)
        outputs = super().call(
            query=inputs,
            value=inputs,
            query_mask=mask,
            value_mask=mask,
            attention_mask=attention_mask,
            return_attention_scores=return_attention_scores,
            training=training,
            use_causal_mask=self.causal,
            cache=cache,
            cache_update_index=cache_update_index,
            mod_inputs=mod_inputs,
            step_inputs=step_inputs,
            segment_ids=segment_ids,
            cache_sink_tokens=cache_sink_tokens,
            positions=positions,
        )
        return self._scaled(outputs)

    def _padding_mask(self, inputs, mask):
        """`mask`, else the Keras mask of `inputs`; checked against them."""
        if mask is None:
            mask = keras_utils.keras_mask(inputs)
        validation.check_padding_mask("mask", mask, inputs)
        return mask

    def compute_output_spec(
        self,
        inputs,
        return_attention_scores=False,
        cache=None,
        cache_sink_tokens=None,
        **kwargs,
    ):
        return super().compute_output_spec(
            inputs,
            inputs,
            return_attention_scores=return_attention_scores,
            cache=cache,
            cache_sink_tokens=cache_sink_tokens,
        )

    def describe_attention(self, arguments, scores, options):
        """`collect_attention`'s hook: see `MultiHeadAttention`."""
        return recording.numpy_weights(scores), self._self_metadata(arguments)

    def _self_metadata(self, arguments):
        mask = recording.padding_mask(
            arguments.get("mask"), arguments.get("inputs")
        )
        return dict(
            kind="self",
            query_mask=mask,
            key_mask=mask,
            causal=self.causal,
            window=None,
        )

    def get_config(self):
        config = super().get_config()
        config["causal"] = self.causal
        if self.layer_scale is not None:  # earlier releases' configs stay
            config["layer_scale"] = self.layer_scale
        return config


@keras.saving.register_keras_serializable(package="keras_attention")
class CausalSelfAttention(SelfAttention):
    """Masked (causal) self-attention of a decoder: `SelfAttention` with
    `causal=True` by default. Position `i` never sees positions `> i`.

    Args, call arguments and returns: see `SelfAttention`.

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> layer = keras_attention.layers.CausalSelfAttention(
    ...     num_heads=2, key_dim=4)
    >>> x = np.ones((1, 3, 8), "float32")
    >>> y, s = layer(x, return_attention_scores=True)
    >>> float(s[0, 0, 0, 1])
    0.0

    References:
        - Vaswani et al., 2017, "Attention Is All You Need".
    """

    def __init__(self, num_heads, key_dim, causal=True, **kwargs):
        super().__init__(
            num_heads=num_heads, key_dim=key_dim, causal=causal, **kwargs
        )
