"""The plumbing shared by the transformer blocks (private to `blocks`).

`TransformerBlock` holds what `TransformerEncoderBlock` and
`TransformerDecoderBlock` have in common: argument checks, the
self-attention and feed-forward sublayers with their norms and dropouts,
the residual wiring (post- or pre-norm) and the config of the shared
arguments. Each block subclasses it directly (they are siblings) and adds
its own arguments (`causal`; `cross_attention`) and its own `call`.

The sublayer attribute names (`self_attention`, `self_attention_norm`,
`self_attention_dropout`, `feed_forward`, `feed_forward_norm`,
`feed_forward_dropout`) are the weight paths of saved `.keras` files:
do not rename them.
"""

import keras

from keras_attention.blocks import _compose
from keras_attention.blocks import _latent
from keras_attention.blocks import _mixer
from keras_attention.layers.feed_forward import FeedForward
from keras_attention.layers.local_self_attention import LocalSelfAttention
from keras_attention.layers.mixture_of_experts import MixtureOfExperts
from keras_attention.layers.rotary_embedding import check_rotary_scaling
from keras_attention.layers.self_attention import SelfAttention
from keras_attention.mods import base as mods_base
from keras_attention.utils import keras_utils
from keras_attention.utils import norms
from keras_attention.utils import validation

# The block's norms: `normalization=` -> Keras layer.
NORMALIZATIONS = ("layer_norm", "rms_norm")


