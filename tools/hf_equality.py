"""Measures how equal `keras_attention.interop.from_huggingface` models
are to transformers' on the cases of `tests/interop/hf_cases.py` (one per
family, its distinctive options on; tiny random configs, no downloads):
the references are built and saved by `tests/interop/hf_reference.py` in
one subprocess (transformers 5, eager attention), then each checkpoint is
loaded on the current Keras backend and compared:

- hidden states: the largest |difference| to transformers' base model
  `last_hidden_state` over the real positions of a right- and a
  left-padded row (8 positions);
- greedy tokens: our `causal_lm_generator`'s 8 greedy tokens after each
  of 2 prompts, equal to `generate(do_sample=False)`'s (a case marked
  `greedy=False` says why it is not compared).

    KERAS_BACKEND=tensorflow python tools/hf_equality.py [--markdown PATH]

`tools/interop_equality.py --huggingface PATH` runs it too; PATH
docs/_generated/hf_equality.md is the table docs/guides/checkpoints.md
includes.
"""

import argparse
import os
import pathlib
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "interop"))

import hf_cases  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
from hf_compare import greedy_tokens  # noqa: E402
from hf_compare import hidden_difference  # noqa: E402
from hf_compare import write_references  # noqa: E402

from keras_attention.interop import from_huggingface  # noqa: E402


def measure(cases=None):
    """`{case: (hidden difference, (equal tokens, tokens) or None)}`."""
    cases = cases or hf_cases.case_names()
    results = {}
    with tempfile.TemporaryDirectory() as out:
        write_references(out, cases)
        for case in cases:
            directory = pathlib.Path(out) / case
            reference = np.load(directory / "reference.npz")
            model = from_huggingface(directory)
            greedy = None
            if hf_cases.CASES[case].get("greedy", True):
                tokens = greedy_tokens(model)
                want = reference["tokens"]
                greedy = (int((tokens == want).sum()), int(want.size))
            results[case] = (hidden_difference(model, reference), greedy)
    return results


def markdown(results):
    """The table: one row per case."""
    label = {"tensorflow": "TF", "jax": "JAX", "torch": "torch"}
    backend = label[keras.backend.backend()]
    lines = [
        f"| model_type (case) | options on | hidden states ({backend}) | "
        f"greedy tokens equal ({backend}) |",
        "|---|---|---|---|",
    ]
    for case, (hidden, greedy) in results.items():
        spec = hf_cases.CASES[case]
        name = f"`{spec['model_type']}`"
        if case != spec["model_type"]:
            name += f" ({case})"
        tokens = "—" if greedy is None else f"{greedy[0]}/{greedy[1]}"
        lines.append(
            f"| {name} | {spec.get('about', '')} | {hidden:.1e} | {tokens} |"
        )
    return "\n".join(lines) + "\n"


def run(path=None):
    table = markdown(measure())
    if path:
        pathlib.Path(path).write_text(table, encoding="utf-8")
    print(table, end="")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", metavar="PATH", help="write the table")
    run(parser.parse_args().markdown)


if __name__ == "__main__":
    main()
