"""Hugging Face `olmo2` checkpoints: the Llama-style model (`hf.llama`)
with OLMo 2's QK-norm over all heads and its norms after each sublayer
(none before)."""

from keras_attention.interop.hf import llama

LAYER, OURS = llama.LAYER, llama.OURS

# The Llama table without its pre-norms, plus OLMo 2's: the sublayers'
# output norms and the QK-norms (`(heads * head_dim,)` to `(heads,
# head_dim)`).
WEIGHT_TABLE = tuple(
    row for row in llama.WEIGHT_TABLE if "layernorm" not in row[0]
) + (
    (
        LAYER + "post_attention_layernorm.weight",
        OURS + "self_attention_post_norm/scale",
        "copy",
    ),
    (
        LAYER + "post_feedforward_layernorm.weight",
        OURS + "feed_forward_post_norm/scale",
        "copy",
    ),
    (
        LAYER + "self_attn.q_norm.weight",
        OURS + "self_attention/query_norm/scale",
        "flat",
    ),
    (
        LAYER + "self_attn.k_norm.weight",
        OURS + "self_attention/key_norm/scale",
        "flat",
    ),
)


def convert_olmo2(config, dtype):
    """An `olmo2` checkpoint's model: `llama_style_model` with the
    blocks' `sandwich_norm="post"` (`x + Norm(a(x))`, then `x +
    Norm'(f(x))`: no norm before a sublayer), the self-attention's
    `qk_norm="rms_across_heads"` (one RMS norm over all heads' queries,
    one over the keys', epsilon `rms_norm_eps`), `attention_bias` (all
    four projections) and no feed-forward biases.

    References:
        - OLMo Team, 2024, "2 OLMo 2 Furious".
    """
    return llama.convert(
        config,
        dtype,
        table=WEIGHT_TABLE,
        arguments={"mlp_bias": False},
        qk_norm="rms_across_heads",
        qk_norm_epsilon=float(config.get("rms_norm_eps", 1e-5)),
        sandwich_norm="post",
    )
