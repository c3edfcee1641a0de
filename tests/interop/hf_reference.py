"""Writes transformers' reference checkpoints and outputs for the cases of
`hf_cases.py` (run in a subprocess: transformers imports torch, which
must not share a process with TensorFlow).

    python tests/interop/hf_reference.py OUT_DIR [CASE ...]

For each case (all when none is named): the transformers model
(`AutoModelForCausalLM.from_config`, or `AutoModel.from_config` for the
encoders of `hf_cases.ENCODERS`; eager attention, seeded with
`torch.manual_seed`, noise added to every weight so that norm scales and
biases are not their initial ones) saved with
`save_pretrained(safe_serialization=True)` into `OUT_DIR/CASE`, and
`OUT_DIR/CASE/reference.npz` with `hidden` (the base model's
`last_hidden_state` on `hf_cases.TOKEN_IDS` / `PADDING_MASK`, and
`SEGMENT_IDS` as `token_type_ids` where the config has more than one
type; float32) and, for the causal LMs, `tokens`
(`generate(do_sample=False)`'s `NEW_TOKENS` greedy tokens after each of
`PROMPTS`, each prompt alone).
"""

import os
import pathlib
import sys

import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_cases  # noqa: E402
import hf_indexer  # noqa: E402


def build(case, seed=0):
    """The transformers causal LM (an encoder's base model) of `case`
    (random, seeded)."""
    spec = hf_cases.CASES[case]
    config = transformers.AutoConfig.for_model(
        spec["model_type"], **spec["config"]
    )
    torch.manual_seed(seed)
    auto = transformers.AutoModelForCausalLM
    if spec["model_type"] in hf_cases.ENCODERS:
        auto = transformers.AutoModel
    model = auto.from_config(
        config, attn_implementation="eager", dtype=torch.float32
    )
    with torch.no_grad():
        for parameter in model.parameters():
            noise = spec.get("noise", hf_cases.NOISE)
            parameter.add_(torch.randn_like(parameter) * noise)
        suffixes = tuple(spec.get("noise_buffers", ()))
        for name, buffer in model.named_buffers():
            if suffixes and name.endswith(suffixes):
                buffer.add_(torch.randn_like(buffer) * noise)
    if spec.get("sharpen_indexer"):
        hf_indexer.sharpen(model)
    return model.eval()


def greedy(model):
    """`NEW_TOKENS` greedy tokens after each prompt (each alone)."""
    out = []
    for prompt in hf_cases.PROMPTS:
        ids = torch.tensor([prompt])
        tokens = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=hf_cases.NEW_TOKENS,
            min_new_tokens=hf_cases.NEW_TOKENS,
            do_sample=False,
            pad_token_id=0,
        )
        out.append(tokens[0, len(prompt) :].numpy())
    return np.stack(out)


def write(case, out_dir):
    model = build(case)
    gaps = []  # DeepSeek-V3.2: the smallest gap of each top-k choice
    if hf_cases.CASES[case].get("sharpen_indexer"):
        gaps = hf_indexer.record_gaps(model)
    directory = pathlib.Path(out_dir) / case
    model.save_pretrained(directory, safe_serialization=True)
    ids = torch.tensor(hf_cases.TOKEN_IDS)
    mask = torch.tensor(hf_cases.PADDING_MASK)
    if hf_cases.CASES[case]["model_type"] in hf_cases.ENCODERS:
        types = getattr(model.config, "type_vocab_size", 1)
        extra = {}
        if types > 1:
            extra["token_type_ids"] = torch.tensor(hf_cases.SEGMENT_IDS)
        with torch.no_grad():
            hidden = model(input_ids=ids, attention_mask=mask, **extra)
        outputs = {}
    else:
        with torch.no_grad():
            hidden = model.model(input_ids=ids, attention_mask=mask)
        outputs = {"tokens": greedy(model)}
    if gaps:
        outputs["index_gap"] = np.array(min(gaps))
    if "hidden_rows" in hf_cases.CASES[case]:
        outputs["rows"] = np.array(hf_cases.CASES[case]["hidden_rows"])
    np.savez(
        directory / "reference.npz",
        hidden=hidden.last_hidden_state.float().numpy(),
        **outputs,
    )


def main(argv):
    out_dir, cases = argv[0], argv[1:] or hf_cases.case_names()
    for case in cases:
        write(case, out_dir)


if __name__ == "__main__":
    main(sys.argv[1:])
