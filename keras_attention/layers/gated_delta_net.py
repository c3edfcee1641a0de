"""`GatedDeltaNet`: the gated delta rule token mixer of Qwen3-Next and
Qwen 3.5 (keras-hub's `Qwen3_5GatedDeltaNet`), with a decoding cache of
constant size, Keras masks and packed documents.

Axes in comments: b - batch, t - positions, h - value heads, k/v - key
and value head dims, c - convolution channels.
"""

import inspect

import keras
from keras import ops

from keras_attention.layers import _einsum_dense
from keras_attention.layers import recording
from keras_attention.layers import token_mixer
from keras_attention.layers._qk_norm import HeadRMSNorm
from keras_attention.layers._short_convolution import causal_convolution
from keras_attention.layers.token_mixer import TokenMixer
from keras_attention.ops.gated_delta_rule import gated_delta_rule
from keras_attention.ops.gated_delta_rule import implied_attention
from keras_attention.ops.scoring import softmax_dtype
from keras_attention.utils import attention_checks
from keras_attention.utils import keras_utils
from keras_attention.utils import validation

_LAYOUT = "(batch, steps, features)"


def _check_activation(value):
    try:
        return keras.activations.get(value)
    except (ValueError, TypeError) as error:
        raise ValueError(
            "`hidden_activation` must be the name of a Keras activation "
            f"or a callable. Received: hidden_activation={value!r}"
        ) from error


def l2_normalize(x, epsilon=1e-6):
    """`x / sqrt(sum(x^2) + eps)` over the last axis, in at least
    float32 (keras-hub's `_l2norm`)."""
    x = ops.cast(x, softmax_dtype(x.dtype))
    return x * ops.rsqrt(ops.sum(x * x, axis=-1, keepdims=True) + epsilon)


def _check_segment_ids(segment_ids, inputs):
    """`segment_ids` integers of shape `(batch, T)` of `inputs`."""
    shape = tuple(segment_ids.shape)
    want = tuple(inputs.shape[:2])
    if len(shape) != 2 or any(
        a is not None and b is not None and a != b for a, b in zip(shape, want)
    ):
        raise ValueError(
            f"`segment_ids` must have shape (batch, T) = {want!r}, the "
            f"inputs' first two axes. Received: segment_ids.shape={shape!r}"
        )
    dtype = keras.backend.standardize_dtype(segment_ids.dtype)
    if "int" not in dtype:
        raise TypeError(
            "`segment_ids` must hold integers. Received: "
            f"segment_ids.dtype={dtype!r}"
        )


def _documents(segment_ids):
    """The document index `(b, t)` of packed `segment_ids`: the count of
    id changes up to each token (as `gated_delta_rule` reads them)."""
    ids = ops.convert_to_tensor(segment_ids)
    changed = ops.cast(ops.not_equal(ids[:, 1:], ids[:, :-1]), "int32")
    changed = ops.concatenate([ops.zeros_like(changed[:, :1]), changed], 1)
    return ops.cumsum(changed, axis=1)


