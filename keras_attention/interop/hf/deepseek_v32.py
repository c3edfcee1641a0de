"""Hugging Face `deepseek_v32` checkpoints: DeepSeek-V3's model
(`hf.deepseek_v3`) with DeepSeek Sparse Attention: each latent attention
has a lightning indexer (`MultiHeadLatentAttention(indexer={...})`,
transformers' `DeepseekV32Indexer`) naming the `index_topk` keys each
query reads."""

from keras_attention.interop.hf import Conversion
from keras_attention.interop.hf import deepseek_v3

# transformers' `DeepseekV32Config` defaults of the fields read here.
DEFAULTS = dict(
    deepseek_v3.DEFAULTS,
    index_topk=2048,
    index_head_dim=128,
    index_n_heads=64,
)
MLP_LAYER_TYPES = ("dense", "sparse")
LAYER_TYPES = ("indexed_attention",)

# The indexer's tensors (`self_attn.indexer`), ours under the attention's
# `indexer` sublayer (a `LightningIndexer`).
INDEXER_TABLE = tuple(
    (
        deepseek_v3.LAYER + f"self_attn.indexer.{theirs}",
        deepseek_v3.ATTENTION + f"indexer/{ours}",
        how,
    )
    for theirs, ours, how in (
        ("wq_b.weight", "wq_b/kernel", "linear"),
        ("wk.weight", "wk/kernel", "linear"),
        ("k_norm.weight", "k_norm/gamma", "copy"),
        ("k_norm.bias", "k_norm/beta", "copy"),
        ("weights_proj.weight", "weights_proj/kernel", "linear"),
    )
)


def mlp_dense(config):
    """Each layer's feed-forward kind: `mlp_layer_types` ("dense" or
    "sparse" per layer), else the first `first_k_dense_replace` dense;
    `ValueError` naming another list."""
    layers = int(config.require("num_hidden_layers"))
    kinds = config.get("mlp_layer_types")
    if kinds is None:
        return deepseek_v3.first_dense(config, DEFAULTS)
    kinds = list(kinds)
    if len(kinds) != layers or set(kinds) - set(MLP_LAYER_TYPES):
        raise ValueError(
            f"config.json of model_type {config.model_type!r}: "
            f"mlp_layer_types={kinds!r} must give one of {MLP_LAYER_TYPES} "
            f"for each of its {layers} layers."
        )
    return [kind == "dense" for kind in kinds]


def convert_deepseek_v32(config, dtype):
    """A `deepseek_v32` checkpoint's model: `deepseek_v3`'s
    (`deepseek_model`: latent attention, YaRN, grouped sigmoid routing
    with shared experts; the dense layers of `mlp_layer_types`, else of
    `first_k_dense_replace`) whose latent attention always rotates
    interleaved pairs and has a `LightningIndexer` (`indexer=
    {"num_heads": index_n_heads, "head_dim": index_head_dim, "top_k":
    index_topk}`; its queries read the query latent, its rotary
    positions, in halves, are the attention's): each query attends to
    the `index_topk` earlier keys the indexer scores highest (all of them
    when it has fewer), ties to the lowest position. The indexer's keys
    join the generation cache.

    Refused by name (`ValueError`): `deepseek_v3`'s refusals, a null
    `q_lora_rank` (the indexer reads the query latent), `layer_types`
    other than "indexed_attention", unknown `mlp_layer_types`.

    References:
        - DeepSeek-AI, 2025, "DeepSeek-V3.2: Pushing the Frontier of Open
          Large Language Models" (DeepSeek Sparse Attention).
    """
    layers = int(config.require("num_hidden_layers"))
    types = list(config.get("layer_types", LAYER_TYPES * layers))
    if set(types) - set(LAYER_TYPES) or len(types) != layers:
        raise ValueError(
            f"config.json of model_type {config.model_type!r}: "
            f"layer_types={types!r} is not supported (supported: "
            f"{list(LAYER_TYPES)!r} for each of its {layers} layers)."
        )
    arguments = deepseek_v3.deepseek_arguments(
        config, mlp_dense(config), DEFAULTS
    )
    latent = arguments["latent"]
    if latent["q_lora_rank"] is None:
        raise ValueError(
            f"config.json of model_type {config.model_type!r}: "
            "q_lora_rank=None is not supported (DeepSeek-V3.2's indexer "
            "reads the query latent; supported: a rank)."
        )
    latent["rope_interleave"] = True  # `DeepseekV32Attention` always
    indexer = {
        "num_heads": int(deepseek_v3.value(config, "index_n_heads", DEFAULTS)),
        "head_dim": int(deepseek_v3.value(config, "index_head_dim", DEFAULTS)),
        "top_k": int(deepseek_v3.value(config, "index_topk", DEFAULTS)),
    }
    model = deepseek_v3.deepseek_model(
        arguments, dtype, config.model_type, indexer=indexer
    )
    return Conversion(
        model,
        deepseek_v3.deepseek_table(arguments, INDEXER_TABLE),
        arguments["num_layers"],
        deepseek_v3.deepseek_ignored(config, arguments, DEFAULTS),
    )
