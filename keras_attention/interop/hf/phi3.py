"""Hugging Face `phi3` checkpoints: the Llama-style model (`hf.llama`)
with Phi-3's fused projections, LongRoPE, partial rotary positions and
sliding window."""

from keras_attention.interop.hf import configs
from keras_attention.interop.hf import llama

LAYER, OURS = llama.LAYER, llama.OURS

# The Llama table with Phi-3's fused tensors: `qkv_proj` split (along
# its output axis) into the query, key and value kernels, `gate_up_proj`
# into the gate and the up projection (gate first).
WEIGHT_TABLE = tuple(
    row
    for row in llama.WEIGHT_TABLE
    if not any(p in row[0] for p in ("q_proj", "k_proj", "v_proj"))
    and not any(p in row[0] for p in ("gate_proj", "up_proj"))
) + (
    (
        LAYER + "self_attn.qkv_proj.weight",
        tuple(
            OURS + f"self_attention/{name}/kernel"
            for name in ("query", "key", "value")
        ),
        "linear",
    ),
    (
        LAYER + "mlp.gate_up_proj.weight",
        (
            OURS + "feed_forward/gate_dense/kernel",
            OURS + "feed_forward/intermediate_dense/kernel",
        ),
        "linear",
    ),
)


def phi3_config(config):
    """`config` with its RoPE type read as transformers' Phi-3 reads it:
    "su" and "yarn" are LongRoPE."""
    values = dict(config.values)
    for key in ("rope_parameters", "rope_scaling"):
        params = values.get(key)
        if params and params.get("rope_type", params.get("type")) in (
            "su",
            "yarn",
        ):
            params = {k: v for k, v in params.items() if k != "type"}
            values[key] = dict(params, rope_type="longrope")
    return configs.HFConfig(values)


def convert_phi3(config, dtype):
    """A `phi3` checkpoint's model: `llama_style_model` without biases,
    with Phi-3's LongRoPE ("longrope", also "su"/"yarn": the
    self-attention's `rotary_scaling={"rope_type": "longrope", ...}`,
    long factors once a call's positions reach past
    `original_max_position_embeddings`, as transformers'), its
    `partial_rotary_factor` (`rotary_fraction`) and `sliding_window` on
    every layer (`window_size = sliding_window - 1`).

    References:
        - Abdin et al., 2024, "Phi-3 Technical Report".
        - Ding et al., 2024, "LongRoPE: Extending LLM Context Window Beyond
          2 Million Tokens".
    """
    config = phi3_config(config)
    window = config.get("sliding_window")
    return llama.convert(
        config,
        dtype,
        table=WEIGHT_TABLE,
        arguments={"attention_bias": False, "mlp_bias": False},
        window_size=None if window is None else int(window) - 1,
    )
