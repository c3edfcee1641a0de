"""Hugging Face `llama4_text` checkpoints (Llama 4's language model): the
Llama-style model (`hf.llama`) with chunked local attention on its
rotary layers, NoPE layers with attention temperature tuning, the
weightless L2 QK-norm, and a mixture of experts with a shared expert on
its MoE layers."""

import numpy as np

from keras_attention.interop import _common
from keras_attention.interop.hf import llama
from keras_attention.interop.hf import mixtral
from keras_attention.mods import ChunkedCausalMask

# transformers' Llama 4 `rope_theta` when the config has none.
DEFAULT_THETA = 500000.0
LAYER_TYPES = ("full_attention", "chunked_attention")
FEED_FORWARD = "model.layers.{i}.feed_forward."
OURS = "transformer_layer_{i}/feed_forward/"

# The Llama table's attention and norm rows (its `.mlp.` rows are
# Llama 4's `feed_forward.` ones, below).
BASE_TABLE = tuple(row for row in llama.WEIGHT_TABLE if ".mlp." not in row[0])
# A dense layer's gated feed-forward (width `intermediate_size_mlp`).
DENSE_ROWS = tuple(
    (FEED_FORWARD + f"{theirs}.weight", OURS + f"{ours}/kernel", "linear")
    for theirs, ours in (
        ("gate_proj", "gate_dense"),
        ("up_proj", "intermediate_dense"),
        ("down_proj", "output_dense"),
    )
)
# A MoE layer: the router, the stacked experts (`gate_up_proj` `(experts,
# hidden, 2 * intermediate)`, gate columns first; `down_proj` `(experts,
# intermediate, hidden)`: our layouts) and the shared expert.
MOE_ROWS = (
    (FEED_FORWARD + "router.weight", OURS + "router_kernel", "linear"),
    (FEED_FORWARD + "experts.gate_up_proj", OURS + "gate_up_kernel", "copy"),
    (FEED_FORWARD + "experts.down_proj", OURS + "down_kernel", "copy"),
    (
        (
            FEED_FORWARD + "shared_expert.gate_proj.weight",
            FEED_FORWARD + "shared_expert.up_proj.weight",
        ),
        OURS + "shared_gate_up_kernel",
        "linear",
    ),
    (
        FEED_FORWARD + "shared_expert.down_proj.weight",
        OURS + "shared_down_kernel",
        "linear",
    ),
)


def halves_order(heads, head_dim):
    """The stored rows of a `q_proj` / `k_proj` in our order: Llama 4
    rotates interleaved pairs `(2m, 2m + 1)` of each head (complex
    numbers), our rotary embedding the halves `(m, m + head_dim / 2)`;
    the features of queries and keys reordered alike (even ones first)
    give the same scores, and the same L2 norms.

    Example:

    >>> from keras_attention.interop.hf.llama4 import halves_order
    >>> halves_order(1, 4).tolist()
    [0, 2, 1, 3]
    """
    within = np.concatenate(
        [np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)]
    )
    return (np.arange(heads)[:, None] * head_dim + within[None]).reshape(-1)


def layer_kinds(config):
    """`(rope, types, moe)` per layer, as transformers' `Llama4TextConfig`
    derives them: rotary positions where `no_rope_layers[i]` is 1 (by
    default all but every `no_rope_layer_interval`-th layer), the
    attention kind (`layer_types`, by default "chunked_attention" on the
    rotary layers when `attention_chunk_size` is set), and the MoE layers
    (`moe_layers`, by default every `interleave_moe_layer_step`-th
    from the step's last)."""
    layers = int(config.require("num_hidden_layers"))
    interval = int(config.get("no_rope_layer_interval", 4))
    rope = config.get(
        "no_rope_layers", [int((i + 1) % interval != 0) for i in range(layers)]
    )
    chunk = config.get("attention_chunk_size")
    types = config.get(
        "layer_types",
        [
            "chunked_attention"
            if flag and chunk is not None
            else "full_attention"
            for flag in rope
        ],
    )
    step = int(config.get("interleave_moe_layer_step", 1))
    moe = config.get("moe_layers", list(range(step - 1, layers, step)))
    unknown = sorted(set(types) - set(LAYER_TYPES))
    if len(rope) != layers or len(types) != layers or unknown:
        raise ValueError(
            f"config.json of model_type 'llama4_text': no_rope_layers="
            f"{rope!r} and layer_types={types!r} must have one entry for "
            f"each of its {layers} layers, the types among {LAYER_TYPES}."
        )
    if "chunked_attention" in types and chunk is None:
        raise ValueError(
            "config.json of model_type 'llama4_text': layer_types has "
            "chunked_attention layers but attention_chunk_size is null."
        )
    return [bool(flag) for flag in rope], list(types), set(moe)


