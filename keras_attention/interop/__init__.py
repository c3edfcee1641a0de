"""Pretrained models in `keras_attention` blocks: keras-hub backbones
rebuilt from this library's blocks and layers, with their weights.

`from_keras_hub(backbone)` returns a Keras model with the backbone's
inputs and outputs and a copy of its weights, so that every feature of the
library (attention weights of every layer, score and mask objects, the
blockwise path, layout maps) works on a pretrained model. One converter per
family (`bert`, `roberta` (also XLM-R), `distil_bert`, `albert`, `electra`,
`gpt2`, `opt`, `gpt_neox`, `llama`, `mistral`, `gemma`, `gemma3`, `gemma4`,
`t5`, `bart`, `whisper`, `t5gemma`, `moonshine`, `bloom`, `falcon`, `phi3`,
`qwen`, `qwen_moe`, `qwen3`, `qwen3_5`, `qwen3_5_moe`, `smollm3`, `mixtral`,
`qwen3_moe`, `gpt_oss`, `vit`, `deit`, `dinov2`, `clip`, `siglip`,
`metaclip_2`, `deberta_v3`, `roformer_v2`, `esm`), each with its table of
weight paths.
`causal_lm_generator(model)` decodes a converted GPT-2, Llama, Mistral,
Mixtral, Gemma (1, 2, 3, 4), BLOOM, Falcon, OPT, Phi-3, Qwen 2, Qwen-MoE,
Qwen 3, Qwen 3.5, Qwen 3.5-MoE, Qwen3-MoE, SmolLM3 or gpt-oss with the
library's cached generator,
`seq2seq_generator(model)` a converted encoder-decoder (T5, BART, Whisper,
T5Gemma, Moonshine).
keras-hub is imported only when a backbone is converted.

`from_huggingface(path)` loads a Hugging Face safetensors checkpoint
(`config.json` and `model.safetensors` or shards) into the same blocks
with NumPy alone (`checkpoint` reads the files); one module per
architecture in `interop.hf`, the registry `huggingface.MODEL_TYPES`
(`supported_model_types()`).
"""

from keras_attention.interop.convert import from_keras_hub
from keras_attention.interop.convert import supported_backbones
from keras_attention.interop.generation import causal_lm_generator
from keras_attention.interop.generation import seq2seq_generator
from keras_attention.interop.huggingface import from_huggingface
from keras_attention.interop.huggingface import supported_model_types

__all__ = [
    "causal_lm_generator",
    "from_huggingface",
    "from_keras_hub",
    "seq2seq_generator",
    "supported_backbones",
    "supported_model_types",
]
