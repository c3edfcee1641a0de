"""`from_keras_hub`: a keras-hub backbone rebuilt from our blocks."""

from keras_attention.interop.albert import convert_albert
from keras_attention.interop.bart import convert_bart
from keras_attention.interop.bert import convert_bert
from keras_attention.interop.bloom import convert_bloom
from keras_attention.interop.clip import convert_clip
from keras_attention.interop.deberta_v3 import convert_deberta_v3
from keras_attention.interop.deit import convert_deit
from keras_attention.interop.dinov2 import convert_dinov2
from keras_attention.interop.distil_bert import convert_distil_bert
from keras_attention.interop.electra import convert_electra
from keras_attention.interop.esm import convert_esm
from keras_attention.interop.falcon import convert_falcon
from keras_attention.interop.gemma import convert_gemma
from keras_attention.interop.gemma3 import convert_gemma3
from keras_attention.interop.gemma4 import convert_gemma4
from keras_attention.interop.gpt2 import convert_gpt2
from keras_attention.interop.gpt_neox import convert_gpt_neox
from keras_attention.interop.gpt_oss import convert_gpt_oss
from keras_attention.interop.llama import convert_llama
from keras_attention.interop.metaclip_2 import convert_metaclip_2
from keras_attention.interop.mistral import convert_mistral
from keras_attention.interop.mixtral import convert_mixtral
from keras_attention.interop.moonshine import convert_moonshine
from keras_attention.interop.opt import convert_opt
from keras_attention.interop.phi3 import convert_phi3
from keras_attention.interop.qwen import convert_qwen
from keras_attention.interop.qwen3 import convert_qwen3
from keras_attention.interop.qwen3_5 import convert_qwen3_5
from keras_attention.interop.qwen3_5_moe import convert_qwen3_5_moe
from keras_attention.interop.qwen3_moe import convert_qwen3_moe
from keras_attention.interop.qwen_moe import convert_qwen_moe
from keras_attention.interop.refused import refusal_reason
from keras_attention.interop.roberta import convert_roberta
from keras_attention.interop.roformer_v2 import convert_roformer_v2
from keras_attention.interop.siglip import convert_siglip
from keras_attention.interop.smollm3 import convert_smollm3
from keras_attention.interop.t5 import convert_t5
from keras_attention.interop.t5gemma import convert_t5gemma
from keras_attention.interop.vit import convert_vit
from keras_attention.interop.whisper import convert_whisper

# keras-hub backbone class name (in `keras_hub.models`) -> its converter.
# Resolved to the classes at call time: keras-hub is an optional extra,
# imported only when a backbone is converted.
CONVERTERS = {
    "AlbertBackbone": convert_albert,
    "BartBackbone": convert_bart,
    "BertBackbone": convert_bert,
    "BloomBackbone": convert_bloom,
    "CLIPBackbone": convert_clip,
    "DebertaV3Backbone": convert_deberta_v3,
    "DeiTBackbone": convert_deit,
    "DINOV2Backbone": convert_dinov2,
    "DistilBertBackbone": convert_distil_bert,
    "ElectraBackbone": convert_electra,
    "ESMBackbone": convert_esm,
    "FalconBackbone": convert_falcon,
    "GPT2Backbone": convert_gpt2,
    "GPTNeoXBackbone": convert_gpt_neox,
    "GptOssBackbone": convert_gpt_oss,
    "GemmaBackbone": convert_gemma,
    "Gemma3Backbone": convert_gemma3,
    "Gemma4Backbone": convert_gemma4,
    "LlamaBackbone": convert_llama,
    "MetaCLIP2Backbone": convert_metaclip_2,
    "MistralBackbone": convert_mistral,
    "MixtralBackbone": convert_mixtral,
    "MoonshineBackbone": convert_moonshine,
    "OPTBackbone": convert_opt,
    "Phi3Backbone": convert_phi3,
    "QwenBackbone": convert_qwen,
    "QwenMoeBackbone": convert_qwen_moe,
    "Qwen3Backbone": convert_qwen3,
    "Qwen3_5Backbone": convert_qwen3_5,
    "Qwen3_5MoeBackbone": convert_qwen3_5_moe,
    "Qwen3MoeBackbone": convert_qwen3_moe,
    "RobertaBackbone": convert_roberta,
    "RoformerV2Backbone": convert_roformer_v2,
    "SigLIPBackbone": convert_siglip,
    "SmolLM3Backbone": convert_smollm3,
    "T5Backbone": convert_t5,
    "T5GemmaBackbone": convert_t5gemma,
    "ViTBackbone": convert_vit,
    "WhisperBackbone": convert_whisper,
    "XLMRobertaBackbone": convert_roberta,
}


