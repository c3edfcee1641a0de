"""`from_huggingface`: a Hugging Face safetensors checkpoint loaded into
our blocks, with NumPy alone (no torch, no transformers)."""

import json
import os

import keras

from keras_attention import ops
from keras_attention.interop.checkpoint import Checkpoint
from keras_attention.interop.hf import configs
from keras_attention.interop.hf import weights
from keras_attention.interop.hf.bert import convert_bert
from keras_attention.interop.hf.deepseek_v3 import convert_deepseek_v3
from keras_attention.interop.hf.deepseek_v32 import convert_deepseek_v32
from keras_attention.interop.hf.gemma import convert_gemma
from keras_attention.interop.hf.gemma4 import convert_gemma4
from keras_attention.interop.hf.gpt_oss import convert_gpt_oss
from keras_attention.interop.hf.kimi_linear import convert_kimi_linear
from keras_attention.interop.hf.llama import convert_llama
from keras_attention.interop.hf.llama4 import convert_llama4_text
from keras_attention.interop.hf.mistral import convert_mistral
from keras_attention.interop.hf.mixtral import convert_mixtral
from keras_attention.interop.hf.modernbert import convert_modernbert
from keras_attention.interop.hf.olmo2 import convert_olmo2
from keras_attention.interop.hf.phi3 import convert_phi3
from keras_attention.interop.hf.qwen2 import convert_qwen2
from keras_attention.interop.hf.qwen3 import convert_qwen3
from keras_attention.interop.hf.qwen3_moe import convert_qwen3_moe
from keras_attention.interop.hf.qwen3_next import convert_qwen3_next
from keras_attention.interop.hf.roberta import convert_roberta
from keras_attention.interop.hf.smollm3 import convert_smollm3

# `model_type` (of `config.json`) -> its family's converter
# (`converter(config, dtype)` -> `hf.Conversion`). One line per family.
MODEL_TYPES = {
    "bert": convert_bert,
    "deepseek_v3": convert_deepseek_v3,
    "deepseek_v32": convert_deepseek_v32,
    "gemma": convert_gemma,
    "gemma2": convert_gemma,
    "gemma3_text": convert_gemma,
    "gemma4_text": convert_gemma4,
    "gpt_oss": convert_gpt_oss,
    "kimi_linear": convert_kimi_linear,
    "llama": convert_llama,
    "llama4_text": convert_llama4_text,
    "mistral": convert_mistral,
    "mixtral": convert_mixtral,
    "modernbert": convert_modernbert,
    "olmo2": convert_olmo2,
    "phi3": convert_phi3,
    "qwen2": convert_qwen2,
    "qwen3": convert_qwen3,
    "qwen3_moe": convert_qwen3_moe,
    "qwen3_next": convert_qwen3_next,
    "roberta": convert_roberta,
    "smollm3": convert_smollm3,
}

HUB_PREFIX = "hf://"
# What `hf://` downloads: the config and the safetensors files.
HUB_FILES = (
    "config.json",
    "model.safetensors",
    "model-*.safetensors",
    "model.safetensors.index.json",
)


def supported_model_types():
    """The `model_type`s `from_huggingface` reads, sorted (its registry,
    `MODEL_TYPES`)."""
    return sorted(MODEL_TYPES)


