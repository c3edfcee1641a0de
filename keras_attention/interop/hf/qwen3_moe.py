"""Hugging Face `qwen3_moe` checkpoints: Qwen 3's model (`hf.qwen3`)
with a mixture of experts on its sparse layers (`hf.mixtral`'s rows)."""

from keras_attention.interop import _common
from keras_attention.interop.hf import llama
from keras_attention.interop.hf import mixtral
from keras_attention.interop.hf import qwen3

# Qwen 3's table (QK-norms included) without the feed-forward's rows,
# and the dense feed-forward's rows (`{i}`: a dense layer's index).
ATTENTION_TABLE = tuple(
    row for row in qwen3.WEIGHT_TABLE if ".mlp." not in row[0]
)
DENSE_TABLE = tuple(row for row in llama.WEIGHT_TABLE if ".mlp." in row[0])


def sparse_layers(config):
    """The layers with a mixture of experts, as transformers' decoder
    layer picks them: not in `mlp_only_layers`, `num_experts > 0`, and
    `(i + 1) % decoder_sparse_step == 0`; the others are dense."""
    layers = int(config.require("num_hidden_layers"))
    step = config.get("decoder_sparse_step", 1)
    if not isinstance(step, int) or isinstance(step, bool) or step < 1:
        raise ValueError(
            "config.json of model_type 'qwen3_moe': decoder_sparse_step="
            f"{step!r} must be an int >= 1."
        )
    dense = set(config.get("mlp_only_layers", []))
    experts = mixtral.num_experts(config)
    return [
        i
        for i in range(layers)
        if i not in dense and experts > 0 and (i + 1) % step == 0
    ]


def convert_qwen3_moe(config, dtype):
    """A `qwen3_moe` checkpoint's model: `llama_style_model` with Qwen
    3's per-head QK-norm (`qk_norm="rms"`, epsilon `rms_norm_eps`),
    `head_dim`, `attention_bias` (all four projections), the tied or
    untied head, `sliding_window` on every layer when
    `use_sliding_window` (transformers' Qwen3-MoE reads no
    `max_window_layers` or `layer_types`; neither is read here), and on
    its sparse layers (`sparse_layers`: `mlp_only_layers`,
    `decoder_sparse_step`) a `keras_attention.layers.MixtureOfExperts`:
    transformers' `Qwen3MoeTopKRouter` (the softmax over all
    `num_experts` in float32, its `num_experts_per_tok` largest,
    renormalized to sum 1 only with `norm_topk_prob`) and SwiGLU experts
    of width `moe_intermediate_size`, read from each expert's
    `mlp.experts.{j}.gate_proj`, `up_proj` and `down_proj`. The dense
    layers keep the gated `FeedForward` of width `intermediate_size`.

    As for `mixtral`, the training settings `router_aux_loss_coef` and
    `output_router_logits` (transformers' load-balancing loss) are not
    carried: the forward pass does not depend on them.

    References:
        - Qwen Team, 2025, "Qwen3 Technical Report".
    """
    sparse = sparse_layers(config)
    if sparse:
        arguments = mixtral.moe_arguments(
            config,
            config.require("moe_intermediate_size"),
            normalize_top_k=config.get("norm_topk_prob", False),
        )
    table = ATTENTION_TABLE
    for i in range(int(config.require("num_hidden_layers"))):
        if i in sparse:
            table += mixtral.expert_rows(i, "mlp.", arguments["num_experts"])
        else:
            table += tuple(
                (theirs.format(i=i), ours.format(i=i), transform)
                for theirs, ours, transform in DENSE_TABLE
            )
    window = None
    if config.get("use_sliding_window", False):
        window = config.get("sliding_window")

    def feed_forward(i):
        if i not in sparse:
            return None
        return _common.mixture_of_experts(arguments, dtype)

    return llama.convert(
        config,
        dtype,
        table=table,
        arguments={"mlp_bias": False},
        qk_norm="rms",
        qk_norm_epsilon=float(config.get("rms_norm_eps", 1e-6)),
        window_size=None if window is None else int(window) - 1,
        layer_feed_forward=feed_forward,
    )