class TransformerBlock(keras.layers.Layer):
    """Base of the transformer blocks: self-attention and feed-forward,
    each with a residual connection and layer normalization.

    Post-norm (`norm_first=False`): `x = LayerNorm(x + Dropout(f(x)))`;
    pre-norm (`norm_first=True`): `x = x + Dropout(f(LayerNorm(x)))`, for
    each sublayer `f`; `parallel_residual` (pre-norm): the feed-forward
    reads the block's input, not the self-attention's output, `x + a(x) +
    f(x)` with their own norms. Subclasses set `causal` (an attribute read
    when the self-attention is made) and write `call`, combining
    `_self_attention_residual`, their own sublayers (through `_residual`)
    and `_feed_forward_residual`.

    The arguments (`TransformerDecoderBlock` and `TransformerEncoderBlock`
    document them) are sublayer options and block options. The sublayers,
    `self_attention` and `feed_forward` (and a decoder's
    `cross_attention`), are either given as layers or built from the
    options (`_make_self_attention`, `_make_feed_forward`, ...); an option
    that configures only sublayers given as layers is refused
    (`_compose`). The norms, dropouts and residual wiring are the
    block's own.
    """

    causal = False

    def __init__(
        self,
        num_heads=None,
        intermediate_dim=None,
        key_dim=None,
        num_key_value_heads=None,
        dropout=0.0,
        activation="relu",
        norm_first=False,
        layer_norm_epsilon=1e-5,
        rotary_max_wavelength=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        window_size=None,
        score_mod=None,
        mask_mod=None,
        normalization="layer_norm",
        use_bias=True,
        gated_feed_forward=False,
        sandwich_norm=False,
        rotary_scaling=None,
        attention_scale=None,
        qk_norm=None,
        qk_norm_epsilon=None,
        learned_sinks=False,
        rotary_fraction=1.0,
        moe=None,
        mixer="attention",
        mixer_options=None,
        latent_attention=None,
        attention_output_gate=False,
        parallel_residual=False,
        self_attention=None,
        feed_forward=None,
        cross_attention=False,
        **kwargs,
    ):
        passed = dict(locals())
        super().__init__(**kwargs)
        self._take_sublayers(
            self_attention, feed_forward, cross_attention, passed
        )
        # Not tracked by the block itself (a ScoreLayer's weights belong to
        # the self-attention layer that uses it, once).
        object.__setattr__(
            self, "score_mod", mods_base.check_mod(score_mod, "score_mod")
        )
        object.__setattr__(
            self, "mask_mod", mods_base.check_mod(mask_mod, "mask_mod")
        )
        if window_size is not None:
            window_size = validation.check_window_size(
                "window_size", window_size
            )
        num_heads = validation.check_positive_int(
            "num_heads", num_heads, allow_none=True
        )
        intermediate_dim = validation.check_positive_int(
            "intermediate_dim", intermediate_dim, allow_none=True
        )
        self.num_heads, self.intermediate_dim = num_heads, intermediate_dim
        _compose.check_required(self, moe, self._given, self._present)
        key_dim, num_key_value_heads = _check_head_shape(
            num_heads, key_dim, num_key_value_heads
        )
        dropout = validation.check_rate("dropout", dropout)
        layer_norm_epsilon = validation.check_positive_number(
            "layer_norm_epsilon", layer_norm_epsilon
        )
        rotary_max_wavelength = validation.check_positive_number(
            "rotary_max_wavelength",
            rotary_max_wavelength,
            allow_none=True,
            minimum=1,
        )
        if key_dim is not None:
            validation.check_rotary_head_size(
                rotary_max_wavelength, key_dim, f"key_dim={key_dim!r}"
            )
        self.key_dim = key_dim
        self.num_key_value_heads = num_key_value_heads
        self.dropout = dropout
        self.activation = keras.activations.get(activation)
        self._set_residual_options(
            norm_first, normalization, sandwich_norm, parallel_residual
        )
        self.use_bias = validation.check_bool("use_bias", use_bias)
        self.gated_feed_forward = validation.check_bool(
            "gated_feed_forward", gated_feed_forward
        )
        self.layer_norm_epsilon = layer_norm_epsilon
        self.rotary_max_wavelength = rotary_max_wavelength
        self.rotary_scaling = check_rotary_scaling(
            rotary_scaling, rotary_max_wavelength
        )
        self._set_attention_options(
            attention_scale, qk_norm, qk_norm_epsilon, learned_sinks
        )
        self.rotary_fraction = float(
            validation.check_positive_number("rotary_fraction", rotary_fraction)
        )
        self.moe = _check_moe(moe, intermediate_dim)
        self.window_size = window_size
        self.attention_output_gate = _check_gate(attention_output_gate)
        self.latent_attention = _latent.check_latent_attention(
            latent_attention, self
        )
        self.mixer, self.mixer_options = _mixer.check_mixer(
            mixer, mixer_options, self
        )
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.supports_masking = True

    def _set_residual_options(
        self, norm_first, normalization, sandwich_norm, parallel_residual
    ):
        """The block's norms and residual wiring, checked: a parallel
        residual is pre-norm, with no cross-attention between."""
        self.norm_first = validation.check_bool("norm_first", norm_first)
        if normalization not in NORMALIZATIONS:
            raise ValueError(
                f"`normalization` must be one of {NORMALIZATIONS!r}. "
                f"Received: normalization={normalization!r}"
            )
        self.normalization = normalization
        if isinstance(sandwich_norm, str) and sandwich_norm == "post":
            if not self.norm_first:
                raise ValueError(
                    '`sandwich_norm="post"` normalizes each sublayer\'s '
                    "output inside its residual, with no norm before the "
                    "sublayer: it needs norm_first=True. Received: "
                    f"sandwich_norm='post', norm_first={norm_first!r}"
                )
            self.sandwich_norm = "post"
        elif isinstance(sandwich_norm, str):
            raise ValueError(
                '`sandwich_norm` must be a bool or "post". Received: '
                f"sandwich_norm={sandwich_norm!r}"
            )
        else:
            self.sandwich_norm = validation.check_bool(
                "sandwich_norm", sandwich_norm
            )
        self.parallel_residual = validation.check_bool(
            "parallel_residual", parallel_residual
        )
        if self.parallel_residual and not self.norm_first:
            raise ValueError(
                "`parallel_residual` runs both sublayers on the block's "
                "input, each through its own norm: it needs "
                "norm_first=True. Received: parallel_residual=True, "
                f"norm_first={norm_first!r}"
            )
        if self.parallel_residual and _compose.CROSS in self._present:
            raise ValueError(
                "`parallel_residual` runs the self-attention and the "
                "feed-forward side by side: a cross-attention between "
                "them cannot apply. Received: parallel_residual=True, "
                "cross_attention=True"
            )

    def _set_attention_options(
        self, attention_scale, qk_norm, qk_norm_epsilon, learned_sinks
    ):
        """The options shared by the attention layers the block builds,
        checked (`layer_norm_epsilon` set first: the QK-norms' default)."""
        self.attention_scale = validation.check_positive_number(
            "attention_scale", attention_scale, allow_none=True
        )
        self.qk_norm_epsilon = None
        if qk_norm_epsilon is not None:
            self.qk_norm_epsilon = validation.check_positive_number(
                "qk_norm_epsilon", qk_norm_epsilon
            )
        self.qk_norm = validation.check_qk_norm(
            qk_norm, self.layer_norm_epsilon
        )[0]
        self.learned_sinks = validation.check_bool(
            "learned_sinks", learned_sinks
        )

    def _take_sublayers(
        self, self_attention, feed_forward, cross_attention, passed
    ):
        """Takes the sublayers given as layers (`self._given`: name ->
        layer; `self._present`: the block's sublayers) and refuses the
        options that would configure only those (`passed`: the
        constructor's arguments)."""
        given = {
            _compose.SELF: _compose.check_layer(
                "self_attention", self_attention
            ),
            _compose.FEED_FORWARD: _compose.check_layer(
                "feed_forward", feed_forward
            ),
        }
        cross, given[_compose.CROSS] = _compose.check_cross_attention(
            cross_attention
        )
        self._given = {k: v for k, v in given.items() if v is not None}
        self._present = (_compose.SELF, _compose.FEED_FORWARD) + (
            (_compose.CROSS,) if cross else ()
        )
        _compose.check_options(passed, self._given, self._present)
        for name, layer in self._given.items():
            if name != _compose.CROSS:
                setattr(self, name, layer)

    # Sublayer factories (override or extend in subclasses).

    def _head_dim(self, hidden_dim):
        if self.key_dim is not None:
            return self.key_dim
        if hidden_dim % self.num_heads:
            raise ValueError(
                "The feature size must be divisible by `num_heads` when "
                f"`key_dim` is None. Received: features={hidden_dim!r}, "
                f"num_heads={self.num_heads!r}"
            )
        head_dim = hidden_dim // self.num_heads
        validation.check_rotary_head_size(
            self.rotary_max_wavelength,
            head_dim,
            f"head size features // num_heads = {hidden_dim!r} // "
            f"{self.num_heads!r} = {head_dim!r}",
        )
        return head_dim

    def _attention_kwargs(self, hidden_dim, name):
        """Arguments shared by the block's attention layers."""
        return dict(
            num_heads=self.num_heads,
            key_dim=self._head_dim(hidden_dim),
            num_key_value_heads=self.num_key_value_heads,
            dropout=self.dropout,
            use_bias=self.use_bias,
            attention_scale=self.attention_scale,
            **self._modern_attention_kwargs(),
            kernel_initializer=keras_utils.clone_initializer(
                self.kernel_initializer
            ),
            bias_initializer=keras_utils.clone_initializer(
                self.bias_initializer
            ),
            dtype=self.dtype_policy,
            name=name,
        )

    def _modern_attention_kwargs(self):
        """QK-norm and learned sinks, given only when set (the layers'
        configs then stay those of earlier releases)."""
        kwargs = {}
        if self.qk_norm is not None:
            epsilon = self.qk_norm_epsilon or self.layer_norm_epsilon
            kwargs.update(qk_norm=self.qk_norm, qk_norm_epsilon=epsilon)
        if self.learned_sinks:
            kwargs["learned_sinks"] = True
        return kwargs

    def _self_attention_kwargs(self, hidden_dim):
        """Arguments shared by every self-attention variant of the block."""
        kwargs = {}
        if self.rotary_fraction != 1.0:
            kwargs["rotary_fraction"] = self.rotary_fraction
        if self.attention_output_gate:
            kwargs["use_gate"] = True
        return dict(
            **kwargs,
            rotary_max_wavelength=self.rotary_max_wavelength,
            rotary_scaling=self.rotary_scaling,
            score_mod=self.score_mod,
            mask_mod=self.mask_mod,
            **self._attention_kwargs(hidden_dim, "self_attention"),
        )

    def _make_self_attention(self, hidden_dim):
        """The block's self-attention layer: `call(x, mask=...,
        attention_mask=..., return_attention_scores=..., training=...)`."""
        if self.latent_attention is not None:
            return _latent.make_latent_attention(self)
        if self.mixer != "attention":
            return _mixer.make_mixer(self, hidden_dim)
        kwargs = self._self_attention_kwargs(hidden_dim)
        if self.window_size is not None:
            return LocalSelfAttention(
                window_size=self.window_size,
                causal=self.causal,
                **self._local_attention_kwargs(),
                **kwargs,
            )
        return SelfAttention(causal=self.causal, **kwargs)

    def _local_attention_kwargs(self):
        """Extra arguments of `LocalSelfAttention` (with `window_size`)."""
        return {}

    def _make_norm(self, name):
        if self.normalization == "rms_norm":
            norm = norms.RMSNormalization(
                epsilon=self.layer_norm_epsilon,
                dtype=self.dtype_policy,
                name=name,
            )
            # Per position, as LayerNormalization: Keras masks pass through.
            norm.supports_masking = True
            return norm
        return norms.LayerNormalization(
            epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name=name
        )

    def _make_pre_norm(self, name, inputs_shape):
        """A built norm of a sublayer's input, or None with
        `sandwich_norm="post"` (only the sublayers' outputs are
        normalized)."""
        if self.sandwich_norm == "post":
            return None
        norm = self._make_norm(name)
        norm.build(inputs_shape)
        return norm

    def _make_post_norm(self, name, inputs_shape):
        """A built norm of a sublayer's output (`sandwich_norm`), or None."""
        if not self.sandwich_norm:
            return None
        norm = self._make_norm(name)
        norm.build(inputs_shape)
        return norm

    def _make_dropout(self, name):
        return keras.layers.Dropout(
            self.dropout, dtype=self.dtype_policy, name=name
        )

    def _make_feed_forward(self):
        if self.moe is not None:
            return MixtureOfExperts(
                **self.moe,
                kernel_initializer=keras_utils.clone_initializer(
                    self.kernel_initializer
                ),
                bias_initializer=keras_utils.clone_initializer(
                    self.bias_initializer
                ),
                dtype=self.dtype_policy,
                name="feed_forward",
            )
        return FeedForward(
            self.intermediate_dim,
            activation=self.activation,
            dropout=self.dropout,
            use_bias=self.use_bias,
            gated=self.gated_feed_forward,
            kernel_initializer=keras_utils.clone_initializer(
                self.kernel_initializer
            ),
            bias_initializer=keras_utils.clone_initializer(
                self.bias_initializer
            ),
            dtype=self.dtype_policy,
            name="feed_forward",
        )

    def build(self, inputs_shape):
        hidden_dim = validation.check_sequence_shape("inputs", inputs_shape)
        self._features = hidden_dim
        if _compose.SELF in self._given:
            _compose.build_layer(self.self_attention, inputs_shape)
        else:
            self.self_attention = self._make_self_attention(hidden_dim)
            self.self_attention.build(inputs_shape)
        self.self_attention_norm = self._make_pre_norm(
            "self_attention_norm", inputs_shape
        )
        self.self_attention_dropout = self._make_dropout(
            "self_attention_dropout"
        )
        if _compose.FEED_FORWARD in self._given:
            _compose.build_layer(self.feed_forward, inputs_shape)
        else:
            self.feed_forward = self._make_feed_forward()
            self.feed_forward.build(inputs_shape)
        self.feed_forward_norm = self._make_pre_norm(
            "feed_forward_norm", inputs_shape
        )
        self.feed_forward_dropout = self._make_dropout("feed_forward_dropout")
        self.self_attention_post_norm = self._make_post_norm(
            "self_attention_post_norm", inputs_shape
        )
        self.feed_forward_post_norm = self._make_post_norm(
            "feed_forward_post_norm", inputs_shape
        )
        self.built = True

    # Residual wiring.

    def _residual(
        self,
        x,
        sublayer,
        norm,
        dropout,
        training,
        post_norm=None,
        sublayer_input=None,
    ):
        """Runs `sublayer` with residual + norm; returns (x, extra outputs).

        Post-norm: `norm(x + dropout(sublayer(x)))`; pre-norm:
        `x + dropout(sublayer(norm(x)))`, or with `sublayer_input` (a
        parallel residual's block input) `x + dropout(sublayer(
        norm(sublayer_input)))`; `post_norm` (`sandwich_norm`) normalizes
        the sublayer's output first; a pre-norm `norm` of None
        (`sandwich_norm="post"`) leaves the sublayer's input as it is. A
        sublayer returning a tuple gives its first item to the residual
        and the rest as extras.
        """
        if sublayer_input is None:
            sublayer_input = x
        y = x
        if self.norm_first:
            y = sublayer_input if norm is None else norm(sublayer_input)
        outputs = sublayer(y)
        if isinstance(outputs, tuple):
            y, extra = outputs[0], outputs[1:]
        else:
            y, extra = outputs, ()
        if post_norm is not None:
            y = post_norm(y)
        x = x + dropout(y, training=training)
        if not self.norm_first:
            x = norm(x)
        return x, extra

    def _self_attention_residual(self, x, training, **attention_kwargs):
        """The self-attention sublayer; `attention_kwargs` go to the
        attention layer (`mask`, `attention_mask`, `cache`, ...). `x` (the
        block's `inputs`) is checked first, and integer inputs computed in
        the compute dtype (the residual sums would mix dtypes)."""
        validation.check_call_input(
            "inputs", x, getattr(self, "_features", None)
        )
        if not keras.backend.is_float_dtype(x.dtype):
            x = keras.ops.cast(x, self.compute_dtype)

        def attend(y):
            args, kwargs = _compose.self_attention_call(
                self, y, attention_kwargs
            )
            return self.self_attention(*args, training=training, **kwargs)

        return self._residual(
            x,
            attend,
            self.self_attention_norm,
            self.self_attention_dropout,
            training,
            post_norm=self.self_attention_post_norm,
        )

    def _feed_forward_residual(
        self, x, training, padding_mask=None, block_inputs=None
    ):
        """The feed-forward sublayer with its residual: on `x` (the output
        of the sublayers before), or with `parallel_residual` on
        `block_inputs` (the block's input), added to `x`. A mixture of
        experts (`moe`) is given the block's `padding_mask`, so that its
        load-balancing loss leaves padded tokens out."""
        sublayer_input = None
        if self.parallel_residual:
            sublayer_input = block_inputs
            if not keras.backend.is_float_dtype(sublayer_input.dtype):
                sublayer_input = keras.ops.cast(
                    sublayer_input, self.compute_dtype
                )
        extra = {}
        if padding_mask is not None and isinstance(
            self.feed_forward, MixtureOfExperts
        ):
            extra["mask"] = padding_mask
        x, _ = self._residual(
            x,
            lambda y: self.feed_forward(y, training=training, **extra),
            self.feed_forward_norm,
            self.feed_forward_dropout,
            training,
            post_norm=self.feed_forward_post_norm,
            sublayer_input=sublayer_input,
        )
        return x

    # Shapes and config.

    def _self_attention_scores_spec(self, inputs, cache=None, sink_tokens=None):
        """Shape of the self-attention weights, as the attention layer says
        (a local attention layer may return banded weights; a rolling
        cache, `sink_tokens`, its slots and this call's keys)."""
        rolling = (
            {} if sink_tokens is None else {"cache_sink_tokens": sink_tokens}
        )
        spec = self.self_attention.compute_output_spec(
            inputs, return_attention_scores=True, cache=cache, **rolling
        )[1]
        return keras.KerasTensor(spec.shape, dtype=self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "intermediate_dim": self.intermediate_dim,
                "key_dim": self.key_dim,
                "num_key_value_heads": self.num_key_value_heads,
                "dropout": self.dropout,
                "activation": keras.activations.serialize(self.activation),
                "norm_first": self.norm_first,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "normalization": self.normalization,
                "use_bias": self.use_bias,
                "gated_feed_forward": self.gated_feed_forward,
                "sandwich_norm": self.sandwich_norm,
                "parallel_residual": self.parallel_residual,
                "rotary_max_wavelength": self.rotary_max_wavelength,
                "rotary_scaling": self.rotary_scaling,
                "attention_scale": self.attention_scale,
                "window_size": self.window_size,
                "qk_norm": self.qk_norm,
                "qk_norm_epsilon": self.qk_norm_epsilon,
                "learned_sinks": self.learned_sinks,
                "rotary_fraction": self.rotary_fraction,
                "attention_output_gate": self.attention_output_gate,
                "moe": None if self.moe is None else dict(self.moe),
                "mixer": self.mixer,
                "mixer_options": _mixer.serialized_options(self.mixer_options),
                "latent_attention": (
                    None
                    if self.latent_attention is None
                    else dict(self.latent_attention)
                ),
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
                "bias_initializer": keras.initializers.serialize(
                    self.bias_initializer
                ),
            }
        )
        config.update(mods_base.config_entries(self))
        if self._given:
            config = _compose.serialize_given(
                config, self._given, self._present
            )
        return config

    @classmethod
    def from_config(cls, config):
        config = _compose.deserialize_given(config)
        config = mods_base.from_config_entries(config)
        return cls(**config)