def supported_backbones():
    """The names of the keras-hub backbone classes `from_keras_hub`
    converts (their subclasses too), sorted."""
    return sorted(CONVERTERS)


def _registry():
    """`{backbone class: converter}` of the installed keras-hub."""
    import keras_hub  # an optional extra, needed only to convert

    return {
        getattr(keras_hub.models, name): converter
        for name, converter in CONVERTERS.items()
        if hasattr(keras_hub.models, name)
    }


def from_keras_hub(backbone):
    """A keras-hub backbone rebuilt from `keras_attention` blocks and
    layers, holding a copy of its weights (not shared: training one leaves
    the other as it was).

    The result is a functional `keras.Model` with the backbone's inputs
    (`token_ids`, `padding_mask`, and BERT's `segment_ids`, int
    `(batch, T)`; T5's `encoder_token_ids`, `encoder_padding_mask`,
    `decoder_token_ids`, `decoder_padding_mask`; ViT's `images`) and
    outputs, equal to the backbone's at
    every real (not padded) position (float32: within 1e-5 on TensorFlow,
    JAX and PyTorch; left or right padding). At padded query positions
    the values differ: our attention gives a padded query a zero attention
    result, keras-hub lets it attend to the real keys; neither is
    meaningful.
    Every feature of the library then works on the model: attention
    weights of every layer (`visualization.collect_attention`), score and
    mask objects, the blockwise path, layout maps. It saves as `.keras` and
    reloads with `safe_mode=True`.

    Supported: `keras_hub.models.BertBackbone`,
    `RobertaBackbone` and `XLMRobertaBackbone` (no token types),
    `DistilBertBackbone` (no token types),
    `AlbertBackbone` (its factorized embedding; its shared layers as one
    block per layer, called as often as keras-hub calls it),
    `ElectraBackbone` (its factorized embedding),
    `GPT2Backbone`, `LlamaBackbone`
    (also `Llama3Backbone`; Llama 3.1's RoPE scaling as the self-attention's
    `rotary_scaling`), `MistralBackbone` (its sliding window as the
    self-attention's `window_size`, its `rope_scaling_factor` as
    `rotary_scaling`), `GemmaBackbone` (Gemma 1 and 2: soft-caps, alternating
    windows, post-norms, Gemma 2 27B's query scaling as the self-attention's
    `attention_scale`), `Gemma3Backbone` (text: QK-norm, five windowed layers
    for one global, a rotary wavelength per kind of layer), `Gemma4Backbone`
    (text: keys and values shared across layers, K = V, two head sizes,
    proportional partial RoPE; `interop.gemma4`), `GptOssBackbone`
    (learned sinks, a window on every other layer, YaRN, its mixture of experts
    as a `MixtureOfExperts`), `T5Backbone` (encoder-decoder; one
    `T5RelativeBias` per stack shared by its blocks, unscaled scores),
    the encoder-decoders `BartBackbone`, `T5GemmaBackbone`,
    `WhisperBackbone` (input `encoder_features`: its convolutions as Keras
    layers) and `MoonshineBackbone` (raw audio `encoder_input_values`: its
    frontend as Keras layers, its frames' mask a `ConvolutionPaddingMask`),
    `BloomBackbone` (ALiBi), `Phi3Backbone` (LongRoPE as the self-attention's
    `rotary_scaling`), `Qwen3Backbone` (QK-norm as the self-attention's
    `qk_norm="rms"`), `Qwen3_5Backbone` (text: gated delta net layers as
    `GatedDeltaNet`s, gated attention layers as a `SelfAttention` with
    `use_gate=True`), `SmolLM3Backbone` (no rotary positions on its NoPE
    layers), `MixtralBackbone` and `Qwen3MoeBackbone` (their mixtures of experts
    as `MixtureOfExperts`), `ViTBackbone` (input `images`), `DeiTBackbone`,
    `DINOV2Backbone` (layer scale as the layers' `layer_scale`, registers, a
    fixed image size), `CLIPBackbone`, `MetaCLIP2Backbone` and
    `SigLIPBackbone` (inputs `images`
    and `token_ids`, outputs `vision_logits` and `text_logits`; both towers,
    `TokenPooling`, `ContrastiveLogits`) and their subclasses
    (`supported_backbones()`); one converter per family in
    `keras_attention.interop.<family>`, where the table of weight paths (theirs
    -> ours) is `WEIGHT_TABLE`. Each block is composed of its layers, built by
    the converter: `TransformerDecoderBlock(self_attention=...,
    feed_forward=..., cross_attention=...)` with a `SelfAttention`,
    `LocalSelfAttention` or `GatedDeltaNet`, a `FeedForward` or
    `MixtureOfExperts` and T5's `CrossAttention` (read them as
    `block.self_attention`, `block.feed_forward`).

    Args:
        backbone: a built keras-hub backbone (`keras_hub.models.*Backbone`,
            e.g. from `keras_hub.models.BertBackbone.from_preset(...)`),
            or a keras-hub task holding one (`CausalLM`, `TextClassifier`,
            ...: its `backbone` is converted).

    Returns:
        The converted `keras.Model`.

    Raises:
        ValueError: for a backbone of an unsupported class (the message
            lists the supported ones), or one whose weights do not match
            the family's layout.
        TypeError: when `backbone` is neither a keras-hub backbone nor a
            keras-hub task.

    Example:

    >>> import numpy as np
    >>> import keras_hub
    >>> import keras_attention
    >>> backbone = keras_hub.models.BertBackbone(
    ...     vocabulary_size=20, num_layers=1, num_heads=2, hidden_dim=8,
    ...     intermediate_dim=16, max_sequence_length=6)
    >>> model = keras_attention.interop.from_keras_hub(backbone)
    >>> inputs = {
    ...     "token_ids": np.array([[2, 5, 7, 0]], "int32"),
    ...     "segment_ids": np.zeros((1, 4), "int32"),
    ...     "padding_mask": np.array([[1, 1, 1, 0]], "int32"),
    ... }
    >>> from keras import ops
    >>> ours = ops.convert_to_numpy(model(inputs)["sequence_output"])
    >>> theirs = ops.convert_to_numpy(backbone(inputs)["sequence_output"])
    >>> real = inputs["padding_mask"] == 1
    >>> bool(np.abs(ours - theirs).max(axis=-1)[real].max() < 1e-5)
    True

    References:
        - Devlin et al., 2019, "BERT".
        - Radford et al., 2019, "Language Models are Unsupervised Multitask
          Learners" (GPT-2).
        - Touvron et al., 2023, "LLaMA: Open and Efficient Foundation
          Language Models".
        - Jiang et al., 2023, "Mistral 7B".
        - Gemma Team, 2024, "Gemma: Open Models Based on Gemini Research
          and Technology".
        - Gemma Team, 2024, "Gemma 2: Improving Open Language Models at a
          Practical Size".
        - Raffel et al., 2020, "Exploring the Limits of Transfer Learning
          with a Unified Text-to-Text Transformer" (T5).
    """
    import keras_hub  # an optional extra, needed only to convert

    if isinstance(backbone, keras_hub.models.Task):
        backbone = backbone.backbone  # A task (`CausalLM`, ...): its model.
    if not isinstance(backbone, keras_hub.models.Backbone):
        raise TypeError(
            "`backbone` must be a keras-hub backbone "
            "(`keras_hub.models.Backbone`) or task (`keras_hub.models."
            "Task`). Received: "
            f"backbone={backbone!r} of type {type(backbone).__name__}"
        )
    registry = _registry()
    for cls in type(backbone).__mro__:
        if cls in registry:
            return registry[cls](backbone)
    reason = refusal_reason(c.__name__ for c in type(backbone).__mro__)
    raise ValueError(
        f"No converter for {type(backbone).__name__}.{reason} Supported "
        f"keras-hub backbones: {', '.join(supported_backbones())}. Received: "
        f"backbone={backbone.name!r} of type {type(backbone).__name__}"
    )