@keras.saving.register_keras_serializable(package="keras_attention")
class GatedDeltaNet(
    recording.AttentionRecording, TokenMixer, keras.layers.Layer
):
    """Gated DeltaNet (Yang, Kautz & Hatamizadeh 2025), the linear-time
    token mixer of Qwen3-Next and Qwen 3.5, as keras-hub's
    `Qwen3_5GatedDeltaNet`.

    Per token `x_t` (`d` = `hidden_size` in, any width `x` has):

        [q, k, v] = act(conv(x W_qkv))     (short causal depthwise conv)
        q, k = l2norm(q), l2norm(k)        (per key head)
        beta = sigmoid(x W_b),  g = -exp(A_log) softplus(x W_a + dt_bias)
        o = gated_delta_rule(q, k, v, g, beta)         (per value head)
        y = (RMSNorm(o) * silu(x W_z)) W_out

    (`keras_attention.ops.gated_delta_rule`: the state `S` of each value
    head is decayed by `exp(g_t)`, corrected toward `v_t` by the delta
    rule with strength `beta_t` and read by `q_t`.) Key heads are
    repeated to the value heads. Memory and time are linear in the
    length; a decoding step costs the same whatever the length.

    Weights: keras-hub's, in its order and shapes, so that
    `layer.set_weights(hub_layer.get_weights())` carries a keras-hub
    layer over: `conv1d_kernel` `(conv_dim, K)`, `dt_bias`, `A_log`
    `(value_heads,)`, then the `Dense` layers `in_proj_qkv` (`conv_dim =
    2 key_dim + value_dim` units), `in_proj_z`, `in_proj_b`, `in_proj_a`,
    the norm `norm` (`scale` of `linear_value_head_dim`) and `out_proj`,
    no biases. Computed in float32 where keras-hub does (the decays, the
    norm, the recurrence and its state; float64 in float64).

    Padding (the Keras mask, or `mask`): padded tokens are taken out of
    the sequence. They neither decay nor write the recurrent state, do
    not enter the convolution (a token after padding convolves the real
    tokens before it), and their outputs are zeros; the outputs of the
    real tokens and the cache equal those of the row without its padding.
    keras-hub's layer zeroes padded inputs instead: the same outputs for
    left or right padding without a cache, but its cached prefill of a
    right-padded buffer runs the decay and the convolution over the
    padding (see the linear attention guide).

    Args:
        hidden_size: int, the output width (`out_proj`'s units).
        linear_num_key_heads: int, query/key heads.
        linear_num_value_heads: int, value heads (a multiple of the key
            heads).
        linear_key_head_dim: int, query/key head size `k`.
        linear_value_head_dim: int, value head size `v`.
        linear_conv_kernel_dim: int, the convolution's width `K`
            (default 4).
        hidden_activation: activation after the convolution (default
            "silu", which keras-hub applies whatever this argument).
        layer_norm_epsilon: float > 0, the epsilon of the output RMSNorm
            (default 1e-6).
        kernel_initializer: initializer of the projections and the
            convolution kernel.
        chunk_size: positive int, the chunk length of the chunked form
            (default 64; a tuning knob, the results do not depend on it).
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: `(batch, T, features)`.
        mask: optional boolean `(batch, T)`, True on real tokens; read
            from the Keras mask of `inputs` when omitted. The output
            carries it.
        cache: optional `(conv_state, recurrent_state)`: the last `K - 1`
            inputs of the convolution `(batch, K - 1, conv_dim)` (the
            compute dtype) and the state `(batch, value_heads, k, v)`
            (float32; float64 in float64), as `init_cache` makes them;
            the call continues from it and returns it updated. Any number
            of tokens per call (a prefill, one decoding step): the cache
            has the same size after any number of tokens.
        cache_update_index: optional int, the position of this call's
            first token, taken for the other layers' signature: the
            recurrent cache does not depend on it.
        segment_ids: optional integer `(batch, T)`: packed documents (a
            run of equal ids is one document); the state and the
            convolution restart at each change of id (a cache belongs to
            the first document).
        return_attention_scores: bool, also return the attention matrix
            the layer applies to its values, `(batch, value_heads, T,
            T)`: the rule is linear in the values, `o = W v` with `W =
            (Q K^T * D) (I + A)^{-1} diag(beta)` lower triangular (`D`
            the decays, `A` the strictly lower `beta_i exp(G_i - G_j)
            k_i . k_j`; see `keras_attention.ops.gated_delta_rule`),
            exact, `O(T^2)` memory: for short inputs. Refused with a
            cache (the output then also reads the state of earlier
            calls, which no matrix over this call's tokens holds).
        training: unused (no dropout), for Keras.
        padding_mask: the `TokenMixer` name of `mask` (both given: and-ed).

    Returns:
        The output `(batch, T, hidden_size)`, then the matrix if
        `return_attention_scores`, then the updated cache if a `cache`
        was given.

    Example:

    >>> import numpy as np
    >>> from keras import ops
    >>> import keras_attention
    >>> layer = keras_attention.layers.GatedDeltaNet(
    ...     hidden_size=16, linear_num_key_heads=1, linear_num_value_heads=2,
    ...     linear_key_head_dim=4, linear_value_head_dim=4)
    >>> x = np.random.default_rng(0).normal(size=(1, 5, 16)).astype("float32")
    >>> y = ops.convert_to_numpy(layer(x))
    >>> cache = layer.init_cache(batch_size=1)
    >>> steps = []
    >>> for t in range(5):  # token by token, constant-size cache
    ...     y_t, cache = layer(x[:, t : t + 1], cache=cache)
    ...     steps.append(ops.convert_to_numpy(y_t))
    >>> bool(np.allclose(np.concatenate(steps, axis=1), y, atol=1e-5))
    True

    References:
        - Yang, Kautz & Hatamizadeh, 2025, "Gated Delta Networks:
          Improving Mamba2 with Delta Rule" (ICLR 2025, arXiv
          2412.06464).
        - Qwen Team, 2025, Qwen3-Next; keras-hub's
          `Qwen3_5GatedDeltaNet` (keras-hub 0.32).
    """

    attention_kind = "self"

    def __init__(
        self,
        hidden_size,
        linear_num_key_heads,
        linear_num_value_heads,
        linear_key_head_dim,
        linear_value_head_dim,
        linear_conv_kernel_dim=4,
        hidden_activation="silu",
        layer_norm_epsilon=1e-6,
        kernel_initializer="glorot_uniform",
        chunk_size=64,
        **kwargs,
    ):
        super().__init__(**kwargs)
        positive = validation.check_positive_int
        self.hidden_size = positive("hidden_size", hidden_size)
        self.linear_num_key_heads = positive(
            "linear_num_key_heads", linear_num_key_heads
        )
        self.linear_num_value_heads = positive(
            "linear_num_value_heads", linear_num_value_heads
        )
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError(
                "`linear_num_value_heads` must be a multiple of "
                "`linear_num_key_heads` (key heads are repeated to the "
                "value heads). Received: linear_num_value_heads="
                f"{linear_num_value_heads!r}, linear_num_key_heads="
                f"{linear_num_key_heads!r}"
            )
        self.linear_key_head_dim = positive(
            "linear_key_head_dim", linear_key_head_dim
        )
        self.linear_value_head_dim = positive(
            "linear_value_head_dim", linear_value_head_dim
        )
        self.linear_conv_kernel_dim = positive(
            "linear_conv_kernel_dim", linear_conv_kernel_dim
        )
        self._activation = _check_activation(hidden_activation)
        self.hidden_activation = hidden_activation
        self.layer_norm_epsilon = float(
            validation.check_positive_number(
                "layer_norm_epsilon", layer_norm_epsilon
            )
        )
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.chunk_size = positive("chunk_size", chunk_size)
        self.supports_masking = True

    @property
    def key_dim(self):
        """All key heads' width, `linear_num_key_heads *
        linear_key_head_dim`."""
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def value_dim(self):
        """All value heads' width, `linear_num_value_heads *
        linear_value_head_dim`."""
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self):
        """The convolution's channels, `2 key_dim + value_dim`."""
        return 2 * self.key_dim + self.value_dim

    # Build ---------------------------------------------------------------

    def _dense(self, units, name, input_dim):
        dense = _einsum_dense.Dense(
            units,
            use_bias=False,
            kernel_initializer=keras_utils.clone_initializer(
                self.kernel_initializer
            ),
            dtype=self.dtype_policy,
            name=name,
        )
        dense.build((None, None, input_dim))
        return dense

    def build(self, inputs_shape):
        hidden = validation.check_sequence_shape(
            "inputs", inputs_shape, layout=_LAYOUT
        )
        self._features = hidden
        heads = self.linear_num_value_heads
        # keras-hub's order (`get_weights` lists the layer's own weights,
        # then its sublayers' in this order).
        self.in_proj_qkv = self._dense(self.conv_dim, "in_proj_qkv", hidden)
        self.in_proj_z = self._dense(self.value_dim, "in_proj_z", hidden)
        self.in_proj_b = self._dense(heads, "in_proj_b", hidden)
        self.in_proj_a = self._dense(heads, "in_proj_a", hidden)
        self.conv1d_weight = self.add_weight(
            name="conv1d_kernel",
            shape=(self.conv_dim, self.linear_conv_kernel_dim),
            initializer=keras_utils.clone_initializer(self.kernel_initializer),
            dtype=self.variable_dtype,
        )
        self.dt_bias = self.add_weight(
            name="dt_bias",
            shape=(heads,),
            initializer="ones",
            dtype=self.variable_dtype,
        )
        self.A_log = self.add_weight(
            name="A_log",
            shape=(heads,),
            initializer="zeros",
            dtype=self.variable_dtype,
        )
        self.norm = HeadRMSNorm(
            epsilon=self.layer_norm_epsilon,
            dtype=self.dtype_policy,
            name="norm",
        )
        self.norm.build((None, self.linear_value_head_dim))
        self.out_proj = self._dense(
            self.hidden_size, "out_proj", self.value_dim
        )
        self.built = True

    def init_cache(self, batch_size, max_length=None, dtype=None):
        """A zero cache `(conv_state, recurrent_state)` for `batch_size`
        rows (`TokenMixer`): `(batch, K - 1, conv_dim)` in `dtype` (the
        compute dtype by default) and `(batch, value_heads, k, v)` in
        float32 (float64 for a float64 layer): its size does not grow
        with the tokens (`max_length` is not read)."""
        dtype = dtype or self.compute_dtype
        conv = ops.zeros(
            (batch_size, self.linear_conv_kernel_dim - 1, self.conv_dim),
            dtype,
        )
        state = ops.zeros(
            (
                batch_size,
                self.linear_num_value_heads,
                self.linear_key_head_dim,
                self.linear_value_head_dim,
            ),
            softmax_dtype(self.compute_dtype),
        )
        return conv, state

    # Call ----------------------------------------------------------------

    def _check_call(self, inputs, mask, cache, index, return_scores):
        validation.check_call_input(
            "inputs", inputs, self._features, (3,), _LAYOUT
        )
        validation.check_padding_mask("mask", mask, inputs)
        if index is not None:
            validation.check_index("cache_update_index", index)
        if cache is None:
            if index is not None:
                raise ValueError(
                    "`cache_update_index` needs a `cache` (it is the "
                    "position of a cached call's first token). Received: "
                    f"cache=None, cache_update_index={index!r}"
                )
            return
        if not isinstance(cache, (tuple, list)) or len(cache) != 2:
            raise ValueError(
                "`cache` must be a pair `(conv_state, recurrent_state)` "
                "(see `init_cache`). Received: cache of type "
                f"{type(cache).__name__!r}"
            )
        for i in (0, 1):
            attention_checks.check_cache_batch(
                f"cache[{i}]", cache[i], inputs, "inputs"
            )
        batch = inputs.shape[0]
        shapes = {
            "cache[0]": (
                tuple(cache[0].shape),
                (batch, self.linear_conv_kernel_dim - 1, self.conv_dim),
            ),
            "cache[1]": (
                tuple(cache[1].shape),
                (
                    batch,
                    self.linear_num_value_heads,
                    self.linear_key_head_dim,
                    self.linear_value_head_dim,
                ),
            ),
        }
        for name, (got, want) in shapes.items():
            ok = len(got) == len(want) and all(
                a is None or b is None or a == b for a, b in zip(got, want)
            )
            if not ok:
                raise ValueError(
                    f"`{name}` must have shape {want!r} (`init_cache`'s). "
                    f"Received: {name}.shape={got!r}"
                )
        if return_scores:
            raise ValueError(
                "`return_attention_scores` cannot apply to a cached call: "
                "its output also reads the state of earlier calls, which "
                "no matrix over this call's tokens holds. Received: "
                "return_attention_scores=True with a cache"
            )

    def _heads(self, x, heads, size):
        shape = ops.shape(x)
        return ops.reshape(x, (shape[0], shape[1], heads, size))

    def _convolve(self, mixed, mask, conv_state, documents):
        """`(act(conv(mixed)), new_conv_state)`: the short convolution of
        the projected `mixed` `(b, t, conv_dim)`, then the activation."""
        if conv_state is None:
            shape = ops.shape(mixed)
            conv_state = ops.zeros(
                (shape[0], self.linear_conv_kernel_dim - 1, self.conv_dim),
                mixed.dtype,
            )
        kernel = ops.cast(self.conv1d_weight, mixed.dtype)
        mixed, conv_state = causal_convolution(
            mixed, kernel, ops.cast(conv_state, mixed.dtype), mask, documents
        )
        return self._activation(mixed), conv_state

    def _mixer_inputs(self, x, mask, conv_state, documents):
        """`(q, k, v, g, beta, new_conv_state)` of the inputs `x`."""
        mixed, conv_state = self._convolve(
            self.in_proj_qkv(x), mask, conv_state, documents
        )
        kd = self.key_dim
        hk, hv = self.linear_num_key_heads, self.linear_num_value_heads
        q = self._heads(mixed[..., :kd], hk, self.linear_key_head_dim)
        k = self._heads(mixed[..., kd : 2 * kd], hk, self.linear_key_head_dim)
        v = self._heads(mixed[..., 2 * kd :], hv, self.linear_value_head_dim)
        dtype = softmax_dtype(x.dtype)
        beta = ops.sigmoid(ops.cast(self.in_proj_b(x), dtype))
        a = ops.cast(self.in_proj_a(x), dtype)
        g = -ops.exp(ops.cast(self.A_log, dtype)) * ops.softplus(
            a + ops.cast(self.dt_bias, dtype)
        )
        return l2_normalize(q), l2_normalize(k), v, g, beta, conv_state

    def call(
        self,
        inputs,
        mask=None,
        cache=None,
        cache_update_index=None,
        segment_ids=None,
        return_attention_scores=False,
        training=None,
        padding_mask=None,
    ):
        mask = token_mixer.padding_mask_and(padding_mask, "mask", mask)
        mask, segment_ids = attention_checks.as_tensors(
            mask=mask, segment_ids=segment_ids
        )
        if mask is None:
            mask = keras_utils.keras_mask(inputs)
        self._check_call(
            inputs, mask, cache, cache_update_index, return_attention_scores
        )
        if mask is not None:
            mask = ops.cast(mask, "bool")
        documents = None
        if segment_ids is not None:
            _check_segment_ids(segment_ids, inputs)
            documents = _documents(segment_ids)
        conv_state, state = (None, None) if cache is None else cache
        q, k, v, g, beta, conv_state = self._mixer_inputs(
            inputs, mask, conv_state, documents
        )
        result = gated_delta_rule(
            q,
            k,
            v,
            g,
            beta,
            chunk_size=self.chunk_size,
            initial_state=state,
            return_state=cache is not None,
            segment_ids=segment_ids,
            key_mask=mask,
        )
        core, state = result if cache is not None else (result, None)
        output = self._output(core, inputs)
        outputs = (output,)
        if return_attention_scores:
            weights = implied_attention(q, k, g, beta, segment_ids, mask)
            outputs += (ops.cast(weights, output.dtype),)
        if cache is not None:
            outputs += ((ops.cast(conv_state, output.dtype), state),)
        return outputs[0] if len(outputs) == 1 else outputs

    def _output(self, core, inputs):
        """The layer's output of the rule's `core` `(b, t, heads, v)`:
        normed, gated by `silu(x W_z)`, projected by `out_proj`."""
        z = self._heads(
            self.in_proj_z(inputs),
            self.linear_num_value_heads,
            self.linear_value_head_dim,
        )
        core = self.norm(ops.cast(core, z.dtype)) * ops.silu(z)
        shape = ops.shape(core)
        return self.out_proj(
            ops.reshape(core, (shape[0], shape[1], self.value_dim))
        )

    def compute_mask(self, inputs, previous_mask=None):
        return previous_mask

    def compute_output_spec(
        self, inputs, cache=None, return_attention_scores=False, **kwargs
    ):
        validation.check_sequence_shape("inputs", inputs.shape, layout=_LAYOUT)
        dtype = self.compute_dtype
        batch, t = inputs.shape[0], inputs.shape[1]
        outputs = (keras.KerasTensor((batch, t, self.hidden_size), dtype),)
        if return_attention_scores:
            shape = (batch, self.linear_num_value_heads, t, t)
            outputs += (keras.KerasTensor(shape, dtype=dtype),)
        if cache is not None:
            conv, state = cache
            outputs += (
                (
                    keras.KerasTensor(tuple(conv.shape), dtype=dtype),
                    keras.KerasTensor(
                        tuple(state.shape), dtype=softmax_dtype(dtype)
                    ),
                ),
            )
        return outputs[0] if len(outputs) == 1 else outputs

    def call_with_attention(self, call, args, kwargs, options):
        """`collect_attention`'s hook: the call with
        `return_attention_scores=True`, refused before it runs when the
        sequence is longer than `options["max_dense_length"]` (the
        matrix is `(T, T)` per head)."""
        bound = inspect.signature(call).bind(*args, **kwargs)
        inputs = bound.arguments.get("inputs")
        steps = None if inputs is None else inputs.shape[1]
        limit = options.get("max_dense_length")
        if limit is not None and steps is not None and steps > limit:
            raise ValueError(
                f"`{self.name}` ({type(self).__name__}) ran on {steps} "
                "steps: its "
                f"attention matrix would be a dense ({steps}, {steps}) "
                "matrix per head. Pass a shorter probe, leave the layer "
                "out with `layers=`, or raise `max_dense_length` (None: no "
                f"limit). Received: max_dense_length={limit!r}"
            )
        return super().call_with_attention(call, args, kwargs, options)

    def describe_attention(self, arguments, scores, options):
        """`collect_attention`'s hook (`layers/recording.py`): the
        implied attention matrix `(batch, value_heads, T, T)` of one
        uncached call (causal, self)."""
        mask = recording.padding_mask(
            arguments.get("mask"), arguments.get("inputs")
        )
        meta = dict(
            kind="self",
            query_mask=mask,
            key_mask=mask,
            causal=True,
            window=None,
        )
        return recording.numpy_weights(scores), meta

    def get_config(self):
        config = super().get_config()
        config.update(
            hidden_size=self.hidden_size,
            linear_num_key_heads=self.linear_num_key_heads,
            linear_num_value_heads=self.linear_num_value_heads,
            linear_key_head_dim=self.linear_key_head_dim,
            linear_value_head_dim=self.linear_value_head_dim,
            linear_conv_kernel_dim=self.linear_conv_kernel_dim,
            hidden_activation=keras.activations.serialize(self._activation),
            layer_norm_epsilon=self.layer_norm_epsilon,
            kernel_initializer=keras.initializers.serialize(
                self.kernel_initializer
            ),
            chunk_size=self.chunk_size,
        )
        return config
