"""A pretrained keras-hub model in `keras_attention` blocks: converted,
checked, and its attention analysed.

Loads the backbone of a keras-hub preset (`keras_hub.models.Backbone
.from_preset`), rebuilds it from this library's blocks with
`keras_attention.interop.from_keras_hub`, prints the largest difference
between the two models' outputs on a sample input, then the attention
statistics of every head of every layer (Clark et al., 2019, "What does
BERT look at?"): mean entropy of the attention distributions (nats), mean
attended distance (tokens), mean weight on the first token and on the
query's own token. Writes the attention explorer and one heatmap per
layer:

    python -m examples.inspect_pretrained --preset bert_tiny_en_uncased
    python -m examples.inspect_pretrained --preset ./my_preset_dir
    python -m examples.inspect_pretrained --preset gpt2_base_en \\
        --text "The quick brown fox jumps over the lazy dog."

A preset name (`keras_hub.models.Backbone.presets`) is downloaded by
keras-hub (Kaggle) on first use and cached; without network, save it on a
machine with network and copy the directory over:

    python -c "import keras_hub; keras_hub.models.Backbone.from_preset(
        'bert_tiny_en_uncased').save_to_preset('bert_tiny')"

(and `keras_hub.models.Tokenizer.from_preset(...).save_to_preset(...)`
into the same directory to tokenize --text; without a tokenizer the sample
is random token ids). Supported backbones:
`keras_attention.interop.supported_backbones()`.

Outputs in `--output-dir` (default runs/inspect_pretrained):
`attention.html` (the explorer: every layer, every head),
`heatmaps/layer_NN.png`, `stats.json` (the statistics and the equality).
"""

import argparse
import json
import logging
import os
import sys

from examples.common import HelpFormatter
from examples.common.training import add_backend_arg
from examples.common.training import select_backend
from examples.common.training import setup_logging

logger = logging.getLogger("examples")

DEFAULT_TEXT = "The cat sat on the mat because it was tired."


class PresetError(ValueError):
    """A preset that cannot be loaded here (missing, unknown, offline)."""


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m examples.inspect_pretrained",
        description=__doc__.split("\n\n")[0],
        formatter_class=HelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    parser.add_argument(
        "--preset",
        required=True,
        help="a keras-hub preset name (e.g. bert_tiny_en_uncased) or a "
        "local preset directory",
    )
    parser.add_argument(
        "--text",
        default=DEFAULT_TEXT,
        help="the sample input, when the preset has a tokenizer",
    )
    parser.add_argument(
        "--length",
        type=int,
        default=16,
        help="tokens of the random sample, without a tokenizer (at most "
        "the backbone's max_sequence_length)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--tolerance",
        type=float,
        default=1e-4,
        help="largest difference accepted between the converted model's "
        "outputs and the backbone's (float32)",
    )
    parser.add_argument("--output-dir", default="runs/inspect_pretrained")
    add_backend_arg(parser)
    args = parser.parse_args(argv)
    select_backend(args.backend, parser.error)
    if args.length < 2:
        parser.error(f"--length must be at least 2. Received: {args.length}")
    return args


def is_local(preset):
    """Whether `preset` names a directory (rather than a preset name or a
    `kaggle://` / `hf://` handle)."""
    return "://" not in preset and (
        os.path.isdir(preset)
        or os.sep in preset
        or preset.startswith(".")
        or preset.startswith("~")
    )


def how_to_get(name):
    return (
        "On a machine with network, save it as a local preset directory "
        'and copy that here: python -c "import keras_hub; '
        f"keras_hub.models.Backbone.from_preset('{name}')"
        ".save_to_preset('my_preset')\" (and keras_hub.models.Tokenizer"
        f".from_preset('{name}').save_to_preset('my_preset') for its "
        "tokenizer), then --preset ./my_preset."
    )


def load_backbone(preset):
    """The preset's backbone and its tokenizer (None when the preset has
    none); `PresetError` with how to get the preset when it cannot be
    loaded."""
    import keras_hub

    if is_local(preset):
        path = os.path.expanduser(preset)
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise PresetError(
                f"No keras-hub preset in the directory {preset!r} (it has "
                "no config.json). A local preset is written by "
                "`backbone.save_to_preset(directory)`. "
                + how_to_get("bert_tiny_en_uncased")
            )
        preset = path
    elif "://" not in preset and preset not in (
        keras_hub.models.Backbone.presets
    ):
        raise PresetError(
            f"Unknown keras-hub preset {preset!r}: neither a preset name "
            "(keras_hub.models.Backbone.presets, e.g. bert_tiny_en_uncased, "
            "gpt2_base_en) nor a local preset directory."
        )
    try:
        backbone = keras_hub.models.Backbone.from_preset(preset)
    except Exception as error:  # the download (no network, credentials)
        if is_local(preset):
            raise
        raise PresetError(
            f"Could not load the keras-hub preset {preset!r} (it is "
            "downloaded on first use; is there network?): "
            f"{type(error).__name__}: {error}. " + how_to_get(preset)
        ) from error
    tokenizer = None
    if not is_local(preset) or os.path.isfile(
        os.path.join(preset, "tokenizer.json")
    ):
        try:
            tokenizer = keras_hub.models.Tokenizer.from_preset(preset)
        except Exception as error:
            logger.info("No tokenizer (%s): random token ids.", error)
    return backbone, tokenizer


