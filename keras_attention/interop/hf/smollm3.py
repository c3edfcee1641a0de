"""Hugging Face `smollm3` checkpoints: the Llama-style model
(`hf.llama`) without rotary positions on its NoPE layers."""

from keras_attention.interop.hf import llama

# transformers' SmolLM3 `rope_theta` when the config has none.
DEFAULT_THETA = 2_000_000.0


def rope_layers(config):
    """Which layers rotate (`no_rope_layers[i]` 1, as transformers';
    default: all but every `no_rope_layer_interval`-th)."""
    layers = int(config.require("num_hidden_layers"))
    interval = int(config.get("no_rope_layer_interval", 4))
    flags = config.get(
        "no_rope_layers",
        [int((i + 1) % interval != 0) for i in range(layers)],
    )
    if len(flags) != layers:
        raise ValueError(
            f"config.json of model_type 'smollm3': no_rope_layers={flags!r} "
            f"must have one entry for each of its {layers} layers."
        )
    return [bool(flag) for flag in flags]


def convert_smollm3(config, dtype):
    """A `smollm3` checkpoint's model: `llama_style_model` (tied head by
    default, `attention_bias`, `mlp_bias`) with rotary positions only on
    the layers whose `no_rope_layers` entry is 1 (the others, "NoPE",
    get `rotary_max_wavelength=None`), and windows on its
    "sliding_attention" layers (`layer_types`; by default the NoPE
    layers when `use_sliding_window`).

    References:
        - Hugging Face, 2025, "SmolLM3: smol, multilingual, long-context
          reasoner".
        - Kazemnejad et al., 2023, "The Impact of Positional Encoding on
          Length Generalization in Transformers" (NoPE).
    """
    rope = rope_layers(config)
    window = config.get("sliding_window")
    default = [
        "sliding_attention"
        if config.get("use_sliding_window", False)
        and window is not None
        and not rope[i]
        else "full_attention"
        for i in range(len(rope))
    ]
    windows = llama.layer_windows(config, window, default)

    def nope(i):
        if rope[i]:
            return {}
        return {"rotary_max_wavelength": None, "rotary_scaling": None}

    return llama.convert(
        config,
        dtype,
        tie_default=True,
        default_theta=DEFAULT_THETA,
        layer_attention=llama.windowed(windows, nope),
    )
