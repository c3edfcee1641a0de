"""`KimiDeltaAttention`: Kimi delta attention (KDA), the linear-time
token mixer of Kimi Linear (Moonshot), as transformers'
`KimiLinearDeltaAttention`: the gated delta rule with a decay per key
channel, with a decoding cache of constant size, Keras masks and packed
documents.

Axes in comments: b - batch, t - positions, h - heads, d - head size,
c - convolution channels.
"""

import math

import keras
from keras import ops

from keras_attention.layers._qk_norm import HeadRMSNorm
from keras_attention.layers.gated_delta_net import GatedDeltaNet
from keras_attention.layers.gated_delta_net import l2_normalize
from keras_attention.ops.scoring import softmax_dtype
from keras_attention.utils import keras_utils
from keras_attention.utils import validation


def _a_log_initializer(shape, dtype=None):
    """fla's (and transformers') `A_log`: `log(U(1, 16))`, decay rates
    from 1 to 16."""
    return ops.log(keras.random.uniform(shape, 1.0, 16.0, dtype=dtype))


def _dt_bias_initializer(shape, dtype=None):
    """fla's (and transformers') `dt_bias`: the inverse softplus of `dt`
    log-uniform in [1e-3, 1e-1] (at least 1e-4), so that the decays
    start between `exp(-16 dt)` and `exp(-dt)`."""
    low, high = math.log(1e-3), math.log(1e-1)
    dt = ops.exp(keras.random.uniform(shape, low, high, dtype=dtype))
    dt = ops.maximum(dt, 1e-4)
    return dt + ops.log(-ops.expm1(-dt))


