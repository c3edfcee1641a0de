"""Hugging Face `mixtral` checkpoints: the Llama-style model (`hf.llama`)
with a mixture of experts in every block, and what the mixture-of-experts
families share (`hf.qwen3_moe`): the experts' table rows, the number of
experts, the SwiGLU check."""

from keras_attention.interop import _common
from keras_attention.interop.hf import llama

# The Llama table without the dense feed-forward's rows.
ATTENTION_TABLE = tuple(
    row for row in llama.WEIGHT_TABLE if ".mlp." not in row[0]
)
# Mixtral's expert projections (gate, up, down) and its router.
MIXTRAL_NAMES = ("w1", "w3", "w2")


def expert_rows(
    layer,
    block,
    num_experts,
    names=("gate_proj", "up_proj", "down_proj"),
    router="gate",
):
    """The table rows of the mixture of experts of layer `layer` (an int,
    or "{i}": every layer), its tensors under `model.layers.<layer>.
    <block>` (Mixtral's "block_sparse_moe.", Qwen3-MoE's "mlp."): the
    router `<router>.weight` `(experts, hidden)` to our `router_kernel`,
    each expert's `experts.{j}.<gate>.weight` and `<up>` (`names`), in
    turn, read as one stacked `(experts, 2 * intermediate, hidden)`
    tensor into our `gate_up_kernel` (gate columns first), and the
    experts' `<down>` into our `down_kernel`."""
    theirs = f"model.layers.{layer}.{block}"
    ours = f"transformer_layer_{layer}/feed_forward/"
    gate, up, down = names
    experts = range(num_experts)
    return (
        (theirs + f"{router}.weight", ours + "router_kernel", "linear"),
        (
            tuple(
                f"{theirs}experts.{j}.{name}.weight"
                for j in experts
                for name in (gate, up)
            ),
            ours + "gate_up_kernel",
            "experts_linear",
        ),
        (
            tuple(f"{theirs}experts.{j}.{down}.weight" for j in experts),
            ours + "down_kernel",
            "experts_linear",
        ),
    )


def num_experts(config):
    """The number of experts: `num_local_experts` or `num_experts`
    (transformers reads either as the other); `ValueError` when the
    config has neither or two different values."""
    values = {
        name: config.get(name)
        for name in ("num_local_experts", "num_experts")
        if config.get(name) is not None
    }
    if not values:
        config.require("num_local_experts")
    if len(set(values.values())) > 1:
        raise ValueError(
            f"config.json of model_type {config.model_type!r}: "
            f"num_local_experts={values['num_local_experts']!r} and "
            f"num_experts={values['num_experts']!r} differ."
        )
    return int(next(iter(values.values())))


def moe_arguments(config, width, normalize_top_k):
    """The `MixtureOfExperts` arguments of a Mixtral-style block: the
    softmax over all experts, its `num_experts_per_tok` largest
    (renormalized to sum 1 with `normalize_top_k`), SwiGLU experts of
    width `width` (`hidden_act` must be SiLU: the experts' only gate
    here). Training settings are not carried (the module docstrings)."""
    config.refuse("hidden_act", ("silu", "swish"), "silu")
    experts = num_experts(config)
    top_k = int(config.require("num_experts_per_tok"))
    if not 1 <= top_k <= experts:
        raise ValueError(
            f"config.json of model_type {config.model_type!r}: "
            f"num_experts_per_tok={top_k!r} must be in [1, {experts}] (the "
            "number of experts)."
        )
    return {
        "num_experts": experts,
        "top_k": top_k,
        "intermediate_dim": int(width),
        "routing": "softmax_topk",
        "normalize_top_k": bool(normalize_top_k),
    }


def convert_mixtral(config, dtype):
    """A `mixtral` checkpoint's model: `llama_style_model` (no biases,
    `head_dim`, the RoPE of either config layout, default `rope_theta`
    1e6 as transformers', `sliding_window` (may be null) on every layer
    as a causal `LocalSelfAttention`'s `window_size = sliding_window - 1`,
    tied or untied head) with a `keras_attention.layers.MixtureOfExperts`
    feed-forward in every block: transformers' `MixtralTopKRouter` (the
    softmax over all `num_local_experts` experts in float32, its
    `num_experts_per_tok` largest renormalized to sum 1) and SwiGLU
    experts of width `intermediate_size`, read from each expert's
    `block_sparse_moe.experts.{j}.w1` (gate), `w3` (up) and `w2` (down).

    The training settings of transformers' model are not carried, as
    the other families' dropout is not: `router_jitter_noise` (training
    noise), and `router_aux_loss_coef` with `output_router_logits` (the
    load-balancing term of transformers' training loss, which averages
    the router statistics over all layers at once; no loss is added
    here: set `MixtureOfExperts.router_aux_loss_coef` to train with a
    per-layer one). None of them changes the forward pass.

    References:
        - Jiang et al., 2024, "Mixtral of Experts".
    """
    window = config.get("sliding_window")
    arguments = moe_arguments(
        config, config.require("intermediate_size"), normalize_top_k=True
    )
    table = ATTENTION_TABLE + expert_rows(
        "{i}", "block_sparse_moe.", arguments["num_experts"], MIXTRAL_NAMES
    )
    return llama.convert(
        config,
        dtype,
        table=table,
        arguments={"attention_bias": False, "mlp_bias": False},
        default_theta=1e6,
        window_size=None if window is None else int(window) - 1,
        layer_feed_forward=lambda i: _common.mixture_of_experts(
            arguments, dtype
        ),
    )