def convert_llama4_text(config, dtype):
    """A `llama4_text` checkpoint's model: `llama_style_model` (untied
    head by default, no biases, `head_dim`, `rms_norm_eps`) whose layers
    are each one of Llama 4's two kinds:

    - rotary (`no_rope_layers[i]` 1): RoPE (Llama 3.1's scaling when the
      config has it), the weightless L2 QK-norm (`qk_norm="l2"`) with
      `use_qk_norm`, and on "chunked_attention" layers causal attention
      within chunks of `attention_chunk_size` (`mask_mod=
      ChunkedCausalMask(attention_chunk_size)`: generation keeps one
      chunk of keys for them);
    - NoPE: no rotary positions, and with `attn_temperature_tuning` the
      queries scaled by `1 + attn_scale * log(1 + floor((p + 1) /
      floor_scale))` (`temperature_tuning`), `p` each token's position
      (transformers takes the index in the padded sequence: a
      left-padded row differs there from the same tokens alone).

    The feed-forward of a MoE layer (`moe_layers`, by default every
    `interleave_moe_layer_step`-th) is a `MixtureOfExperts`: the router's
    `num_experts_per_tok` largest logits through a sigmoid
    (`routing="sigmoid_topk"`), each chosen expert fed the token times
    its weight (`scale_expert_inputs`), SwiGLU experts of width
    `intermediate_size` read from the stacked `experts.gate_up_proj` and
    `experts.down_proj`, plus an ungated shared expert of the same width;
    a dense layer's is a gated `FeedForward` of width
    `intermediate_size_mlp`. The query and key projections are read with
    each head's features reordered (`halves_order`). The training
    settings (`router_aux_loss_coef`, `router_jitter_noise`,
    `output_router_logits`) are not carried.

    References:
        - Meta AI, 2025, "The Llama 4 herd".
        - Nakanishi, 2025, "Scalable-Softmax Is Superior for Attention"
          (arXiv 2501.19399; the temperature tuning).
    """
    rope, types, moe = layer_kinds(config)
    config.refuse("attention_bias", (False,), False)
    heads = int(config.require("num_attention_heads"))
    kv_heads = int(config.get("num_key_value_heads", heads))
    head_dim = config.head_dim()
    epsilon = float(config.get("rms_norm_eps", 1e-5))
    tuning = None
    if config.get("attn_temperature_tuning", True):
        tuning = {
            "floor_scale": float(config.get("floor_scale", 8192)),
            "scale": float(config.get("attn_scale", 0.1)),
        }
    table = tuple(
        row
        + (halves_order(kv_heads if ".k_proj" in row[0] else heads, head_dim),)
        if ".q_proj" in row[0] or ".k_proj" in row[0]
        else row
        for row in BASE_TABLE
    )
    layers = len(rope)
    for i in range(layers):
        rows = MOE_ROWS if i in moe else DENSE_ROWS
        table += tuple(
            (
                tuple(t.format(i=i) for t in theirs)
                if isinstance(theirs, tuple)
                else theirs.format(i=i),
                ours.format(i=i),
                transform,
            )
            for theirs, ours, transform in rows
        )
    if moe:
        arguments = {
            "num_experts": mixtral.num_experts(config),
            "top_k": int(config.get("num_experts_per_tok", 1)),
            "intermediate_dim": int(config.require("intermediate_size")),
            "routing": "sigmoid_topk",
            "shared_expert_dim": int(config.require("intermediate_size")),
            "scale_expert_inputs": True,
        }
        config.refuse("hidden_act", ("silu", "swish"), "silu")

    def attention(i):
        if not rope[i]:
            own = {"rotary_max_wavelength": None, "rotary_scaling": None}
            return (
                own if tuning is None else dict(own, temperature_tuning=tuning)
            )
        own = {}
        if config.get("use_qk_norm", True):
            own = {"qk_norm": "l2", "qk_norm_epsilon": epsilon}
        if types[i] == "chunked_attention":
            chunk = int(config.require("attention_chunk_size"))
            own["mask_mod"] = ChunkedCausalMask(chunk)
        return own

    def feed_forward(i):
        if i not in moe:
            return None
        return _common.mixture_of_experts(arguments, dtype)

    return llama.convert(
        config,
        dtype,
        table=table,
        arguments={
            "intermediate_dim": int(
                config.get(
                    "intermediate_size_mlp", config.require("intermediate_size")
                )
            ),
            "mlp_bias": False,
            "attention_bias": False,
        },
        default_theta=DEFAULT_THETA,
        layer_attention=attention,
        layer_feed_forward=feed_forward,
    )