@keras.saving.register_keras_serializable(package="keras_attention")
class KimiDeltaAttention(GatedDeltaNet):
    """Kimi delta attention (KDA), the linear-time token mixer of Kimi
    Linear, as transformers' `KimiLinearDeltaAttention`: Gated DeltaNet
    whose decay is per key channel instead of per head.

    Per token `x_t` (`d` = `head_dim`, `H` = `num_heads`; any width `x`
    has):

        [q, k, v] = act(conv([x W_q, x W_k, x W_v]))  (short causal conv)
        q, k = l2norm(q), l2norm(k)                    (per head)
        g = -exp(A_log) softplus((x W_fa) W_fb + dt_bias)   (H x d)
        beta = sigmoid(x W_b)                          (per head)
        o = gated_delta_rule(q, k, v, g, beta)         (per head)
        y = (RMSNorm(o) * sigmoid((x W_ga) W_gb)) W_o

    (`keras_attention.ops.gated_delta_rule` with `g` of `(batch, T, H,
    d)`: row `i` of each head's state decays by `exp(g_t[i])`, then the
    delta rule moves the value it recalls for `k_t` toward `v_t` by
    `beta_t`, and `q_t` reads it.) The forget gate `W_fa W_fb` and the
    output gate `W_ga W_gb` are low rank (through `d`). Memory and time
    are linear in the length; a decoding step costs the same whatever
    the length.

    Weights, transformers' by name: the layer's own `conv1d_kernel`
    `(3 H d, K)` (transformers' `conv1d.weight[:, 0]`), `dt_bias` `(H
    d,)` and `A_log` `(H,)` (its `forget_gate.dt_bias`,
    `forget_gate.A_log` flattened), then the `Dense` layers (no biases;
    kernels are transformers' weights transposed) `q_proj`, `k_proj`,
    `v_proj`, `f_a_proj`, `f_b_proj` (its `forget_gate.f_a_proj`,
    `f_b_proj`), `b_proj`, `g_a_proj`, `g_b_proj`, the norm `o_norm`
    (`scale` of `d`) and `o_proj`. The decays, the gates, the norm, the
    recurrence and its state are computed in float32 (float64 in
    float64), as transformers does.

    Padding, packed documents, the cache and the implied attention
    matrix are `GatedDeltaNet`'s (this is its subclass): padded tokens
    are taken out of the sequence (no decay, no write, no convolution
    tap; output zero). transformers zeroes padded inputs instead, which
    gives the same outputs at the real tokens of a left- or right-padded
    row without a cache.

    Args:
        hidden_size: int, the output width (`o_proj`'s units).
        num_heads: int, the heads (query, key and value alike;
            transformers' `linear_num_heads`).
        head_dim: int, the head size `d` of queries, keys and values
            (transformers' `linear_head_dim`).
        conv_kernel_size: int, the convolution's width `K` (default 4;
            transformers' `linear_conv_kernel_dim`).
        hidden_activation: activation after the convolution (default
            "silu", transformers' `hidden_act`).
        layer_norm_epsilon: float > 0, the epsilon of the output RMSNorm
            (default 1e-5, transformers' `rms_norm_eps`).
        kernel_initializer: initializer of the projections and the
            convolution kernel (`A_log` and `dt_bias` start as fla's).
        chunk_size: positive int, the chunk length of the chunked form
            (default 32; a tuning knob, the results do not depend on
            it: its memory is `O(T chunk_size head_dim)` per head, its
            sequential steps `T / chunk_size`).
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Call arguments: `GatedDeltaNet`'s (`inputs`, `mask`, `cache`,
    `cache_update_index`, `segment_ids`, `return_attention_scores`,
    `training`, `padding_mask`). The cache is `(conv_state,
    recurrent_state)`: `(batch, K - 1, 3 H d)` and `(batch, H, d, d)`
    (float32; float64 in float64), as `init_cache` makes them.

    Returns:
        The output `(batch, T, hidden_size)`, then the attention matrix
        `(batch, H, T, T)` if `return_attention_scores`, then the
        updated cache if a `cache` was given.

    Example:

    >>> import numpy as np
    >>> from keras import ops
    >>> import keras_attention
    >>> layer = keras_attention.layers.KimiDeltaAttention(
    ...     hidden_size=16, num_heads=2, head_dim=4)
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
        - Kimi Team, 2025, "Kimi Linear: An Expressive, Efficient
          Attention Architecture" (arXiv 2510.26692).
        - transformers' `KimiLinearDeltaAttention` (transformers 5.25);
          fla's `chunk_kda`.
    """

    def __init__(
        self,
        hidden_size,
        num_heads,
        head_dim,
        conv_kernel_size=4,
        hidden_activation="silu",
        layer_norm_epsilon=1e-5,
        kernel_initializer="glorot_uniform",
        chunk_size=32,
        **kwargs,
    ):
        positive = validation.check_positive_int
        num_heads = positive("num_heads", num_heads)
        head_dim = positive("head_dim", head_dim)
        conv_kernel_size = positive("conv_kernel_size", conv_kernel_size)
        super().__init__(
            hidden_size,
            linear_num_key_heads=num_heads,
            linear_num_value_heads=num_heads,
            linear_key_head_dim=head_dim,
            linear_value_head_dim=head_dim,
            linear_conv_kernel_dim=conv_kernel_size,
            hidden_activation=hidden_activation,
            layer_norm_epsilon=layer_norm_epsilon,
            kernel_initializer=kernel_initializer,
            chunk_size=chunk_size,
            **kwargs,
        )
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.conv_kernel_size = conv_kernel_size

    def build(self, inputs_shape):
        hidden = validation.check_sequence_shape(
            "inputs", inputs_shape, layout="(batch, steps, features)"
        )
        self._features = hidden
        width, d = self.key_dim, self.head_dim
        self.conv1d_weight = self.add_weight(
            name="conv1d_kernel",
            shape=(self.conv_dim, self.conv_kernel_size),
            initializer=keras_utils.clone_initializer(self.kernel_initializer),
            dtype=self.variable_dtype,
        )
        self.dt_bias = self.add_weight(
            name="dt_bias",
            shape=(width,),
            initializer=_dt_bias_initializer,
            dtype=self.variable_dtype,
        )
        self.A_log = self.add_weight(
            name="A_log",
            shape=(self.num_heads,),
            initializer=_a_log_initializer,
            dtype=self.variable_dtype,
        )
        self.q_proj = self._dense(width, "q_proj", hidden)
        self.k_proj = self._dense(width, "k_proj", hidden)
        self.v_proj = self._dense(width, "v_proj", hidden)
        self.f_a_proj = self._dense(d, "f_a_proj", hidden)
        self.f_b_proj = self._dense(width, "f_b_proj", d)
        self.b_proj = self._dense(self.num_heads, "b_proj", hidden)
        self.g_a_proj = self._dense(d, "g_a_proj", hidden)
        self.g_b_proj = self._dense(width, "g_b_proj", d)
        self.o_norm = HeadRMSNorm(
            epsilon=self.layer_norm_epsilon,
            dtype=self.dtype_policy,
            name="o_norm",
        )
        self.o_norm.build((None, d))
        self.o_proj = self._dense(self.hidden_size, "o_proj", width)
        self.built = True

    def _mixer_inputs(self, x, mask, conv_state, documents):
        """`(q, k, v, g, beta, new_conv_state)` of the inputs `x`, `g`
        the log decay per key channel `(b, t, h, d)`."""
        projected = [self.q_proj(x), self.k_proj(x), self.v_proj(x)]
        mixed, conv_state = self._convolve(
            ops.concatenate(projected, axis=-1), mask, conv_state, documents
        )
        h, d, width = self.num_heads, self.head_dim, self.key_dim
        q, k, v = (
            self._heads(mixed[..., i * width : (i + 1) * width], h, d)
            for i in range(3)
        )
        dtype = softmax_dtype(x.dtype)
        forget = ops.cast(self.f_b_proj(self.f_a_proj(x)), dtype)
        forget = self._heads(forget + ops.cast(self.dt_bias, dtype), h, d)
        rate = ops.exp(ops.cast(self.A_log, dtype))[:, None]  # (h, 1)
        g = -rate * ops.softplus(forget)
        beta = ops.sigmoid(ops.cast(self.b_proj(x), dtype))
        return l2_normalize(q), l2_normalize(k), v, g, beta, conv_state

    def _output(self, core, inputs):
        """The layer's output of the rule's `core` `(b, t, h, d)`:
        RMS-normed, gated by `sigmoid((x W_ga) W_gb)` in float32 (as
        transformers' `KimiLinearRMSNormGated`), projected by
        `o_proj`."""
        gate = self.g_b_proj(self.g_a_proj(inputs))
        dtype = softmax_dtype(gate.dtype)
        gate = self._heads(ops.cast(gate, dtype), self.num_heads, self.head_dim)
        normed = ops.cast(self.o_norm(core), dtype) * ops.sigmoid(gate)
        shape = ops.shape(normed)
        normed = ops.reshape(normed, (shape[0], shape[1], self.key_dim))
        return self.o_proj(ops.cast(normed, self.compute_dtype))

    def get_config(self):
        config = super().get_config()
        for name in (
            "linear_num_key_heads",
            "linear_num_value_heads",
            "linear_key_head_dim",
            "linear_value_head_dim",
            "linear_conv_kernel_dim",
        ):
            config.pop(name)
        config.update(
            num_heads=self.num_heads,
            head_dim=self.head_dim,
            conv_kernel_size=self.conv_kernel_size,
        )
        return config
