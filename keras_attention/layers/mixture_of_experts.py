import keras
import numpy as np
from keras import ops

from keras_attention.layers import _moe_routing
from keras_attention.ops.scoring import softmax_dtype
from keras_attention.utils import attention_checks
from keras_attention.utils import keras_utils
from keras_attention.utils import validation

# keras-hub's sparse MoE blocks (class name -> routing family), their
# `MixtureOfExperts` arguments and weights, and gpt-oss's interleaved
# gate/up columns reordered: for `from_keras_hub` and the converters
# (`keras_attention.interop`).
HUB_BLOCKS = _moe_routing.HUB_BLOCKS
hub_arguments_and_weights = _moe_routing.hub_arguments_and_weights
deinterleave_gate_up = _moe_routing.deinterleave
shared_expert_variables = _moe_routing.shared_expert_variables

_RANKS = (2, 3, 4, 5)
_LAYOUT = "(batch, ..., features)"


@keras.saving.register_keras_serializable(package="keras_attention")
class MixtureOfExperts(keras.layers.Layer):
    """Sparse mixture-of-experts feed-forward layer (Mixtral, Qwen3-MoE,
    gpt-oss, DeepSeek-V3), computed densely.

    A router (`x W_r (+ b_r)`) scores `num_experts` gated feed-forward
    experts for every token; each token's output is the weighted sum of its
    `top_k` experts' outputs, `sum_e w_e (act(x W_gu[e] + b_gu[e]) W_d[e] +
    b_d[e])`. Every expert is computed for every token with one einsum over
    an experts axis (no gather or scatter: simple, and exact; the cost is
    `num_experts / top_k` times a sparse dispatch's).

    Routing (`routing`): `"softmax_topk"` takes the `top_k` largest of the
    softmax over all experts, renormalized to sum 1 when `normalize_top_k`;
    `"topk_softmax"` takes a softmax over the `top_k` largest logits;
    `"sigmoid_topk"` (DeepSeek-V3) scores each expert `sigmoid(logit)`,
    chooses the `top_k` largest of the scores plus a score-correction
    bias (`score_correction_bias`: a non-trainable weight, DeepSeek's
    load balancing without a loss, which steers the choice and not the
    weights), among the experts of the `top_k_groups` best of
    `num_groups` groups of consecutive experts (a group's score: its two
    best corrected scores summed), and weights them by their scores,
    divided by their sum (plus 1e-20) with `normalize_top_k`. Every
    routing's weights are then multiplied by `routed_scaling_factor`. The
    router, its softmax and the load-balancing loss run in float32 for
    float16/bfloat16 computations (under `mixed_*` policies the router's
    float32 weights are read as they are, not cast to half precision), in
    float64 for float64 ones; the experts' activation also runs in float32
    for float16/bfloat16.

    A shared expert (`shared_expert_dim`: Qwen-MoE, Qwen 3.5-MoE; DeepSeek's
    shared experts) is one more gated expert, of width `shared_expert_dim`,
    that every token goes through: its output is added to the routed
    experts', scaled by `sigmoid(x w_g)` (one logit per token) with
    `shared_expert_gate`.

    Experts (`activation`): `"swiglu"`, `silu(gate) * up`; `"gpt_oss_glu"`,
    gpt-oss's clamped GLU: `gate = min(gate, glu_limit)`, `up =
    clip(up, -glu_limit, glu_limit)`, `(up + 1) * gate * sigmoid(glu_alpha
    * gate)`. Weights (the `set_weights` order; the bracketed ones only
    with `router_bias` / `expert_bias`): `router_kernel (hidden,
    num_experts)`, [`router_bias (num_experts,)`], `gate_up_kernel
    (num_experts, hidden, 2 * intermediate_dim)` (gate columns first, then
    up), [`gate_up_bias (num_experts, 2 * intermediate_dim)`],
    `down_kernel (num_experts, intermediate_dim, hidden)`, [`down_bias
    (num_experts, hidden)`], then with a shared expert
    `shared_gate_up_kernel (hidden, 2 * shared_expert_dim)` (gate columns
    first), `shared_down_kernel (shared_expert_dim, hidden)` and
    [`shared_gate_kernel (hidden, 1)`], and last the non-trainable
    [`score_correction_bias (num_experts,)`] (float32 under mixed
    policies). `MixtureOfExperts.from_keras_hub(block)`
    copies a keras-hub block (Mixtral: gate and up kernels concatenated;
    gpt-oss: its interleaved gate/up columns de-interleaved).

    The presets of keras-hub 0.32's blocks:

    | argument             | Mixtral        | Qwen3-MoE       | gpt-oss       |
    |----------------------|----------------|-----------------|---------------|
    | routing              | "softmax_topk" | "softmax_topk"  | "topk_softmax"|
    | normalize_top_k      | True           | norm_top_k_prob | False         |
    |                      |                | (False)         | (no effect)   |
    | router_bias          | False          | False           | True          |
    | activation           | "swiglu"       | "swiglu"        | "gpt_oss_glu" |
    | expert_bias          | False          | False           | True          |
    | glu_alpha, glu_limit | -              | -               | 1.702, 7.0    |
    | router_aux_loss_coef | 0.02           | 0.01            | None (none in |
    |                      |                |                 | keras-hub)    |
    | router_jitter_noise  | its argument   | 0.0             | 0.0           |

    DeepSeek-V3 (`transformers`' `DeepseekV3MoE`): `routing=
    "sigmoid_topk"`, `score_correction_bias=True`, `num_groups=n_group`,
    `top_k_groups=topk_group`, `normalize_top_k=norm_topk_prob`,
    `routed_scaling_factor`, `shared_expert_dim = n_shared_experts *
    moe_intermediate_size` (ungated), `activation="swiglu"`.

    Load balancing: with `router_aux_loss_coef` (not None or 0), a call
    with `training=True` adds `router_aux_loss_coef * num_experts * sum_e
    f_e P_e` with `self.add_loss` (`f_e` the share of the top-k choices
    given to expert `e`, `P_e` its mean router probability over all
    experts), keras-hub's formula. Keras masks are read and passed
    through: masked (padding) tokens are left out of that loss's
    statistics, as keras-hub's Mixtral block does with its padding mask;
    their outputs are computed like any other token's.

    Args:
        num_experts: int, the number of experts.
        top_k: int in `[1, num_experts]`, experts per token.
        intermediate_dim: int, each expert's hidden width.
        routing: `"softmax_topk"`, `"topk_softmax"` or `"sigmoid_topk"`
            (above).
        normalize_top_k: bool, renormalize the top-k probabilities
            (`"softmax_topk"`, `"sigmoid_topk"`).
        router_bias: bool, a bias on the router's logits (gpt-oss).
        activation: `"swiglu"` or `"gpt_oss_glu"` (above).
        expert_bias: bool, biases on the experts' projections (gpt-oss).
        glu_alpha: float > 0, `"gpt_oss_glu"`'s sigmoid factor.
        glu_limit: float > 0, `"gpt_oss_glu"`'s clamp.
        router_aux_loss_coef: None or a float >= 0, the load-balancing
            loss's factor (None or 0: no loss; not with `"sigmoid_topk"`,
            whose balance is the score-correction bias).
        shared_expert_dim: None or int, the width of the shared expert
            (None: none). It has the routed experts' `activation` and no
            biases (`expert_bias` is refused with it).
        shared_expert_gate: bool, scale the shared expert's output by
            `sigmoid(x w_g)` (needs `shared_expert_dim`).
        num_groups: int dividing `num_experts`, the expert groups of
            `"sigmoid_topk"` (1: no group limit; more: at least 2
            experts a group). Defaults to 1.
        top_k_groups: int in `[1, num_groups]`, the groups a token's
            experts are chosen from (enough for `top_k` experts).
            Defaults to 1.
        score_correction_bias: bool, `"sigmoid_topk"`'s score-correction
            bias weight (zeros until set). Defaults to False.
        routed_scaling_factor: number > 0, the factor on the routing
            weights (DeepSeek-V3: 2.5). Defaults to 1.
        scale_expert_inputs: bool, each chosen expert takes the token
            times its routing weight, `expert_e(w_e x)`, rather than
            weighting its output, `w_e expert_e(x)` (Llama 4); not with
            `expert_bias` (an unchosen expert, fed zeros, would give its
            biases). Defaults to False.
        router_jitter_noise: float in [0, 1), Mixtral's training-time
            noise: the inputs (of the router and the experts) are
            multiplied by `uniform(1 - noise, 1 + noise)`.
        kernel_initializer: initializer of the router's and experts'
            kernels.
        bias_initializer: initializer of the biases.
        seed: None or int, the jitter noise's seed.
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: `(batch, ..., hidden)`.
        mask: Keras mask `inputs.shape[:-1]` (True: a real token), read
            for the load-balancing loss.
        training: bool, the load-balancing loss and the jitter noise on.

    Returns:
        `inputs`' shape.

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> moe = keras_attention.layers.MixtureOfExperts(
    ...     num_experts=4, top_k=2, intermediate_dim=16)
    >>> tuple(moe(np.ones((2, 5, 8), "float32")).shape)
    (2, 5, 8)
    >>> gpt_oss = keras_attention.layers.MixtureOfExperts(
    ...     4, 2, 16, routing="topk_softmax", router_bias=True,
    ...     activation="gpt_oss_glu", expert_bias=True)
    >>> tuple(gpt_oss(np.ones((2, 5, 8), "float32")).shape)
    (2, 5, 8)
    >>> print(*[w.path.split("/")[-1] for w in gpt_oss.weights])
    router_kernel router_bias gate_up_kernel gate_up_bias down_kernel down_bias

    References:
        - Shazeer et al., 2017, "Outrageously Large Neural Networks: The
          Sparsely-Gated Mixture-of-Experts Layer".
        - Fedus et al., 2021, "Switch Transformers" (the load-balancing
          loss).
        - Jiang et al., 2024, "Mixtral of Experts".
        - Qwen Team, 2025, "Qwen3 Technical Report".
        - OpenAI, 2025, "gpt-oss-120b & gpt-oss-20b Model Card".
        - DeepSeek-AI, 2024, "DeepSeek-V3 Technical Report" (arXiv
          2412.19437), section 2.1.2.
    """

    def __init__(
        self,
        num_experts,
        top_k,
        intermediate_dim,
        routing="softmax_topk",
        normalize_top_k=False,
        router_bias=False,
        activation="swiglu",
        expert_bias=False,
        glu_alpha=1.702,
        glu_limit=7.0,
        router_aux_loss_coef=None,
        router_jitter_noise=0.0,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        seed=None,
        shared_expert_dim=None,
        shared_expert_gate=False,
        num_groups=1,
        top_k_groups=1,
        score_correction_bias=False,
        routed_scaling_factor=1.0,
        scale_expert_inputs=False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_experts = validation.check_positive_int(
            "num_experts", num_experts
        )
        self.top_k = validation.check_positive_int("top_k", top_k)
        if self.top_k > self.num_experts:
            raise ValueError(
                "`top_k` must be at most `num_experts` "
                f"({self.num_experts!r}). Received: top_k={top_k!r}"
            )
        self.intermediate_dim = validation.check_positive_int(
            "intermediate_dim", intermediate_dim
        )
        self.routing = _choice("routing", routing, _moe_routing.ROUTINGS)
        self.normalize_top_k = validation.check_bool(
            "normalize_top_k", normalize_top_k
        )
        self.router_bias = validation.check_bool("router_bias", router_bias)
        self.activation = _choice(
            "activation", activation, _moe_routing.ACTIVATIONS
        )
        self.expert_bias = validation.check_bool("expert_bias", expert_bias)
        self.glu_alpha = validation.check_positive_number(
            "glu_alpha", glu_alpha
        )
        self.glu_limit = validation.check_positive_number(
            "glu_limit", glu_limit
        )
        self.router_aux_loss_coef = _check_coef(router_aux_loss_coef)
        self.router_jitter_noise = validation.check_rate(
            "router_jitter_noise", router_jitter_noise
        )
        self.shared_expert_dim, self.shared_expert_gate = _check_shared(
            shared_expert_dim, shared_expert_gate, self.expert_bias
        )
        (
            self.num_groups,
            self.top_k_groups,
            self.score_correction_bias,
        ) = _check_sigmoid_routing(
            self, num_groups, top_k_groups, score_correction_bias
        )
        self.routed_scaling_factor = validation.check_positive_number(
            "routed_scaling_factor", routed_scaling_factor
        )
        self.scale_expert_inputs = validation.check_bool(
            "scale_expert_inputs", scale_expert_inputs
        )
        if self.scale_expert_inputs and self.expert_bias:
            raise ValueError(
                "`scale_expert_inputs` feeds unchosen experts zeros, which "
                "their biases would turn into outputs: not with "
                "`expert_bias`. Received: scale_expert_inputs=True, "
                "expert_bias=True"
            )
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.seed = validation.check_seed("seed", seed)
        self.seed_generator = None
        if self.router_jitter_noise:
            self.seed_generator = keras.random.SeedGenerator(self.seed)
        self.supports_masking = True

    @classmethod
    def from_keras_hub(cls, block, **kwargs):
        """A `MixtureOfExperts` equal to a built keras-hub 0.32 sparse MoE
        block (`MixtralSparseMoeBlock`, `Qwen3SparseMoeBlock`,
        `GptOssSparseMoeBlock`), its weights copied: the block's routing,
        activation, biases and aux-loss coefficient (table above), its
        dtype policy; `kwargs` override them (`name=...`).

        The copy, per family: the router's kernel (and gpt-oss's bias) as
        they are; Mixtral's gate and up kernels concatenated on the last
        axis; Qwen3-MoE's gate-up kernel as it is; gpt-oss's gate-up
        kernel and bias with their interleaved columns (`[g0, u0, g1, u1,
        ...]`) reordered as `[g..., u...]`; the down kernels (and biases)
        as they are.
        """
        config, hidden, weights = _moe_routing.hub_arguments_and_weights(block)
        config.update(kwargs)
        layer = cls(**config)
        layer.build((None, None, hidden))
        layer.set_weights(weights)
        return layer

    def _weight(self, name, shape, initializer, autocast=True, **kwargs):
        return self.add_weight(
            name=name,
            shape=shape,
            initializer=keras_utils.clone_initializer(initializer),
            autocast=autocast,
            **kwargs,
        )

    def build(self, inputs_shape):
        hidden = validation.check_sequence_shape(
            "inputs", inputs_shape, ranks=_RANKS, layout=_LAYOUT
        )
        self._features = hidden
        e, i = self.num_experts, self.intermediate_dim
        kernel, bias = self.kernel_initializer, self.bias_initializer
        # The router is read at full precision under mixed policies.
        self.router_kernel = self._weight(
            "router_kernel", (hidden, e), kernel, autocast=False
        )
        self.router_bias_weight = None
        if self.router_bias:
            self.router_bias_weight = self._weight(
                "router_bias", (e,), bias, autocast=False
            )
        self.gate_up_kernel = self._weight(
            "gate_up_kernel", (e, hidden, 2 * i), kernel
        )
        self.gate_up_bias = None
        if self.expert_bias:
            self.gate_up_bias = self._weight("gate_up_bias", (e, 2 * i), bias)
        self.down_kernel = self._weight("down_kernel", (e, i, hidden), kernel)
        self.down_bias = None
        if self.expert_bias:
            self.down_bias = self._weight("down_bias", (e, hidden), bias)
        self._build_shared_expert(hidden)
        self.score_correction = None
        if self.score_correction_bias:  # set, not trained
            self.score_correction = self._weight(
                "score_correction_bias",
                (e,),
                "zeros",
                autocast=False,
                trainable=False,
            )
        self.built = True

    def _build_shared_expert(self, hidden):
        s, kernel = self.shared_expert_dim, self.kernel_initializer
        self.shared_gate_up_kernel = self.shared_down_kernel = None
        self.shared_gate_kernel = None
        if s is None:
            return
        self.shared_gate_up_kernel = self._weight(
            "shared_gate_up_kernel", (hidden, 2 * s), kernel
        )
        self.shared_down_kernel = self._weight(
            "shared_down_kernel", (s, hidden), kernel
        )
        if self.shared_expert_gate:
            self.shared_gate_kernel = self._weight(
                "shared_gate_kernel", (hidden, 1), kernel
            )

    def call(self, inputs, mask=None, training=None):
        mask = attention_checks.as_tensor("mask", mask)
        validation.check_call_input(
            "inputs", inputs, self._features, _RANKS, _LAYOUT
        )
        if mask is not None:
            validation.check_padding_mask("mask", mask, inputs)
        x = inputs
        if training and self.router_jitter_noise:
            noise = self.router_jitter_noise
            x = x * keras.random.uniform(
                ops.shape(x),
                minval=1.0 - noise,
                maxval=1.0 + noise,
                dtype=x.dtype,
                seed=self.seed_generator,
            )
        flat = ops.reshape(x, (-1, self._features))
        logits = self._router_logits(flat)
        weights, selected = self._route(logits)
        outputs = self._experts(flat, weights)
        if self.shared_expert_dim is not None:
            outputs = outputs + self._shared_expert(flat)
        if training and self.router_aux_loss_coef:
            token_mask = None
            if mask is not None:
                token_mask = ops.reshape(ops.cast(mask, "bool"), (-1,))
            loss = _moe_routing.load_balancing_loss(
                logits, selected, self.top_k, token_mask
            )
            self.add_loss(self.router_aux_loss_coef * loss)
        return ops.reshape(outputs, ops.shape(inputs))

    def _route(self, logits):
        """`(weights, selected)` of the routing (`_moe_routing`), the
        weights times `routed_scaling_factor`."""
        if self.routing == "sigmoid_topk":
            weights, selected = _moe_routing.route_sigmoid(
                logits,
                self.top_k,
                self.normalize_top_k,
                self.score_correction,
                (self.num_groups, self.top_k_groups),
            )
        else:
            weights, selected = _moe_routing.route(
                logits, self.top_k, self.routing, self.normalize_top_k
            )
        if self.routed_scaling_factor != 1:
            factor = keras_utils.constant(
                self.routed_scaling_factor, weights.dtype
            )
            weights = weights * factor
        return weights, selected

    def _router_logits(self, flat):
        dtype = softmax_dtype(self.compute_dtype)
        # An einsum: Keras's torch `matmul` computes float64 in float32.
        logits = ops.einsum(
            "nd,de->ne",
            ops.cast(flat, dtype),
            ops.cast(self.router_kernel, dtype),
        )
        if self.router_bias:
            logits = logits + ops.cast(self.router_bias_weight, dtype)
        return logits

    def _experts(self, flat, weights):
        """`sum_e weights[:, e] * expert_e(flat)` (`sum_e
        expert_e(weights[:, e] * flat)` with `scale_expert_inputs`), all
        experts computed."""
        hidden = ops.einsum("nd,edm->nem", flat, self.gate_up_kernel)
        weights = ops.cast(weights, self.compute_dtype)
        if self.scale_expert_inputs:  # (w x) W = w (x W): no bias here
            hidden = hidden * weights[..., None]
        if self.expert_bias:
            hidden = hidden + self.gate_up_bias
        gate, up = ops.split(hidden, 2, axis=-1)
        dtype = softmax_dtype(self.compute_dtype)
        hidden = _moe_routing.gated_activation(
            ops.cast(gate, dtype),
            ops.cast(up, dtype),
            self.activation,
            self.glu_alpha,
            self.glu_limit,
        )
        hidden = ops.cast(hidden, self.compute_dtype)
        if not self.scale_expert_inputs:
            hidden = hidden * weights[..., None]
        outputs = ops.einsum("nem,emd->nd", hidden, self.down_kernel)
        if self.expert_bias:
            outputs = outputs + ops.einsum("ne,ed->nd", weights, self.down_bias)
        return outputs

    def _shared_expert(self, flat):
        """The shared expert's output for every token (gated with
        `shared_expert_gate`)."""
        # Einsums: Keras's torch `matmul` computes float64 in float32.
        hidden = ops.einsum("nd,dm->nm", flat, self.shared_gate_up_kernel)
        gate, up = ops.split(hidden, 2, axis=-1)
        dtype = softmax_dtype(self.compute_dtype)
        hidden = _moe_routing.gated_activation(
            ops.cast(gate, dtype),
            ops.cast(up, dtype),
            self.activation,
            self.glu_alpha,
            self.glu_limit,
        )
        hidden = ops.cast(hidden, self.compute_dtype)
        outputs = ops.einsum("nm,md->nd", hidden, self.shared_down_kernel)
        if self.shared_expert_gate:
            logit = ops.einsum("nd,do->no", flat, self.shared_gate_kernel)
            outputs = outputs * ops.sigmoid(logit)
        return outputs

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_experts": self.num_experts,
                "top_k": self.top_k,
                "intermediate_dim": self.intermediate_dim,
                "routing": self.routing,
                "normalize_top_k": self.normalize_top_k,
                "router_bias": self.router_bias,
                "activation": self.activation,
                "expert_bias": self.expert_bias,
                "glu_alpha": self.glu_alpha,
                "glu_limit": self.glu_limit,
                "router_aux_loss_coef": self.router_aux_loss_coef,
                "router_jitter_noise": self.router_jitter_noise,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
                "bias_initializer": keras.initializers.serialize(
                    self.bias_initializer
                ),
                "seed": self.seed,
                "shared_expert_dim": self.shared_expert_dim,
                "shared_expert_gate": self.shared_expert_gate,
                "num_groups": self.num_groups,
                "top_k_groups": self.top_k_groups,
                "score_correction_bias": self.score_correction_bias,
                "routed_scaling_factor": self.routed_scaling_factor,
            }
        )
        if self.scale_expert_inputs:  # earlier configs stay as they were
            config["scale_expert_inputs"] = True
        return config


