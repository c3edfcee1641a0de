"""Which mixer when? The `--mixer` comparison of the `language_model`
example: several models, one per token mixer, trained with the same
data, steps and seed, and one Markdown table.

    python -m examples.language_model \
        --mixer attention linear gated_delta hybrid

Each row: the blocks (`A` attention, `L` linear attention, `G` gated
delta net, first block first), the parameters, test bits per character
on windows of the training length and teacher-forced on windows of 4x
it, training tokens per second (real tokens, median step), and the cost
of decoding `--decode-length` characters through `CausalLMGenerator` in
a fresh process (`examples.language_model.decoding`): milliseconds per
character (median over the streamed pieces after the first) and the
peak memory of the generation above the loaded model (its compiled
loop, caches and activations; `decoding.py` says how).
"""

import copy
import json
import logging
import os

from examples.language_model import decoding

logger = logging.getLogger("examples")

HEADERS = (
    "mixer",
    "blocks",
    "parameters",
    "bits/char at {n}",
    "bits/char at {n4}",
    "training tokens/s",
    "decoding ms/char",
    "peak MiB, {d} chars",
)

LETTERS = {"attention": "A", "linear": "L", "gated_delta": "G"}


def headers(sequence_length, decode_length):
    """The table's column names for these lengths."""
    return [
        h.format(n=sequence_length, n4=4 * sequence_length, d=decode_length)
        for h in HEADERS
    ]


def row(mixer, result, decoded):
    """A table row (strings) of one mixer's `train_mixer` result and
    `decoding.measure` dict."""
    return [
        mixer,
        "".join(LETTERS[m] for m in result["blocks"]),
        f"{result['parameters']:,}",
        f"{result['bits']:.3f}",
        f"{result['bits_4x']:.3f}",
        f"{result['tokens_per_second']:,.0f}",
        f"{decoded['ms_per_token']:.2f}",
        f"{decoded['peak_mib']:.0f}",
    ]


def markdown_table(header, rows):
    lines = ["| " + " | ".join(header) + " |"]
    lines.append("|" + "|".join("---" for _ in header) + "|")
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def compare(args, train):
    """Trains each of `args.mixer` with `train(mixer, args)` (`args` with
    `output_dir` set to `<output_dir>/<mixer>`), measures its decoding,
    prints the table and writes it to `<output_dir>/mixers.md` (the
    results to `mixers.json`).

    Returns `{"table": markdown, "results": {mixer: dict}}`, each dict
    `train`'s plus `decoding` (`decoding.measure`'s).
    """
    import keras

    header = headers(args.sequence_length, args.decode_length)
    results, rows = {}, []
    for mixer in args.mixer:
        logger.info("--mixer %s: training", mixer)
        sub = copy.copy(args)
        sub.output_dir = os.path.join(args.output_dir, mixer)
        result = train(mixer, sub)
        logger.info(
            "--mixer %s: decoding %d characters", mixer, args.decode_length
        )
        result["decoding"] = decoding.measure(
            result["model_config"], result["weights"], args.decode_length
        )
        results[mixer] = result
        rows.append(row(mixer, result, result["decoding"]))
        print(markdown_table(header, rows[-1:]).splitlines()[-1], flush=True)
    table = markdown_table(header, rows)
    title = (
        f"Mixers, {keras.backend.backend()}: {args.num_layers} blocks of "
        f"{args.hidden_dim} ({args.num_heads} heads), attention window "
        f"{args.window or 'none (full)'}, positions {args.positions}; "
        f"{args.epochs} x {args.steps_per_epoch} steps of "
        f"{args.batch_size} x {args.sequence_length} characters, seed "
        f"{args.seed}; decoding {args.decode_length} characters, greedy, "
        "streamed."
    )
    print(f"\n{title}\n\n{table}")
    os.makedirs(args.output_dir, exist_ok=True)
    with open(os.path.join(args.output_dir, "mixers.md"), "w") as f:
        f.write(f"{title}\n\n{table}\n")
    with open(os.path.join(args.output_dir, "mixers.json"), "w") as f:
        json.dump(results, f, indent=2)  # the figures before rounding
    return {"table": table, "results": results}