def _download(repo_id):
    """The local snapshot of hub repository `repo_id` (its config and
    safetensors files only), through `huggingface_hub`."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ImportError(
            f"Loading {HUB_PREFIX}{repo_id} needs the optional "
            "`huggingface_hub` package: pip install "
            "'keras-attention-layers[huggingface]' (or download the "
            "repository and pass its directory)."
        ) from None
    return snapshot_download(repo_id=repo_id, allow_patterns=list(HUB_FILES))


def _directory(path):
    """The local directory of `path` (a directory, or `hf://org/name`)."""
    if isinstance(path, str) and path.startswith(HUB_PREFIX):
        repo_id = path[len(HUB_PREFIX) :].strip("/")
        if repo_id.count("/") != 1 or not all(repo_id.split("/")):
            raise ValueError(
                "A hub checkpoint is named `hf://<organization>/<name>`. "
                f"Received: path={path!r}"
            )
        return _download(repo_id)
    try:
        directory = os.fspath(path)
    except TypeError:
        raise TypeError(
            "`path` must be a directory (str or path-like) or "
            f"'hf://<organization>/<name>'. Received: path={path!r} of "
            f"type {type(path).__name__}"
        ) from None
    if not os.path.isdir(directory):
        raise ValueError(
            f"`path` must be a checkpoint directory. Received: path={path!r}"
        )
    return directory


def read_config(directory):
    """The `config.json` of `directory` as an `HFConfig`; `ValueError` for
    a missing file or an unsupported `model_type` (listing the
    supported ones)."""
    path = os.path.join(directory, "config.json")
    if not os.path.isfile(path):
        raise ValueError(f"{directory!r} has no config.json.")
    with open(path, encoding="utf-8") as f:
        config = configs.HFConfig(json.load(f))
    if config.model_type not in MODEL_TYPES:
        raise ValueError(
            f"model_type {config.model_type!r} of {path!r} is not "
            "supported. Supported model types: "
            f"{', '.join(supported_model_types())}."
        )
    return config


def _dtype_policy(dtype, checkpoint):
    """The model's dtype policy: `dtype`'s, else the checkpoint's
    floating dtype (bfloat16 stays bfloat16)."""
    if dtype is None:
        dtype = checkpoint.floating_dtype() or keras.config.floatx()
    try:
        return keras.dtype_policies.get(dtype)
    except (ValueError, TypeError):
        raise ValueError(
            "`dtype` must be None, a float dtype name (e.g. 'float32', "
            "'bfloat16') or a Keras dtype policy. Received: "
            f"dtype={dtype!r}"
        ) from None


def from_huggingface(path, dtype=None):
    """A Hugging Face safetensors checkpoint as a `keras.Model` of
    `keras_attention` blocks.

    The checkpoint's `config.json` names its architecture (`model_type`,
    one of `supported_model_types()`); the family's converter (one
    module per family in `keras_attention.interop.hf`) reads the config
    into the blocks' arguments and maps the tensors to the weights by its
    table. Only `safetensors` files are read, with NumPy alone (no torch
    or transformers at run time), shard by shard and tensor by tensor:
    the process holds the model's weights and one tensor at a time (peak
    memory while loading about the checkpoint's size; the measure is
    `benchmarks/checkpoint_memory.py`).

    The model has inputs `token_ids` and `padding_mask` (int `(batch,
    T)`; BERT-style encoders with token types also `segment_ids`) and
    outputs the final hidden states, equal to transformers' base model's
    `last_hidden_state` at the real (not padded) positions, left or
    right padding. A decoder LM keeps the LM head (the tied token table or
    the separate `lm_head`): `keras_attention.interop.causal_lm_generator
    (model)` decodes it, giving the greedy tokens of transformers'
    `generate(do_sample=False)`.

    Args:
        path: a directory as `transformers`' `save_pretrained` writes it
            (`config.json` and `model.safetensors`, or shards listed by
            `model.safetensors.index.json`), or `"hf://<org>/<name>"`: a
            hub repository, downloaded (config and safetensors files
            only) through `huggingface_hub`, the optional extra
            `keras-attention-layers[huggingface]`.
        dtype: None (the checkpoint's own floating dtype: a bfloat16
            checkpoint gives a bfloat16 model), or a dtype name or Keras
            dtype policy (`"float32"`, `"bfloat16"`,
            `"mixed_bfloat16"`, ...) that the weights are cast to.

    Returns:
        The `keras.Model`, with its weights loaded.

    Raises:
        ValueError: an unsupported `model_type` (the message lists the
            supported ones); a directory with only a pickled
            `pytorch_model.bin` (never loaded: convert it to
            safetensors); a missing tensor or a tensor of another shape
            than the config implies (naming it and both shapes); a
            config option the family's converter does not support
            (naming it, e.g. an unknown RoPE type).
        ImportError: `hf://` without `huggingface_hub` installed.

    Example:

    >>> import json, pathlib, tempfile
    >>> import numpy as np
    >>> from safetensors.numpy import save_file
    >>> import keras_attention
    >>> directory = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (directory / "config.json").write_text(json.dumps({
    ...     "model_type": "llama", "vocab_size": 10, "hidden_size": 4,
    ...     "intermediate_size": 8, "num_hidden_layers": 1,
    ...     "num_attention_heads": 2, "tie_word_embeddings": True}))
    >>> rng = np.random.default_rng(0)
    >>> shapes = {"model.embed_tokens.weight": (10, 4),
    ...     "model.norm.weight": (4,)}
    >>> for name, shape in {"q_proj": (4, 4), "k_proj": (4, 4),
    ...         "v_proj": (4, 4), "o_proj": (4, 4)}.items():
    ...     shapes[f"model.layers.0.self_attn.{name}.weight"] = shape
    >>> for name, shape in {"gate_proj": (8, 4), "up_proj": (8, 4),
    ...         "down_proj": (4, 8)}.items():
    ...     shapes[f"model.layers.0.mlp.{name}.weight"] = shape
    >>> for name in ("input_layernorm", "post_attention_layernorm"):
    ...     shapes[f"model.layers.0.{name}.weight"] = (4,)
    >>> save_file({k: rng.normal(size=s).astype("float32")
    ...     for k, s in shapes.items()}, str(directory / "model.safetensors"))
    >>> model = keras_attention.interop.from_huggingface(directory)
    >>> hidden = model({"token_ids": np.array([[3, 5, 7]]),
    ...     "padding_mask": np.ones((1, 3), "int32")})
    >>> tuple(hidden.shape)
    (1, 3, 4)
    """
    directory = _directory(path)
    config = read_config(directory)
    checkpoint = Checkpoint(directory)
    policy = _dtype_policy(dtype, checkpoint)
    # Every weight is assigned from the checkpoint next: none is drawn.
    with ops.zeros_for_initializers():
        conversion = MODEL_TYPES[config.model_type](config, policy)
    if conversion.check is not None:
        conversion.check(checkpoint)
    weights.load_weights(
        conversion.model,
        checkpoint,
        conversion.table,
        conversion.num_layers,
        conversion.ignored,
    )
    return conversion.model