def _choice(name, value, choices):
    if not isinstance(value, str) or value not in choices:
        raise ValueError(
            f"`{name}` must be one of {choices!r}. Received: {name}={value!r}"
        )
    return value


def _check_shared(dim, gate, expert_bias):
    """`(shared_expert_dim, shared_expert_gate)` checked: None or an int
    > 0, a bool needing a width; no shared expert with `expert_bias`."""
    dim = validation.check_positive_int(
        "shared_expert_dim", dim, allow_none=True
    )
    gate = validation.check_bool("shared_expert_gate", gate)
    if gate and dim is None:
        raise ValueError(
            "`shared_expert_gate` gates a shared expert: set "
            "`shared_expert_dim` too. Received: shared_expert_gate=True, "
            "shared_expert_dim=None"
        )
    if dim is not None and expert_bias:
        raise ValueError(
            "The shared expert has no biases: `expert_bias` cannot apply "
            "with `shared_expert_dim`. Received: expert_bias=True, "
            f"shared_expert_dim={dim!r}"
        )
    return dim, gate


def _check_sigmoid_routing(layer, num_groups, top_k_groups, correction):
    """`(num_groups, top_k_groups, score_correction_bias)` checked against
    `layer`'s routing, experts and `top_k`: groups dividing the experts
    (at least 2 a group when more than one), enough chosen groups for
    `top_k` experts, and the groups, the correction bias (and no
    load-balancing loss) with `"sigmoid_topk"` only."""
    num_groups = validation.check_positive_int("num_groups", num_groups)
    top_k_groups = validation.check_positive_int("top_k_groups", top_k_groups)
    correction = validation.check_bool("score_correction_bias", correction)
    experts, sigmoid = layer.num_experts, layer.routing == "sigmoid_topk"
    if not sigmoid:
        for name, value, unset in (
            ("num_groups", num_groups, 1),
            ("top_k_groups", top_k_groups, 1),
            ("score_correction_bias", correction, False),
        ):
            if value != unset:
                raise ValueError(
                    f"`{name}` applies to `routing='sigmoid_topk'` only "
                    f"(DeepSeek-V3's). Received: {name}={value!r}, "
                    f"routing={layer.routing!r}"
                )
    elif layer.router_aux_loss_coef:
        raise ValueError(
            "`router_aux_loss_coef` cannot apply to `routing="
            "'sigmoid_topk'` (its loss reads softmax probabilities; the "
            "sigmoid routing balances by `score_correction_bias`). "
            f"Received: router_aux_loss_coef={layer.router_aux_loss_coef!r}"
        )
    size = experts // num_groups
    if experts % num_groups or (num_groups > 1 and size < 2):
        raise ValueError(
            "`num_groups` must divide `num_experts` "
            f"({experts}) into groups of at least 2 experts. Received: "
            f"num_groups={num_groups!r}"
        )
    if top_k_groups > num_groups or top_k_groups * size < layer.top_k:
        raise ValueError(
            "`top_k_groups` must be at most `num_groups` "
            f"({num_groups}) and its groups hold `top_k` ({layer.top_k}) "
            f"experts ({size} a group). Received: "
            f"top_k_groups={top_k_groups!r}"
        )
    return num_groups, top_k_groups, correction


def _check_coef(value):
    """None, or a finite number >= 0 as a Python number."""
    real = (int, float, np.integer, np.floating)
    if value is None:
        return None
    if isinstance(value, real) and not isinstance(value, bool) and value == 0:
        return value.item() if isinstance(value, np.generic) else value
    return validation.check_positive_number("router_aux_loss_coef", value)