def _check_moe(moe, intermediate_dim):
    """The blocks' `moe` option: None, or a dict of `MixtureOfExperts`
    arguments (checked by building one; `intermediate_dim` defaults to
    the block's), returned as a plain dict."""
    if moe is None:
        return None
    if not isinstance(moe, dict):
        raise TypeError(
            "`moe` must be None or a dict of MixtureOfExperts arguments "
            f"(num_experts, top_k, ...). Received: moe={moe!r}"
        )
    refused = sorted(
        {"kernel_initializer", "bias_initializer", "dtype", "name"} & set(moe)
    )
    if refused:
        raise ValueError(
            f"`moe` takes the experts' own arguments; {refused} come from "
            f"the block. Received: moe={moe!r}"
        )
    moe = dict(moe)
    moe.setdefault("intermediate_dim", intermediate_dim)
    MixtureOfExperts(**moe)  # Its own checks of the values.
    return moe


def _check_head_shape(num_heads, key_dim, num_key_value_heads):
    """`(key_dim, num_key_value_heads)` checked, as Python ints or None."""
    key_dim = validation.check_positive_int("key_dim", key_dim, allow_none=True)
    num_key_value_heads = validation.check_positive_int(
        "num_key_value_heads", num_key_value_heads, allow_none=True
    )
    if num_key_value_heads is not None and num_heads % num_key_value_heads:
        raise ValueError(
            "`num_key_value_heads` must divide `num_heads`. Received: "
            f"num_key_value_heads={num_key_value_heads!r}, "
            f"num_heads={num_heads!r}"
        )
    return key_dim, num_key_value_heads


def _check_gate(attention_output_gate):
    """The blocks' `attention_output_gate`, a bool."""
    return validation.check_bool("attention_output_gate", attention_output_gate)