def sample_input(backbone, tokenizer, args):
    """The backbone's inputs for one example (batch of 1, no padding) and
    the token strings the explorer and heatmaps show."""
    import numpy as np

    names = set(backbone.input) if isinstance(backbone.input, dict) else set()
    rng = np.random.default_rng(args.seed)
    if "images" in names:
        shape = tuple(backbone.input["images"].shape[1:])
        images = rng.uniform(0.0, 1.0, (1,) + shape).astype("float32")
        return {"images": images}, None
    limit = getattr(backbone, "max_sequence_length", None) or 1_000_000
    if tokenizer is not None:
        ids = [int(i) for i in np.asarray(tokenizer(args.text))]
        first = getattr(tokenizer, "cls_token_id", None)
        if first is None:
            first = getattr(tokenizer, "start_token_id", None)
        last = getattr(tokenizer, "sep_token_id", None)
        ids = ([] if first is None else [first]) + ids[: limit - 2]
        ids += [] if last is None else [last]
        tokens = [str(tokenizer.id_to_token(i)) for i in ids]
    else:
        length = min(args.length, limit)
        ids = rng.integers(1, backbone.vocabulary_size, length).tolist()
        tokens = [str(i) for i in ids]
    token_ids = np.array([ids], "int32")
    if "encoder_token_ids" in names:
        # T5: the text is both the source and the (teacher-forced) target,
        # so one token list labels the encoder's, the decoder's and the
        # cross-attention's maps.
        return {
            f"{stack}_{name}": value
            for stack in ("encoder", "decoder")
            for name, value in (
                ("token_ids", token_ids),
                ("padding_mask", np.ones_like(token_ids)),
            )
        }, tokens
    inputs = {"token_ids": token_ids, "padding_mask": np.ones_like(token_ids)}
    if "segment_ids" in names:
        inputs["segment_ids"] = np.zeros_like(token_ids)
    return inputs, tokens


def max_difference(ours, theirs):
    """The largest absolute difference over every output (a dict of
    outputs, as BERT's, or one tensor)."""
    import numpy as np
    from keras.ops import convert_to_numpy

    if not isinstance(theirs, dict):
        ours, theirs = {"output": ours}, {"output": theirs}
    return max(
        float(
            np.abs(
                convert_to_numpy(ours[k]).astype("float64")
                - convert_to_numpy(theirs[k]).astype("float64")
            ).max()
        )
        for k in theirs
    )


def main(argv=None):
    args = parse_args(argv)
    setup_logging()
    import keras
    import numpy as np

    from examples.common.attention_outputs import write_explorer
    from examples.inspect_pretrained.stats import STATISTICS
    from examples.inspect_pretrained.stats import head_statistics
    from examples.inspect_pretrained.stats import plot_layer
    from keras_attention.interop import from_keras_hub
    from keras_attention.visualization import collect_attention

    keras.utils.set_random_seed(args.seed)
    try:
        backbone, tokenizer = load_backbone(args.preset)
    except PresetError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    model = from_keras_hub(backbone)
    inputs, tokens = sample_input(backbone, tokenizer, args)
    difference = max_difference(model(inputs), backbone(inputs))
    equal = difference <= args.tolerance
    print(
        f"{type(backbone).__name__} ({backbone.count_params():,} "
        f"parameters, {keras.backend.backend()}): max |ours - keras-hub| = "
        f"{difference:.3g} over the outputs "
        f"({'equal' if equal else 'NOT equal'} within {args.tolerance:g})"
    )

    maps = collect_attention(model, inputs)
    if tokens is None:  # images: the class token, then the patches
        size = next(iter(maps.values())).shape[-1]
        tokens = ["[CLS]"] + [f"p{i}" for i in range(size - 1)]
    os.makedirs(os.path.join(args.output_dir, "heatmaps"), exist_ok=True)
    print(
        "\nPer head, averaged over the queries: entropy (nats), attended "
        "distance (tokens), weight on the first token, on the same token."
    )
    width = max(len(name) for name in maps)
    print(
        f"{'layer':<{width}} head {'entropy':>8} {'distance':>9} "
        f"{'first':>6} {'self':>6}"
    )
    layers = []
    for index, (name, weights) in enumerate(maps.items()):
        weights = np.asarray(keras.ops.convert_to_numpy(weights))[0]
        weights = weights[:, : len(tokens), : len(tokens)]
        stats = head_statistics(weights)
        for head in range(weights.shape[0]):
            row = " ".join(
                f"{stats[k][head]:{w}.3f}"
                for k, w in zip(STATISTICS, (8, 9, 6, 6))
            )
            print(f"{name:<{width}} {head:>4} {row}")
        means = ", ".join(f"{k} {stats[k].mean():.3f}" for k in STATISTICS)
        print(f"{name:<{width}} mean {means}")
        png = os.path.join(
            args.output_dir, "heatmaps", f"layer_{index:02d}.png"
        )
        plot_layer(weights, tokens, png, f"{args.preset}: {name}")
        layers.append(
            {
                "layer": name,
                "heatmap": png,
                **{k: [float(v) for v in stats[k]] for k in STATISTICS},
            }
        )
    encoder_decoder = "encoder_token_ids" in inputs  # T5: same text
    html = write_explorer(
        args.output_dir,
        maps,
        [tokens],
        target_tokens=[tokens] if encoder_decoder else None,
        title=f"{args.preset} ({type(backbone).__name__})",
    )
    results = {
        "preset": args.preset,
        "backbone": type(backbone).__name__,
        "backend": keras.backend.backend(),
        "max_difference": difference,
        "equal": bool(equal),
        "tokens": tokens,
        "layers": layers,
        "explorer": html,
    }
    with open(os.path.join(args.output_dir, "stats.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(
        f"\nWrote {html}, {len(layers)} heatmaps and stats.json in "
        f"{args.output_dir}"
    )
    return results


if __name__ == "__main__":
    main()
